// GPT-style sampling: fixed-length samples of seq_len + 1 tokens cut from the concatenated
// documents of a split (train / calibration / eval, split by documents), shuffled with a
// seed, blended across datasets with Megatron's greedy rule, handed out to data-parallel
// ranks as disjoint slices of one global order, and resumable from a DataCursor.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/token_source.h"

namespace ac::data {

enum class Split { Train = 0, Calibration = 1, Eval = 2 };
const char* split_name(Split s);
Split split_from_name(const std::string& name);  // "train", "calibration", "eval"

// Fractions of the documents per split; parse_split("98,1,1") (any positive scale).
struct SplitSpec {
  double train = 0.98, calibration = 0.01, eval = 0.01;
};
SplitSpec parse_split(const std::string& text);

// Deterministic generator (splitmix64): the same seed gives the same order on every
// platform and compiler, unlike std::uniform_int_distribution.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n);  // uniform in [0, n), unbiased
 private:
  uint64_t s_;
};
// Seeded Fisher-Yates shuffle of v.
void shuffle(std::vector<int64_t>& v, uint64_t seed);

// One dataset, one split. Epoch e orders the split's documents by a seeded shuffle,
// concatenates them, and cuts sample j as tokens [j * seq_len, j * seq_len + seq_len + 1)
// (consecutive samples share one token, as in Megatron's GPTDataset); samples are then
// shuffled within the epoch. Sample k >= 0 lives in epoch k / samples_per_epoch().
// Thread-safe (one epoch's order is cached under a mutex).
class GptSampler {
 public:
  GptSampler(std::shared_ptr<const TokenSource> src, int64_t seq_len, uint64_t seed, const SplitSpec& split, Split which);
  int64_t seq_len() const { return seq_len_; }
  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  int64_t num_tokens() const { return tokens_; }                 // in this split
  const std::vector<int64_t>& documents() const { return docs_; }  // document ids of the split, ascending
  // Writes seq_len + 1 tokens (int64 or int32).
  void sample(int64_t k, int64_t* out) const;
  void sample(int64_t k, int32_t* out) const;

 private:
  template <typename Out>
  void sample_as(int64_t k, Out* out) const;
  struct Epoch {
    int64_t index = -1;
    std::vector<int64_t> order, start, perm;  // documents, their first token, sample order
  };
  std::shared_ptr<const Epoch> epoch(int64_t e) const;
  std::shared_ptr<const TokenSource> src_;
  int64_t seq_len_;
  uint64_t seed_;
  std::vector<int64_t> docs_;
  int64_t tokens_ = 0, samples_per_epoch_ = 0;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const Epoch> cache_;
};

struct BlendEntry {
  std::shared_ptr<const TokenSource> source;
  double weight = 1.0;
};
// Opens "PATH" or "WEIGHT:PATH" (Megatron's --data-path lists weights before paths).
// Throws ac::InputError naming --data for a malformed entry.
BlendEntry parse_blend_entry(const std::string& spec);

// Megatron's greedy blend (helpers.cpp build_blending_indices): sample i goes to the
// dataset with the largest weight_d * max(i, 1) - used_d (the first on ties), and is that
// dataset's sample number used_d. One dataset with weight 1 is plain sampling.
class BlendedSampler {
 public:
  BlendedSampler(std::vector<BlendEntry> entries, int64_t seq_len, uint64_t seed, const SplitSpec& split, Split which);
  int64_t seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }
  Split split() const { return which_; }
  const std::vector<double>& weights() const { return weights_; }  // normalized
  const std::vector<int64_t>& dataset_tokens() const { return dataset_tokens_; }
  size_t num_datasets() const { return samplers_.size(); }
  const GptSampler& dataset(size_t d) const { return *samplers_[d]; }
  // Which dataset and which of its samples global sample i is.
  std::pair<int, int64_t> locate(int64_t i) const;
  void sample(int64_t i, int64_t* out) const { sample_as(i, out); }
  void sample(int64_t i, int32_t* out) const { sample_as(i, out); }

 private:
  template <typename Out>
  void sample_as(int64_t i, Out* out) const {
    auto [d, k] = locate(i);
    samplers_[d]->sample(k, out);
  }
  int64_t seq_len_;
  uint64_t seed_;
  Split which_;
  std::vector<double> weights_;
  std::vector<int64_t> dataset_tokens_;
  std::vector<std::unique_ptr<GptSampler>> samplers_;
  // The greedy rule is sequential: keep the state at `pos_` and walk forward from it.
  mutable std::mutex mu_;
  mutable int64_t pos_ = 0;
  mutable std::vector<int64_t> used_;
};

// Where a run is in its data: enough to restore the exact sample order, on any DP size.
// Stored in checkpoints as JSON. consumed_samples counts global samples handed out.
struct DataCursor {
  int version = 1;
  uint64_t seed = 0;
  int64_t seq_len = 0;
  std::string split = "train";
  int64_t consumed_samples = 0;
  std::vector<double> weights;            // normalized blend weights
  std::vector<int64_t> dataset_tokens;    // tokens per dataset in this split (a fingerprint)

  nlohmann::json to_json() const;
  // Throws ac::InputError(where, field, problem) for a malformed cursor.
  static DataCursor from_json(const nlohmann::json& j, const std::string& where = "data cursor");
  // A cursor at the start of `s`.
  static DataCursor start(const BlendedSampler& s);
  // Throws ac::InputError when this cursor was not made for sampler `s` (other seed,
  // sequence length, split, blend or data).
  void check_matches(const BlendedSampler& s, const std::string& where = "data cursor") const;
};

struct LoaderConfig {
  int64_t micro_batch_size = 1;  // samples per rank per step
  int dp_rank = 0;
  int dp_size = 1;
};

// Per-rank view: step t (from cursor c) gives rank r the global samples
// c + r * micro_batch_size + [0, micro_batch_size), then every rank's cursor advances by
// micro_batch_size * dp_size. Ranks are disjoint, and a cursor saved at any step resumes
// under any DP size without repeating or skipping a sample.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<const BlendedSampler> sampler, const LoaderConfig& cfg, const DataCursor& cursor);
  // Fills out[micro_batch_size * (seq_len + 1)], row-major. The int32 form hands on half the
  // bytes (the trainer widens on the tensor); both advance the cursor the same way.
  void next(int64_t* out);
  void next(int32_t* out);
  std::vector<int64_t> next();
  const DataCursor& cursor() const { return cursor_; }
  // Global sample indices of the next batch of this rank (for tests and logging).
  std::vector<int64_t> next_indices() const;

 private:
  template <typename Out>
  void next_as(Out* out);
  std::shared_ptr<const BlendedSampler> sampler_;
  LoaderConfig cfg_;
  DataCursor cursor_;
};

}  // namespace ac::data

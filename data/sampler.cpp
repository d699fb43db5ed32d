// GPT-style sampling, blends, the data cursor and the DP-sharded loader.
#include "data/sampler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dist/error.h"

namespace ac::data {

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Calibration: return "calibration";
    case Split::Eval: return "eval";
  }
  return "?";
}

BlendEntry parse_blend_entry(const std::string& spec) {
  BlendEntry e;
  std::string path = spec;
  const size_t colon = spec.find(':');
  if (colon != std::string::npos) {
    try {
      size_t used = 0;
      e.weight = std::stod(spec.substr(0, colon), &used);
      if (used != colon) throw std::invalid_argument(spec);
      path = spec.substr(colon + 1);
    } catch (const std::exception&) {
      throw InputError("--data", "value", "\"" + spec + "\" is not PATH or WEIGHT:PATH");
    }
  }
  e.source = open_token_source(path);
  return e;
}

Split split_from_name(const std::string& n) {
  if (n == "train") return Split::Train;
  if (n == "calibration" || n == "calib") return Split::Calibration;
  if (n == "eval" || n == "valid" || n == "validation") return Split::Eval;
  throw InputError("split", "name", "\"" + n + "\" is not train, calibration or eval");
}

SplitSpec parse_split(const std::string& text) {
  std::vector<double> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      v.push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw InputError("--split", "value", "\"" + text + "\" is not three numbers like 98,1,1");
    }
  }
  if (v.size() != 3 || v[0] < 0 || v[1] < 0 || v[2] < 0 || v[0] + v[1] + v[2] <= 0)
    throw InputError("--split", "value", "\"" + text + "\" is not three non-negative numbers like 98,1,1");
  const double s = v[0] + v[1] + v[2];
  return SplitSpec{v[0] / s, v[1] / s, v[2] / s};
}

uint64_t Rng::next() {
  uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Rng::below(uint64_t n) {
  // Lemire's multiply-shift with rejection: unbiased and portable.
  unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
  uint64_t lo = static_cast<uint64_t>(m);
  if (lo < n) {
    const uint64_t t = (0 - n) % n;
    while (lo < t) {
      m = static_cast<unsigned __int128>(next()) * n;
      lo = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

void shuffle(std::vector<int64_t>& v, uint64_t seed) {
  Rng r(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[r.below(i)]);
}

namespace {
// Independent streams for the different shuffles of one run.
uint64_t mix(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0xD1B54A32D192ED03ull));
  return r.next();
}
enum Stream : uint64_t { kSplitDocs = 1, kEpochDocs = 2, kEpochSamples = 3, kDataset = 4 };
}  // namespace

// ---- GptSampler ----------------------------------------------------------------------------

GptSampler::GptSampler(std::shared_ptr<const TokenSource> src, int64_t seq_len, uint64_t seed, const SplitSpec& split, Split which)
    : src_(std::move(src)), seq_len_(seq_len), seed_(seed) {
  if (seq_len < 1) throw InputError("--seq-len", "value", "must be >= 1");
  const int64_t n = src_->num_documents();
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  shuffle(all, mix(seed, kSplitDocs));  // split by documents, not by position in the file
  // Cumulative rounding, as Megatron's split boundaries: every document lands in exactly one split.
  const int64_t b1 = std::llround(split.train * n), b2 = std::llround((split.train + split.calibration) * n);
  const int64_t lo = which == Split::Train ? 0 : which == Split::Calibration ? b1 : b2;
  const int64_t hi = which == Split::Train ? b1 : which == Split::Calibration ? b2 : n;
  docs_.assign(all.begin() + std::min(lo, n), all.begin() + std::min(std::max(hi, lo), n));
  std::sort(docs_.begin(), docs_.end());
  for (int64_t d : docs_) tokens_ += src_->document_length(d);
  samples_per_epoch_ = tokens_ > 0 ? (tokens_ - 1) / seq_len_ : 0;
  if (samples_per_epoch_ < 1)
    throw InputError(src_->describe(), std::string("split ") + split_name(which),
                     "has " + std::to_string(docs_.size()) + " documents and " + std::to_string(tokens_) +
                         " tokens: fewer than one sample of seq_len + 1 = " + std::to_string(seq_len_ + 1) + " tokens");
  seed_ = mix(seed, static_cast<uint64_t>(which) + 17);
}

std::shared_ptr<const GptSampler::Epoch> GptSampler::epoch(int64_t e) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (cache_ && cache_->index == e) return cache_;
  auto ep = std::make_shared<Epoch>();
  ep->index = e;
  ep->order = docs_;
  shuffle(ep->order, mix(mix(seed_, kEpochDocs), static_cast<uint64_t>(e)));
  ep->start.resize(ep->order.size() + 1);
  ep->start[0] = 0;
  for (size_t i = 0; i < ep->order.size(); ++i) ep->start[i + 1] = ep->start[i] + src_->document_length(ep->order[i]);
  ep->perm.resize(samples_per_epoch_);
  for (int64_t i = 0; i < samples_per_epoch_; ++i) ep->perm[i] = i;
  shuffle(ep->perm, mix(mix(seed_, kEpochSamples), static_cast<uint64_t>(e)));
  cache_ = ep;
  return ep;
}

template <typename Out>
void GptSampler::sample_as(int64_t k, Out* out) const {
  if (k < 0) throw std::out_of_range("GptSampler: negative sample index");
  auto ep = epoch(k / samples_per_epoch_);
  int64_t pos = ep->perm[k % samples_per_epoch_] * seq_len_;
  int64_t need = seq_len_ + 1;
  // The document holding token `pos`: the last start <= pos.
  size_t i = static_cast<size_t>(std::upper_bound(ep->start.begin(), ep->start.end(), pos) - ep->start.begin()) - 1;
  while (need > 0) {
    const int64_t d = ep->order[i];
    const int64_t off = pos - ep->start[i];
    const int64_t take = std::min(need, ep->start[i + 1] - ep->start[i] - off);
    if (take > 0) {
      src_->read(d, off, take, out);
      out += take;
      need -= take;
      pos += take;
    }
    ++i;
  }
}

void GptSampler::sample(int64_t k, int64_t* out) const { sample_as(k, out); }
void GptSampler::sample(int64_t k, int32_t* out) const { sample_as(k, out); }

// ---- BlendedSampler ------------------------------------------------------------------------

BlendedSampler::BlendedSampler(std::vector<BlendEntry> entries, int64_t seq_len, uint64_t seed, const SplitSpec& split, Split which)
    : seq_len_(seq_len), seed_(seed), which_(which) {
  if (entries.empty()) throw InputError("--data", "value", "no datasets");
  if (entries.size() > 32767) throw InputError("--data", "value", "too many datasets in one blend");
  double total = 0;
  for (const auto& e : entries) {
    if (!(e.weight > 0) || !std::isfinite(e.weight))
      throw InputError(e.source->describe(), "blend weight", "must be a positive number, is " + std::to_string(e.weight));
    total += e.weight;
  }
  for (size_t d = 0; d < entries.size(); ++d) {
    weights_.push_back(entries[d].weight / total);
    samplers_.push_back(std::make_unique<GptSampler>(entries[d].source, seq_len, mix(mix(seed, kDataset), d), split, which));
    dataset_tokens_.push_back(samplers_.back()->num_tokens());
  }
  used_.assign(entries.size(), 0);
}

std::pair<int, int64_t> BlendedSampler::locate(int64_t i) const {
  if (i < 0) throw std::out_of_range("BlendedSampler: negative sample index");
  std::lock_guard<std::mutex> lk(mu_);
  if (i < pos_) {
    pos_ = 0;
    std::fill(used_.begin(), used_.end(), 0);
  }
  const size_t n = weights_.size();
  for (;; ++pos_) {
    const double x = std::max(static_cast<double>(pos_), 1.0);
    size_t best = 0;
    double best_err = weights_[0] * x - static_cast<double>(used_[0]);
    for (size_t d = 1; d < n; ++d) {
      const double err = weights_[d] * x - static_cast<double>(used_[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    if (pos_ == i) {
      // Do not advance past i: the next call for i (another rank, a re-read) finds it again.
      return {static_cast<int>(best), used_[best]};
    }
    ++used_[best];
  }
}


// ---- DataCursor ----------------------------------------------------------------------------

nlohmann::json DataCursor::to_json() const {
  return nlohmann::json{{"version", version},
                        {"seed", seed},
                        {"seq_len", seq_len},
                        {"split", split},
                        {"consumed_samples", consumed_samples},
                        {"weights", weights},
                        {"dataset_tokens", dataset_tokens}};
}

DataCursor DataCursor::from_json(const nlohmann::json& j, const std::string& where) {
  DataCursor c;
  auto need = [&](const char* k) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(k)) throw InputError(where, k, "missing");
    return j.at(k);
  };
  try {
    c.version = need("version").get<int>();
    if (c.version != 1) throw InputError(where, "version", std::to_string(c.version) + " is not supported (this build reads 1)");
    c.seed = need("seed").get<uint64_t>();
    c.seq_len = need("seq_len").get<int64_t>();
    c.split = need("split").get<std::string>();
    c.consumed_samples = need("consumed_samples").get<int64_t>();
    c.weights = need("weights").get<std::vector<double>>();
    c.dataset_tokens = need("dataset_tokens").get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where, "value", std::string("wrong type: ") + e.what());
  }
  if (c.consumed_samples < 0) throw InputError(where, "consumed_samples", "is negative");
  if (c.seq_len < 1) throw InputError(where, "seq_len", "must be >= 1");
  if (c.weights.size() != c.dataset_tokens.size()) throw InputError(where, "weights", "and dataset_tokens differ in length");
  split_from_name(c.split);
  return c;
}

DataCursor DataCursor::start(const BlendedSampler& s) {
  DataCursor c;
  c.seed = s.seed();
  c.seq_len = s.seq_len();
  c.split = split_name(s.split());
  c.weights = s.weights();
  c.dataset_tokens = s.dataset_tokens();
  return c;
}

void DataCursor::check_matches(const BlendedSampler& s, const std::string& where) const {
  if (seed != s.seed()) throw InputError(where, "seed", std::to_string(seed) + " but the run uses " + std::to_string(s.seed()));
  if (seq_len != s.seq_len()) throw InputError(where, "seq_len", std::to_string(seq_len) + " but the run uses " + std::to_string(s.seq_len()));
  if (split != split_name(s.split())) throw InputError(where, "split", split + " but the run reads " + split_name(s.split()));
  if (dataset_tokens != s.dataset_tokens())
    throw InputError(where, "dataset_tokens", "the datasets differ from the ones this cursor was saved with (other files or another split)");
  if (weights.size() != s.weights().size()) throw InputError(where, "weights", "the blend has a different number of datasets");
  for (size_t d = 0; d < weights.size(); ++d)
    if (std::abs(weights[d] - s.weights()[d]) > 1e-12) throw InputError(where, "weights", "the blend weights differ from the run's");
}

// ---- DataLoader ----------------------------------------------------------------------------

DataLoader::DataLoader(std::shared_ptr<const BlendedSampler> sampler, const LoaderConfig& cfg, const DataCursor& cursor)
    : sampler_(std::move(sampler)), cfg_(cfg), cursor_(cursor) {
  if (cfg.micro_batch_size < 1) throw InputError("--micro-batch-size", "value", "must be >= 1");
  if (cfg.dp_size < 1 || cfg.dp_rank < 0 || cfg.dp_rank >= cfg.dp_size)
    throw InputError("data loader", "dp_rank", std::to_string(cfg.dp_rank) + " is not in [0, " + std::to_string(cfg.dp_size) + ")");
  cursor_.check_matches(*sampler_);
}

std::vector<int64_t> DataLoader::next_indices() const {
  std::vector<int64_t> idx(cfg_.micro_batch_size);
  for (int64_t m = 0; m < cfg_.micro_batch_size; ++m) idx[m] = cursor_.consumed_samples + cfg_.dp_rank * cfg_.micro_batch_size + m;
  return idx;
}

template <typename Out>
void DataLoader::next_as(Out* out) {
  const int64_t row = sampler_->seq_len() + 1;
  for (int64_t i : next_indices()) {
    sampler_->sample(i, out);
    out += row;
  }
  cursor_.consumed_samples += cfg_.micro_batch_size * cfg_.dp_size;
}

void DataLoader::next(int64_t* out) { next_as(out); }
void DataLoader::next(int32_t* out) { next_as(out); }

std::vector<int64_t> DataLoader::next() {
  std::vector<int64_t> out(cfg_.micro_batch_size * (sampler_->seq_len() + 1));
  next(out.data());
  return out;
}

}  // namespace ac::data

// Minitron-style importance scores of a teacher's parts (REFERENCE.md "Pruning and
// importance"): one calibration forward with hooks, per axis the estimator
// sqrt(sum_batches (mean_seq |activation|)^2). The scores are a value (ImportanceScores) and
// an HDF5 file (docs/importance.md); pruning, the Minitron baseline and the search read the
// file and never re-run the calibration forward. Layout-independent: reduced over DP and
// assembled from TP shards, so the same samples give the same file at any TP x DP.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/arch_spec.h"

namespace ac::search {

inline constexpr const char* kImportanceFormat = "autocompress.importance";
inline constexpr int kImportanceVersion = 1;

// Scores of one layer. A vector is empty when the layer has no such part. All scores are
// "higher = more important"; the pruner keeps the top-ranked units.
struct LayerImportance {
  // Attention: per query head (L2 over head_dim of the o_proj input), per KV group
  // (L2 over the group's query-head scores).
  std::vector<double> attn_heads;      // [num_heads]
  std::vector<double> attn_kv_groups;  // [num_kv_heads]
  // Dense MLP: per neuron (input of down_proj).
  std::vector<double> mlp_neurons;     // [ffn]
  // Mamba-2: per head (L2 over head_dim of the x part of in_proj's output) and per head-dim
  // channel (L2 over heads; one ranking shared by all heads).
  std::vector<double> mamba_heads;     // [num_heads]
  std::vector<double> mamba_head_dim;  // [head_dim]
  // MoE: per routed expert the mean output norm per routed token and the routed-token count;
  // per expert FFN neuron (row-major [num_experts, expert_ffn]); shared-expert neurons;
  // latent channels (output of fc1_latent_proj) of a latent MoE.
  std::vector<double> moe_experts;         // [num_experts]
  std::vector<double> moe_expert_tokens;   // [num_experts]
  std::vector<double> moe_expert_neurons;  // [num_experts * expert_ffn]
  std::vector<double> moe_shared_neurons;  // [shared_ffn]
  std::vector<double> moe_latent;          // [latent_size]
  // Depth: 1 - mean cos(h_in, h_out) over calibration tokens, and the calibration LM-loss
  // increase when this one layer is skipped (loss_without_layer - base_loss).
  double depth_cosine = 0;
  double depth_loss_increase = 0;
};

struct ImportanceScores {
  std::vector<double> hidden;          // [hidden_size]: pre-norm outputs summed over layers
  std::vector<LayerImportance> layers; // one per teacher layer
  double base_loss = 0;                // calibration LM loss of the unpruned teacher
  // Provenance (root attributes of the file).
  std::string teacher_checkpoint;      // path as given
  std::string teacher_fingerprint;     // checkpoint::model_fingerprint of the teacher
  model::ArchSpec teacher_arch;
  std::string data;                    // the data argument, as given
  int64_t calib_samples = 0, seq_len = 0;
  uint64_t seed = 0;
  std::string split;                   // document split the calibration samples come from
  std::string dtype;                   // compute dtype used ("float32" | "bfloat16")
  // Calibration samples the skipped-layer losses used (the first ones; 0: not computed,
  // depth_loss_increase is then 0 everywhere).
  int64_t depth_loss_samples = 0;
};

// Writes `scores` to `path` atomically (temporary file + rename); one process.
void save_importance(const ImportanceScores& scores, const std::string& path);
// Reads and checks an importance file: format/version, every dataset's shape against the
// stored teacher ArchSpec. With `expected_fingerprint` non-empty, a different teacher is an
// ac::InputError naming the file ("importance file X was computed for teacher Y ...").
ImportanceScores load_importance(const std::string& path, const std::string& expected_fingerprint = "");
// Scores of `spec` that rank nothing above anything else (every score 0: ties keep the lower
// index). For checks that need a search space's shape but not its order (`search --check`,
// `minitron --check`: whether a budget is reachable before the calibration has run).
ImportanceScores neutral_importance(const model::ArchSpec& spec);

// Calibration: the options of `autocompress importance`.
struct ImportanceOptions {
  std::string teacher;              // checkpoint dir or .h5
  std::vector<std::string> data;    // PATH or WEIGHT:PATH, as the trainer takes them
  int64_t calib_samples = 64;       // global number of sequences
  int64_t seq_len = 256;
  int64_t micro_batch = 4;          // sequences per DP rank per forward
  int tp = 1;                       // dp = world / tp
  uint64_t seed = 1234;
  bool depth_loss = true;           // also the one-layer-skipped losses (one forward per layer)
  int64_t depth_loss_samples = 0;   // of the calibration samples, the first N get them (0: all)
  std::string dtype = "auto";       // compute dtype: auto | bf16 | f32
  std::string device = "auto";      // auto | cpu | cuda (dist::choose_device)
  int local_rank = 0;               // node-local rank: which GPU
  std::string split = "98,1,1";     // train,calibration,eval document fractions; samples come from calibration
  // Called on every rank after each global micro-batch (the launcher prints rate and ETA).
  std::function<void(int64_t samples_done, int64_t samples_total, double seconds)> on_progress;
};

// Collective over `world`. Every rank gets the full, identical scores.
ImportanceScores compute_importance(const ImportanceOptions& options, MPI_Comm world);

// Benchmark (`autocompress bench importance`): tokens/s over the calibration batches of
// the plain teacher forward (hidden states, LM head, vocab-parallel loss) and of the
// importance collection forward (the same plus the observer and its accumulation, without
// the skipped-layer losses), at the same layout and micro-batch, alternated `repeats` times
// (medians); and one pass with the skipped-layer losses. Collective over `world`.
struct ImportanceBench {
  double plain_tokens_per_s = 0, collect_tokens_per_s = 0, depth_tokens_per_s = 0;
  double ratio = 0;  // median over repeats of collect / plain
  int tp = 1, dp = 1;
  std::string dtype;
};
ImportanceBench bench_importance(const ImportanceOptions& options, MPI_Comm world, int repeats = 3);

}  // namespace ac::search

// Autoregressive decoding of a model::CausalLM with its inference cache (KV cache for attention,
// conv + SSM state for Mamba): one prefill of the prompt, then one token per step. Greedy
// (temperature 0) or temperature + top-p (nucleus) sampling from a seeded generator, so a
// seed gives the same text at any TP size (every rank draws from the same full logits).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.h"

namespace ac::eval {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0: greedy (argmax)
  double top_p = 1.0;        // keep the smallest set of tokens whose probability reaches top_p
  uint64_t seed = 0;
  std::vector<int64_t> stop_ids;  // generation ends after emitting one of these
};

struct GenerationResult {
  std::vector<int64_t> ids;  // the new tokens (a stop token included when one ended it)
  bool stopped = false;      // ended by a stop token rather than max_new_tokens
  double prefill_seconds = 0, decode_seconds = 0;
};

// The next token from one row of logits [vocab] (any float dtype; computed in fp32).
int64_t pick_token(const torch::Tensor& logits, const SamplingOptions& options, at::Generator& generator);

// Decodes after `prompt` (non-empty). `on_token(id)` is called as each token is chosen.
GenerationResult generate(model::CausalLM& model, const std::vector<int64_t>& prompt, const SamplingOptions& options,
                          const std::function<void(int64_t)>& on_token = nullptr);

// ---- batched serving (static batch): what `autocompress scorecard` measures -------------------
// Stacks per-sequence caches of the same position along the batch dimension (every layer's
// K/V and Mamba states); the caches must all be at the same position.
model::InferenceCache stack_caches(const std::vector<model::InferenceCache>& caches);
// Keeps rows `rows` of a stacked cache (sequences that are still decoding).
void keep_cache_rows(model::InferenceCache& cache, const std::vector<int64_t>& rows);

struct BatchTimings {
  std::vector<std::vector<int64_t>> ids;  // per sequence: the greedy tokens, max_new_tokens[i] of them
  std::vector<double> queue_s;            // per sequence: from the batch's start until its prefill starts
  std::vector<double> ttft_s;             // per sequence: its prefill + the first token (service time)
  std::vector<double> step_s;             // per batched decode step: its wall time
  std::vector<int64_t> step_rows;         // ... and the sequences it decoded
  double seconds = 0;                     // the whole batch
};

// A static batch served by the model's own loop: each prompt is prefilled alone (batch 1, the
// whole prompt in one forward, logits of its last position only), then the caches are stacked
// and every decode step runs one batched forward of one token per unfinished sequence; a
// sequence leaves the batch when it has its max_new_tokens (no stop tokens: fixed output
// lengths, as serving benchmarks run). Greedy. All prompts must have the same length (the
// model has no padding mask); ids must be inside the vocabulary. `clock` (seconds, monotonic)
// times it; default the wall clock (steady_clock).
BatchTimings generate_static_batch(model::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                   const std::vector<int64_t>& max_new_tokens,
                                   const std::function<double()>& clock = nullptr);

}  // namespace ac::eval

// Autoregressive decoding of a CausalLM with its inference cache (KV cache for attention,
// conv + SSM state for Mamba): one prefill of the prompt, then one token per step. Greedy
// (temperature 0) or temperature + top-p (nucleus) sampling from a seeded generator, so a
// seed gives the same text at any TP size (every rank draws from the same full logits).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.h"

namespace ac::model {

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
GenerationResult generate(CausalLM& model, const std::vector<int64_t>& prompt, const SamplingOptions& options,
                          const std::function<void(int64_t)>& on_token = nullptr);

}  // namespace ac::model

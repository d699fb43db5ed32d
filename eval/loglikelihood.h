// Log-likelihood of continuations under a model: the forward pass behind the zero-shot tasks
// (eval/tasks.h). Requests are sorted by length and batched, right-padded (the model is
// causal, so padding after a row changes none of its positions), and the vocabulary
// projection runs only at the positions that predict continuation tokens. Consecutive requests
// with one context (a document's choices) run the context once and reuse its KV / Mamba state.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "eval/tasks.h"
#include "model/model.h"

namespace ac::eval {

struct LoglikelihoodOptions {
  int64_t max_length = 0;        // positions the model takes; longer inputs lose their oldest tokens (lm-eval); 0: no limit
  int64_t batch_tokens = 4096;   // padded tokens per forward
  torch::Device device{torch::kCPU};
  bool shared_context = true;    // a context shared by consecutive requests runs once
};

// One RequestScore per request (logprob, tokens, greedy; chars are left 0). Collective over
// the model's TP group: every TP rank passes the same requests. Throws ac::InputError when a
// token id is outside the model's vocabulary or a continuation is longer than max_length.
std::vector<RequestScore> score_loglikelihood(model::CausalLM& m, const std::vector<EncodedRequest>& requests,
                                              const LoglikelihoodOptions& opt);

}  // namespace ac::eval

// generate(): prefill once, then decode token by token through the model's cache.
#include "model/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "dist/error.h"

namespace ac::model {

int64_t pick_token(const torch::Tensor& logits, const SamplingOptions& o, at::Generator& generator) {
  torch::Tensor row = logits.to(torch::kFloat32).reshape({-1});
  if (o.temperature <= 0) return row.argmax().item<int64_t>();
  torch::Tensor probs = torch::softmax(row / o.temperature, 0);
  if (o.top_p < 1.0) {
    auto [sorted, order] = probs.sort(0, /*descending=*/true);
    // Keep a token while the mass before it is below top_p (the first token always stays).
    torch::Tensor before = sorted.cumsum(0) - sorted;
    sorted.masked_fill_(before >= o.top_p, 0.0);
    probs = torch::zeros_like(probs).scatter_(0, order, sorted);
  }
  return torch::multinomial(probs, 1, /*replacement=*/false, generator).item<int64_t>();
}

GenerationResult generate(CausalLM& model, const std::vector<int64_t>& prompt, const SamplingOptions& o,
                          const std::function<void(int64_t)>& on_token) {
  if (prompt.empty()) throw InputError("generate", "prompt", "is empty: at least one token is needed");
  if (o.temperature < 0) throw InputError("command line", "--temperature", "must be >= 0");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw InputError("command line", "--top-p", "must be in (0, 1]");
  const int64_t limit = model->spec().max_position_embeddings;
  if (limit > 0 && int64_t(prompt.size()) + o.max_new_tokens > limit)
    throw InputError("command line", "--max-new-tokens",
                     std::to_string(prompt.size()) + " prompt tokens + " + std::to_string(o.max_new_tokens) +
                         " exceed the model's " + std::to_string(limit) + " positions");
  using clock = std::chrono::steady_clock;
  torch::NoGradGuard ng;
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  GenerationResult r;
  InferenceCache cache = model->new_cache();
  auto t0 = clock::now();
  torch::Tensor logits = model->forward(torch::tensor(prompt, torch::kInt64).view({1, -1}), &cache);
  auto t1 = clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int64_t next = pick_token(logits[0][logits.size(1) - 1], o, gen);
    r.ids.push_back(next);
    if (on_token) on_token(next);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) {
      r.stopped = true;
      break;
    }
    if (i + 1 == o.max_new_tokens) break;
    logits = model->forward(torch::full({1, 1}, next, torch::kInt64), &cache);
  }
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

}  // namespace ac::model

// generate(): prefill once, then decode token by token through the model's cache.
#include "eval/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "dist/error.h"

namespace ac::eval {

namespace {
// The device the model's weights are on: inputs go there, sampled ids come back to the host.
torch::Device device_of(model::CausalLM& model) {
  for (const auto& p : model->parameters()) return p.device();
  return torch::Device(torch::kCPU);
}
}  // namespace

int64_t pick_token(const torch::Tensor& logits, const SamplingOptions& o, at::Generator& generator) {
  // Sampling runs on the host with the CPU generator: the same ids whatever the model's device.
  torch::Tensor row = logits.to(torch::kCPU, torch::kFloat32).reshape({-1});
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

GenerationResult generate(model::CausalLM& model, const std::vector<int64_t>& prompt, const SamplingOptions& o,
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
  model::InferenceCache cache = model->new_cache(int64_t(prompt.size()) + o.max_new_tokens);
  auto t0 = clock::now();
  const torch::Device dev = device_of(model);
  torch::Tensor logits = model->forward(torch::tensor(prompt, torch::kInt64).view({1, -1}).to(dev), &cache);
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
    logits = model->forward(torch::full({1, 1}, next, torch::TensorOptions().dtype(torch::kInt64).device(dev)), &cache);
  }
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

}  // namespace ac::eval

namespace ac::eval {

model::InferenceCache stack_caches(const std::vector<model::InferenceCache>& caches) {
  if (caches.empty()) return {};
  model::InferenceCache out;
  out.position = caches[0].position;
  out.layers.resize(caches[0].layers.size());
  auto cat = [&](auto field) {
    std::vector<torch::Tensor> parts;
    for (const auto& c : caches) {
      if (c.position != out.position || c.layers.size() != out.layers.size())
        throw std::invalid_argument("stack_caches: caches at different positions");
      parts.push_back(field(c));
    }
    return parts.front().defined() ? torch::cat(parts, 0) : torch::Tensor();
  };
  for (size_t i = 0; i < out.layers.size(); ++i) {
    model::KvCache& kv = out.layers[i].kv;
    kv.capacity = caches[0].layers[i].kv.capacity;
    const torch::Tensor& k0 = caches[0].layers[i].kv.k;
    if (kv.capacity > 0 && k0.defined() && kv.capacity > k0.size(2)) {
      // Stack straight into buffers with the caches' spare room (KvCache::capacity).
      const int64_t len = k0.size(2), rows = k0.size(0);
      for (const auto& c : caches)
        if (c.position != out.position || c.layers.size() != out.layers.size() || !c.layers[i].kv.k.defined() ||
            c.layers[i].kv.k.sizes() != k0.sizes())
          throw std::invalid_argument("stack_caches: caches at different positions");
      std::vector<int64_t> shape = k0.sizes().vec();
      shape[0] = rows * int64_t(caches.size());
      shape[2] = kv.capacity;
      kv.k_buf = torch::empty(shape, k0.options());
      kv.v_buf = torch::empty(shape, caches[0].layers[i].kv.v.options());
      for (size_t c = 0; c < caches.size(); ++c) {
        kv.k_buf.narrow(0, int64_t(c) * rows, rows).narrow(2, 0, len).copy_(caches[c].layers[i].kv.k);
        kv.v_buf.narrow(0, int64_t(c) * rows, rows).narrow(2, 0, len).copy_(caches[c].layers[i].kv.v);
      }
      kv.k = kv.k_buf.narrow(2, 0, len);
      kv.v = kv.v_buf.narrow(2, 0, len);
    } else {
      kv.k = cat([i](const model::InferenceCache& c) { return c.layers[i].kv.k; });
      kv.v = cat([i](const model::InferenceCache& c) { return c.layers[i].kv.v; });
    }
    out.layers[i].mamba.conv_state = cat([i](const model::InferenceCache& c) { return c.layers[i].mamba.conv_state; });
    out.layers[i].mamba.ssm_state = cat([i](const model::InferenceCache& c) { return c.layers[i].mamba.ssm_state; });
  }
  return out;
}

void keep_cache_rows(model::InferenceCache& cache, const std::vector<int64_t>& rows) {
  const torch::Tensor idx = torch::tensor(rows, torch::kInt64);
  auto keep = [&](torch::Tensor& t) {
    if (t.defined()) t = t.index_select(0, idx.to(t.device()));
  };
  for (auto& l : cache.layers) {
    if (l.kv.buffered()) {  // keep the rows of the buffers (with their spare room), k / v stay views
      const int64_t len = l.kv.k.size(2);
      keep(l.kv.k_buf), keep(l.kv.v_buf);
      l.kv.k = l.kv.k_buf.narrow(2, 0, len);
      l.kv.v = l.kv.v_buf.narrow(2, 0, len);
    } else {
      keep(l.kv.k), keep(l.kv.v);
    }
    keep(l.mamba.conv_state), keep(l.mamba.ssm_state);
  }
}

BatchTimings generate_static_batch(model::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                   const std::vector<int64_t>& max_new_tokens, const std::function<double()>& clock) {
  const auto wall0 = std::chrono::steady_clock::now();
  auto now = [&]() -> double {
    return clock ? clock() : std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  };
  auto secs = [](double a, double b) { return b - a; };
  const size_t n = prompts.size();
  if (n == 0 || max_new_tokens.size() != n) throw std::invalid_argument("generate_static_batch: one length per prompt");
  for (const auto& p : prompts)
    if (p.empty() || p.size() != prompts[0].size())
      throw std::invalid_argument("generate_static_batch: prompts must be non-empty and of one length");
  torch::NoGradGuard ng;
  const torch::Device dev = device_of(model);
  BatchTimings r;
  r.ids.resize(n);
  r.queue_s.resize(n);
  r.ttft_s.resize(n);
  // The next token of each row from the last position's hidden state (the LM head on one row).
  auto next_tokens = [&](const torch::Tensor& hidden) {
    const int64_t T = hidden.size(1);
    torch::Tensor logits = model->gather_logits(model->logits_local(hidden.narrow(1, T - 1, 1)));
    torch::Tensor ids = logits.squeeze(1).argmax(-1).to(torch::kCPU, torch::kInt64).contiguous();
    return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  };
  // Room for every position a sequence reaches: the KV cache is preallocated, not grown.
  const int64_t capacity = int64_t(prompts[0].size()) + *std::max_element(max_new_tokens.begin(), max_new_tokens.end());
  const double t0 = now();
  std::vector<model::InferenceCache> caches(n);
  for (size_t i = 0; i < n; ++i) {
    const double a = now();
    r.queue_s[i] = secs(t0, a);
    caches[i] = model->new_cache(capacity);
    torch::Tensor h = model->hidden_states(torch::tensor(prompts[i], torch::kInt64).view({1, -1}).to(dev), &caches[i]);
    r.ids[i].push_back(next_tokens(h)[0]);
    r.ttft_s[i] = secs(a, now());
  }
  // Rows still decoding (a sequence is done once it has max_new_tokens tokens).
  std::vector<int64_t> live;  // indices into prompts
  std::vector<model::InferenceCache> live_caches;
  for (size_t i = 0; i < n; ++i)
    if (max_new_tokens[i] > 1) live.push_back(int64_t(i)), live_caches.push_back(std::move(caches[i]));
  caches.clear();
  model::InferenceCache cache = stack_caches(live_caches);
  live_caches.clear();
  while (!live.empty()) {
    std::vector<int64_t> last;
    for (int64_t i : live) last.push_back(r.ids[size_t(i)].back());
    const double a = now();
    torch::Tensor h = model->hidden_states(torch::tensor(last, torch::kInt64).view({-1, 1}).to(dev), &cache);
    const std::vector<int64_t> next = next_tokens(h);
    std::vector<int64_t> keep_rows, still;
    for (size_t k = 0; k < live.size(); ++k) {
      auto& ids = r.ids[size_t(live[k])];
      ids.push_back(next[k]);
      if (int64_t(ids.size()) < max_new_tokens[size_t(live[k])]) keep_rows.push_back(int64_t(k)), still.push_back(live[k]);
    }
    if (!still.empty() && still.size() < live.size()) keep_cache_rows(cache, keep_rows);
    r.step_s.push_back(secs(a, now()));
    r.step_rows.push_back(int64_t(live.size()));
    live = std::move(still);
  }
  r.seconds = secs(t0, now());
  return r;
}

}  // namespace ac::eval

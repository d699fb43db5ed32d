// Batched continuation log-likelihoods (eval/loglikelihood.h).
#include "eval/loglikelihood.h"

#include <algorithm>
#include <numeric>

#include "dist/error.h"

namespace ac::eval {

namespace {

// One request as the model sees it: input = (context + continuation) without its last token,
// cut from the left to max_length (lm-eval: `(context + continuation)[-(max_length + 1):][:-1]`);
// position `first` + k predicts targets[k].
struct Row {
  std::vector<int64_t> input, targets;
  int64_t first = 0;
};

Row make_row(const EncodedRequest& r, int64_t max_length) {
  Row row;
  row.targets = r.continuation;
  row.input = r.context;
  row.input.insert(row.input.end(), r.continuation.begin(), r.continuation.end());
  row.input.pop_back();
  row.first = int64_t(r.context.size()) - 1;
  if (max_length > 0 && int64_t(row.input.size()) > max_length) {
    const int64_t drop = int64_t(row.input.size()) - max_length;
    row.input.erase(row.input.begin(), row.input.begin() + drop);
    row.first -= drop;
    if (row.first < 0)
      throw InputError("task requests", "continuation", std::to_string(r.continuation.size()) +
                                                            " tokens do not fit the model's " + std::to_string(max_length) + " positions");
  }
  return row;
}

// Log-probabilities of `targets` and whether each is the argmax, from hidden states [N, hidden]:
// the vocabulary projection runs only on these N positions.
std::pair<torch::Tensor, torch::Tensor> target_logprobs(model::CausalLM& m, const torch::Tensor& hidden,
                                                        const std::vector<int64_t>& targets, const torch::Device& device) {
  torch::Tensor logits = m->gather_logits(m->logits_local(hidden.unsqueeze(0))).squeeze(0).to(torch::kFloat32);
  torch::Tensor tgt = torch::tensor(targets, torch::kLong).to(device);
  torch::Tensor lp = torch::log_softmax(logits, -1).gather(1, tgt.unsqueeze(1)).squeeze(1).to(torch::kDouble).cpu();
  return {lp, (logits.argmax(-1) == tgt).cpu()};
}

// Adds the per-token results (in `requests` order, `counts[i]` tokens each) to out.
void add_scores(const std::vector<size_t>& requests, const std::vector<int64_t>& counts,
                const std::pair<torch::Tensor, torch::Tensor>& lp_hit, std::vector<RequestScore>& out) {
  const double* lp = lp_hit.first.data_ptr<double>();
  const bool* hit = lp_hit.second.data_ptr<bool>();
  size_t k = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    RequestScore& s = out[requests[r]];
    s.tokens = counts[r];
    s.greedy = true;
    for (int64_t t = 0; t < s.tokens; ++t, ++k) {
      s.logprob += lp[k];
      s.greedy = s.greedy && hit[k];
    }
  }
}

// Scores rows[batch] in one right-padded forward.
void score_batch(model::CausalLM& m, const std::vector<Row>& rows, const std::vector<size_t>& batch,
                 const torch::Device& device, std::vector<RequestScore>& out) {
  const int64_t B = int64_t(batch.size());
  int64_t T = 0;
  for (size_t i : batch) T = std::max<int64_t>(T, int64_t(rows[i].input.size()));
  torch::Tensor ids = torch::zeros({B, T}, torch::kLong);
  std::vector<int64_t> at, targets, counts;  // flat positions b * T + p and the tokens they predict
  auto* p = ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const Row& r = rows[batch[size_t(b)]];
    std::copy(r.input.begin(), r.input.end(), p + b * T);
    for (size_t k = 0; k < r.targets.size(); ++k) {
      at.push_back(b * T + r.first + int64_t(k));
      targets.push_back(r.targets[k]);
    }
    counts.push_back(int64_t(r.targets.size()));
  }
  torch::Tensor h = m->hidden_states(ids.to(device));
  torch::Tensor sel = h.reshape({B * T, h.size(2)}).index_select(0, torch::tensor(at, torch::kLong).to(device));
  add_scores(batch, counts, target_logprobs(m, sel, targets, device), out);
}

// `t` [1, ...] as n rows [n, ...].
torch::Tensor as_rows(const torch::Tensor& t, int64_t n) {
  if (!t.defined()) return t;
  std::vector<int64_t> size(size_t(t.dim()), -1);
  size[0] = n;
  return t.expand(size).contiguous();
}

// Requests `group` share one context: it runs once, its KV / Mamba state is copied to one row per
// request, and the continuations run on from it (right-padded).
void score_shared(model::CausalLM& m, const std::vector<EncodedRequest>& reqs, const std::vector<size_t>& group,
                  const torch::Device& device, std::vector<RequestScore>& out) {
  const auto& ctx = reqs[group[0]].context;
  const int64_t n = int64_t(group.size());
  model::InferenceCache cache = m->new_cache();
  torch::Tensor hc = m->hidden_states(torch::tensor(ctx, torch::kLong).view({1, -1}).to(device), &cache);
  std::vector<torch::Tensor> parts = {hc.select(1, hc.size(1) - 1)};  // [1, hidden]: predicts every first token
  int64_t T = 0;
  for (size_t i : group) T = std::max<int64_t>(T, int64_t(reqs[i].continuation.size()) - 1);
  if (T > 0) {
    for (auto& l : cache.layers) {
      l.kv.k = as_rows(l.kv.k, n);
      l.kv.v = as_rows(l.kv.v, n);
      l.kv.k_buf = l.kv.v_buf = torch::Tensor();
      l.mamba.conv_state = as_rows(l.mamba.conv_state, n);
      l.mamba.ssm_state = as_rows(l.mamba.ssm_state, n);
    }
    torch::Tensor ids = torch::zeros({n, T}, torch::kLong);
    auto* p = ids.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) {
      const auto& c = reqs[group[size_t(r)]].continuation;
      std::copy(c.begin(), c.end() - 1, p + r * T);
    }
    torch::Tensor h = m->hidden_states(ids.to(device), &cache);
    parts.push_back(h.reshape({n * T, h.size(2)}));
  }
  torch::Tensor all = torch::cat(parts, 0);
  std::vector<int64_t> at, targets, counts;  // row 0: the context's last position; 1 + r * T + j: continuation j of r
  for (int64_t r = 0; r < n; ++r) {
    const auto& c = reqs[group[size_t(r)]].continuation;
    for (size_t j = 0; j < c.size(); ++j) {
      at.push_back(j == 0 ? 0 : 1 + r * T + int64_t(j) - 1);
      targets.push_back(c[j]);
    }
    counts.push_back(int64_t(c.size()));
  }
  torch::Tensor sel = all.index_select(0, torch::tensor(at, torch::kLong).to(device));
  add_scores(group, counts, target_logprobs(m, sel, targets, device), out);
}

// Runs of consecutive requests with one context (a document's choices), each of >= 2 requests
// that fits max_length whole.
std::vector<std::vector<size_t>> shared_context_groups(const std::vector<EncodedRequest>& reqs, int64_t max_length) {
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < reqs.size();) {
    size_t end = i + 1;
    while (end < reqs.size() && reqs[end].context == reqs[i].context) ++end;
    bool fits = true;
    for (size_t k = i; k < end; ++k)
      fits = fits && (max_length <= 0 || int64_t(reqs[k].context.size() + reqs[k].continuation.size()) - 1 <= max_length);
    if (end - i >= 2 && fits) {
      groups.emplace_back();
      for (size_t k = i; k < end; ++k) groups.back().push_back(k);
    }
    i = end;
  }
  return groups;
}

}  // namespace

std::vector<RequestScore> score_loglikelihood(model::CausalLM& m, const std::vector<EncodedRequest>& requests,
                                              const LoglikelihoodOptions& opt) {
  std::vector<Row> rows;
  std::vector<RequestScore> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i)
    if (requests[i].context.empty() || requests[i].continuation.empty())
      throw InputError("task requests", "request " + std::to_string(i), "an empty context or continuation after encoding");
  std::vector<bool> shared(requests.size(), false);
  const auto groups = opt.shared_context ? shared_context_groups(requests, opt.max_length) : std::vector<std::vector<size_t>>{};
  for (const auto& g : groups)
    for (size_t i : g) shared[i] = true;
  std::vector<size_t> order;
  rows.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (shared[i]) continue;
    rows[i] = make_row(requests[i], opt.max_length);
    order.push_back(i);
  }
  // Longest first, as lm-eval: similar lengths share a batch and little is padding.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rows[a].input.size() > rows[b].input.size(); });
  torch::NoGradGuard ng;
  for (const auto& g : groups) score_shared(m, requests, g, opt.device, out);
  for (size_t i = 0; i < order.size();) {
    const int64_t longest = int64_t(rows[order[i]].input.size());
    size_t end = i + 1;
    while (end < order.size() && int64_t(end - i + 1) * longest <= opt.batch_tokens) ++end;
    score_batch(m, rows, std::vector<size_t>(order.begin() + long(i), order.begin() + long(end)), opt.device, out);
    i = end;
  }
  return out;
}

}  // namespace ac::eval

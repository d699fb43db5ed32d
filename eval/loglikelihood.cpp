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

// Scores rows[order[b0..b1)] in one forward.
void score_batch(model::CausalLM& m, const std::vector<Row>& rows, const std::vector<size_t>& batch,
                 const torch::Device& device, std::vector<RequestScore>& out) {
  const int64_t B = int64_t(batch.size());
  int64_t T = 0;
  for (size_t i : batch) T = std::max<int64_t>(T, int64_t(rows[i].input.size()));
  torch::Tensor ids = torch::zeros({B, T}, torch::kLong);
  std::vector<int64_t> at, targets;  // flat positions b * T + p and the tokens they predict
  auto* p = ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const Row& r = rows[batch[size_t(b)]];
    std::copy(r.input.begin(), r.input.end(), p + b * T);
    for (size_t k = 0; k < r.targets.size(); ++k) {
      at.push_back(b * T + r.first + int64_t(k));
      targets.push_back(r.targets[k]);
    }
  }
  torch::Tensor h = m->hidden_states(ids.to(device));
  torch::Tensor sel = h.reshape({B * T, h.size(2)}).index_select(0, torch::tensor(at, torch::kLong).to(device));
  // The vocabulary projection only where a continuation token is predicted.
  torch::Tensor logits = m->gather_logits(m->logits_local(sel.unsqueeze(0))).squeeze(0).to(torch::kFloat32);
  torch::Tensor tgt = torch::tensor(targets, torch::kLong).to(device);
  torch::Tensor lp = torch::log_softmax(logits, -1).gather(1, tgt.unsqueeze(1)).squeeze(1).to(torch::kDouble).cpu();
  torch::Tensor hit = (logits.argmax(-1) == tgt).cpu();
  const double* lpp = lp.data_ptr<double>();
  const bool* hp = hit.data_ptr<bool>();
  size_t k = 0;
  for (size_t i : batch) {
    RequestScore& s = out[i];
    s.tokens = int64_t(rows[i].targets.size());
    s.greedy = true;
    for (int64_t t = 0; t < s.tokens; ++t, ++k) {
      s.logprob += lpp[k];
      s.greedy = s.greedy && hp[k];
    }
  }
}

}  // namespace

std::vector<RequestScore> score_loglikelihood(model::CausalLM& m, const std::vector<EncodedRequest>& requests,
                                              const LoglikelihoodOptions& opt) {
  std::vector<Row> rows;
  std::vector<RequestScore> out(requests.size());
  std::vector<size_t> order;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].context.empty() || requests[i].continuation.empty())
      throw InputError("task requests", "request " + std::to_string(i), "an empty context or continuation after encoding");
    rows.push_back(make_row(requests[i], opt.max_length));
    order.push_back(i);
  }
  // Longest first, as lm-eval: similar lengths share a batch and little is padding.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rows[a].input.size() > rows[b].input.size(); });
  torch::NoGradGuard ng;
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

// The soft cost of the search (search/das/soft_cost.h).
#include "search/das/soft_cost.h"

#include <algorithm>
#include <limits>

#include "search/das/das.h"

namespace ac::search {

// ---- flat probabilities ---------------------------------------------------------------------

FlatSoftmax::FlatSoftmax(const SearchSpace& s) {
  int64_t cmax = 1, n = 0;
  for (const auto& d : s.decisions) cmax = std::max<int64_t>(cmax, int64_t(d.choices.size()));
  const int64_t D = int64_t(s.decisions.size());
  std::vector<int64_t> gather(size_t(D * cmax), 0), valid;
  std::vector<uint8_t> pad(size_t(D * cmax), 1);
  for (int64_t d = 0; d < D; ++d) {
    const int64_t c = int64_t(s.decisions[size_t(d)].choices.size());
    for (int64_t j = 0; j < c; ++j) {
      gather[size_t(d * cmax + j)] = n + j;
      pad[size_t(d * cmax + j)] = 0;
      valid.push_back(d * cmax + j);
    }
    n += c;
  }
  rows_ = D, cols_ = cmax;
  gather_ = torch::tensor(gather, torch::kLong);
  valid_ = torch::tensor(valid, torch::kLong);
  pad_ = torch::tensor(std::vector<int64_t>(pad.begin(), pad.end()), torch::kLong).to(torch::kBool).view({D, cmax});
}

torch::Tensor FlatSoftmax::operator()(const torch::Tensor& theta) const {
  torch::Tensor x = theta.index_select(0, gather_).view({rows_, cols_}).masked_fill(pad_, -std::numeric_limits<double>::infinity());
  return torch::softmax(x, 1).reshape({-1}).index_select(0, valid_);
}

// ---- the expected cost ----------------------------------------------------------------------

SoftCostFn::SoftCostFn(const SearchSpace& s, const CostTarget& target)
    : s_(s),
      model_(s.teacher, target.hardware, target.engine, target.workload,
             s.hidden >= 0 ? s.decisions[size_t(s.hidden)].choices : std::vector<int64_t>{s.teacher.hidden_size}) {
  const auto& t = s.teacher;
  const size_t L = t.layers.size();
  offset_.assign(s.decisions.size() + 1, 0);
  for (size_t d = 0; d < s.decisions.size(); ++d) offset_[d + 1] = offset_[d] + int64_t(s.decisions[d].choices.size());
  if (s.hidden >= 0) hidden_offset_ = offset_[size_t(s.hidden)];
  std::vector<double> heads(L, 1.0), ffn(L, 1.0), kv(L, 1.0), experts(L, 1.0), top_k(L, 1.0), expert_ffn(L, 1.0), shared(L, 0.0);
  std::vector<double> m_heads(L, 1.0), m_groups(L, 1.0), latent(L, 0.0);
  for (size_t l = 0; l < L; ++l) {
    const auto& x = t.layers[l];
    if (x.attention) heads[l] = double(x.attention->num_heads), kv[l] = double(x.attention->num_kv_heads);
    if (x.mlp) ffn[l] = double(x.mlp->ffn_size);
    if (x.mamba) m_heads[l] = double(x.mamba->num_heads), m_groups[l] = double(x.mamba->n_groups);
    if (x.moe)
      experts[l] = double(x.moe->num_experts), top_k[l] = double(x.moe->top_k), expert_ffn[l] = double(x.moe->expert_ffn),
      shared[l] = double(x.moe->shared_ffn), latent[l] = double(x.moe->latent_size);
  }
  const std::vector<double> ones(L, 1.0);
  attn_ = group(s.attn, kv, heads);
  ffn_ = group(s.ffn, ones, ffn);
  mamba_ = group(s.mamba, ones, ones);
  mamba_heads_ = group(s.mamba_heads, m_groups, m_heads);
  moe_ = group(s.moe, ones, ones);
  experts_ = group(s.experts, ones, experts);
  top_k_ = group(s.top_k, ones, top_k);
  expert_ffn_ = group(s.expert_ffn, ones, expert_ffn);
  shared_ffn_ = group(s.shared_ffn, ones, shared);
  latent_ = group(s.latent, ones, latent);
  base_heads_ = torch::tensor(heads, torch::kFloat64);
  base_m_heads_ = torch::tensor(m_heads, torch::kFloat64);
  base_ffn_ = torch::tensor(ffn, torch::kFloat64);
  base_experts_ = torch::tensor(experts, torch::kFloat64);
  base_top_k_ = torch::tensor(top_k, torch::kFloat64);
  base_expert_ffn_ = torch::tensor(expert_ffn, torch::kFloat64);
  base_shared_ffn_ = torch::tensor(shared, torch::kFloat64);
  base_latent_ = torch::tensor(latent, torch::kFloat64);
  ones_ = torch::ones({int64_t(L)}, torch::kFloat64);
  reserved_ = target.engine.cuda_graph_bytes + target.engine.non_torch_bytes;
  conc_ = double(std::max<int64_t>(1, target.workload.concurrency));
}

SoftCostFn::Group SoftCostFn::group(const std::vector<int>& per_layer, const std::vector<double>& scale,
                                    const std::vector<double>& base) const {
  Group g;
  std::vector<int64_t> layers, first;
  std::vector<double> zero, b;
  std::vector<std::vector<int64_t>> idx;
  std::vector<std::vector<double>> val;
  size_t cmax = 1;
  for (size_t l = 0; l < per_layer.size(); ++l) {
    const int d = per_layer[l];
    if (d < 0) continue;
    const Decision& x = s_.decisions[size_t(d)];
    layers.push_back(int64_t(l));
    first.push_back(offset_[size_t(d)]);
    zero.push_back(x.choices[0] == 0 ? 1.0 : 0.0);
    b.push_back(base[l]);
    idx.emplace_back();
    val.emplace_back();
    for (size_t c = 0; c < x.choices.size(); ++c) {
      idx.back().push_back(offset_[size_t(d)] + int64_t(c));
      val.back().push_back(double(x.choices[c]) * scale[l]);
    }
    cmax = std::max(cmax, x.choices.size());
  }
  g.n = int64_t(layers.size());
  if (g.n == 0) return g;
  std::vector<int64_t> fi;
  std::vector<double> fv;
  for (size_t r = 0; r < idx.size(); ++r)
    for (size_t c = 0; c < cmax; ++c) {
      fi.push_back(c < idx[r].size() ? idx[r][c] : idx[r][0]);
      fv.push_back(c < val[r].size() ? val[r][c] : 0.0);  // padding weighs nothing
    }
  g.layers = torch::tensor(layers, torch::kLong);
  g.first = torch::tensor(first, torch::kLong);
  g.second = g.first + 1;
  g.idx = torch::tensor(fi, torch::kLong);
  g.val = torch::tensor(fv, torch::kFloat64).view({g.n, int64_t(cmax)});
  g.zero = torch::tensor(zero, torch::kFloat64);
  g.base = torch::tensor(b, torch::kFloat64);
  return g;
}

// The expected per-layer dimensions of flat probabilities p.
SoftDims SoftCostFn::dims(const torch::Tensor& p) const {
  // Per row of a group: the expected choice (scaled), and P(choice 0) where 0 is a choice.
  auto expected = [&](const Group& g) { return (p.index_select(0, g.idx).view(g.val.sizes()) * g.val).sum(1); };
  // A sublayer's keep probability and its expected width given kept, scattered over the layers.
  auto keep_and_width = [&](const Group& g, const torch::Tensor& base, torch::Tensor& keep, torch::Tensor& width) {
    const torch::Tensor k = 1.0 - g.zero * p.index_select(0, g.first);
    const torch::Tensor w = torch::where(k > 1e-6, expected(g) / k.clamp_min(1e-6), g.base);
    keep = ones_.index_copy(0, g.layers, k);
    width = base.index_copy(0, g.layers, w);
  };
  SoftDims d;
  if (attn_.n) keep_and_width(attn_, base_heads_, d.attn_keep, d.heads);
  if (ffn_.n) keep_and_width(ffn_, base_ffn_, d.mlp_keep, d.ffn);
  if (mamba_.n) d.mamba_keep = ones_.index_copy(0, mamba_.layers, p.index_select(0, mamba_.second));
  if (mamba_heads_.n) d.mamba_heads = base_m_heads_.index_copy(0, mamba_heads_.layers, expected(mamba_heads_));
  if (moe_.n) d.moe_keep = ones_.index_copy(0, moe_.layers, p.index_select(0, moe_.second));
  if (experts_.n || top_k_.n || expert_ffn_.n || shared_ffn_.n || latent_.n) {
    auto dim = [&](const Group& g, const torch::Tensor& base) { return g.n ? base.index_copy(0, g.layers, expected(g)) : base; };
    d.experts = dim(experts_, base_experts_), d.top_k = dim(top_k_, base_top_k_), d.expert_ffn = dim(expert_ffn_, base_expert_ffn_);
    d.shared_ffn = dim(shared_ffn_, base_shared_ffn_), d.latent = dim(latent_, base_latent_);
  }
  return d;
}

std::vector<torch::Tensor> SoftCostFn::operator()(const torch::Tensor& p) const {
  const SoftCost c = model_(dims(p));  // [widths] each
  const torch::Tensor w = s_.hidden >= 0 ? p.narrow(0, hidden_offset_, model_.num_widths()) : torch::ones({1}, torch::kFloat64);
  const torch::Tensor mem = c.weight_bytes + c.activation_bytes + reserved_ + conc_ * c.bytes_per_seq;
  const torch::Tensor m[6] = {c.params, c.active_params, mem, c.ttft_s, c.tpot_s, c.throughput_tok_s};
  std::vector<torch::Tensor> out;
  for (const auto& x : m) out.push_back((w * x).sum());
  return out;
}

std::vector<double> expected_cost(const SearchSpace& space, const CostTarget& target, const std::vector<std::vector<double>>& probs) {
  const SoftCostFn f(space, target);
  std::vector<double> flat;
  for (const auto& v : probs) flat.insert(flat.end(), v.begin(), v.end());
  std::vector<double> out;
  for (const auto& t : f(torch::tensor(flat, torch::kFloat64))) out.push_back(t.item<double>());
  return out;
}

// ---- the budgets' penalty -------------------------------------------------------------------

BudgetPenalty budget_penalty(const SoftCostFn& cost, const FlatSoftmax& softmax, const std::vector<Budget>& budgets,
                             const torch::Tensor& theta, const torch::Tensor& lambda, double rho, double ramp) {
  BudgetPenalty out;
  torch::Tensor theta_c = theta.clone().requires_grad_(true);
  const std::vector<torch::Tensor> soft = cost(softmax(theta_c));
  torch::Tensor penalty = torch::zeros({}, torch::kFloat64);
  for (size_t i = 0; i < budgets.size(); ++i) {
    const Budget& b = budgets[i];
    // From the teacher's value where the teacher is over the budget; a budget the teacher
    // already meets holds from the start.
    const double start = b.at_least ? std::min(b.teacher, b.value) : std::max(b.teacher, b.value);
    const double limit = start + (b.value - start) * ramp;
    const torch::Tensor& x = soft[size_t(b.metric)];
    const torch::Tensor v = b.at_least ? 1.0 - x / limit : x / limit - 1.0;
    out.limit.push_back(limit);
    out.soft.push_back(x.item<double>());
    out.violation.push_back(v.item<double>());
    const double lam = lambda[int64_t(i)].item<double>();
    penalty = penalty + (torch::relu(lam + rho * v).pow(2) - lam * lam) / (2.0 * rho);
  }
  if (!budgets.empty()) {
    penalty.backward();
    out.grad = theta_c.grad();
  }
  return out;
}

}  // namespace ac::search

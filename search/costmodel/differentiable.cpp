// The shared cost formulas instantiated over [num_layers] float64 tensors. Floors and ceilings
// (pages, whole sequences) use straight-through estimators: exact values forward, identity
// gradient backward.
#include "search/costmodel/differentiable.h"

#include <torch/torch.h>

#include "search/costmodel/formulas.h"

namespace ac::search {

namespace detail {
template <>
struct Ops<torch::Tensor> {
  using T = torch::Tensor;
  using S = torch::Tensor;
  static T full(const T& like, double x) { return torch::full_like(like, x); }
  static T maximum(const T& a, const T& b) { return torch::maximum(a, b); }
  static T maximum(const T& a, double b) { return torch::clamp_min(a, b); }
  static T minimum(const T& a, double b) { return torch::clamp_max(a, b); }
  static T pow(const T& a, const T& b) { return torch::pow(a, b); }
  static T pow(const T& a, double b) { return torch::pow(a, b); }
  static T sum(const T& a) { return a.sum(); }
  static T max_all(const T& a) { return a.max(); }
  // An infinite value (no KV cache at all: sequences per budget unbounded) stays infinite
  // instead of inf - inf = NaN.
  static T floor_st(const T& a) { return torch::where(torch::isfinite(a), a + (torch::floor(a) - a).detach(), a); }
  static T ceil_st(const T& a) { return torch::where(torch::isfinite(a), a + (torch::ceil(a) - a).detach(), a); }
  static T scalar(double x, const T& like) { return torch::scalar_tensor(x, like.options()); }
};
}  // namespace detail

struct DifferentiableCostModel::Impl {
  detail::Globals globals;
  detail::LayerDims<torch::Tensor> base;
};

DifferentiableCostModel::DifferentiableCostModel(const model::ArchSpec& base, HardwareProfile hw, EngineProfile engine,
                                                 Workload workload)
    : base_(base), hw_(std::move(hw)), engine_(std::move(engine)), workload_(std::move(workload)) {
  model::validate(base_, base_.name.empty() ? "<arch>" : base_.name);
  auto impl = std::make_shared<Impl>();
  impl->globals = detail::globals_from_spec(base_);
  impl->base = detail::dims_from_spec<torch::Tensor>(base_, [](const std::vector<double>& v) {
    return torch::tensor(v, torch::kFloat64);
  });
  impl_ = impl;
}

SoftCost DifferentiableCostModel::operator()(const SoftDims& s) const {
  const auto& b = impl_->base;
  detail::LayerDims<torch::Tensor> d = b;
  // A soft value replaces the base one only where the base has that sublayer, so absent
  // sublayers keep their harmless placeholder dimensions.
  auto pick = [](const torch::Tensor& soft, const torch::Tensor& mask, const torch::Tensor& base) {
    return soft.defined() ? torch::where(mask > 0, soft.to(torch::kFloat64), base) : base;
  };
  auto scale = [](const torch::Tensor& mask, const torch::Tensor& keep, const torch::Tensor& sub) {
    torch::Tensor k = mask;
    if (keep.defined()) k = k * keep.to(torch::kFloat64);
    if (sub.defined()) k = k * sub.to(torch::kFloat64);
    return k;
  };
  d.attn_keep = scale(b.attn_keep, s.keep, s.attn_keep);
  d.heads = pick(s.heads, b.attn_keep, b.heads);
  d.kv_heads = pick(s.kv_heads, b.attn_keep, b.kv_heads);
  d.mamba_keep = scale(b.mamba_keep, s.keep, s.mamba_keep);
  d.m_heads = pick(s.mamba_heads, b.mamba_keep, b.m_heads);
  d.m_head_dim = pick(s.mamba_head_dim, b.mamba_keep, b.m_head_dim);
  d.mlp_keep = scale(b.mlp_keep, s.keep, s.mlp_keep);
  d.ffn = pick(s.ffn, b.mlp_keep, b.ffn);
  d.moe_keep = scale(b.moe_keep, s.keep, s.moe_keep);
  d.experts = pick(s.experts, b.moe_keep, b.experts);
  d.top_k = pick(s.top_k, b.moe_keep, b.top_k);
  d.expert_ffn = pick(s.expert_ffn, b.moe_keep, b.expert_ffn);
  const detail::CostResult<torch::Tensor> r =
      detail::Evaluator<torch::Tensor>(impl_->globals, d, hw_, engine_, workload_).run();
  SoftCost c;
  c.params = r.params;
  c.active_params = r.active_params;
  c.weight_bytes = r.weight_bytes;
  c.kv_bytes_per_token = r.kv_bytes_per_token;
  c.state_bytes_per_seq = r.state_bytes_per_seq;
  c.activation_bytes = r.activation_bytes;
  c.kv_budget_bytes = r.kv_budget_bytes;
  c.bytes_per_seq = r.bytes_per_seq;
  c.concurrency_limit = r.concurrency_limit;
  c.max_concurrency = r.max_concurrency;
  c.concurrency = r.concurrency;
  c.ttft_s = r.ttft_s;
  c.tpot_s = r.tpot_s;
  c.decode_tok_s = r.decode_tok_s;
  c.throughput_tok_s = r.throughput_tok_s;
  c.layer_prefill_s = r.layer_prefill_s;
  c.layer_decode_s = r.layer_decode_s;
  return c;
}

torch::Tensor expected_value(const torch::Tensor& probs, const torch::Tensor& choices) {
  return (probs.to(torch::kFloat64) * choices.to(torch::kFloat64)).sum(-1);
}

}  // namespace ac::search

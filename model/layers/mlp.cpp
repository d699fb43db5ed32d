// Dense MLP and mixture of experts.
#include "model/layers/init.h"
#include "model/layers/mlp.h"

#include "dist/error.h"
#include "dist/tensor_parallel.h"

namespace ac::model {

torch::Tensor activate(const torch::Tensor& x, MlpActivation act) {
  if (act == MlpActivation::ReLU2) return torch::relu(x).square();
  return act_silu(x);
}

std::string MlpImpl::split_problem(int64_t ffn, int tp) {
  if (ffn % tp != 0)
    return "FFN width " + std::to_string(ffn) + " does not split evenly over TP=" + std::to_string(tp);
  return "";
}

MlpImpl::MlpImpl(int64_t hidden, int64_t ffn, MlpActivation act, bool bias, const TpGroup& tp,
                 torch::Dtype dtype, const std::string& where)
    : hidden_(hidden), ffn_(ffn), act_(act), bias_(bias), tp_(tp) {
  if (auto why = split_problem(ffn, tp.size()); !why.empty())
    throw InputError("ArchSpec", where + ".ffn_size", why);
  ffn_local_ = ffn / tp.size();
  auto b = [&](int64_t n) { return bias ? std::vector<int64_t>{n} : std::vector<int64_t>{}; };
  if (act == MlpActivation::SwiGLU)
    gate_proj = register_module("gate_proj", Weights(std::vector<int64_t>{ffn_local_, hidden}, b(ffn_local_), dtype));
  up_proj = register_module("up_proj", Weights(std::vector<int64_t>{ffn_local_, hidden}, b(ffn_local_), dtype));
  down_proj = register_module("down_proj", Weights(std::vector<int64_t>{hidden, ffn_local_}, b(hidden), dtype));
}

torch::Tensor MlpImpl::forward_partial(const torch::Tensor& x) {
  auto up = column_parallel(x, up_proj->weight, up_proj->bias, tp_);
  auto h = act_ == MlpActivation::SwiGLU
               ? act_silu(column_parallel(x, gate_proj->weight, gate_proj->bias, tp_)) * up
               : activate(up, act_);
  if (observe.observer) {
    observe.observer->activation(observe.layer, observe_as, h);
    observe.observer->modify(observe.layer, observe_as, h);
  }
  return torch::nn::functional::linear(h, down_proj->weight);
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto y = forward_partial(x);
  if (tp_.size() > 1) y = dist::reduce_from_tp(y, *tp_.comm);
  if (down_proj->bias.defined()) y = y + down_proj->bias;
  return y;
}

void MlpImpl::shard_map(const std::string& p, std::vector<ParamShard>& out) const {
  const int64_t s = tp_.rank() * ffn_local_, n = ffn_local_;
  for (const char* name : {"gate_proj", "up_proj"}) {
    if (std::string(name) == "gate_proj" && act_ != MlpActivation::SwiGLU) continue;
    const std::string w = p + name + ".weight", b = p + name + ".bias";
    out.push_back({w, {slice(w, {ffn_, hidden_}, 0, s, n)}});
    if (bias_) out.push_back({b, {slice(b, {ffn_}, 0, s, n)}});
  }
  out.push_back({p + "down_proj.weight", {slice(p + "down_proj.weight", {hidden_, ffn_}, 1, s, n)}});
  if (bias_) out.push_back({p + "down_proj.bias", {whole(p + "down_proj.bias", {hidden_})}});
}

RouterImpl::RouterImpl(int64_t experts, int64_t hidden, bool with_bias) {
  weight = register_parameter("weight", init_normal(torch::empty({experts, hidden}, torch::kFloat32)));
  if (with_bias)
    e_score_correction_bias =
        register_parameter("e_score_correction_bias", torch::zeros({experts}, torch::kFloat32),
                           /*requires_grad=*/false);
}

ExpertsImpl::ExpertsImpl(int64_t n, int64_t in, int64_t ffn, MlpActivation act, torch::Dtype dtype) {
  auto o = torch::TensorOptions().dtype(dtype);
  up_proj = register_parameter("up_proj", init_normal(torch::empty({n, ffn, in}, o)));
  down_proj = register_parameter("down_proj", init_normal(torch::empty({n, in, ffn}, o)));
  if (act == MlpActivation::SwiGLU)
    gate_proj = register_parameter("gate_proj", init_normal(torch::empty({n, ffn, in}, o)));
}

std::string MoeImpl::split_problem(const MoeSpec& s, int tp) {
  if (s.num_experts % tp != 0)
    return std::to_string(s.num_experts) + " experts do not split evenly over TP=" + std::to_string(tp);
  if (s.shared_ffn % tp != 0)
    return "shared expert FFN " + std::to_string(s.shared_ffn) + " does not split evenly over TP=" +
           std::to_string(tp);
  if (s.num_experts % s.n_group != 0)
    return std::to_string(s.num_experts) + " experts do not split into " + std::to_string(s.n_group) +
           " routing groups";
  return "";
}

MoeImpl::MoeImpl(const MoeSpec& spec, int64_t hidden, const TpGroup& tp, torch::Dtype dtype,
                 const std::string& where)
    : spec_(spec), hidden_(hidden), tp_(tp) {
  if (auto why = split_problem(spec, tp.size()); !why.empty())
    throw InputError("ArchSpec", where + ".num_experts", why);
  local_experts_ = spec.num_experts / tp.size();
  expert_start_ = tp.rank() * local_experts_;
  gate = register_module("gate", Router(spec.num_experts, hidden, spec.router == RouterKind::SigmoidBias));
  const int64_t in = spec.latent_size > 0 ? spec.latent_size : hidden;
  experts = register_module("experts", Experts(local_experts_, in, spec.expert_ffn, spec.activation, dtype));
  if (spec.shared_ffn > 0)
    shared_experts = register_module(
        "shared_experts", Mlp(hidden, spec.shared_ffn, spec.activation, false, tp, dtype, where + ".shared_experts"));
  if (shared_experts) shared_experts->observe_as = ObservePoint::SharedDownInput;
  if (spec.latent_size > 0) {
    fc1_latent_proj = register_module("fc1_latent_proj", Weights(std::vector<int64_t>{spec.latent_size, hidden}, std::vector<int64_t>{}, dtype));
    fc2_latent_proj = register_module("fc2_latent_proj", Weights(std::vector<int64_t>{hidden, spec.latent_size}, std::vector<int64_t>{}, dtype));
  }
}

std::pair<torch::Tensor, torch::Tensor> MoeImpl::route(const torch::Tensor& x) {
  auto logits = torch::nn::functional::linear(x.to(torch::kFloat32), gate->weight);
  const int64_t E = spec_.num_experts, k = spec_.top_k;
  torch::Tensor idx, w;
  if (spec_.router == RouterKind::SigmoidBias) {
    auto scores = logits.sigmoid();
    auto choice = scores + gate->e_score_correction_bias;
    if (spec_.n_group > 1) {  // keep the topk_group groups with the best top-2 sums
      auto grouped = choice.view({-1, spec_.n_group, E / spec_.n_group});
      auto group_scores = std::get<0>(grouped.topk(2, -1)).sum(-1);
      auto group_idx = std::get<1>(group_scores.topk(spec_.topk_group, -1, true, false));
      auto keep = torch::zeros_like(group_scores).scatter_(1, group_idx, 1.0);
      auto mask = keep.unsqueeze(-1).expand({-1, spec_.n_group, E / spec_.n_group}).reshape({-1, E});
      choice = choice.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
    }
    idx = std::get<1>(choice.topk(k, -1, true, false));
    w = scores.gather(1, idx);
    if (spec_.norm_topk_prob) w = w / (w.sum(-1, true) + 1e-20);
  } else {
    auto probs = torch::softmax(logits, -1);
    std::tie(w, idx) = probs.topk(k, -1);
    if (spec_.norm_topk_prob) w = w / w.sum(-1, true);
  }
  return {idx, w * spec_.routed_scaling};
}

torch::Tensor MoeImpl::forward(const torch::Tensor& x0) {
  auto shape = x0.sizes().vec();
  // Every path below yields this rank's partial sum: gradients to x are all-reduced.
  auto x = (tp_.size() > 1 ? dist::copy_to_tp(x0, *tp_.comm) : x0).reshape({-1, hidden_});
  auto [idx, w] = route(x);
  auto h = fc1_latent_proj ? torch::nn::functional::linear(x, fc1_latent_proj->weight) : x;
  if (observe.observer && fc1_latent_proj) observe.observer->activation(observe.layer, ObservePoint::MoeLatent, h);
  auto acc = torch::zeros({h.size(0), h.size(1)}, h.options().dtype(torch::kFloat32));
  // Tokens per local expert: one sort instead of one scan per expert.
  auto flat = idx.reshape({-1});
  auto order = flat.argsort();
  auto sorted = flat.index_select(0, order);
  auto counts = torch::bincount(sorted, {}, spec_.num_experts).cpu();
  auto counts_a = counts.accessor<int64_t, 1>();
  int64_t offset = 0;
  for (int64_t e = 0; e < expert_start_; ++e) offset += counts_a[e];
  const int64_t k = spec_.top_k;
  // Split the stacked weights once: per-expert indexing would give every expert's backward
  // a full-size gradient of the stack.
  auto ups = experts->up_proj.unbind(0), downs = experts->down_proj.unbind(0);
  std::vector<torch::Tensor> gates;
  if (spec_.activation == MlpActivation::SwiGLU) gates = experts->gate_proj.unbind(0);
  bool ran_local = false;
  for (int64_t le = 0; le < local_experts_; ++le) {
    const int64_t n = counts_a[expert_start_ + le];
    if (n == 0) continue;
    ran_local = true;
    auto sel = order.narrow(0, offset, n);  // positions in the flattened [tokens * k]
    offset += n;
    auto tok = sel.div(k, "floor");
    auto xe = h.index_select(0, tok);
    auto up = torch::matmul(xe, ups[size_t(le)].t());
    auto a = spec_.activation == MlpActivation::SwiGLU
                 ? act_silu(torch::matmul(xe, gates[size_t(le)].t())) * up
                 : activate(up, spec_.activation);
    auto ye = torch::matmul(a, downs[size_t(le)].t());
    auto we = w.reshape({-1}).index_select(0, sel).unsqueeze(1);
    auto weighted = ye * we;
    if (observe.observer) observe.observer->expert(observe.layer, expert_start_ + le, tok, a, weighted);
    acc.index_add_(0, tok, weighted.to(torch::kFloat32));
  }
  // No token for any local expert (experts are split over TP ranks): keep x and the routing
  // weights in this rank's graph anyway, or its backward would skip copy_to_tp's all-reduce
  // that the other ranks make, and the TP group would deadlock.
  if (tp_.size() > 1 && (x.requires_grad() || w.requires_grad()) && !ran_local)
    acc = acc + (h.sum() + w.sum()).to(torch::kFloat32) * 0.0;
  auto y = acc.to(x.scalar_type());
  if (fc2_latent_proj) y = torch::nn::functional::linear(y, fc2_latent_proj->weight);
  // The shared expert's column-parallel input does its own copy_to_tp: give it x0.
  if (shared_experts) y = y + shared_experts->forward_partial(x0.reshape({-1, hidden_}));
  if (tp_.size() > 1) y = dist::reduce_from_tp(y, *tp_.comm);
  return y.view(shape);
}

void MoeImpl::shard_map(const std::string& p, std::vector<ParamShard>& out) const {
  const int64_t E = spec_.num_experts, H = hidden_, F = spec_.expert_ffn;
  const int64_t in = spec_.latent_size > 0 ? spec_.latent_size : H;
  out.push_back({p + "gate.weight", {whole(p + "gate.weight", {E, H})}});
  if (spec_.router == RouterKind::SigmoidBias)
    out.push_back({p + "gate.e_score_correction_bias", {whole(p + "gate.e_score_correction_bias", {E})}});
  // Logical expert tensors are per expert, as Hugging Face checkpoints store them.
  std::vector<std::pair<std::string, std::vector<int64_t>>> kinds = {{"up_proj", {F, in}}, {"down_proj", {in, F}}};
  if (spec_.activation == MlpActivation::SwiGLU) kinds.push_back({"gate_proj", {F, in}});
  for (const auto& [name, shape] : kinds) {
    ParamShard s{p + "experts." + name, {}, /*stack=*/true};
    for (int64_t e = expert_start_; e < expert_start_ + local_experts_; ++e)
      s.pieces.push_back(whole(p + "experts." + std::to_string(e) + "." + name + ".weight", shape));
    out.push_back(std::move(s));
  }
  if (shared_experts) shared_experts->shard_map(p + "shared_experts.", out);
  if (spec_.latent_size > 0) {
    out.push_back({p + "fc1_latent_proj.weight", {whole(p + "fc1_latent_proj.weight", {spec_.latent_size, H})}});
    out.push_back({p + "fc2_latent_proj.weight", {whole(p + "fc2_latent_proj.weight", {H, spec_.latent_size})}});
  }
}

}  // namespace ac::model

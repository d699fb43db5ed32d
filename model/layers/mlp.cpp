// Dense MLP and mixture of experts.
#include "model/layers/init.h"
#include "model/layers/mlp.h"

#include <functional>

#include "dist/error.h"
#include "dist/expert_parallel.h"
#include "dist/tensor_parallel.h"
#include "model/layers/selective_recompute.h"

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
  auto up = apply_linear(x, up_proj->weight, up_proj->bias);
  auto gate = act_ == MlpActivation::SwiGLU ? apply_linear(x, gate_proj->weight, gate_proj->bias) : torch::Tensor();
  auto h = mlp_activation(gate, up, act_);
  if (observe.observer) {
    observe.observer->activation(observe.layer, observe_as, h);
    observe.observer->modify(observe.layer, observe_as, h);
  }
  return apply_linear(h, down_proj->weight);
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto y = tp_region_output(forward_partial(tp_region_input(x, tp_)), tp_);
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

std::string MoeImpl::split_problem(const MoeSpec& s, int tp, int ep, bool expert_tp) {
  if (expert_tp) {
    if (s.expert_ffn % tp != 0)
      return "expert FFN width " + std::to_string(s.expert_ffn) + " does not split evenly over ETP = TP = " +
             std::to_string(tp);
    if (s.num_experts % ep != 0)
      return std::to_string(s.num_experts) + " experts do not split evenly over EP=" + std::to_string(ep);
  } else {
    if (s.num_experts % tp != 0)
      return std::to_string(s.num_experts) + " experts do not split evenly over TP=" + std::to_string(tp);
    if (s.num_experts % (int64_t(tp) * ep) != 0)
      return std::to_string(s.num_experts) + " experts do not split evenly over TP x EP = " + std::to_string(tp) +
             " x " + std::to_string(ep) + " ranks";
  }
  if (s.shared_ffn % tp != 0)
    return "shared expert FFN " + std::to_string(s.shared_ffn) + " does not split evenly over TP=" +
           std::to_string(tp);
  if (s.num_experts % s.n_group != 0)
    return std::to_string(s.num_experts) + " experts do not split into " + std::to_string(s.n_group) +
           " routing groups";
  return "";
}

MoeImpl::MoeImpl(const MoeSpec& spec, int64_t hidden, const TpGroup& tp, torch::Dtype dtype,
                 const std::string& where, const EpGroup& ep)
    : spec_(spec), hidden_(hidden), tp_(tp), ep_(ep) {
  if (auto why = split_problem(spec, tp.size(), ep.size(), ep.expert_tp); !why.empty())
    throw InputError("ArchSpec", where + (ep.expert_tp && spec.expert_ffn % tp.size() ? ".expert_ffn" : ".num_experts"), why);
  if (ep.expert_tp) {  // every TP rank: a slice of the FFN of the EP rank's experts
    local_experts_ = spec.num_experts / ep.size();
    expert_start_ = ep.rank() * local_experts_;
    expert_ffn_local_ = spec.expert_ffn / tp.size();
  } else {  // TP rank r holds experts [r E/tp, (r+1) E/tp) as at EP 1; its EP group splits them further
    local_experts_ = spec.num_experts / (int64_t(tp.size()) * ep.size());
    expert_start_ = (int64_t(tp.rank()) * ep.size() + ep.rank()) * local_experts_;
    expert_ffn_local_ = spec.expert_ffn;
    if (tp.sp() && ep.size() > 1 &&
        (!ep.tp_ep || ep.tp_ep->size() != tp.size() * ep.size() || ep.tp_ep->rank() != tp.rank() * ep.size() + ep.rank()))
      throw std::invalid_argument(where + ": sequence parallelism with whole experts over TP x EP needs EpGroup::tp_ep, "
                                          "the TP x EP group ranked TP rank x EP + EP rank");
  }
  gate = register_module("gate", Router(spec.num_experts, hidden, spec.router == RouterKind::SigmoidBias));
  const int64_t in = spec.latent_size > 0 ? spec.latent_size : hidden;
  experts = register_module("experts", Experts(local_experts_, in, expert_ffn_local_, spec.activation, dtype));
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
  // Search masks (observer.h modify_routing): expected routing over sets of kept experts and
  // numbers of routing slots.
  torch::Tensor expert_sets, expert_weights, slot_sets, slot_weights;
  if (observe.observer) observe.observer->modify_routing(observe.layer, expert_sets, expert_weights, slot_sets, slot_weights);
  const bool expected = expert_sets.defined() || slot_sets.defined();
  // The router's candidates among `kept` ([E] 0/1; undefined: all), best first: ids [rows, k]
  // and their weights before top-k renormalisation.
  auto choose = [&](const torch::Tensor& kept) -> std::pair<torch::Tensor, torch::Tensor> {
    if (spec_.router == RouterKind::SigmoidBias) {
      auto scores = logits.sigmoid();
      auto choice = scores + gate->e_score_correction_bias;
      // A removed expert is never chosen, whatever its bias: the others' scores are unchanged.
      if (kept.defined()) choice = choice.masked_fill(kept.eq(0).unsqueeze(0), -std::numeric_limits<float>::infinity());
      if (spec_.n_group > 1) {  // keep the topk_group groups with the best top-2 sums
        auto grouped = choice.view({-1, spec_.n_group, E / spec_.n_group});
        auto group_scores = std::get<0>(grouped.topk(2, -1)).sum(-1);
        auto group_idx = std::get<1>(group_scores.topk(spec_.topk_group, -1, true, false));
        auto keep = torch::zeros_like(group_scores).scatter_(1, group_idx, 1.0);
        auto mask = keep.unsqueeze(-1).expand({-1, spec_.n_group, E / spec_.n_group}).reshape({-1, E});
        choice = choice.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
      }
      auto idx = std::get<1>(choice.topk(k, -1, true, expected));
      return {idx, scores.gather(1, idx)};
    }
    auto probs = torch::softmax(logits, -1);
    // Without an expert the softmax runs over the others: the kept probabilities renormalised.
    if (kept.defined()) {
      probs = probs * kept.unsqueeze(0);
      probs = probs / probs.sum(-1, true);
    }
    auto [w, idx] = probs.topk(k, -1);
    return {idx, w};
  };
  auto normalise = [&](const torch::Tensor& w) {
    if (!spec_.norm_topk_prob) return w;
    return spec_.router == RouterKind::SigmoidBias ? w / (w.sum(-1, true) + 1e-20) : w / w.sum(-1, true);
  };
  if (!expected) {
    auto [idx, w] = choose(torch::Tensor());
    return {idx, normalise(w) * spec_.routed_scaling};
  }
  // The expectation over the search's sets: set c of experts (weight p_c) and the first j slots
  // (weight q_j) route token t to expert e with weight w_cj(t, e); the layer's output is linear
  // in those weights, so sum_cj p_c q_j w_cj(t, e) gives exactly the expected output (given the
  // layer's input), differentiable in p and q, and the pruned layer's output at one-hot p, q.
  auto dev = logits.device();
  if (!expert_sets.defined()) {
    expert_sets = torch::ones({1, E}, logits.options());
    expert_weights = torch::ones({1}, logits.options());
  }
  if (!slot_sets.defined()) {
    slot_sets = torch::ones({1, k}, logits.options());
    slot_weights = torch::ones({1}, logits.options());
  }
  expert_sets = expert_sets.to(dev, torch::kFloat32);
  expert_weights = expert_weights.to(dev, torch::kFloat32);
  slot_sets = slot_sets.to(dev, torch::kFloat32);
  slot_weights = slot_weights.to(dev, torch::kFloat32);
  torch::Tensor dense = torch::zeros({logits.size(0), E}, logits.options());
  for (int64_t c = 0; c < expert_sets.size(0); ++c) {
    auto [idx, w] = choose(expert_sets[c]);
    for (int64_t j = 0; j < slot_sets.size(0); ++j)
      dense = dense.scatter_add(1, idx, normalise(w * slot_sets[j].unsqueeze(0)) * (expert_weights[c] * slot_weights[j]));
  }
  // Every (token, expert) pair with a weight under some set, as [rows, n] ids and weights.
  const int64_t n = std::max<int64_t>(1, dense.ne(0).sum(1).max().item<int64_t>());
  auto [w, idx] = dense.topk(n, -1);
  return {idx, w * spec_.routed_scaling};
}

// Training splits the stacked weights once: per-expert indexing would give every expert's
// backward a full-size gradient of the stack. Without a gradient to make, indexing is cheaper:
// only the experts that run take a view (mlp.h, ExpertWeights).
MoeImpl::ExpertWeights MoeImpl::split_experts() const {
  ExpertWeights ew;
  const bool swiglu = spec_.activation == MlpActivation::SwiGLU;
  if (!torch::GradMode::is_enabled() || !experts->up_proj.requires_grad()) {
    ew.up = experts->up_proj, ew.down = experts->down_proj;
    if (swiglu) ew.gate = experts->gate_proj;
    return ew;
  }
  ew.ups = experts->up_proj.unbind(0);
  ew.downs = experts->down_proj.unbind(0);
  if (swiglu) ew.gates = experts->gate_proj.unbind(0);
  return ew;
}

torch::Tensor MoeImpl::run_expert(const ExpertWeights& ew, int64_t le, const torch::Tensor& xe, torch::Tensor* act) {
  // apply_linear: linear (= matmul(x, w^T)) when training; a decode step's few routed tokens
  // take the matrix-vector / small-M paths.
  auto up = apply_linear(xe, ew.up_of(le));
  auto gate = spec_.activation == MlpActivation::SwiGLU ? apply_linear(xe, ew.gate_of(le)) : torch::Tensor();
  auto a = mlp_activation(gate, up, spec_.activation);
  if (observe.observer) observe.observer->modify_expert(observe.layer, expert_start_ + le, a);
  if (act) *act = a;
  return apply_linear(a, ew.down_of(le));
}

namespace {

// Rows x [sum(send), ...] from each rank of `comm` to all of them (an all-gather with a row
// count per rank): the result holds recv[q] rows of rank q, in rank order. Backward: each
// rank's rows get the sum of every rank's gradient for them.
torch::Tensor all_gather_rows(const torch::Tensor& x, const std::vector<int64_t>& recv, dist::Communicator& comm) {
  const int n = comm.size();
  return dist::all_to_all_rows(x.repeat({n, 1}), std::vector<int64_t>(size_t(n), x.size(0)), recv, comm);
}

// Every rank's row count of a [n] int64 vector per rank (one all-gather), as vectors.
std::vector<std::vector<int64_t>> all_gather_counts(const std::vector<int64_t>& mine, dist::Communicator& comm,
                                                    const torch::Device& device) {
  torch::Tensor in = torch::tensor(mine, torch::kLong).to(device);
  torch::Tensor out = torch::empty({comm.size() * in.size(0)}, in.options());
  comm.all_gather(out, in);
  out = out.cpu();
  std::vector<std::vector<int64_t>> v(size_t(comm.size()));
  for (int q = 0; q < comm.size(); ++q) v[size_t(q)].assign(out.data_ptr<int64_t>() + q * in.size(0), out.data_ptr<int64_t>() + (q + 1) * in.size(0));
  return v;
}

// Megatron's alltoall dispatcher with SP and ETP = TP: the routed copies of this rank's
// sequence slice go over EP to the rank holding their expert (1/TP of the non-SP volume), are
// gathered over TP (every TP rank holds a slice of every expert's FFN), run through this
// rank's FFN slice, and the partial outputs go back to their TP rank (summed there) and over
// EP to their token. The result is the routed sum for the slice's tokens, complete (fp32).
// `expert(l, rows)` runs local expert l (this rank's FFN slice) on rows; ep is null at EP 1.
using ExpertFn = std::function<torch::Tensor(int64_t, const torch::Tensor&)>;
torch::Tensor routed_sequence_parallel(const torch::Tensor& h, const torch::Tensor& idx, const torch::Tensor& w,
                                       int64_t E, int64_t L, dist::Communicator& tp, dist::Communicator* ep,
                                       const ExpertFn& expert) {
  const int P = ep ? ep->size() : 1;
  const int64_t k = idx.size(1), width = h.size(1);
  auto flat = idx.reshape({-1});
  auto sel = flat.argsort();  // copies by expert: EP rank by EP rank
  auto tok = sel.div(k, "floor");
  auto counts = torch::bincount(flat, {}, E).cpu();
  const std::vector<int64_t> per_expert(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + E);
  std::vector<int64_t> send(size_t(P), 0), r = per_expert;  // r[p * L + l]: copies from EP rank p for local expert l
  for (int q = 0; q < P; ++q)
    for (int64_t l = 0; l < L; ++l) send[size_t(q)] += per_expert[size_t(q * L + l)];
  if (P > 1) {
    torch::Tensor pe_send = torch::tensor(per_expert, torch::kLong).to(h.device()), pe_recv = torch::empty_like(pe_send);
    const std::vector<int64_t> Ls(size_t(P), L);
    ep->all_to_all(pe_recv, pe_send, Ls, Ls);
    pe_recv = pe_recv.cpu();
    r.assign(pe_recv.data_ptr<int64_t>(), pe_recv.data_ptr<int64_t>() + P * L);
  }
  std::vector<int64_t> recv(size_t(P), 0);
  for (int p = 0; p < P; ++p)
    for (int64_t l = 0; l < L; ++l) recv[size_t(p)] += r[size_t(p * L + l)];
  torch::Tensor xr = h.index_select(0, tok);
  if (P > 1) xr = dist::all_to_all_rows(xr, send, recv, *ep);
  // Gather the received copies over TP: rows TP rank by TP rank, each EP source by source,
  // each source's expert by expert.
  const auto R = all_gather_counts(r, tp, h.device());
  const int Q = tp.size();
  std::vector<int64_t> n_q(size_t(Q), 0);
  for (int q = 0; q < Q; ++q)
    for (auto n : R[size_t(q)]) n_q[size_t(q)] += n;
  auto xg = all_gather_rows(xr, n_q, tp);
  // perm: the gathered rows expert by expert.
  std::vector<int64_t> perm, seg(size_t(L + 1), 0), start(size_t(Q * P * L));
  int64_t at = 0;
  for (int q = 0; q < Q; ++q)
    for (int64_t j = 0; j < P * L; ++j) start[size_t(q * P * L + j)] = at, at += R[size_t(q)][size_t(j)];
  for (int64_t l = 0; l < L; ++l) {
    for (int q = 0; q < Q; ++q)
      for (int p = 0; p < P; ++p) {
        const int64_t s = start[size_t((q * P + p) * L + l)], n = R[size_t(q)][size_t(p * L + l)];
        for (int64_t j = 0; j < n; ++j) perm.push_back(s + j);
      }
    seg[size_t(l + 1)] = int64_t(perm.size());
  }
  torch::Tensor yg;
  if (at == 0) {
    yg = xg * 0;  // no copy for this rank's experts: still in the graph, so the backward collectives run
  } else {
    auto opts = torch::TensorOptions().dtype(torch::kLong).device(h.device());
    auto perm_t = torch::tensor(perm, torch::kLong).to(h.device());
    std::vector<torch::Tensor> outs;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t n = seg[size_t(l + 1)] - seg[size_t(l)];
      if (n > 0) outs.push_back(expert(l, xg.index_select(0, perm_t.narrow(0, seg[size_t(l)], n))));
    }
    auto inverse = torch::empty({at}, opts);
    inverse.index_put_({perm_t}, torch::arange(at, opts));
    yg = torch::cat(outs, 0).index_select(0, inverse);
  }
  // Partial outputs back to their TP rank, summed there (a reduce-scatter with row counts).
  const int64_t mine = n_q[size_t(tp.rank())];
  auto ys = dist::all_to_all_rows(yg, n_q, std::vector<int64_t>(size_t(Q), mine), tp).view({Q, mine, width}).sum(0);
  // Combine over EP, weighted by the router on the token's rank.
  auto yb = P > 1 ? dist::all_to_all_rows(ys, recv, send, *ep) : ys;
  auto weighted = yb * w.reshape({-1}).index_select(0, sel).unsqueeze(1);
  auto acc = torch::zeros({h.size(0), width}, h.options().dtype(torch::kFloat32));
  acc.index_add_(0, tok, weighted.to(torch::kFloat32));
  return acc;
}

}  // namespace

dist::Communicator& MoeImpl::tp_ep_comm() const { return ep_.tp_ep ? *ep_.tp_ep : *tp_.comm; }

torch::Tensor MoeImpl::forward_sequence_parallel(const torch::Tensor& x0) {
  auto x = x0.reshape({-1, hidden_});
  auto [idx, w] = route(x);
  auto h = fc1_latent_proj ? apply_linear(x, fc1_latent_proj->weight) : x;
  torch::Tensor acc;
  if (ep_.expert_tp) {
    const ExpertWeights ew = split_experts();
    acc = routed_sequence_parallel(h, idx, w, spec_.num_experts, local_experts_, *tp_.comm, ep_.comm.get(),
                                   [&](int64_t l, const torch::Tensor& rows) { return run_expert(ew, l, rows); });
  } else {
    // Whole experts: rank j of the TP x EP group holds experts [j L, (j + 1) L) (expert_start_),
    // so one all-to-all over it sends each of the slice's copies to its expert (Megatron's
    // alltoall dispatcher over tp_ep at ETP 1) and brings the outputs back.
    acc = routed_expert_parallel(h, idx, w, tp_ep_comm(), 0);
  }
  auto y = acc.to(x.scalar_type());
  if (fc2_latent_proj) y = apply_linear(y, fc2_latent_proj->weight);
  y = y.view(x0.sizes());
  if (shared_experts) {
    const auto xin = tp_region_input(x0, tp_);
    y = y + tp_region_output(shared_experts->forward_partial(xin.reshape({-1, hidden_})).view(xin.sizes()), tp_);
  }
  return y;
}

torch::Tensor MoeImpl::forward(const torch::Tensor& x0) {
  if (observe.observer && (ep_.size() > 1 || (ep_.expert_tp && tp_.size() > 1)))
    throw std::logic_error("MoE observers (importance, search) need EP 1 and whole experts per rank");
  // With SP the block dispatches from the sequence slice (Megatron's layout, ETP 1 or TP);
  // an observer (the search's masks, at EP 1 and ETP 1) sees it as a TP region on the gathered
  // sequence, as without SP, since its per-expert hooks describe this rank's whole tokens.
  if (tp_.sp() && !observe.observer) return forward_sequence_parallel(x0);
  // The region input (with SP: the gathered sequence). Every path below yields this rank's
  // partial sum of the output: gradients to it are reduced over TP.
  const auto xin = tp_region_input(x0, tp_);
  auto shape = xin.sizes().vec();
  auto x = xin.reshape({-1, hidden_});
  auto [idx, w] = route(x);
  auto h = fc1_latent_proj ? apply_linear(x, fc1_latent_proj->weight) : x;
  if (observe.observer && fc1_latent_proj) {
    observe.observer->activation(observe.layer, ObservePoint::MoeLatent, h);
    observe.observer->modify(observe.layer, ObservePoint::MoeLatent, h);
  }
  bool ran_local = false;
  torch::Tensor acc;
  if (ep_.size() > 1) {
    // This TP rank's experts, spread over the EP group (all of them when TP splits FFN widths).
    acc = routed_expert_parallel(h, idx, w, *ep_.comm, ep_.expert_tp ? 0 : int64_t(tp_.rank()) * local_experts_ * ep_.size());
    ran_local = true;  // every rank took part in the all-to-alls, whose backward reaches x
  } else {
    acc = torch::zeros({h.size(0), h.size(1)}, h.options().dtype(torch::kFloat32));
    // Tokens per local expert: one sort instead of one scan per expert.
    auto flat = idx.reshape({-1});
    auto order = flat.argsort();
    auto sorted = flat.index_select(0, order);
    auto counts = torch::bincount(sorted, {}, spec_.num_experts).cpu();
    auto counts_a = counts.accessor<int64_t, 1>();
    int64_t offset = 0;
    for (int64_t e = 0; e < expert_start_; ++e) offset += counts_a[e];
    const int64_t k = idx.size(1);  // top_k, or more under the search's expected routing
    const ExpertWeights ew = split_experts();
    for (int64_t le = 0; le < local_experts_; ++le) {
      const int64_t n = counts_a[expert_start_ + le];
      if (n == 0) continue;
      ran_local = true;
      auto sel = order.narrow(0, offset, n);  // positions in the flattened [tokens * k]
      offset += n;
      auto tok = sel.div(k, "floor");
      torch::Tensor a;
      auto ye = run_expert(ew, le, h.index_select(0, tok), &a);
      auto we = w.reshape({-1}).index_select(0, sel).unsqueeze(1);
      auto weighted = ye * we;
      if (observe.observer) observe.observer->expert(observe.layer, expert_start_ + le, tok, a, weighted);
      acc.index_add_(0, tok, weighted.to(torch::kFloat32));
    }
  }
  // No token for any local expert (experts are split over TP ranks): keep x and the routing
  // weights in this rank's graph anyway, or its backward would skip copy_to_tp's all-reduce
  // that the other ranks make, and the TP group would deadlock.
  if (tp_.size() > 1 && (x.requires_grad() || w.requires_grad()) && !ran_local)
    acc = acc + (h.sum() + w.sum()).to(torch::kFloat32) * 0.0;
  auto y = acc.to(x.scalar_type());
  if (fc2_latent_proj) {
    if (observe.observer) observe.observer->modify(observe.layer, ObservePoint::MoeLatentOut, y);
    y = apply_linear(y, fc2_latent_proj->weight);
  }
  if (shared_experts) y = y + shared_experts->forward_partial(x);
  return tp_region_output(y.view(shape), tp_);
}

torch::Tensor MoeImpl::routed_expert_parallel(const torch::Tensor& h, const torch::Tensor& idx, const torch::Tensor& w,
                                              dist::Communicator& comm, int64_t first) {
  const int P = comm.size();
  const int64_t k = idx.size(1), L = local_experts_, E = spec_.num_experts;
  // Copies sorted by expert: those of the experts [first, first + L P) are contiguous and
  // already in the order of the ranks that hold them (Megatron's permute).
  auto flat = idx.reshape({-1});
  auto order = flat.argsort();
  auto counts = torch::bincount(flat, {}, E).cpu();
  const auto* c = counts.data_ptr<int64_t>();
  int64_t offset = 0;
  for (int64_t e = 0; e < first; ++e) offset += c[e];
  std::vector<int64_t> per_expert(c + first, c + first + L * P), send(size_t(P), 0);
  for (int q = 0; q < P; ++q)
    for (int64_t l = 0; l < L; ++l) send[size_t(q)] += per_expert[size_t(q * L + l)];
  int64_t n_send = 0;
  for (auto n : send) n_send += n;
  auto sel = order.narrow(0, offset, n_send);
  auto tok = sel.div(k, "floor");
  // Each rank learns how many copies of each of its experts every peer sends.
  torch::Tensor pe_send = torch::tensor(per_expert, torch::kLong).to(h.device()), pe_recv = torch::empty_like(pe_send);
  const std::vector<int64_t> Ls(size_t(P), L);
  comm.all_to_all(pe_recv, pe_send, Ls, Ls);
  pe_recv = pe_recv.cpu();
  const auto* r = pe_recv.data_ptr<int64_t>();  // r[p * L + l]: copies from rank p for local expert l
  std::vector<int64_t> recv(size_t(P), 0);
  for (int p = 0; p < P; ++p)
    for (int64_t l = 0; l < L; ++l) recv[size_t(p)] += r[p * L + l];
  // Dispatch. Received rows come source by source, each source's rows expert by expert.
  auto xr = dist::all_to_all_rows(h.index_select(0, tok), send, recv, comm);
  // Group the received rows by local expert, run each expert once, and put the outputs back in
  // the received order for the combine.
  std::vector<int64_t> start(size_t(P * L));
  int64_t at = 0;
  for (int p = 0; p < P; ++p)
    for (int64_t l = 0; l < L; ++l) start[size_t(p * L + l)] = at, at += r[p * L + l];
  // perm: received rows expert by expert; expert l's rows are perm[seg[l], seg[l + 1]).
  std::vector<int64_t> perm, seg(size_t(L + 1), 0);
  perm.reserve(size_t(at));
  for (int64_t l = 0; l < L; ++l) {
    for (int p = 0; p < P; ++p)
      for (int64_t j = 0; j < r[p * L + l]; ++j) perm.push_back(start[size_t(p * L + l)] + j);
    seg[size_t(l + 1)] = int64_t(perm.size());
  }
  torch::Tensor yr;
  if (at == 0) {
    yr = xr * 0;  // no copy for any local expert: still part of the graph, so the backward all-to-alls run
  } else {
    auto opts = torch::TensorOptions().dtype(torch::kLong).device(h.device());
    auto perm_t = torch::tensor(perm, torch::kLong).to(h.device());
    const ExpertWeights ew = split_experts();
    std::vector<torch::Tensor> outs;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t n = seg[size_t(l + 1)] - seg[size_t(l)];
      if (n > 0) outs.push_back(run_expert(ew, l, xr.index_select(0, perm_t.narrow(0, seg[size_t(l)], n))));
    }
    auto inverse = torch::empty({at}, opts);
    inverse.index_put_({perm_t}, torch::arange(at, opts));
    yr = torch::cat(outs, 0).index_select(0, inverse);
  }
  // Combine: outputs back to the ranks whose tokens they are, weighted there by the router.
  auto yb = dist::all_to_all_rows(yr, recv, send, comm);
  auto weighted = yb * w.reshape({-1}).index_select(0, sel).unsqueeze(1);
  auto acc = torch::zeros({h.size(0), h.size(1)}, h.options().dtype(torch::kFloat32));
  acc.index_add_(0, tok, weighted.to(torch::kFloat32));
  return acc;
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
  const int64_t f0 = ep_.expert_tp ? tp_.rank() * expert_ffn_local_ : 0;
  for (const auto& [name, shape] : kinds) {
    ParamShard s{p + "experts." + name, {}, /*stack=*/true};
    const int64_t ffn_dim = name == "down_proj" ? 1 : 0;  // up/gate [F, in], down [in, F]
    for (int64_t e = expert_start_; e < expert_start_ + local_experts_; ++e)
      s.pieces.push_back(ep_.expert_tp ? slice(p + "experts." + std::to_string(e) + "." + name + ".weight", shape,
                                               ffn_dim, f0, expert_ffn_local_)
                                       : whole(p + "experts." + std::to_string(e) + "." + name + ".weight", shape));
    out.push_back(std::move(s));
  }
  if (shared_experts) shared_experts->shard_map(p + "shared_experts.", out);
  if (spec_.latent_size > 0) {
    out.push_back({p + "fc1_latent_proj.weight", {whole(p + "fc1_latent_proj.weight", {spec_.latent_size, H})}});
    out.push_back({p + "fc2_latent_proj.weight", {whole(p + "fc2_latent_proj.weight", {H, spec_.latent_size})}});
  }
}

}  // namespace ac::model

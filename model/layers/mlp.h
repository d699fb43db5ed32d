// Channel mixers: the dense MLP (SwiGLU or squared ReLU) split by FFN columns, and the
// mixture of experts (softmax or sigmoid-with-bias router, shared expert, latent
// projections, routed scaling) with the routed experts split across the TP group and, with
// expert parallelism, each TP rank's experts across an EP group (token all-to-all).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "model/layers/common.h"
#include "model/layers/observer.h"

namespace ac::model {

torch::Tensor activate(const torch::Tensor& x, MlpActivation act);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(int64_t hidden, int64_t ffn, MlpActivation act, bool bias, const TpGroup& tp,
          torch::Dtype dtype, const std::string& where);
  torch::Tensor forward(const torch::Tensor& x);  // all-reduced over TP
  // This rank's share of the output before the TP reduction and without the down bias, from
  // the region input x (tp_region_input; the MoE sums it with the routed experts and reduces once).
  torch::Tensor forward_partial(const torch::Tensor& x);
  void shard_map(const std::string& prefix, std::vector<ParamShard>& out) const;
  static std::string split_problem(int64_t ffn, int tp);

  Weights gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  ObserverSlot observe;  // sees the down_proj input
  ObservePoint observe_as = ObservePoint::MlpDownInput;  // SharedDownInput in a MoE

 private:
  int64_t hidden_, ffn_, ffn_local_;
  MlpActivation act_;
  bool bias_;
  TpGroup tp_;
};
TORCH_MODULE(Mlp);

// Router: weight [experts, hidden] kept in fp32, plus the expert-bias correction of the
// sigmoid router (a non-trainable parameter, as Hugging Face's buffer).
class RouterImpl : public torch::nn::Module {
 public:
  RouterImpl(int64_t experts, int64_t hidden, bool with_bias);
  torch::Tensor weight, e_score_correction_bias;
};
TORCH_MODULE(Router);

// This rank's routed experts as stacked weights: up [E_local, ffn, in], down [E_local, in, ffn]
// (gate [E_local, ffn, in] for SwiGLU experts).
class ExpertsImpl : public torch::nn::Module {
 public:
  ExpertsImpl(int64_t local_experts, int64_t in, int64_t ffn, MlpActivation act, torch::Dtype dtype);
  torch::Tensor up_proj, down_proj, gate_proj;
};
TORCH_MODULE(Experts);

class MoeImpl : public torch::nn::Module {
 public:
  MoeImpl(const MoeSpec& spec, int64_t hidden, const TpGroup& tp, torch::Dtype dtype,
          const std::string& where, const EpGroup& ep = {});
  torch::Tensor forward(const torch::Tensor& x);
  // Top-k expert ids [tokens, k] and their weights [tokens, k] (fp32) for x [tokens, hidden].
  std::pair<torch::Tensor, torch::Tensor> route(const torch::Tensor& x);
  void shard_map(const std::string& prefix, std::vector<ParamShard>& out) const;
  // Why the experts cannot be split over TP x EP ranks ("" if they can); with expert_tp the
  // TP ranks split each expert's FFN width instead of the experts.
  static std::string split_problem(const MoeSpec& spec, int tp, int ep = 1, bool expert_tp = false);
  int64_t local_experts() const { return local_experts_; }
  int64_t expert_start() const { return expert_start_; }  // global id of the first local expert

  Router gate{nullptr};
  Experts experts{nullptr};
  Mlp shared_experts{nullptr};
  Weights fc1_latent_proj{nullptr}, fc2_latent_proj{nullptr};
  ObserverSlot observe;  // sees routed experts and the latent (shared_experts has its own slot)

 private:
  // The routed experts' sum [tokens, in] (fp32) over the experts [first, first + L x comm's
  // size) held L per rank of `comm` in rank order: each token copy for them goes to its
  // expert's rank and its output comes back (at EP > 1 without SP: this TP rank's experts
  // over EP, a partial sum; with SP at ETP 1: all experts over TP x EP, the whole sum).
  torch::Tensor routed_expert_parallel(const torch::Tensor& h, const torch::Tensor& idx, const torch::Tensor& w,
                                       dist::Communicator& comm, int64_t first);
  // With SP: router, latent projections and the token dispatch on this rank's sequence slice
  // x [batch, T/TP, hidden]; the shared expert a TP region. The layer's output slice.
  torch::Tensor forward_sequence_parallel(const torch::Tensor& x);
  dist::Communicator& tp_ep_comm() const;  // the joint TP x EP group (SP at ETP 1)
  // The local experts' matrices. Training: unbound once per forward (one stacked gradient
  // instead of a full-size one per selected expert). Inference: the stacks, each expert's matrix
  // taken when it runs, so a step costs its active experts and not one view per expert (at
  // 64 experts top-1 the unbinding took ~20% of a small model's decode step).
  struct ExpertWeights {
    torch::Tensor up, down, gate;                  // stacked [local experts, out, in] (inference)
    std::vector<torch::Tensor> ups, downs, gates;  // unbound (training)
    torch::Tensor up_of(int64_t e) const { return ups.empty() ? up.select(0, e) : ups[size_t(e)]; }
    torch::Tensor down_of(int64_t e) const { return downs.empty() ? down.select(0, e) : downs[size_t(e)]; }
    torch::Tensor gate_of(int64_t e) const { return gates.empty() ? gate.select(0, e) : gates[size_t(e)]; }
  };
  ExpertWeights split_experts() const;
  // Local expert `le` on its rows x [n, in] -> [n, in]; `act` (optional) gets the down input.
  torch::Tensor run_expert(const ExpertWeights& ew, int64_t le, const torch::Tensor& x, torch::Tensor* act = nullptr);

  MoeSpec spec_;
  int64_t hidden_, local_experts_, expert_start_, expert_ffn_local_;
  TpGroup tp_;
  EpGroup ep_;
};
TORCH_MODULE(Moe);

}  // namespace ac::model

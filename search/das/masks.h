// The masked teacher: the soft masks of one sample of the search's distribution, applied to the
// teacher's forward through the model's observer hooks (model/layers/observer.h).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "model/layers/observer.h"
#include "search/das/space.h"

namespace ac::search {

// Per decision the [choices, units] matrix of prefix masks: M[c, j] = 1 when rank_j < choices[c].
torch::Tensor prefix_matrix(const Decision& d);

// The soft masks of one sample, as an observer of this TP rank's shard of the teacher.
class SearchMasks : public model::ActivationObserver {
 public:
  torch::Tensor hidden;                                   // [hidden] or undefined
  std::vector<torch::Tensor> heads, ffn, mixer, channel;  // per layer: this rank's o_proj-input / down-input mask, sublayer gates
  // Per MoE layer: the experts decision's sets of kept experts [C, E] and their weights [C], the
  // top-k decision's slot prefixes [C', top_k] and weights [C'] (the routing's expectation over
  // them), each expert's FFN mask [E, expert_ffn].
  std::vector<torch::Tensor> expert_sets, expert_weights, slot_sets, slot_weights, expert_ffn;
  std::vector<torch::Tensor> shared;  // per MoE layer: this rank's shared-expert down-input mask
  std::vector<torch::Tensor> mamba_y;  // per Mamba layer: this rank's mask of the SSM output, per channel
  std::vector<torch::Tensor> latent;   // per latent MoE layer: the latent channels' mask (in and out)

  void activation(int, model::ObservePoint, const at::Tensor&) override {}
  void expert(int, int64_t, const at::Tensor&, const at::Tensor&, const at::Tensor&) override {}
  void modify(int layer, model::ObservePoint p, at::Tensor& x) override;
  void modify_routing(int layer, at::Tensor& sets, at::Tensor& weights, at::Tensor& slots, at::Tensor& slot_w) override;
  void modify_expert(int layer, int64_t e, at::Tensor& x) override;

  // The masks of one sample `y` (per decision, [choices] weights; `prefix`: prefix_matrix of
  // each decision) for TP rank `tp_rank` of `tp_size`, on `dev`. Their gradient flows back to y.
  void set(const SearchSpace& space, const std::vector<torch::Tensor>& prefix, const std::vector<torch::Tensor>& y,
           int64_t tp_rank, int64_t tp_size, const torch::Device& dev);
};

}  // namespace ac::search

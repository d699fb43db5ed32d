// The cost model over soft per-layer dimensions (expected heads, FFN width, experts, layers
// kept) as torch tensors, so that gradients of memory, TTFT, TPOT and throughput reach the
// architecture parameters of the search. Same formulas as the exact model (formulas.h): at
// one-hot choices it returns the exact model's numbers.
#pragma once

#include <torch/types.h>

#include <vector>

#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"

namespace ac::search {

// [num_layers] float64 tensors; an undefined tensor keeps the base spec's value. `keep`
// scales a whole layer, the *_keep fields one sublayer (a sublayer the base spec lacks stays
// absent whatever is given).
struct SoftDims {
  torch::Tensor keep;
  torch::Tensor attn_keep, heads, kv_heads;
  torch::Tensor mamba_keep, mamba_heads, mamba_head_dim;
  torch::Tensor mlp_keep, ffn;
  torch::Tensor moe_keep, experts, top_k, expert_ffn, shared_ffn;  // shared_ffn: where the base has a shared expert
  torch::Tensor latent;  // where the base has a latent MoE (its routed experts then work at this width)
};

// 0-dim tensors, except the two per-layer breakdowns ([num_layers]). Of a model over several
// hidden widths: [widths] and [widths, num_layers].
struct SoftCost {
  torch::Tensor params, active_params, weight_bytes, kv_bytes_per_token, state_bytes_per_seq, activation_bytes,
      kv_budget_bytes, bytes_per_seq, concurrency_limit, max_concurrency, concurrency, ttft_s, tpot_s, decode_tok_s,
      throughput_tok_s;
  torch::Tensor layer_prefill_s, layer_decode_s;
};

class DifferentiableCostModel {
 public:
  DifferentiableCostModel(const model::ArchSpec& base, HardwareProfile hw, EngineProfile engine, Workload workload);
  // The same formulas at each of `hidden_widths` at once (one evaluation over [widths,
  // num_layers] tensors instead of one model per width: the search mixes its hidden choices
  // this way). Row i equals the one-width model of `base` with hidden_size = hidden_widths[i].
  DifferentiableCostModel(const model::ArchSpec& base, HardwareProfile hw, EngineProfile engine, Workload workload,
                          const std::vector<int64_t>& hidden_widths);
  SoftCost operator()(const SoftDims& soft) const;
  int64_t num_layers() const { return int64_t(base_.layers.size()); }
  int64_t num_widths() const { return widths_; }

 private:
  model::ArchSpec base_;
  HardwareProfile hw_;
  EngineProfile engine_;
  Workload workload_;
  int64_t widths_ = 1;
  bool batched_ = false;
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// The expected dimension under a categorical choice: sum_c probs[l, c] * choices[l, c]
// (choices [C] is shared by all layers). probs [L, C].
torch::Tensor expected_value(const torch::Tensor& probs, const torch::Tensor& choices);

}  // namespace ac::search

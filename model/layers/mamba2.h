// Mamba-2 mixer with the chunked SSD scan written in plain tensor ops (no fused kernels)
// and a single-token step for decode with conv and SSM state. Tensor parallel by heads with
// whole B/C groups per rank, so the gated group norm stays local.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "model/arch_spec.h"
#include "model/layers/common.h"
#include "model/layers/norm.h"
#include "model/layers/observer.h"

namespace ac::model {

struct MambaCache {
  torch::Tensor conv_state;  // [batch, local conv channels, K - 1]: the last inputs of the conv
  torch::Tensor ssm_state;   // [batch, local heads, head_dim, state] (fp32)
};

// SSD scan. x [B, L, H, P], dt [B, L, H] (already softplus'd and clamped), A [H] (negative),
// Bm, Cm [B, L, G, N], D [H], initial state [B, H, P, N] or undefined. Computes in fp32 and
// returns y [B, L, H, P] (fp32) and the final state [B, H, P, N].
std::pair<torch::Tensor, torch::Tensor> ssd_chunked_scan(
    const torch::Tensor& x, const torch::Tensor& dt, const torch::Tensor& A, const torch::Tensor& Bm,
    const torch::Tensor& Cm, const torch::Tensor& D, int64_t chunk, const torch::Tensor& initial);
// The same by the recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t,
// one position at a time (the decode step, and the reference the chunked form is tested against).
std::pair<torch::Tensor, torch::Tensor> ssd_recurrent_scan(
    const torch::Tensor& x, const torch::Tensor& dt, const torch::Tensor& A, const torch::Tensor& Bm,
    const torch::Tensor& Cm, const torch::Tensor& D, const torch::Tensor& initial);

class Mamba2Impl : public torch::nn::Module {
 public:
  Mamba2Impl(const MambaSpec& spec, int64_t hidden, double norm_eps, const TpGroup& tp,
             torch::Dtype dtype, const std::string& where);
  // x [batch, T, hidden]. With a cache: continues from its state and leaves the new one there
  // (T == 1 takes the recurrent step, longer inputs the chunked scan).
  torch::Tensor forward(const torch::Tensor& x, MambaCache* cache = nullptr);
  void shard_map(const std::string& prefix, std::vector<ParamShard>& out) const;
  static std::string split_problem(const MambaSpec& spec, int tp);

  Weights in_proj{nullptr}, conv1d{nullptr}, out_proj{nullptr};
  torch::Tensor dt_bias, A_log, D;
  GatedRMSNorm norm{nullptr};
  ObserverSlot observe;  // sees the x part of in_proj's output; may mask the SSM output (MambaY)

 private:
  MambaSpec spec_;
  int64_t hidden_, heads_, groups_, d_inner_, conv_dim_;  // local sizes
  TpGroup tp_;
};
TORCH_MODULE(Mamba2);

}  // namespace ac::model

// RMSNorm and the gated, grouped RMSNorm of Mamba-2 (normalisation runs in fp32).
#pragma once

#include <torch/torch.h>

namespace ac::model {

class RMSNormImpl : public torch::nn::Module {
 public:
  // weight_in_fp32: multiply by the weight in fp32 and cast after (Nemotron-H); otherwise
  // cast the normalised input first, then multiply (Llama). Equal in fp32.
  RMSNormImpl(int64_t dim, double eps, torch::Dtype dtype, bool weight_in_fp32 = false);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
  bool weight_in_fp32;
};
TORCH_MODULE(RMSNorm);

// y = RMSNorm_per_group(x * silu(gate)) * weight, groups of `group_size` channels.
class GatedRMSNormImpl : public torch::nn::Module {
 public:
  GatedRMSNormImpl(int64_t dim, int64_t group_size, double eps, torch::Dtype dtype);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& gate);
  torch::Tensor weight;
  int64_t group_size;
  double eps;
};
TORCH_MODULE(GatedRMSNorm);

}  // namespace ac::model

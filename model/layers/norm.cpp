// RMSNorm variants.
#include "model/layers/norm.h"

namespace ac::model {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, torch::Dtype dtype, bool weight_in_fp32_)
    : eps(eps_), weight_in_fp32(weight_in_fp32_) {
  weight = register_parameter("weight", torch::ones({dim}, torch::TensorOptions().dtype(dtype)));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, true) + eps);
  if (weight_in_fp32) return (weight.to(torch::kFloat32) * h).to(x.scalar_type());
  return weight * h.to(x.scalar_type());
}

GatedRMSNormImpl::GatedRMSNormImpl(int64_t dim, int64_t group_size_, double eps_,
                                   torch::Dtype dtype)
    : group_size(group_size_), eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}, torch::TensorOptions().dtype(dtype)));
}

torch::Tensor GatedRMSNormImpl::forward(const torch::Tensor& x, const torch::Tensor& gate) {
  auto h = x.to(torch::kFloat32) * torch::silu(gate.to(torch::kFloat32));
  auto sizes = h.sizes().vec();
  const int64_t last = sizes.back();
  auto g = h.reshape({-1, last / group_size, group_size});
  g = g * torch::rsqrt(g.pow(2).mean(-1, true) + eps);
  return weight * g.reshape(sizes).to(x.scalar_type());
}

}  // namespace ac::model

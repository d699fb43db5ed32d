// Shared layer helpers: shard descriptions and column/row-parallel linear maps.
#include "model/layers/common.h"

#include "dist/tensor_parallel.h"

namespace ac::model {

ShardPiece whole(const std::string& logical, std::vector<int64_t> shape) {
  ShardPiece p;
  p.logical = logical;
  p.dim = 0;
  p.start = 0;
  p.size = shape.empty() ? 1 : shape[0];
  p.logical_shape = std::move(shape);
  return p;
}

ShardPiece slice(const std::string& logical, std::vector<int64_t> shape, int64_t dim,
                 int64_t start, int64_t size) {
  ShardPiece p;
  p.logical = logical;
  p.logical_shape = std::move(shape);
  p.dim = dim;
  p.start = start;
  p.size = size;
  return p;
}

torch::Tensor column_parallel(const torch::Tensor& x, const torch::Tensor& w,
                              const torch::Tensor& b, const TpGroup& tp) {
  auto in = tp.size() > 1 ? dist::copy_to_tp(x, *tp.comm) : x;
  return torch::nn::functional::linear(in, w, b);
}

torch::Tensor row_parallel(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           const TpGroup& tp) {
  auto y = torch::nn::functional::linear(x, w);
  if (tp.size() > 1) y = dist::reduce_from_tp(y, *tp.comm);
  if (b.defined()) y = y + b;
  return y;
}

WeightsImpl::WeightsImpl(std::vector<int64_t> weight_shape, std::vector<int64_t> bias_shape,
                         torch::Dtype dtype) {
  auto opt = torch::TensorOptions().dtype(dtype);
  weight = register_parameter("weight", torch::empty(weight_shape, opt).normal_(0.0, 0.02));
  if (!bias_shape.empty()) bias = register_parameter("bias", torch::zeros(bias_shape, opt));
}

}  // namespace ac::model

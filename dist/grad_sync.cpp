// Bucketed data-parallel gradient all-reduce (see grad_sync.h).
#include "dist/grad_sync.h"

#include <torch/torch.h>

namespace ac::dist {

GradBuckets::GradBuckets(std::vector<torch::Tensor> params, Communicator& dp, size_t bucket_bytes)
    : params_(std::move(params)), dp_(dp) {
  // Open bucket per dtype, so each flat buffer holds one dtype.
  std::map<torch::ScalarType, size_t> open;
  for (size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    if (!p.requires_grad()) continue;
    const auto dtype = p.scalar_type();
    auto it = open.find(dtype);
    if (it == open.end() || buckets_[it->second].offsets.back() * p.element_size() >= int64_t(bucket_bytes)) {
      buckets_.push_back(Bucket{});
      buckets_.back().offsets.push_back(0);
      it = open.insert_or_assign(dtype, buckets_.size() - 1).first;
    }
    Bucket& b = buckets_[it->second];
    b.params.push_back(k);
    b.offsets.push_back(b.offsets.back() + p.numel());
  }
  for (Bucket& b : buckets_) {
    const torch::Tensor& first = params_[b.params.front()];
    b.flat = torch::zeros({b.offsets.back()}, first.options().requires_grad(false));
  }
}

void GradBuckets::all_reduce_gradients() {
  torch::NoGradGuard ng;
  for (Bucket& b : buckets_) {
    for (size_t i = 0; i < b.params.size(); ++i) {
      torch::Tensor view = b.flat.narrow(0, b.offsets[i], b.offsets[i + 1] - b.offsets[i]);
      const torch::Tensor& g = params_[b.params[i]].grad();
      if (g.defined()) view.copy_(g.reshape(-1));
      else view.zero_();
    }
    if (dp_.size() > 1) dp_.all_reduce(b.flat, ReduceOp::Avg);
    for (size_t i = 0; i < b.params.size(); ++i) {
      torch::Tensor& p = params_[b.params[i]];
      torch::Tensor view = b.flat.narrow(0, b.offsets[i], b.offsets[i + 1] - b.offsets[i]).view(p.sizes());
      if (p.grad().defined()) p.mutable_grad().copy_(view);
      else p.mutable_grad() = view.clone();
    }
  }
}

}  // namespace ac::dist

// Data-parallel gradient averaging in buckets: gradients are packed into a few large flat
// buffers (one dtype per bucket, ~bucket_bytes each), each buffer is all-reduced (Avg) in
// one call, and the results are copied back. Fewer, larger messages run at bus bandwidth.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <vector>

#include "dist/communicator.h"

namespace ac::dist {

class GradBuckets {
 public:
  static constexpr size_t kDefaultBucketBytes = size_t(25) << 20;  // 25 MiB, as in PyTorch DDP

  // Parameters are bucketed in reverse order (the order backward produces gradients).
  GradBuckets(std::vector<torch::Tensor> params, Communicator& dp, size_t bucket_bytes = kDefaultBucketBytes);

  // Averages every parameter's gradient over the DP group. A parameter without a gradient
  // on this rank (e.g. an expert no token reached) contributes zeros and receives the average.
  void all_reduce_gradients();

  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    torch::Tensor flat;
  };
  std::vector<torch::Tensor> params_;
  std::vector<Bucket> buckets_;
  Communicator& dp_;
};

}  // namespace ac::dist

// Expert-parallel building blocks: the token all-to-all of a mixture of experts whose routed
// experts are spread over an EP group (dispatch: token copies to the rank holding their
// expert; combine: the expert outputs back), as an autograd function whose backward is the
// transposed all-to-all. Counts vary per rank and step.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "dist/communicator.h"

namespace ac::dist {

// recv[r] = what rank r sends to this rank, from every rank's send counts (one all-to-all of
// one int64 per peer, through a tensor on `device`: NCCL groups take CUDA tensors).
// Collective over `comm`.
std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_counts, Communicator& comm,
                                     const torch::Device& device);

// Rows of x [sum(send_counts), ...]: send_counts[r] rows go to rank r (in rank order); the
// result holds recv_counts[r] rows from rank r, in rank order. Backward sends the gradient
// rows back to where they came from. Every rank of `comm` must call it, also with no rows
// (forward and, when a loss depends on the result, backward). Identity on a group of one.
torch::Tensor all_to_all_rows(const torch::Tensor& x, const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& recv_counts, Communicator& comm);

}  // namespace ac::dist

// Expert-parallel all-to-all (see expert_parallel.h).
#include "dist/expert_parallel.h"

#include <torch/torch.h>

namespace ac::dist {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

torch::Tensor exchange(const torch::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                       Communicator& c) {
  int64_t rows = 0;
  for (int64_t n : recv) rows += n;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows;
  torch::Tensor out = torch::empty(shape, x.options());
  c.all_to_all(out, x.contiguous(), recv, send);
  return out;
}

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, std::vector<int64_t> send,
                               std::vector<int64_t> recv, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange(x, send, recv, *reinterpret_cast<Communicator*>(static_cast<intptr_t>(comm)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto& c = *reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
    // The transpose: what came from rank r goes back to rank r.
    const auto send = ctx->saved_data["send"].toIntVector(), recv = ctx->saved_data["recv"].toIntVector();
    return {exchange(g[0], recv, send, c), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_counts, Communicator& comm,
                                     const torch::Device& device) {
  if (comm.size() == 1) return send_counts;
  torch::Tensor s = torch::tensor(send_counts, torch::kLong).to(device);
  torch::Tensor r = torch::empty_like(s);
  const std::vector<int64_t> ones(size_t(comm.size()), 1);
  comm.all_to_all(r, s, ones, ones);
  r = r.cpu();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

torch::Tensor all_to_all_rows(const torch::Tensor& x, const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& recv_counts, Communicator& comm) {
  if (comm.size() == 1) return x;
  return AllToAllRows::apply(x, send_counts, recv_counts, static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm)));
}

}  // namespace ac::dist

// Collectives on torch tensors over one process group. MpiCommunicator serves CPU tensors;
// NcclCommunicator serves CUDA tensors (built when CUDA and NCCL are found). All calls are
// collective: every rank of the group calls them in the same order with matching shapes.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ac::dist {

enum class ReduceOp { Sum, Max, Avg };

// A collective in flight (the *_async calls). wait() orders what the calling thread issues
// next after the collective: with NCCL the current CUDA stream waits for the collective's end
// event (the host does not block); MPI and groups of one finish inside the call.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // In place. bf16/f16 are reduced in fp32 on the MPI path (see docs/dist.md); Avg on
  // integer tensors truncates.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // out = concatenation of every rank's `in` along dim 0 (out.size(0) == size() * in.size(0)).
  virtual void all_gather(at::Tensor& out, const at::Tensor& in) = 0;
  // in is size() equal blocks along dim 0; rank r receives the reduction of block r.
  virtual void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::Sum) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;

  // Asynchronous variants, for overlapping communication with compute (ZeRO-1's buckets).
  // Contiguous tensors; `out` is valid, and `in`/`out` may be changed, only after wait().
  // NCCL runs them on a communication stream of its own (docs/gpu.md); the defaults (MPI,
  // groups of one) run the blocking call and return a finished Work.
  virtual std::shared_ptr<Work> reduce_scatter_async(at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::Sum);
  virtual std::shared_ptr<Work> all_gather_async(at::Tensor& out, const at::Tensor& in);
  // Rows (dim 0) with a count per peer, as MPI_Alltoallv: `in` holds send_counts[r] rows for
  // rank r, one rank after another; `out` receives recv_counts[r] rows from rank r in rank
  // order (MoE token dispatch and combine; counts differ per rank and step). Same dtype and
  // trailing shape on both sides.
  virtual void all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& recv_counts,
                          const std::vector<int64_t>& send_counts) = 0;
};

namespace detail {
struct FinishedWork final : Work {
  void wait() override {}
};
}  // namespace detail
inline std::shared_ptr<Work> Communicator::reduce_scatter_async(at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  reduce_scatter(out, in, op);
  return std::make_shared<detail::FinishedWork>();
}
inline std::shared_ptr<Work> Communicator::all_gather_async(at::Tensor& out, const at::Tensor& in) {
  all_gather(out, in);
  return std::make_shared<detail::FinishedWork>();
}

// Checks all_to_all's arguments for a group of `size` (throws std::invalid_argument saying
// what does not match); returns the bytes of one row.
int64_t check_all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& recv_counts,
                         const std::vector<int64_t>& send_counts, int size);

// Duplicates `comm`, so the communicator owns its own MPI context.
std::shared_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);
// A group of one (for TP = 1 or DP = 1): every collective is the identity.
std::shared_ptr<Communicator> make_self_communicator();
// backend: "mpi" or "nccl". "nccl" throws when this build has no NCCL.
std::shared_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm comm, int device_index = 0);

bool nccl_available();                       // built with NCCL
std::optional<std::string> nccl_version();   // "2.27.3" when built with NCCL

}  // namespace ac::dist

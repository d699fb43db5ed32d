// NcclCommunicator: collectives on CUDA tensors through NCCL, bootstrapped over MPI (rank 0
// creates the unique id, MPI_Bcast shares it). Compiled whenever CUDA and NCCL are found;
// it talks to the CUDA runtime API directly so that it also builds against a CPU-only
// LibTorch. With a CUDA LibTorch, collectives run on the current torch CUDA stream, so they
// are ordered with the kernels that produced and consume the tensors.
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdexcept>

#include "autocompress/build_info.h"
#include "dist/communicator.h"
#include "dist/error.h"

#if AC_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ac::dist {
namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}
void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(rc));
}

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    default: throw std::invalid_argument(std::string("nccl: unsupported dtype ") + c10::toString(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Avg: return ncclAvg;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, int device_index) : device_(device_index) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    ncclUniqueId id;
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    at::Tensor c = prepare(t, "all_reduce");
    check_nccl(ncclAllReduce(c.data_ptr(), c.data_ptr(), c.numel(), nccl_type(c.scalar_type()), nccl_op(op), comm_,
                             stream()),
               "ncclAllReduce");
    if (!c.is_same(t)) t.copy_(c);
  }
  void all_gather(at::Tensor& out, const at::Tensor& in) override {
    at::Tensor src = prepare(in, "all_gather");
    at::Tensor dst = prepare(out, "all_gather");
    if (dst.numel() != src.numel() * size_) throw std::invalid_argument("all_gather: out must hold size() x in");
    check_nccl(ncclAllGather(src.data_ptr(), dst.data_ptr(), src.numel(), nccl_type(src.scalar_type()), comm_,
                             stream()),
               "ncclAllGather");
    if (!dst.is_same(out)) out.copy_(dst);
  }
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    at::Tensor src = prepare(in, "reduce_scatter");
    at::Tensor dst = prepare(out, "reduce_scatter");
    if (src.numel() != dst.numel() * size_) throw std::invalid_argument("reduce_scatter: in must hold size() x out");
    check_nccl(ncclReduceScatter(src.data_ptr(), dst.data_ptr(), dst.numel(), nccl_type(src.scalar_type()),
                                 nccl_op(op), comm_, stream()),
               "ncclReduceScatter");
    if (!dst.is_same(out)) out.copy_(dst);
  }
  void broadcast(at::Tensor& t, int root) override {
    at::Tensor c = prepare(t, "broadcast");
    check_nccl(ncclBroadcast(c.data_ptr(), c.data_ptr(), c.numel(), nccl_type(c.scalar_type()), root, comm_,
                             stream()),
               "ncclBroadcast");
    if (!c.is_same(t)) t.copy_(c);
  }
  void barrier() override {
    // A one-element all-reduce on the stream, then wait for it: every rank has arrived.
    void* buf = nullptr;
    check_cuda(cudaMalloc(&buf, sizeof(float)), "cudaMalloc");
    check_nccl(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm_, stream()), "ncclAllReduce");
    check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    cudaFree(buf);
  }

 private:
  at::Tensor prepare(const at::Tensor& t, const char* what) const {
    if (!t.defined() || !t.device().is_cuda())
      throw std::invalid_argument(std::string(what) + ": the NCCL communicator takes CUDA tensors");
    return t.contiguous();
  }
  cudaStream_t stream() const {
#if AC_TORCH_HAS_CUDA
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
#else
    return cudaStreamLegacy;  // no torch streams in a CPU LibTorch: the legacy default stream
#endif
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
};

}  // namespace

bool nccl_available() { return true; }

std::optional<std::string> nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return std::nullopt;
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}

std::shared_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device_index) {
  return std::make_shared<NcclCommunicator>(comm, device_index);
}

}  // namespace ac::dist

// NcclCommunicator: collectives on CUDA tensors through NCCL, bootstrapped over MPI (rank 0
// creates the unique id, MPI_Bcast shares it). Compiled whenever CUDA and NCCL are found;
// it talks to the CUDA runtime API directly so that it also builds against a CPU-only
// LibTorch. With a CUDA LibTorch, the blocking collectives run on the current torch CUDA
// stream, so they are ordered with the kernels that produced and consume the tensors; the
// *_async ones run on a communication stream of their own, with events both ways.
//
// Errors and hangs (docs/gpu.md "NCCL errors and timeouts"): the communicator is created
// nonblocking (NCCL >= 2.14), so that its init and every call can be polled with a timeout;
// every collective is registered with a CollectiveWatchdog (an end event per collective),
// whose thread aborts the communicator (ncclCommAbort) and the job (MPI_Abort) when one has
// been in flight longer than AC_NCCL_TIMEOUT or NCCL reports an asynchronous error; a failed
// call aborts the communicator before its exception leaves.
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include "autocompress/build_info.h"
#include "dist/collective_watchdog.h"
#include "dist/communicator.h"
#include "dist/error.h"

#if AC_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define AC_NCCL_NONBLOCKING 1  // ncclConfig_t.blocking, ncclCommInitRankConfig, ncclCommFinalize
#else
#define AC_NCCL_NONBLOCKING 0
#endif

namespace ac::dist {
namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
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

std::string describe(const char* op, const at::Tensor& t) {
  return std::string(op) + " of " + std::to_string(t.numel()) + " " + c10::toString(t.scalar_type());
}

// A CUDA event that is destroyed with its last owner (an event still pending is released by
// CUDA once it completes).
using EventPtr = std::shared_ptr<std::remove_pointer_t<cudaEvent_t>>;
EventPtr record_event(cudaStream_t stream) {
  cudaEvent_t ev = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  EventPtr owned(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
  check_cuda(cudaEventRecord(ev, stream), "cudaEventRecord");
  return owned;
}

// What an asynchronous collective keeps alive until its stream is done with it: released by
// wait() (the current stream is then ordered after the collective, so the caching allocator
// may reuse the memory there) or, if wait() is never called, by the watchdog when the end
// event has completed.
struct Stash {
  std::vector<at::Tensor> tensors;
};

class NcclWork final : public Work {
 public:
  NcclWork(EventPtr end, std::shared_ptr<Stash> stash, int device)
      : end_(std::move(end)), stash_(std::move(stash)), device_(device) {}
  void wait() override {
    if (!end_) return;
#if AC_TORCH_HAS_CUDA
    cudaStream_t current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
#else
    cudaStream_t current = cudaStreamLegacy;
#endif
    check_cuda(cudaStreamWaitEvent(current, end_.get(), 0), "cudaStreamWaitEvent");
    stash_->tensors.clear();
    end_.reset();
  }

 private:
  EventPtr end_;
  std::shared_ptr<Stash> stash_;
  int device_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, int device_index) : device_(device_index), timeout_s_(nccl_timeout_seconds()) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    name_ = "NCCL group of " + std::to_string(size_) + " ranks (rank " + std::to_string(rank_) + ", cuda:" +
            std::to_string(device_) + ")";
    ncclUniqueId id;
    if (rank_ == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&id);
      if (rc != ncclSuccess) throw std::runtime_error(std::string("ncclGetUniqueId: ") + ncclGetErrorString(rc));
    }
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
#if AC_NCCL_NONBLOCKING
    // Nonblocking: the init returns at once and is polled, so a peer that never joins (it died
    // before this point) ends in a timeout and an abort instead of a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
#else
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
#endif
#if AC_TORCH_HAS_CUDA
    comm_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, static_cast<c10::DeviceIndex>(device_)).stream();
#endif
    WatchdogHooks hooks;
    hooks.now = steady_seconds;
    hooks.async_error = [this]() -> std::string {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return "ncclCommGetAsyncError failed";
      if (state == ncclSuccess || state == ncclInProgress) return "";
      return ncclGetErrorString(state);
    };
    hooks.abort = [this](const std::string& reason) { abort_job(reason); };
    watchdog_ = std::make_unique<CollectiveWatchdog>(name_, timeout_s_, hooks);
    watchdog_->start(/*interval_s=*/0.5);
  }

  ~NcclCommunicator() override {
    if (watchdog_) watchdog_->stop();
    if (comm_ == nullptr || aborted_) return;
    // Unwinding from an error, or a watchdog failure: the peers may never reach their
    // matching calls, so abort (local, never waits) rather than finalize (waits for them).
    if (std::uncaught_exceptions() > 0 || (watchdog_ && watchdog_->failed())) {
      abort_comm();
      return;
    }
#if AC_NCCL_NONBLOCKING
    const ncclResult_t rc = ncclCommFinalize(comm_);
    const bool finished =
        (rc == ncclSuccess || rc == ncclInProgress) &&
        wait_while([this] { return async_state() == ncclInProgress; }, timeout_s_, steady_seconds, pause);
    if (!finished || async_state() != ncclSuccess) {
      abort_comm();
      return;
    }
#endif
    ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    at::Tensor c = prepare(t, "all_reduce");
    issue(describe("all_reduce", c), stream(), [&](cudaStream_t s) {
      return ncclAllReduce(c.data_ptr(), c.data_ptr(), c.numel(), nccl_type(c.scalar_type()), nccl_op(op), comm_, s);
    });
    if (!c.is_same(t)) t.copy_(c);
  }
  void all_gather(at::Tensor& out, const at::Tensor& in) override {
    at::Tensor src = prepare(in, "all_gather");
    at::Tensor dst = prepare(out, "all_gather");
    if (dst.numel() != src.numel() * size_) throw std::invalid_argument("all_gather: out must hold size() x in");
    issue(describe("all_gather", src), stream(), [&](cudaStream_t s) {
      return ncclAllGather(src.data_ptr(), dst.data_ptr(), src.numel(), nccl_type(src.scalar_type()), comm_, s);
    });
    if (!dst.is_same(out)) out.copy_(dst);
  }
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    at::Tensor src = prepare(in, "reduce_scatter");
    at::Tensor dst = prepare(out, "reduce_scatter");
    if (src.numel() != dst.numel() * size_) throw std::invalid_argument("reduce_scatter: in must hold size() x out");
    issue(describe("reduce_scatter", src), stream(), [&](cudaStream_t s) {
      return ncclReduceScatter(src.data_ptr(), dst.data_ptr(), dst.numel(), nccl_type(src.scalar_type()),
                               nccl_op(op), comm_, s);
    });
    if (!dst.is_same(out)) out.copy_(dst);
  }
  void broadcast(at::Tensor& t, int root) override {
    at::Tensor c = prepare(t, "broadcast");
    issue(describe("broadcast", c), stream(), [&](cudaStream_t s) {
      return ncclBroadcast(c.data_ptr(), c.data_ptr(), c.numel(), nccl_type(c.scalar_type()), root, comm_, s);
    });
    if (!c.is_same(t)) t.copy_(c);
  }
  // Grouped point-to-point send/recv (NCCL has no all-to-all-v): one group, so the 2 x size
  // operations are issued together and cannot deadlock on their order.
  void all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& recv_counts,
                  const std::vector<int64_t>& send_counts) override {
    const int64_t row = check_all_to_all(out, in, recv_counts, send_counts, size_);
    at::Tensor src = prepare(in, "all_to_all");
    at::Tensor dst = prepare(out, "all_to_all");
    auto* sp = static_cast<char*>(src.data_ptr());
    auto* rp = static_cast<char*>(dst.data_ptr());
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      const size_t sb = size_t(send_counts[size_t(r)] * row), rb = size_t(recv_counts[size_t(r)] * row);
      if (sb) check_nccl(ncclSend(sp, sb, ncclUint8, r, comm_, stream()), "ncclSend");
      if (rb) check_nccl(ncclRecv(rp, rb, ncclUint8, r, comm_, stream()), "ncclRecv");
      sp += sb, rp += rb;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    if (!dst.is_same(out)) out.copy_(dst);
  }
  void barrier() override {
    // A one-element all-reduce on the stream, then wait for it: every rank has arrived. A peer
    // that never arrives leaves this host thread in the synchronize; the watchdog ends it.
    void* buf = nullptr;
    check_cuda(cudaMalloc(&buf, sizeof(float)), "cudaMalloc");
    issue("barrier", stream(), [&](cudaStream_t s) { return ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm_, s); });
    check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    cudaFree(buf);
  }

#if AC_TORCH_HAS_CUDA
  // On the communication stream: it first waits for what the current stream has issued (the
  // producers of `in`), the collective runs there while the current stream goes on, and
  // wait() makes the current stream wait for its end event. `in` and `out` stay alive until
  // then (or until the collective is done, if wait() is never called).
  std::shared_ptr<Work> reduce_scatter_async(at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    check_async_args(out, in, "reduce_scatter_async");
    if (in.numel() != out.numel() * size_) throw std::invalid_argument("reduce_scatter_async: in must hold size() x out");
    return issue_async(describe("reduce_scatter (async)", in), {in, out}, [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in.scalar_type()), nccl_op(op),
                               comm_, s);
    });
  }
  std::shared_ptr<Work> all_gather_async(at::Tensor& out, const at::Tensor& in) override {
    check_async_args(out, in, "all_gather_async");
    if (out.numel() != in.numel() * size_) throw std::invalid_argument("all_gather_async: out must hold size() x in");
    return issue_async(describe("all_gather (async)", in), {in, out}, [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in.scalar_type()), comm_, s);
    });
  }
#endif

 private:
  // Every NCCL call's result. In progress (a nonblocking communicator): poll until it is done,
  // up to the timeout, before anything else is issued (NCCL's rule). An error or a timeout:
  // abort the communicator, then throw (the job-wide abort stops the other ranks).
  void check_nccl(ncclResult_t rc, const char* what) {
    if (rc == ncclInProgress) {
      if (!wait_while([this] { return async_state() == ncclInProgress; }, timeout_s_, steady_seconds, pause)) {
        fail(std::string(what) + ": still in progress after " + std::to_string(static_cast<long>(timeout_s_)) +
             " s (AC_NCCL_TIMEOUT): a peer is missing");
      }
      rc = async_state();
    }
    if (rc != ncclSuccess) fail(std::string(what) + ": " + ncclGetErrorString(rc) + last_error());
  }
  ncclResult_t async_state() const {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    return rc != ncclSuccess ? rc : state;
  }
  static void pause() { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }
  std::string last_error() const {
    const char* s = ncclGetLastError(comm_);
    return s != nullptr && *s != '\0' ? std::string(" (") + s + ")" : std::string();
  }
  // ncclCommAbort once, from whichever thread gets there first.
  void abort_comm() {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (comm_ != nullptr && !aborted_.exchange(true)) ncclCommAbort(comm_);
  }
  [[noreturn]] void fail(const std::string& message) {
    abort_comm();
    throw std::runtime_error(name_ + ": " + message + "; the NCCL communicator was aborted");
  }
  // The watchdog's verdict (its thread): free the GPU's spinning kernels, then stop every rank.
  // MPI_Abort from this thread: the main thread may be blocked in a CUDA synchronize for good.
  void abort_job(const std::string& reason) {
    abort_comm();
    std::fprintf(stderr, "[rank %d/%d] autocompress: error: %s; the NCCL communicator was aborted, stopping the job\n",
                 world_rank_, world_size_, reason.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  template <class Call>
  EventPtr issue(const std::string& what, cudaStream_t s, Call&& call, std::shared_ptr<void> keep = nullptr) {
    if (aborted_ || watchdog_->failed()) throw std::runtime_error(name_ + ": " + what + ": the communicator was aborted");
    check_nccl(call(s), what.c_str());
    EventPtr end = record_event(s);
    watchdog_->add(what, [end] { return cudaEventQuery(end.get()) != cudaErrorNotReady; }, std::move(keep));
    return end;
  }

#if AC_TORCH_HAS_CUDA
  void check_async_args(const at::Tensor& out, const at::Tensor& in, const char* what) const {
    for (const at::Tensor* t : {&out, &in})
      if (!t->defined() || !t->device().is_cuda() || !t->is_contiguous())
        throw std::invalid_argument(std::string(what) + ": the NCCL communicator takes contiguous CUDA tensors");
  }
  template <class Call>
  std::shared_ptr<Work> issue_async(const std::string& what, std::vector<at::Tensor> tensors, Call&& call) {
    // The communication stream waits for the producers on the current stream (the host does not).
    EventPtr ready = record_event(stream());
    check_cuda(cudaStreamWaitEvent(comm_stream_, ready.get(), 0), "cudaStreamWaitEvent");
    auto stash = std::make_shared<Stash>();
    stash->tensors = std::move(tensors);
    EventPtr end = issue(what, comm_stream_, std::forward<Call>(call), stash);
    return std::make_shared<NcclWork>(std::move(end), std::move(stash), device_);
  }
#endif

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
  int rank_ = 0, size_ = 1, device_ = 0, world_rank_ = 0, world_size_ = 1;
  double timeout_s_;
  std::string name_;
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  cudaStream_t comm_stream_ = nullptr;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
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

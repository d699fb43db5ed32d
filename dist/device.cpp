// The device resolver (see device.h).
#include "dist/device.h"

#include <ATen/Context.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <stdexcept>

#include "autocompress/build_info.h"
#if AC_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include "dist/communicator.h"
#include "dist/error.h"

namespace ac::dist {

DeviceFacts device_facts(int local_rank) {
  DeviceFacts f;
  f.build_has_cuda = AC_TORCH_HAS_CUDA;
  f.build_has_nccl = nccl_available();
  f.local_rank = local_rank;
  if (f.build_has_cuda) f.device_count = static_cast<int>(torch::cuda::device_count());
  return f;
}

DeviceChoice choose_device(const std::string& requested, const DeviceFacts& f, const std::string& what) {
  if (requested != "auto" && requested != "cpu" && requested != "cuda")
    throw InputError(what, requested, "expected auto, cpu or cuda");
  DeviceChoice c;
  c.automatic = requested == "auto";
  const std::string lr = std::to_string(f.local_rank);
  // Why CUDA cannot be used here, or "" when it can.
  std::string no_cuda;
  if (!f.build_has_cuda)
    no_cuda = "this build has no CUDA (its LibTorch is CPU-only)";
  else if (f.device_count <= 0)
    no_cuda = "no GPU visible (this CUDA build sees 0 devices; check CUDA_VISIBLE_DEVICES and the driver)";
  else if (f.local_rank >= f.device_count)
    no_cuda = "no GPU visible for local rank " + lr + ": only " + std::to_string(f.device_count) +
              " visible on this node (one rank per GPU)";
  if (requested == "cpu") {
    c.reason = "--device cpu";
    return c;
  }
  if (!no_cuda.empty()) {
    if (requested == "cuda") throw InputError(what, "cuda", no_cuda);
    c.reason = "auto: " + no_cuda;
    return c;
  }
  c.cuda = true;
  c.index = f.local_rank;
  c.device = "cuda:" + std::to_string(c.index);
  c.reason = std::string(c.automatic ? "auto: " : "--device cuda: ") + "local rank " + lr + " of " +
             std::to_string(f.device_count) + " visible GPUs";
  return c;
}

DeviceChoice choose_device(const std::string& requested, int local_rank, const std::string& what) {
  return choose_device(requested, device_facts(local_rank), what);
}

int local_rank_of(MPI_Comm world) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                           "MV2_COMM_WORLD_LOCAL_RANK"}) {
    if (const char* v = std::getenv(name)) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && r >= 0) return static_cast<int>(r);
    }
  }
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int node_rank = 0;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_free(&node);
  return node_rank;
}

std::shared_ptr<Communicator> make_device_communicator(MPI_Comm comm, const DeviceChoice& choice) {
  if (!choice.cuda) return make_mpi_communicator(comm);
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (size == 1) return make_self_communicator();
  if (!nccl_available())
    throw InputError("--device", choice.device,
                     "a group of " + std::to_string(size) + " CUDA ranks needs NCCL, and this build has none");
  return make_communicator("nccl", comm, choice.index);
}

void cuda_synchronize(int index) { torch::cuda::synchronize(index); }

#if AC_TORCH_HAS_CUDA
// allocated_bytes[0]: the aggregate over pool types (StatType::AGGREGATE in every release).
int64_t cuda_allocated_bytes(int index) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index)).allocated_bytes[0].current;
}
int64_t cuda_peak_allocated_bytes(int index) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index)).allocated_bytes[0].peak;
}
void reset_cuda_peak(int index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
}
#else
namespace {
[[noreturn]] void no_cuda() { throw std::runtime_error("CUDA memory statistics: this build has no CUDA"); }
}  // namespace
int64_t cuda_allocated_bytes(int) { no_cuda(); }
int64_t cuda_peak_allocated_bytes(int) { no_cuda(); }
void reset_cuda_peak(int) { no_cuda(); }
#endif

bool apply_tf32_policy(const DeviceChoice& choice) {
  const char* env = std::getenv("AC_ALLOW_TF32");
  const bool allow = env != nullptr && std::string(env) == "1";
  if (choice.cuda) {
    at::globalContext().setAllowTF32CuBLAS(allow);
    at::globalContext().setAllowTF32CuDNN(allow);
  }
  return choice.cuda && allow;
}

}  // namespace ac::dist

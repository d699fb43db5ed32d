// The one device resolver: `--device auto|cpu|cuda` plus what this build and this node have
// -> the torch device a rank uses, the reason (for progress headers and manifests) and the
// communicator backend its collectives take. Every stage that builds a model or tensors
// resolves its device here, before any model is built.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <mpi.h>
#include <string>

namespace ac::dist {

class Communicator;

// What the choice depends on. Unit tests inject them; device_facts() reads this process's.
struct DeviceFacts {
  bool build_has_cuda = false;  // the LibTorch in use was built with CUDA
  int device_count = 0;         // CUDA devices visible to this process
  int local_rank = 0;           // rank among this node's processes (one rank per GPU)
  bool build_has_nccl = false;  // the NCCL communicator is compiled in
};

// This process's facts (torch::cuda::device_count() only where the build has CUDA).
DeviceFacts device_facts(int local_rank);

struct DeviceChoice {
  std::string device = "cpu";  // "cpu" | "cuda:<index>"
  bool cuda = false;
  int index = -1;              // CUDA device index; -1 on the CPU
  std::string reason;          // one line: why this device
  bool automatic = false;      // chosen by "auto"
  c10::Device torch_device() const { return cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)) : c10::Device(c10::kCPU); }
  // The communicator backend for tensors on this device: "nccl" for CUDA, "mpi" for CPU.
  std::string backend() const { return cuda ? "nccl" : "mpi"; }
};

// `requested` is "auto", "cpu", "cuda" or "cuda:<local index>"-free spellings only (anything
// else throws ac::InputError naming `what`). "auto": cuda:<local rank> when the build has CUDA
// and this node has more GPUs than the local rank, else cpu (the reason says which fact
// decided). "cuda" throws ac::InputError ("this build has no CUDA" / "no GPU visible" /
// "local rank N but only M GPUs visible") -- on every rank, since every rank resolves it.
DeviceChoice choose_device(const std::string& requested, const DeviceFacts& facts, const std::string& what = "--device");
// The same with this process's facts.
DeviceChoice choose_device(const std::string& requested, int local_rank, const std::string& what = "--device");

// Node-local rank of this process: the launcher's environment (OMPI_COMM_WORLD_LOCAL_RANK,
// SLURM_LOCALID, ...), else its rank in `world`'s shared-memory split (collective then).
int local_rank_of(MPI_Comm world);

// A communicator over `comm` for tensors on `choice`'s device: NCCL for CUDA tensors (throws
// ac::InputError when the build has no NCCL and the group has more than one rank), MPI for
// CPU tensors, the identity for a group of one.
std::shared_ptr<Communicator> make_device_communicator(MPI_Comm comm, const DeviceChoice& choice);

// CUDA device `index`: wait for all its streams; live bytes of its tensors and their peak since
// reset_cuda_peak (the caching allocator's allocated-bytes statistics, what `cost validate
// --device cuda` measures memory with). In a build without CUDA they throw.
void cuda_synchronize(int index);
int64_t cuda_allocated_bytes(int index);
int64_t cuda_peak_allocated_bytes(int index);
void reset_cuda_peak(int index);

// TF32 matmuls (CUDA only) off unless AC_ALLOW_TF32=1: fp32 stays fp32 (docs/gpu.md).
// Returns whether TF32 is allowed. A no-op on the CPU.
bool apply_tf32_policy(const DeviceChoice& choice);

}  // namespace ac::dist

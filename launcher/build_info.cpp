// Build features and library versions for `env` and manifests.
#include "launcher/build_info.h"

#include <ATen/Parallel.h>
#include <cstdlib>
#include <hdf5.h>
#include <mpi.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include "autocompress/build_info.h"
#include "dist/communicator.h"
#include "dist/cpu_features.h"
#include "dist/omp_env.h"
#include "dist/runtime.h"
#include "dist/tensor_memory.h"

namespace ac::launcher {

nlohmann::json build_features() {
  nlohmann::json j;
  j["autocompress"] = {{"version", AC_VERSION}, {"git", AC_GIT_DESCRIBE}, {"build_type", AC_BUILD_TYPE},
                       {"compiler", AC_CXX_COMPILER}};
  j["libtorch"] = {{"version", TORCH_VERSION}, {"cuda", bool(AC_TORCH_HAS_CUDA)}};
  int mpi_major = 0, mpi_minor = 0;
  MPI_Get_version(&mpi_major, &mpi_minor);
  j["mpi"] = {{"library", dist::mpi_library_version()},
              {"standard", std::to_string(mpi_major) + "." + std::to_string(mpi_minor)}};
  unsigned h5_major = 0, h5_minor = 0, h5_rel = 0;
  H5get_libversion(&h5_major, &h5_minor, &h5_rel);
  j["hdf5"] = {{"version", std::to_string(h5_major) + "." + std::to_string(h5_minor) + "." + std::to_string(h5_rel)},
#ifdef H5_HAVE_PARALLEL
               {"parallel", true}};
#else
               {"parallel", false}};
#endif
  const auto nccl = dist::nccl_version();
  j["nccl"] = {{"built", dist::nccl_available()}, {"version", nccl ? *nccl : std::string()}};
  j["cuda"] = {{"toolkit", std::string(AC_CUDA_TOOLKIT_VERSION)},
               {"torch_cuda_available", torch::cuda::is_available()},
               {"devices", torch::cuda::is_available() ? torch::cuda::device_count() : 0}};
  auto env_or_empty = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  j["cpu_tensor_cache"] = {{"installed", dist::tensor_memory::installed()},
                           {"limit_bytes", dist::tensor_memory::cache_limit()}};
  j["threads"] = {{"intra_op", at::get_num_threads()}, {"inter_op", at::get_num_interop_threads()},
                  {"omp_wait_policy", env_or_empty("OMP_WAIT_POLICY")},
                  {"gomp_spincount", env_or_empty("GOMP_SPINCOUNT")},  // set by the launcher unless the user set one of them
                  {"openblas", dist::blas_threads()}};  // 0: LibTorch's BLAS is not OpenBLAS
  // Set by the launcher unless the user set them (dist/omp_env.h, default_primitive_caches).
  j["onednn_caches"] = {{"primitive_cache_capacity", env_or_empty("ONEDNN_PRIMITIVE_CACHE_CAPACITY")},
                        {"ideep_lru_cache_capacity", env_or_empty("LRU_CACHE_CAPACITY")}};
  const dist::CpuFeatures& cpu = dist::detect_cpu();
  const dist::DtypeChoice automatic = dist::choose_dtype("auto", torch::cuda::is_available());
  j["cpu"] = {{"vendor", cpu.vendor}, {"model", cpu.model},
              {"avx2", cpu.avx2}, {"avx512f", cpu.avx512f}, {"avx512_bf16", cpu.avx512_bf16}, {"amx_bf16", cpu.amx_bf16},
              {"dtype_auto", automatic.dtype}, {"dtype_auto_reason", automatic.reason},
              {"denormals_flushed", dist::denormals_flushed()}};  // main() set it unless AC_KEEP_DENORMALS=1
  return j;
}

}  // namespace ac::launcher

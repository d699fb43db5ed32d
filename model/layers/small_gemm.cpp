// Dispatch and torch glue for the small-M linear kernel (small_gemm_kernel.inc).
#include "model/layers/small_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace ac::model {

// The signature of small_gemm_kernel.inc's entry point, once per instruction set.
using KernelFn = void(const float* x, int64_t ldx, int64_t M, const float* w, int64_t ldw, int64_t K, int64_t N,
                      float* y, int64_t ldy, float* xt, int threads);
using Kernel = KernelFn*;

#ifdef AC_SMALL_GEMM_X86
namespace kernels {
KernelFn small_linear_f32_avx2, small_linear_f32_avx512;
}  // namespace kernels
#endif

namespace {

bool cpu_has(const std::string& isa) {
#ifdef AC_SMALL_GEMM_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == "avx2") return avx2;
  if (isa == "avx512") return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
#endif
  (void)isa;
  return false;
}

Kernel kernel_for(const std::string& isa) {
#ifdef AC_SMALL_GEMM_X86
  if (!cpu_has(isa)) return nullptr;
  if (isa == "avx2") return kernels::small_linear_f32_avx2;
  if (isa == "avx512") return kernels::small_linear_f32_avx512;
#endif
  (void)isa;
  return nullptr;
}

}  // namespace

const std::string& small_linear_isa() {
  static const std::string isa = [] {
    const char* env = std::getenv("AC_SMALL_GEMM");
    const std::string want = env ? env : "";
    if (want == "0") return std::string();
    // "avx2" caps an AVX-512 machine at the AVX2 kernel (the AVX2-only class's path, emulated).
    bool allowed = want != "avx2";
    for (const char* c : {"avx512", "avx2"}) {
      allowed = allowed || want == c;
      if (allowed && cpu_has(c)) return std::string(c);
    }
    return std::string();
  }();
  return isa;
}

torch::Tensor small_linear(const torch::Tensor& x, const torch::Tensor& w, const std::string& isa) {
  static const Kernel default_kernel = kernel_for(small_linear_isa());  // resolved once, not per call
  const Kernel kernel = isa.empty() ? default_kernel : kernel_for(isa);
  if (!kernel || x.dim() < 1 || w.dim() != 2) return {};
  const int64_t K = x.size(-1), N = w.size(0);
  if (K == 0 || w.size(1) != K || x.scalar_type() != torch::kFloat32 || w.scalar_type() != torch::kFloat32 ||
      !x.device().is_cpu() || !w.device().is_cpu() || !w.is_contiguous())
    return {};
  const int64_t M = x.numel() / K;
  const int threads = at::get_num_threads();
#ifndef AC_SMALL_GEMM_OPENMP
  if (threads > 1) return {};  // the kernels were built without OpenMP: BLAS's threads instead
#endif
  if (M < 2 || M > 16) return {};
  const torch::Tensor x2 = x.reshape({M, K}).contiguous();
  torch::Tensor y = torch::empty({M, N}, x.options());
  thread_local std::vector<float> xt;
  xt.resize(size_t(K) * 16);
  kernel(x2.data_ptr<float>(), K, M, w.data_ptr<float>(), K, K, N, y.data_ptr<float>(), N, xt.data(), threads);
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  return y.view(sizes);
}

}  // namespace ac::model

// y = x W^T for a few rows of x on the CPU, without the BLAS GEMM's packed copy of W: the
// matrix product of a decode step of 2-16 sequences (model/layers/small_gemm_kernel.inc).
// At M = 8 on the real teacher's shapes, weights streamed from memory as in a decode step:
// 1.4-1.5x OpenBLAS's linear at 1 thread, 1.6-1.8x at 2 (bench/bench_small_gemm.cpp,
// docs/benchmarks.md).
#pragma once

#include <torch/torch.h>

#include <string>

namespace ac::model {

// The kernel this CPU gets: "avx512" (AVX-512F + VL + FMA), "avx2" (AVX2 + FMA), or "" when
// none applies (not an x86-64 build, an older CPU, or AC_SMALL_GEMM=0 in the environment).
// AC_SMALL_GEMM=avx2 picks the AVX2 kernel on an AVX-512 CPU too.
const std::string& small_linear_isa();

// x [..., K] float32 with 2 <= x.numel() / K <= 16 rows, w [N, K] float32 contiguous, both on
// the CPU: x W^T with the kernel for `isa` ("" = small_linear_isa()). Returns an undefined
// tensor when any of that does not hold or the kernel is unavailable, so the caller can fall
// back to torch's linear. No autograd: callers use it only when no gradient is recorded.
// Threads: at::get_num_threads(), splitting the rows of W (OpenMP in the kernel files; a build
// without OpenMP declines at more than one thread and leaves it to the threaded BLAS GEMM).
torch::Tensor small_linear(const torch::Tensor& x, const torch::Tensor& w, const std::string& isa = "");

}  // namespace ac::model

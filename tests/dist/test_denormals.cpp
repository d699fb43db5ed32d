// Denormals flushed to zero (dist/omp_env.h): set by the test main as by the launcher, on every
// thread that computes (the caller, ATen's OpenMP workers, OpenBLAS's pool), and kept on request.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "dist/omp_env.h"

namespace {

constexpr float kDenormal = 1e-39f;  // below float's smallest normal, 1.18e-38

#if defined(__x86_64__) || defined(__i386__)
TEST(Denormals, FlushedByTheMainOnEveryComputeThread) {
  if (const char* keep = std::getenv("AC_KEEP_DENORMALS"); keep && std::string(keep) == "1")
    GTEST_SKIP() << "AC_KEEP_DENORMALS=1 in the environment: the default is not in force";
  ASSERT_TRUE(ac::dist::denormals_flushed());  // tests/gtest_main.cpp, as launcher/main.cpp
  ac::dist::ScopedComputeThreads threads(2);
  // A GEMM large enough for OpenBLAS's pool and an elementwise op large enough for ATen's
  // OpenMP split: read as zero (DAZ) on whichever thread computes a slice, not 1e-29 per term.
  const auto a = torch::full({1024, 1024}, kDenormal), b = torch::full({1024, 1024}, 1e10f);
  EXPECT_EQ(torch::mm(a, b).count_nonzero().item<int64_t>(), 0);
  EXPECT_EQ((a.repeat({8, 1}) * 1e10f).count_nonzero().item<int64_t>(), 0);
  // An exp into the denormal range gives zero (FTZ), not 5.5e-42.
  EXPECT_EQ(torch::exp(torch::full({1 << 20}, -95.0f)).count_nonzero().item<int64_t>(), 0);
}

TEST(Denormals, KeptWithAcKeepDenormals) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved & ~0x8040u);  // this thread as a process that never flushed
  setenv("AC_KEEP_DENORMALS", "1", 1);
  EXPECT_FALSE(ac::dist::default_flush_denormals());
  EXPECT_FALSE(ac::dist::denormals_flushed());
  // One element: computed on this thread, where the denormal is now kept.
  EXPECT_GT((torch::full({1}, kDenormal) * 1e10f).item<float>(), 0.0f);
  unsetenv("AC_KEEP_DENORMALS");
  EXPECT_TRUE(ac::dist::default_flush_denormals());
  EXPECT_EQ((torch::full({1}, kDenormal) * 1e10f).item<float>(), 0.0f);
  _mm_setcsr(saved);
}
#endif

}  // namespace

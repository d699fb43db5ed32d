// gtest main for single-process suites: the CPU defaults the autocompress launcher sets before
// any tensor work (denormals flushed, dist/omp_env.h), so a test times and computes the kernels
// as a run does, then the usual gtest report.
#include <gtest/gtest.h>

#include "dist/omp_env.h"

int main(int argc, char** argv) {
  ac::dist::default_flush_denormals();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

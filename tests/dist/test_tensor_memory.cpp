// The CPU tensor allocator (dist/tensor_memory.h): live-byte counting and the reuse of freed
// large blocks, through real LibTorch tensors.
#include "dist/tensor_memory.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace mem = ac::dist::tensor_memory;

namespace {
constexpr int64_t kMiB = int64_t(1) << 20;

class TensorMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    mem::install();
    mem::set_cache_limit(64 * kMiB);
    mem::empty_cache();
  }
  void TearDown() override { mem::empty_cache(); }
};
}  // namespace

TEST_F(TensorMemory, AFreedLargeBlockIsReusedAndNotCountedLive) {
  const int64_t live = mem::current();
  auto a = torch::empty({3 * kMiB / 4}, torch::kFloat32);  // 3 MiB
  const void* where = a.data_ptr();
  EXPECT_EQ(mem::current() - live, 3 * kMiB);
  a.reset();
  EXPECT_EQ(mem::current(), live);
  EXPECT_GE(mem::cached(), 3 * kMiB);
  EXPECT_LT(mem::cached(), 3 * kMiB + kMiB);  // one block, rounded up to 512 KiB
  const int64_t cached = mem::cached();
  auto b = torch::empty({3 * kMiB / 4}, torch::kFloat32);
  EXPECT_EQ(b.data_ptr(), where) << "a request of the same size class takes the freed block";
  EXPECT_EQ(mem::cached(), 0) << "cached " << cached << " before";
  EXPECT_EQ(mem::current() - live, 3 * kMiB);
}

TEST_F(TensorMemory, SmallBlocksAreLeftToMalloc) {
  { auto a = torch::empty({1024}, torch::kFloat32); }
  EXPECT_EQ(mem::cached(), 0);
}

TEST_F(TensorMemory, TheCapReleasesTheLeastRecentlyFreed) {
  auto a = torch::empty({2 * kMiB}, torch::kUInt8), b = torch::empty({3 * kMiB}, torch::kUInt8),
       c = torch::empty({4 * kMiB}, torch::kUInt8);
  const void* where_b = b.data_ptr();
  const void* where_c = c.data_ptr();
  // Classes: 2 MiB + 64 B -> 2.5 MiB, 3.5 MiB, 4.5 MiB. Room for the last two only.
  mem::set_cache_limit(8 * kMiB + kMiB / 2);
  a.reset();
  b.reset();
  EXPECT_EQ(mem::cached(), 6 * kMiB);
  c.reset();  // a, the oldest, goes back to the system
  EXPECT_EQ(mem::cached(), 8 * kMiB);
  auto c2 = torch::empty({4 * kMiB}, torch::kUInt8);
  auto b2 = torch::empty({3 * kMiB}, torch::kUInt8);
  EXPECT_EQ(c2.data_ptr(), where_c);
  EXPECT_EQ(b2.data_ptr(), where_b);
  EXPECT_EQ(mem::cached(), 0);
  mem::set_cache_limit(0);  // caching off: a freed block goes straight back
  c2.reset();
  EXPECT_EQ(mem::cached(), 0);
}

TEST_F(TensorMemory, PeakCountsLiveBytesNotCachedOnes) {
  auto a = torch::ones({8 * kMiB / 4}, torch::kFloat32);
  a.reset();
  mem::reset_peak();
  const int64_t base = mem::peak();
  auto b = torch::ones({8 * kMiB / 4}, torch::kFloat32);  // reuses a's block
  EXPECT_EQ(mem::peak() - base, 8 * kMiB);
  EXPECT_EQ(b.sum().item<float>(), float(2 * kMiB)) << "a reused block holds what was written to it";
  mem::empty_cache();
  EXPECT_EQ(mem::cached(), 0);
}

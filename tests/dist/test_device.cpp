// The device resolver with injected facts (build has CUDA?, GPUs visible, local rank), as the
// DtypeAuto tests feed CPU feature sets.
#include <gtest/gtest.h>

#include <string>

#include "dist/device.h"
#include "dist/error.h"

namespace {

using ac::dist::choose_device;
using ac::dist::DeviceFacts;

DeviceFacts facts(bool cuda, int devices, int local_rank) {
  DeviceFacts f;
  f.build_has_cuda = cuda;
  f.device_count = devices;
  f.local_rank = local_rank;
  f.build_has_nccl = cuda;
  return f;
}

std::string refusal(const std::string& requested, const DeviceFacts& f) {
  try {
    choose_device(requested, f, "--device");
  } catch (const ac::InputError& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceAuto, PicksTheLocalRanksGpuWhenBuildAndNodeHaveOne) {
  const auto d = choose_device("auto", facts(true, 8, 3));
  EXPECT_TRUE(d.cuda);
  EXPECT_TRUE(d.automatic);
  EXPECT_EQ(d.device, "cuda:3");
  EXPECT_EQ(d.index, 3);
  EXPECT_EQ(d.backend(), "nccl");
  EXPECT_TRUE(d.torch_device().is_cuda());
  EXPECT_EQ(d.torch_device().index(), 3);
  EXPECT_NE(d.reason.find("local rank 3 of 8"), std::string::npos) << d.reason;
}

TEST(DeviceAuto, FallsBackToCpuAndSaysWhy) {
  const auto no_build = choose_device("auto", facts(false, 0, 0));
  EXPECT_FALSE(no_build.cuda);
  EXPECT_EQ(no_build.device, "cpu");
  EXPECT_EQ(no_build.backend(), "mpi");
  EXPECT_TRUE(no_build.torch_device().is_cpu());
  EXPECT_NE(no_build.reason.find("this build has no CUDA"), std::string::npos) << no_build.reason;

  const auto no_gpu = choose_device("auto", facts(true, 0, 0));
  EXPECT_EQ(no_gpu.device, "cpu");
  EXPECT_NE(no_gpu.reason.find("no GPU visible"), std::string::npos) << no_gpu.reason;

  // More ranks on the node than GPUs: the extra ranks do not share a GPU.
  const auto short_node = choose_device("auto", facts(true, 2, 2));
  EXPECT_EQ(short_node.device, "cpu");
  EXPECT_NE(short_node.reason.find("local rank 2"), std::string::npos) << short_node.reason;
}

TEST(DeviceCuda, RefusedWithTheFactThatDecided) {
  EXPECT_NE(refusal("cuda", facts(false, 0, 0)).find("this build has no CUDA"), std::string::npos);
  // A CPU-only build refuses on that ground even when the driver shows GPUs.
  EXPECT_NE(refusal("cuda", facts(false, 4, 0)).find("this build has no CUDA"), std::string::npos);
  EXPECT_NE(refusal("cuda", facts(true, 0, 0)).find("no GPU visible"), std::string::npos);
  const std::string short_node = refusal("cuda", facts(true, 1, 1));
  EXPECT_NE(short_node.find("no GPU visible for local rank 1"), std::string::npos) << short_node;
  EXPECT_NE(short_node.find("--device"), std::string::npos) << short_node;
  const auto ok = choose_device("cuda", facts(true, 2, 1));
  EXPECT_EQ(ok.device, "cuda:1");
  EXPECT_FALSE(ok.automatic);
}

TEST(DeviceCpu, AlwaysCpuAndUnknownSpellingsRefused) {
  const auto d = choose_device("cpu", facts(true, 8, 0));
  EXPECT_FALSE(d.cuda);
  EXPECT_EQ(d.device, "cpu");
  EXPECT_EQ(d.reason, "--device cpu");
  const std::string bad = refusal("tpu", facts(true, 8, 0));
  EXPECT_NE(bad.find("tpu"), std::string::npos) << bad;
  EXPECT_NE(bad.find("auto, cpu or cuda"), std::string::npos) << bad;
}

TEST(DeviceFacts, ThisProcess) {
  const auto f = ac::dist::device_facts(0);
  if (!f.build_has_cuda) EXPECT_EQ(f.device_count, 0);
  const auto d = choose_device("auto", 0);
  EXPECT_EQ(d.cuda, f.build_has_cuda && f.device_count > 0);
}

}  // namespace

// Calibration on this machine (quick mode): the fitted profile is a valid hardware profile,
// reproduces its own measurements, and predicts a GEMM size it was not fitted on.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "dist/error.h"
#include "search/costmodel/calibrate.h"
#include "search/costmodel/profiles.h"

using namespace ac::search;

TEST(CostCalibrate, QuickCalibrationFitsAndPredicts) {
  CalibrationOptions o;
  o.quick = true;
  o.min_seconds = 0.02;
  o.memory_bytes = 8e9;
  const CalibrationResult r = calibrate(o);
  const HardwareProfile& h = r.profile;
  EXPECT_EQ(h.id, "cpu-local");
  EXPECT_GT(h.peak_flops, 1e9);           // any CPU does more than 1 GFLOP/s in bf16 GEMMs
  EXPECT_LT(h.peak_flops, 1e14);
  EXPECT_GT(h.memory_bandwidth, 1e8);
  EXPECT_LT(h.memory_bandwidth, 1e13);
  EXPECT_GE(r.points.size(), 12u);
  EXPECT_GT(h.kernel_overhead_s, 0);    // one tiny framework op costs something
  EXPECT_LT(h.kernel_overhead_s, 1e-3); // and far less than a millisecond
  EXPECT_LT(r.mape, 1.0) << r.to_json().dump(1);  // two parameters per kind, on a shared, noisy machine
  // The JSON it writes is a loadable profile.
  const HardwareProfile back = hardware_from_json(r.to_json(), "cpu-local.json");
  EXPECT_DOUBLE_EQ(back.peak_flops, h.peak_flops);
  // A GEMM shape outside the fitted set is predicted within a factor of 5 (the CI machine is
  // 2 cores shared by several builds: this catches unit and fitting errors, not noise).
  torch::NoGradGuard ng;
  auto a = torch::randn({256, 1536}, torch::kBFloat16), b = torch::randn({1536, 1536}, torch::kBFloat16);
  (void)torch::matmul(a, b);
  double s = 1e9;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)torch::matmul(a, b);
    s = std::min(s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double pred = roofline_seconds(h, "gemm", 2.0 * 256 * 1536 * 1536, 2.0 * (2 * 256 * 1536 + 1536 * 1536));
  EXPECT_GT(pred / s, 1 / 5.0) << pred << " vs " << s;
  EXPECT_LT(pred / s, 5.0) << pred << " vs " << s;
}

TEST(CostCalibrate, BadOptions) {
  CalibrationOptions o;
  o.memory_bytes = 8e9;
  o.device = "tpu";
  EXPECT_THROW(calibrate(o), ac::InputError);
  o.device = "cpu";
  o.memory_bytes = 0;
  EXPECT_THROW(calibrate(o), ac::InputError);
}

// The device, dtype and rank grid of a job: `--device` and `--dtype` resolved once, and
// the layout record that manifests and checkpoints carry.
#pragma once

#include <torch/torch.h>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/cpu_features.h"
#include "dist/device.h"
#include "dist/parallel_layout.h"

namespace ac::job {

struct RunDevice {
  dist::DeviceChoice choice;
  torch::Device device{torch::kCPU};
  bool tf32 = false;
  dist::DtypeChoice dtype_choice;
  torch::Dtype dtype = torch::kFloat32;
};
// `--device`, `--dtype` resolved (dist::choose_device / choose_dtype), the TF32 policy applied.
// Call it first: `--device cuda` where there is none stops every rank before any model.
RunDevice choose_run_device(const std::string& device, int local_rank, const std::string& dtype);
// What the manifest and the checkpoints record of the layout (with the expert-TP size `etp`)
// and device.
nlohmann::json layout_json(const dist::ParallelLayout& layout, const RunDevice& d, int etp = 1);

}  // namespace ac::job

// What this binary was built with and runs on: versions of LibTorch, MPI, HDF5, NCCL,
// CUDA, threads. Printed by `autocompress env` and recorded in every run manifest.
#pragma once

#include <nlohmann/json.hpp>

namespace ac::launcher {

nlohmann::json build_features();

}  // namespace ac::launcher

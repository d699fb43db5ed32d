// Profiles of the local CPU belong to the machine that measured them. A CPU profile records
// the CPU model, ISA and dtype it was calibrated with (HardwareProfile::calibrated_on); this
// file says whether one describes this machine and keeps one calibrated profile per CPU,
// dtype and thread count in a per-user cache, calibrated on first use (`cpu-local`).
#pragma once

#include <functional>
#include <string>

#include "dist/cpu_features.h"
#include "search/costmodel/calibrate.h"
#include "search/costmodel/profiles.h"

namespace ac::search {

// The id that means "this machine's calibrated CPU profile".
inline constexpr const char* kLocalProfileId = "cpu-local";

// Why `hw` does not describe `cpu` running `dtype` ("bfloat16" | "float32"; "" = any):
// calibrated on another CPU model or ISA, in another dtype, or with no record of its machine.
// "" when it does, and for profiles of other devices (GPU profiles: no calibration points,
// no thread count).
std::string machine_mismatch(const HardwareProfile& hw, const dist::CpuFeatures& cpu, const std::string& dtype = "");

// <cache_dir>/hardware/cpu-local-<key>.json, the key a hash of the CPU model, ISA, dtype and
// thread count (another machine class or setting gets its own file).
std::string local_profile_path(const std::string& cache_dir, const dist::CpuFeatures& cpu, const std::string& dtype,
                               int threads);

struct LocalProfile {
  HardwareProfile profile;
  std::string path;        // the cached file
  bool calibrated = false; // calibrated by this call (else read from the cache)
  double seconds = 0;      // the calibration's wall time when calibrated
};

// This machine's profile for `options` (dtype, threads, quick): the cached one when it
// exists and matches this CPU, else a new calibration written atomically to the cache
// (creating the folders). `on_calibrate`, when set, is called before calibrating (to print
// why and how long it takes). Runs on one process.
LocalProfile local_profile(const std::string& cache_dir, const CalibrationOptions& options,
                           const std::function<void(const std::string& path)>& on_calibrate = nullptr);

}  // namespace ac::search

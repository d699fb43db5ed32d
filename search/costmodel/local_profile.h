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
// calibrated on another CPU model or ISA, in another dtype, with other kernels
// (model::kernels_version()), or with no record of its machine.
// "" when it does, and for profiles of other devices (GPU profiles: no calibration points,
// no thread count).
std::string machine_mismatch(const HardwareProfile& hw, const dist::CpuFeatures& cpu, const std::string& dtype = "");

// <cache_dir>/hardware/cpu-local-<key>.json, the key a hash of the CPU model, ISA, dtype and
// thread count (another machine class or setting gets its own file).
std::string local_profile_path(const std::string& cache_dir, const dist::CpuFeatures& cpu, const std::string& dtype,
                               int threads);

// How a cached profile is trusted (docs/costmodel.md "A busy machine").
struct LocalProfileOptions {
  // Other processes' load (cores) above which a calibration is marked busy: it is cached
  // marked, said so, and replaced on a later use when the machine is quiet.
  double max_other_cores = 0.5;
  // Before a cached profile is used, a few of its GEMMs are re-timed (about a second); a
  // profile whose GEMMs now run more than `spot_tolerance` away from its times is recalibrated.
  bool spot_check = true;
  double spot_tolerance = 0.35;
  // A check out of tolerance is repeated, up to this many checks in all, and the profile is
  // recalibrated only when every one is off on the same side (confirm_spot_check).
  int spot_checks = 3;
  // A profile file that passed the check is not re-timed again by the same process (a command
  // that resolves `cpu-local` more than once pays for one check).
  bool spot_check_once_per_process = true;
};

struct LocalProfile {
  HardwareProfile profile;
  std::string path;        // the cached file
  bool calibrated = false; // calibrated by this call (else read from the cache)
  double seconds = 0;      // the calibration's wall time when calibrated
  std::string why;         // why it was calibrated ("" when read from the cache)
  std::string warning;     // what the user should know about the profile in use ("" when nothing)
};

// calibrate() with the record of where and how it ran: the kernels' version, the UTC time,
// and the cores' worth of CPU time other processes used meanwhile (calibrated_on).
CalibrationResult calibrate_recorded(const CalibrationOptions& options);

// The median ratio of a profile's GEMM times re-timed now to its calibrated ones (probe_speed;
// 1: as calibrated), 0 when it holds none to re-time; timed at `threads` compute threads (the
// profile's; <= 0: as the process runs now).
double spot_check_ratio(const HardwareProfile& hw, const std::string& dtype, int threads);

// The spot check's verdict over up to `checks` readings of `check()` (each a spot_check_ratio):
// the first within `tolerance` (or 0: nothing to re-time) passes at once, and so does a second
// reading off on the other side from the first; `off` only when every reading is beyond the
// tolerance on the same side. `ratio` is the reading nearest 1, `checks` how many were taken.
// One reading is a second of a VM whose speed swings for seconds; a calibration keeps the
// fastest of its passes (docs/costmodel.md "A busy machine": each recalibration one reading
// caused on the AVX2-only VM re-timed its 512-row GEMM within 8% of the cached profile's).
struct SpotCheck {
  double ratio = 0;
  bool off = false;
  int checks = 0;
};
SpotCheck confirm_spot_check(const std::function<double()>& check, double tolerance, int checks);

// A warning when `hw` was calibrated while other processes used more than `max_other_cores`.
std::string busy_warning(const HardwareProfile& hw, double max_other_cores = 0.5);

// This machine's profile for `options` (dtype, threads, quick): the cached one when it
// exists, matches this CPU and these kernels, and passes the spot check, else a new
// calibration written atomically to the cache (creating the folders). `on_calibrate`, when
// set, is called before calibrating with the path and why (to print why and how long it
// takes). Runs on one process.
LocalProfile local_profile(const std::string& cache_dir, const CalibrationOptions& options,
                           const std::function<void(const std::string& path, const std::string& why)>& on_calibrate = nullptr,
                           const LocalProfileOptions& trust = {});

}  // namespace ac::search

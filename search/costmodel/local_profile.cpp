// Local CPU profiles: machine checks and the per-user calibration cache (local_profile.h).
#include "search/costmodel/local_profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <vector>

#include "dist/error.h"
#include "dist/machine_load.h"
#include "dist/omp_env.h"
#include "model/kernels_version.h"

namespace fs = std::filesystem;

namespace ac::search {

std::string machine_mismatch(const HardwareProfile& hw, const dist::CpuFeatures& cpu, const std::string& dtype) {
  const bool cpu_profile = hw.threads > 0 || !hw.calibration_seconds.empty() || !hw.calibrated_on.empty();
  if (!cpu_profile) return "";
  const std::string here = (cpu.model.empty() ? std::string("an unknown CPU") : cpu.model) + " (" + cpu.isa() + ")";
  if (hw.calibrated_on.empty())
    return "profile '" + hw.id + "' does not record the CPU it was calibrated on; this machine is " + here;
  if (hw.calibrated_on.cpu_model != cpu.model || hw.calibrated_on.isa != cpu.isa())
    return "profile '" + hw.id + "' was calibrated on " + hw.calibrated_on.cpu_model + " (" + hw.calibrated_on.isa +
           "); this machine is " + here;
  if (!dtype.empty() && !hw.calibrated_on.dtype.empty() && hw.calibrated_on.dtype != dtype)
    return "profile '" + hw.id + "' was calibrated in " + hw.calibrated_on.dtype + "; this run computes in " + dtype;
  if (!hw.calibrated_on.kernels.empty() && hw.calibrated_on.kernels != model::kernels_version())
    return "profile '" + hw.id + "' timed kernels " + hw.calibrated_on.kernels + "; this build runs kernels " +
           model::kernels_version();
  return "";
}

std::string local_profile_path(const std::string& cache_dir, const dist::CpuFeatures& cpu, const std::string& dtype,
                               int threads) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  const std::string key = cpu.vendor + "|" + cpu.model + "|" + cpu.isa() + "|" + dtype + "|" + std::to_string(threads);
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return (fs::path(cache_dir) / "hardware" / (std::string(kLocalProfileId) + "-" + std::string(hex, 12) + ".json")).string();
}

CalibrationResult calibrate_recorded(const CalibrationOptions& options) {
  const dist::CpuLoadSample before = dist::sample_cpu_load();
  CalibrationResult c = calibrate(options);
  auto& on = c.profile.calibrated_on;
  on.kernels = model::kernels_version();
  on.other_cores = dist::other_cores(before, dist::sample_cpu_load());
  on.cores = int(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
  on.when = when;
  return c;
}

double spot_check_ratio(const HardwareProfile& hw, const std::string& dtype, int threads) {
  // At the profile's thread count: a command runs at its share of the cores (main()), and two
  // threads on the wall clock read a one-thread profile's GEMMs at ~0.6x, so every use
  // recalibrated.
  const dist::ScopedComputeThreads scoped(threads);
  std::vector<double> ratios;
  for (const SpeedProbe& p : probe_speed(hw, dtype, 0.02)) ratios.push_back(p.now_s / p.calibrated_s);
  if (ratios.empty()) return 0;
  std::sort(ratios.begin(), ratios.end());
  return ratios[ratios.size() / 2];
}

SpotCheck confirm_spot_check(const std::function<double()>& check, double tolerance, int checks) {
  SpotCheck s;
  int first_side = 0;  // +1: the first reading slower than the profile, -1: faster
  for (s.checks = 1; s.checks <= std::max(1, checks); ++s.checks) {
    const double r = check();
    if (!(r > 0)) return {0.0, false, s.checks};
    if (s.checks == 1 || std::fabs(std::log(r)) < std::fabs(std::log(s.ratio))) s.ratio = r;
    const int side = r > 1 + tolerance ? 1 : r < 1 / (1 + tolerance) ? -1 : 0;
    if (side == 0 || (first_side != 0 && side != first_side)) return s;
    first_side = side;
  }
  s.checks = std::max(1, checks);
  s.off = true;
  return s;
}

std::string busy_warning(const HardwareProfile& hw, double max_other_cores) {
  const auto& on = hw.calibrated_on;
  if (!(on.other_cores > max_other_cores)) return "";
  char text[160];
  std::snprintf(text, sizeof text, "profile '%s' was calibrated while other processes used %.1f of %d cores%s%s", hw.id.c_str(),
                on.other_cores, on.cores, on.when.empty() ? "" : " at ", on.when.c_str());
  return std::string(text) + ": its times may be too slow for this machine when quiet";
}

namespace {

// Why the cached profile at `path` cannot be used as it is ("" when it can); `warning` is set
// when it is used although it was calibrated under load and the machine is still busy.
std::string cached_profile_problem(const std::string& path, const HardwareProfile& hw, const dist::CpuFeatures& cpu,
                                   const CalibrationOptions& o, const LocalProfileOptions& trust, std::string& warning) {
  if (std::string why = machine_mismatch(hw, cpu, o.dtype); !why.empty()) return why;
  if (hw.decode.measured && !hw.decode.batched)  // cached before the 2-16-row GEMMs were timed
    return "profile '" + hw.id + "' has no batched decode GEMMs (2-16 rows) measured";
  if (hw.decode.measured && !hw.decode.has_model_fixed)  // cached before whole model steps were timed
    return "profile '" + hw.id + "' has no cold model decode step measured";
  if (hw.decode.measured && !hw.decode.has_model_per_layer)  // cached before two-block model steps were timed
    return "profile '" + hw.id + "' has no per-layer cost of a cold model decode step measured";
  if (hw.decode.measured && !hw.decode.has_model_kinds)  // cached before MoE and Mamba model steps were timed
    return "profile '" + hw.id + "' has no per-kind (MoE, Mamba) or per-weight-byte cost of a cold model decode step measured";
  if (hw.decode.measured && !hw.decode.has_row_rests)  // cached before batched sublayer steps were timed
    return "profile '" + hw.id + "' has no batched (4- and 8-sequence) attention and MLP decode steps measured";
  if (hw.decode.measured && !hw.decode.has_multirow)  // cached before the 2-16-row call's own terms were fitted
    return "profile '" + hw.id + "' has no cost of a 2-16-row GEMM call beyond the one-row call's measured";
  if (hw.decode.measured && !hw.prefill.measured)  // cached before whole model prefills were timed
    return "profile '" + hw.id + "' has no cold model prefill measured";
  if (hw.decode.measured && !hw.gemm_line.measured)  // cached before the GEMM line was fitted
    return "profile '" + hw.id + "' has no measured GEMM line (fixed, per weight byte, per FLOP)";
  if (hw.decode.measured && !hw.activation.measured())  // cached before the MLP activation was timed
    return "profile '" + hw.id + "' has no MLP activation (SwiGLU, squared ReLU) measured";
  if (const std::string busy = busy_warning(hw, trust.max_other_cores); !busy.empty()) {
    const double now = dist::measure_other_cores(0.5);
    if (now >= 0 && now <= trust.max_other_cores) return busy + "; the machine is quiet now";
    warning = busy + " (still busy now: recalibrated on a quiet use; `autocompress cost calibrate` forces it)";
    return "";
  }
  if (!trust.spot_check) return "";
  // Paths whose profile passed this process's check (a file rewritten since is checked again:
  // its `when` is part of the key).
  static std::mutex mu;
  static std::set<std::string> passed;
  const std::string key = path + "@" + hw.calibrated_on.when;
  if (trust.spot_check_once_per_process) {
    std::lock_guard<std::mutex> lock(mu);
    if (passed.count(key)) return "";
  }
  const dist::CpuLoadSample before = dist::sample_cpu_load();
  const SpotCheck check = confirm_spot_check([&] { return spot_check_ratio(hw, o.dtype, o.threads); },
                                             trust.spot_tolerance, trust.spot_checks);
  const double busy_now = dist::other_cores(before, dist::sample_cpu_load());
  if (check.off) {
    char text[256];
    std::snprintf(text, sizeof text, "spot check: its GEMMs now take %.2fx the profile's times (tolerance %.0f%%%s)",
                  check.ratio, 100 * trust.spot_tolerance,
                  check.checks > 1 ? (", the nearest of " + std::to_string(check.checks) + " checks").c_str() : "");
    // Other work running now: the check timed the load, and a calibration now would too. A
    // profile made on a quiet machine is kept (with the warning) rather than replaced by one
    // that is marked busy; the check runs again on the next use.
    if (busy_now > trust.max_other_cores) {
      char more[128];
      std::snprintf(more, sizeof more, " while other processes use %.1f cores: kept, checked again on a quiet use", busy_now);
      warning = std::string(text) + more;
      return "";
    }
    return text;
  }
  std::lock_guard<std::mutex> lock(mu);
  passed.insert(key);
  return "";
}

void write_profile(const std::string& path, const std::string& cache_dir, const CalibrationResult& c) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) throw InputError("--cache-dir", cache_dir, "cannot create " + fs::path(path).parent_path().string() + ": " + ec.message());
  // Through a file of this process's own, so two processes calibrating at once do not mix.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) throw InputError("--cache-dir", cache_dir, "cannot write " + tmp);
    const std::string text = c.to_json().dump(2) + "\n";
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) {
      std::remove(tmp.c_str());
      throw std::runtime_error(tmp + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": rename from " + tmp + " failed");
}

}  // namespace

LocalProfile local_profile(const std::string& cache_dir, const CalibrationOptions& options,
                           const std::function<void(const std::string& path, const std::string& why)>& on_calibrate,
                           const LocalProfileOptions& trust) {
  const dist::CpuFeatures& cpu = dist::detect_cpu();
  LocalProfile r;
  r.path = local_profile_path(cache_dir, cpu, options.dtype, options.threads);
  r.why = "no profile of this CPU in the cache yet";
  if (fs::exists(r.path)) {
    r.profile = load_hardware(r.path, "");
    r.why = cached_profile_problem(r.path, r.profile, cpu, options, trust, r.warning);
    if (r.why.empty()) return r;
  }
  if (on_calibrate) on_calibrate(r.path, r.why);
  const auto t0 = std::chrono::steady_clock::now();
  const CalibrationResult c = calibrate_recorded(options);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Cached even when busy (marked): every stage of a run then prices the same profile, and a
  // later quiet use replaces it.
  write_profile(r.path, cache_dir, c);
  r.profile = load_hardware(r.path, "");
  r.warning = busy_warning(r.profile, trust.max_other_cores);
  if (!r.warning.empty()) r.warning += " (marked in the profile; recalibrated on a quiet use)";
  r.calibrated = true;
  return r;
}

}  // namespace ac::search

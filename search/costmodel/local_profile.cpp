// Local CPU profiles: machine checks and the per-user calibration cache (local_profile.h).
#include "search/costmodel/local_profile.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "dist/error.h"

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

LocalProfile local_profile(const std::string& cache_dir, const CalibrationOptions& options,
                           const std::function<void(const std::string& path)>& on_calibrate) {
  const dist::CpuFeatures& cpu = dist::detect_cpu();
  LocalProfile r;
  r.path = local_profile_path(cache_dir, cpu, options.dtype, options.threads);
  if (fs::exists(r.path)) {
    r.profile = load_hardware(r.path, "");
    if (machine_mismatch(r.profile, cpu, options.dtype).empty()) return r;
  }
  if (on_calibrate) on_calibrate(r.path);
  const auto t0 = std::chrono::steady_clock::now();
  const CalibrationResult c = calibrate(options);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;
  fs::create_directories(fs::path(r.path).parent_path(), ec);
  if (ec) throw InputError("--cache-dir", cache_dir, "cannot create " + fs::path(r.path).parent_path().string() + ": " + ec.message());
  // Through a file of this process's own, so two processes calibrating at once do not mix.
  const std::string tmp = r.path + ".tmp" + std::to_string(::getpid());
  {
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) throw InputError("--cache-dir", cache_dir, "cannot write " + tmp);
    const std::string text = c.to_json().dump(2) + "\n";
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) throw std::runtime_error(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), r.path.c_str()) != 0) throw std::runtime_error(r.path + ": rename from " + tmp + " failed");
  r.profile = load_hardware(r.path, "");
  r.calibrated = true;
  return r;
}

}  // namespace ac::search

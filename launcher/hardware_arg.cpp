// `--hardware` resolution with the local CPU profile cache (hardware_arg.h).
#include "launcher/hardware_arg.h"

#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "dist/cpu_features.h"
#include "dist/error.h"
#include "search/costmodel/local_profile.h"

namespace ac::launcher {

std::string default_cache_dir() {
  if (const char* d = std::getenv("AC_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/autocompress";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/autocompress";
  return ".autocompress-cache";
}

std::string cost_dtype(const std::string& requested, std::string* reason) {
  if (requested == "f16" || requested == "float16") {
    if (reason) *reason = "float16 as requested";
    return "float16";
  }
  const dist::DtypeChoice c = dist::choose_dtype(requested);
  if (reason) *reason = c.reason;
  return c.dtype == "bf16" ? "bfloat16" : "float32";
}

ResolvedHardware resolve_hardware(const HardwareArg& arg) {
  ResolvedHardware r;
  const dist::CpuFeatures& cpu = dist::detect_cpu();
  if (arg.value == search::kLocalProfileId) {
    search::CalibrationOptions o;
    o.dtype = arg.dtype;
    o.threads = arg.threads;
    o.quick = arg.quick;
    o.configs_dir = arg.configs_dir;
    o.memory_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
    const std::string path = search::local_profile_path(arg.cache_dir, cpu, o.dtype, o.threads);
    if (!arg.calibrate) {
      ResolvedHardware none;
      none.path = path;
      try {
        none.profile = search::load_hardware(path, "");
      } catch (const InputError&) {
        return none;  // absent or unreadable: the caller goes on without a profile
      }
      none.found = search::machine_mismatch(none.profile, cpu, o.dtype).empty();
      return none;
    }
    const search::LocalProfile lp = search::local_profile(arg.cache_dir, o, [&](const std::string& p, const std::string& why) {
      std::fprintf(stderr, "cpu-local: %s (%s, %s, %s, %d thread%s): calibrating %s (%s) into %s\n", why.c_str(),
                   cpu.model.c_str(), cpu.isa().c_str(), o.dtype.c_str(), o.threads, o.threads == 1 ? "" : "s",
                   o.quick ? "quickly" : "once", o.quick ? "about 10-20 s" : "about 2 minutes", p.c_str());
      std::fflush(stderr);
    });
    if (lp.calibrated) std::fprintf(stderr, "cpu-local: calibrated in %.1f s\n", lp.seconds);
    if (!lp.warning.empty()) std::fprintf(stderr, "warning: cpu-local: %s\n", lp.warning.c_str());
    r.found = true;
    r.profile = lp.profile;
    r.path = lp.path;
    return r;
  }
  r.path = arg.value;
  r.profile = search::load_hardware(arg.value, arg.configs_dir);
  r.found = true;
  r.mismatch = search::machine_mismatch(r.profile, cpu, arg.dtype);
  return r;
}

std::string profile_provenance(const search::HardwareProfile& hw) {
  const auto& on = hw.calibrated_on;
  if (on.empty()) return "no record of the machine that calibrated it";
  std::string s = "calibrated " + (on.when.empty() ? std::string("(time not recorded)") : on.when);
  if (on.other_cores >= 0) {
    char load[96];
    std::snprintf(load, sizeof load, ", other processes used %.1f of %d cores meanwhile", on.other_cores, on.cores);
    s += load;
  } else {
    s += ", load not recorded";
  }
  s += "; " + on.cpu_model + " (" + on.isa + "), " + on.dtype + ", kernels " + (on.kernels.empty() ? "not recorded" : on.kernels);
  if (!search::busy_warning(hw).empty()) s += " [busy: recalibrated on a quiet use]";
  return s;
}

std::string local_profile_summary(const std::string& cache_dir, const std::string& dtype, int threads) {
  HardwareArg h;
  h.value = search::kLocalProfileId;
  h.cache_dir = cache_dir;
  h.dtype = dtype.empty() ? cost_dtype("auto") : dtype;
  h.threads = threads;
  h.calibrate = false;
  const ResolvedHardware r = resolve_hardware(h);
  const std::string head = "cpu-local (" + h.dtype + ", " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") + "): ";
  if (r.found) return head + r.path + ", " + profile_provenance(r.profile);
  if (r.profile.calibrated_on.empty())
    return head + "none for this CPU and build yet; calibrated on first use into " + r.path;
  return head + r.path + " does not describe this build (" +
         search::machine_mismatch(r.profile, dist::detect_cpu(), h.dtype) + "); recalibrated on first use";
}

std::string hardware_profile_path(const std::string& value, const std::string& configs_dir, const std::string& dtype) {
  if (value != search::kLocalProfileId) return value;
  HardwareArg h;
  h.value = value;
  h.configs_dir = configs_dir;
  h.cache_dir = default_cache_dir();
  h.dtype = cost_dtype(dtype);
  return resolve_hardware(h).path;
}

}  // namespace ac::launcher

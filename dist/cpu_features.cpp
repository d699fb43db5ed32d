// CPU model and ISA features, and the dtype `--dtype auto` picks (see cpu_features.h).
#include "dist/cpu_features.h"

#include <cpuid.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "dist/error.h"

namespace ac::dist {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// CPUID fallback for systems without /proc/cpuinfo. Does not check that the OS enabled the
// AVX-512 state (XCR0); /proc/cpuinfo does, which is why it is read first.
CpuFeatures from_cpuid() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char v[13] = {};
    std::memcpy(v, &b, 4);
    std::memcpy(v + 4, &d, 4);
    std::memcpy(v + 8, &c, 4);
    f.vendor = v;
  }
  const unsigned max_leaf = a;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = b & (1u << 5);
    f.avx512f = b & (1u << 16);
    f.amx_bf16 = d & (1u << 22);
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = a & (1u << 5);
  }
  char brand[49] = {};
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002u + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
  }
  f.model = trim(brand);
  return f;
}

}  // namespace

std::string CpuFeatures::isa() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(avx512f, "avx512f");
  add(avx512_bf16, "avx512_bf16");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "none" : s;
}

bool CpuFeatures::same_class(const CpuFeatures& o) const {
  return model == o.model && avx2 == o.avx2 && avx512f == o.avx512f && avx512_bf16 == o.avx512_bf16 &&
         amx_bf16 == o.amx_bf16;
}

CpuFeatures parse_cpuinfo(const std::string& cpuinfo) {
  CpuFeatures f;
  std::istringstream in(cpuinfo);
  std::string line;
  bool have_flags = false;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) {
      if (have_flags) break;  // end of the first processor's block
      continue;
    }
    const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "vendor_id" && f.vendor.empty()) f.vendor = value;
    else if (key == "model name" && f.model.empty()) f.model = value;
    else if (key == "flags" && !have_flags) {
      std::istringstream fl(value);
      std::set<std::string> flags;
      for (std::string w; fl >> w;) flags.insert(w);
      f.avx2 = flags.count("avx2");
      f.avx512f = flags.count("avx512f");
      f.avx512_bf16 = flags.count("avx512_bf16");
      f.amx_bf16 = flags.count("amx_bf16");
      have_flags = true;
    }
  }
  return f;
}

const CpuFeatures& detect_cpu() {
  static const CpuFeatures cpu = [] {
    std::ifstream in("/proc/cpuinfo");
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      CpuFeatures f = parse_cpuinfo(ss.str());
      if (!f.model.empty() || !f.vendor.empty()) return f;
    }
    return from_cpuid();
  }();
  return cpu;
}

DtypeChoice choose_dtype(const std::string& requested, const CpuFeatures& cpu, bool cuda_device,
                         const std::string& what) {
  if (requested == "bf16" || requested == "bfloat16") return {"bf16", "bf16 as requested", false};
  if (requested == "f32" || requested == "float32" || requested == "fp32") return {"f32", "f32 as requested", false};
  if (requested != "auto")
    throw InputError("command line", what, "'" + requested + "': expected auto, bf16 or f32");
  if (cuda_device) return {"bf16", "auto: bf16 on a CUDA device", true};
  if (cpu.amx_bf16) return {"bf16", "auto: bf16, the CPU has AMX-BF16 (" + cpu.model + ")", true};
  if (cpu.avx512_bf16) return {"bf16", "auto: bf16, the CPU has AVX512_BF16 (" + cpu.model + ")", true};
  return {"f32", "auto: f32, the CPU has no native bf16 arithmetic (no AVX512_BF16/AMX-BF16: " +
                     (cpu.model.empty() ? std::string("unknown CPU") : cpu.model) + "), where bf16 is emulated and slow",
          true};
}

DtypeChoice choose_dtype(const std::string& requested, bool cuda_device, const std::string& what) {
  return choose_dtype(requested, detect_cpu(), cuda_device, what);
}

}  // namespace ac::dist

// The CPU this process runs on (model name and the ISA features that decide how fast bf16
// is) and the compute dtype `--dtype auto` picks from it: bf16 on CUDA devices and on CPUs
// with native bf16 arithmetic (AVX512_BF16 or AMX-BF16), fp32 otherwise. Without them
// LibTorch emulates bf16 GEMMs in scalar code (~80x slower than fp32 on an AVX2 EPYC:
// docs/benchmarks.md), so bf16 there only costs time. No torch dependency.
#pragma once

#include <string>
#include <vector>

namespace ac::dist {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ... ("" when unknown)
  std::string model;   // /proc/cpuinfo "model name" (or the CPUID brand string)
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false;
  // "avx2 avx512f ..." : the features above that are present, for reports and profiles.
  std::string isa() const;
  // The ISA features that change which dtype or kernels run, as one comparable key.
  bool same_class(const CpuFeatures& other) const;
};

// From a /proc/cpuinfo text (the first processor's "vendor_id", "model name" and "flags").
// Unit tests feed it feature sets; detect_cpu() feeds it the real file.
CpuFeatures parse_cpuinfo(const std::string& cpuinfo);
// This machine's CPU: /proc/cpuinfo (the kernel lists only the features it enabled), else
// CPUID. Computed once.
const CpuFeatures& detect_cpu();

struct DtypeChoice {
  std::string dtype;   // "bf16" | "f32"
  std::string reason;  // one line: why (printed in progress headers, stored in manifests)
  bool automatic = false;  // chosen by "auto"
};

// `requested` is "auto", "bf16"/"bfloat16" or "f32"/"float32" (anything else throws
// ac::InputError naming `what`). "auto": bf16 when `cuda_device`, or when `cpu` has
// AVX512_BF16 or AMX-BF16; else f32.
DtypeChoice choose_dtype(const std::string& requested, const CpuFeatures& cpu, bool cuda_device = false,
                         const std::string& what = "--dtype");
// The same for this machine's CPU (detect_cpu()).
DtypeChoice choose_dtype(const std::string& requested, bool cuda_device = false, const std::string& what = "--dtype");

}  // namespace ac::dist

// CPU feature parsing and the `--dtype auto` choice, fed with /proc/cpuinfo texts of the two
// CPU classes this project meets (AMD EPYC with AVX2 only; Intel with AVX512_BF16) and others.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "dist/cpu_features.h"
#include "dist/error.h"

namespace {

std::string cpuinfo(const std::string& vendor, const std::string& model, const std::string& flags) {
  // Two processors: only the first block counts.
  return "processor\t: 0\nvendor_id\t: " + vendor + "\ncpu family\t: 25\nmodel name\t: " + model +
         "\nflags\t\t: " + flags + "\n\nprocessor\t: 1\nvendor_id\t: Other\nmodel name\t: Other\nflags\t\t: avx512_bf16\n";
}

const char* kEpycFlags = "fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes vpclmulqdq";
const char* kSprFlags = "fpu sse2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_fp16 amx_bf16 amx_tile";

}  // namespace

TEST(CpuFeatures, ParsesTheFirstProcessorOfCpuinfo) {
  const auto f = ac::dist::parse_cpuinfo(cpuinfo("AuthenticAMD", "AMD EPYC", kEpycFlags));
  EXPECT_EQ(f.vendor, "AuthenticAMD");
  EXPECT_EQ(f.model, "AMD EPYC");
  EXPECT_TRUE(f.avx2);
  EXPECT_FALSE(f.avx512f);
  EXPECT_FALSE(f.avx512_bf16);  // the second processor's flags are not read
  EXPECT_FALSE(f.amx_bf16);
  EXPECT_EQ(f.isa(), "avx2");
  const auto s = ac::dist::parse_cpuinfo(cpuinfo("GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+", kSprFlags));
  EXPECT_TRUE(s.avx512f && s.avx512_bf16 && s.amx_bf16);
  EXPECT_EQ(s.isa(), "avx2 avx512f avx512_bf16 amx_bf16");
  EXPECT_FALSE(s.same_class(f));
  EXPECT_TRUE(s.same_class(s));
}

TEST(CpuFeatures, FlagNamesMustMatchWholeWords) {
  // "avx512_bf16" must not be found inside another flag, nor "avx2" inside "avx256".
  const auto f = ac::dist::parse_cpuinfo(cpuinfo("X", "Y", "avx512_bf16x avx256 xavx2"));
  EXPECT_FALSE(f.avx512_bf16);
  EXPECT_FALSE(f.avx2);
}

TEST(DtypeAuto, PicksF32WithoutNativeBf16AndBf16WithIt) {
  using ac::dist::choose_dtype;
  const auto epyc = ac::dist::parse_cpuinfo(cpuinfo("AuthenticAMD", "AMD EPYC 9654", kEpycFlags));
  const auto d = choose_dtype("auto", epyc);
  EXPECT_EQ(d.dtype, "f32");
  EXPECT_TRUE(d.automatic);
  EXPECT_NE(d.reason.find("AMD EPYC 9654"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("no native bf16"), std::string::npos) << d.reason;

  // AVX-512 without BF16 (Skylake/Ice Lake): still f32.
  const auto skx = ac::dist::parse_cpuinfo(cpuinfo("GenuineIntel", "Xeon Gold 6148", "avx2 avx512f avx512bw"));
  EXPECT_EQ(choose_dtype("auto", skx).dtype, "f32");
  // AVX512_BF16 alone (Cooper Lake, Zen 4) or AMX-BF16: bf16.
  const auto zen4 = ac::dist::parse_cpuinfo(cpuinfo("AuthenticAMD", "AMD EPYC 9004", "avx2 avx512f avx512_bf16"));
  EXPECT_EQ(choose_dtype("auto", zen4).dtype, "bf16");
  const auto spr = ac::dist::parse_cpuinfo(cpuinfo("GenuineIntel", "Xeon 8480+", kSprFlags));
  EXPECT_EQ(choose_dtype("auto", spr).dtype, "bf16");
  EXPECT_NE(choose_dtype("auto", spr).reason.find("AMX-BF16"), std::string::npos);
  // A CUDA device: bf16 whatever the host CPU.
  EXPECT_EQ(choose_dtype("auto", epyc, /*cuda_device=*/true).dtype, "bf16");
}

TEST(DtypeAuto, ExplicitChoicesPassAndUnknownOnesAreRefused) {
  using ac::dist::choose_dtype;
  const auto epyc = ac::dist::parse_cpuinfo(cpuinfo("AuthenticAMD", "AMD EPYC", kEpycFlags));
  EXPECT_EQ(choose_dtype("bf16", epyc).dtype, "bf16");
  EXPECT_EQ(choose_dtype("bfloat16", epyc).dtype, "bf16");
  EXPECT_FALSE(choose_dtype("bf16", epyc).automatic);
  EXPECT_EQ(choose_dtype("float32", epyc).dtype, "f32");
  try {
    choose_dtype("fp8", epyc, false, "--dtype");
    FAIL() << "fp8 accepted";
  } catch (const ac::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--dtype"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos);
  }
}

TEST(CpuFeatures, DetectsThisMachine) {
  const auto& f = ac::dist::detect_cpu();
  EXPECT_FALSE(f.model.empty() && f.vendor.empty());
  // An AVX512_BF16 bit without AVX-512F would be a parsing error.
  if (f.avx512_bf16) EXPECT_TRUE(f.avx512f) << f.isa();
  // Detection reads the kernel's view of the first CPU; lscpu / /proc/cpuinfo say the same.
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo (CPUID was used)";
  std::stringstream ss;
  ss << in.rdbuf();
  const auto again = ac::dist::parse_cpuinfo(ss.str());
  EXPECT_TRUE(again.same_class(f));
  EXPECT_NE(ss.str().find(f.model), std::string::npos);
}

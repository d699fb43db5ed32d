#include "dist/omp_env.h"

#include <dlfcn.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace ac::dist {

std::string openblas_core_upgrade() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  auto corename = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (corename == nullptr || corename() == nullptr) return "";
  std::string core(corename());
  for (char& c : core) c = char(std::tolower(static_cast<unsigned char>(c)));
  // OpenBLAS's cores without AVX2 kernels (Prescott: its fallback for an unknown Intel model).
  static const char* const generic[] = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "sandybridge", "unknown"};
  bool low = false;
  for (const char* g : generic) low = low || core == g;
  if (!low) return "";
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

void default_primitive_caches() {
  for (const char* name : {"ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"})
    if (std::getenv(name) == nullptr) setenv(name, kPrimitiveCacheCapacity, 0);
}

void default_omp_wait(int argc, char** argv) {
  if (std::getenv("AC_NO_REEXEC") != nullptr) return;
  if (argc < 2 || argv == nullptr || argv[0] == nullptr) return;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--version")) return;
  // One thread: no OpenMP team waits, and OpenBLAS takes OMP_NUM_THREADS too.
  const char* threads = std::getenv("OMP_NUM_THREADS");
  const bool gomp = std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr &&
                    !((threads != nullptr && std::string(threads) == "1") || std::thread::hardware_concurrency() == 1);
  const std::string blas_core = openblas_core_upgrade();
  if (!gomp && blas_core.empty()) return;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return;
  exe[n] = '\0';
  // Started as `ld-linux*.so PROGRAM ...`: /proc/self/exe is the loader, argv[0] the program.
  const std::string path(exe);
  const std::string base = path.substr(path.find_last_of('/') + 1);
  if (base.rfind("ld-", 0) == 0 || base.rfind("ld.so", 0) == 0) return;
  if (gomp && setenv("GOMP_SPINCOUNT", kDefaultGompSpincount, 0) != 0) return;
  if (!blas_core.empty() && setenv("OPENBLAS_CORETYPE", blas_core.c_str(), 0) != 0) return;
  execv("/proc/self/exe", argv);
  // Only reached when execv failed: carry on in this process (libgomp's and OpenBLAS's defaults stay).
  std::fprintf(stderr, "autocompress: note: could not re-execute with GOMP_SPINCOUNT=%s / OPENBLAS_CORETYPE=%s (%s); "
                       "set them in the environment for full CPU speed\n",
               gomp ? kDefaultGompSpincount : "(unset)", blas_core.empty() ? "(unset)" : blas_core.c_str(), std::strerror(errno));
  if (gomp) unsetenv("GOMP_SPINCOUNT");
  if (!blas_core.empty()) unsetenv("OPENBLAS_CORETYPE");
}

std::string omp_wait_setting() {
  std::string s;
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
    if (const char* v = std::getenv(name)) {
      if (!s.empty()) s += ' ';
      s.append(name).append("=").append(v);
    }
  return s.empty() ? "libgomp default" : s;
}

namespace {
// OpenBLAS's thread-count entry points, looked up in the process's global scope (libopenblas
// is loaded with LibTorch when the blas alternative points at it); null when absent.
template <typename Fn>
Fn openblas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}
}  // namespace

void set_compute_threads(int n) {
  n = n < 1 ? 1 : n;
  at::set_num_threads(n);
  if (auto set = openblas_symbol<void (*)(int)>("openblas_set_num_threads")) set(n);
}

ScopedComputeThreads::ScopedComputeThreads(int n) {
  if (n <= 0) return;
  previous_ = at::get_num_threads();
  set_compute_threads(n);
}
ScopedComputeThreads::~ScopedComputeThreads() {
  if (previous_ > 0) set_compute_threads(previous_);
}

namespace {
#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFtzDaz = 0x8040;  // MXCSR: flush to zero (bit 15), denormals are zero (bit 6)
#endif
}  // namespace

bool default_flush_denormals() {
  if (const char* keep = std::getenv("AC_KEEP_DENORMALS"); keep != nullptr && std::string(keep) == "1") return false;
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(_mm_getcsr() | kFtzDaz);
#endif
  return denormals_flushed();
}

bool denormals_flushed() {
#if defined(__x86_64__) || defined(__i386__)
  return (_mm_getcsr() & kFtzDaz) == kFtzDaz;
#else
  return false;
#endif
}

int blas_threads() {
  auto get = openblas_symbol<int (*)()>("openblas_get_num_threads");
  return get ? get() : 0;
}

}  // namespace ac::dist

// OpenMP waiting for CPU runs: a short spin (GOMP_SPINCOUNT=1000) unless the user chose one.
//
// Debian's LibTorch runs fp32 GEMMs in OpenBLAS's own pthread pool while its other ops use
// libgomp's OpenMP pool. With libgomp's default (spin ~300k iterations before sleeping) the
// idle OpenMP workers keep the cores busy after every parallel region and OpenBLAS's threads
// get only what is left: at 2 threads fp32 forward/backward ran at 0.4x. Sleeping at once
// (OMP_WAIT_POLICY=PASSIVE, sessions 3) fixes that but makes every small parallel op wake a
// sleeping thread: bf16 steps at 2 threads ran at 0.71-0.95 of PyTorch. A spin of 1000
// iterations (a few microseconds) keeps both: measured in docs/benchmarks.md ("OpenMP
// waiting"). libgomp reads these variables once, when it is loaded, so setting them from
// main() is too late: the process has to be started again with them in its environment.
#pragma once

#include <string>

namespace ac::dist {

constexpr const char* kDefaultGompSpincount = "1000";

// Call first thing in main(), before MPI is initialised and before any output. When
// OMP_WAIT_POLICY, GOMP_SPINCOUNT and AC_NO_REEXEC are all unset, sets
// GOMP_SPINCOUNT=kDefaultGompSpincount and replaces the process image with /proc/self/exe and
// the same argv (execv keeps the PID, so mpirun, Slurm and debuggers keep tracking the same
// process). Values the user set are kept as they are. Returns (doing nothing) when one of
// them is set, when the run is single-threaded anyway (OMP_NUM_THREADS=1, one hardware
// thread), for a help / version call or no arguments (loading LibTorch twice costs ~0.5 s),
// or when the re-exec is impossible (no /proc, the program was started through the dynamic
// loader); then the run goes on with libgomp's defaults.
//
// The same re-exec sets OPENBLAS_CORETYPE (unless set) when OpenBLAS picked a core without
// AVX2 kernels on a CPU that has them: Debian 12's OpenBLAS 0.3.21 does not know newer Intel
// models (a Sapphire Rapids VM that reports "Intel Xeon Processor") and falls back to its
// Prescott (SSE3) kernels, ~2-3x slower gemv / small GEMMs than its AVX-512 ones. AVX-512
// F/BW/DQ/VL -> SkylakeX, else AVX2 + FMA -> Haswell (openblas_core_upgrade()). This one is
// done at one thread too. OpenBLAS reads it once, when it is loaded.
void default_omp_wait(int argc, char** argv);

// oneDNN's primitive cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY) and LibTorch's ideep LRU cache of
// oneDNN objects (LRU_CACHE_CAPACITY) hold 1024 entries by default: one per operator and shape.
// bf16 matmuls on a CPU run through oneDNN, and a decode step's attention has a new shape at
// every context length, so a process that runs many models and shapes keeps them full and
// evicting. In `cost validate` (24 architectures at 3 prompt lengths and 3 batch sizes) the
// first sweep decoded 1.10x the prediction and every later one 1.19-1.29x; with the caches at
// 65536 every sweep read 1.08-1.14x (docs/costmodel.md, "The oneDNN primitive cache"; how a
// full cache slows the steps was not traced inside oneDNN). Sets both to
// kPrimitiveCacheCapacity unless the user set them; the libraries read them lazily, at their
// first primitive, so main() calls this before any tensor work.
constexpr const char* kPrimitiveCacheCapacity = "16384";
void default_primitive_caches();

// The OPENBLAS_CORETYPE the re-exec would set ("" for none: not OpenBLAS, already set, or
// OpenBLAS's core already has AVX2 kernels or the CPU has none).
std::string openblas_core_upgrade();

// How OpenMP workers wait in this process, for reports: "OMP_WAIT_POLICY=..." and/or
// "GOMP_SPINCOUNT=..." as set, or "libgomp default".
std::string omp_wait_setting();

// Sets the compute threads of every pool the CPU path uses: ATen's intra-op (OpenMP) pool and
// OpenBLAS's own pthread pool, when the BLAS LibTorch runs on is OpenBLAS (found at run time
// by symbol; with MKL or another BLAS only ATen's pool is set, MKL follows it). Debian's
// LibTorch does not pass its thread count on to OpenBLAS, so without this a process told to
// use one thread still runs every large fp32 GEMM on all cores, plus OpenBLAS's spin-waiting
// workers: a run timed by process CPU time (cost calibrate/validate) counts both, and
// several MPI ranks on a node oversubscribe it (docs/costmodel.md, "OpenBLAS threads").
void set_compute_threads(int n);

// Denormal floats (|x| < 1.2e-38, in fp32 and in bf16, which has fp32's exponent) flushed to
// zero where an op produces one (FTZ) and read as zero where an op takes one (DAZ), as
// PyTorch's torch.set_flush_denormal(True) does. A denormal operand sends the CPU's vector unit
// to a microcode assist: on the Intel AMX class an fp32 GEMM whose input is denormal ran 160x
// slower (165 ms vs 1.0 ms at 512^3), an exp into the denormal range 6.7x. The Mamba-2 scan
// makes them wherever a chunk's decay exp(cs_i - cs_j) underflows, so its prefill cost
// depended on the weights' decay rates, not on its shape: 1.04-3.45x between flushing and not
// at the calibration's twelve mixer sizes there (docs/costmodel.md, "Denormals"). Flushed, an op's time
// follows its shape, which is what the cost model prices; values that small change no result
// this project computes. Call first thing in main(), after default_omp_wait (an exec resets
// the CPU's control register) and before any thread is started: the register is per thread,
// and threads inherit their creator's (ATen's OpenMP workers are started later, by the main
// thread; OpenBLAS's pool, started when it is loaded, takes the caller's mode with each call,
// checked by test). Sets nothing when AC_KEEP_DENORMALS=1 or off x86. Returns whether this
// thread flushes them now.
bool default_flush_denormals();

// Whether this thread flushes denormals (FTZ and DAZ both set); false off x86.
bool denormals_flushed();

// OpenBLAS's thread count, or 0 when LibTorch does not run on OpenBLAS.
int blas_threads();

// set_compute_threads(n) for a scope (nothing when n <= 0), the previous count restored at its
// end: a calibration or spot check at the profile's thread count inside a command that runs
// at another (main() sets one per rank's share of the cores).
class ScopedComputeThreads {
 public:
  explicit ScopedComputeThreads(int n);
  ~ScopedComputeThreads();
  ScopedComputeThreads(const ScopedComputeThreads&) = delete;
  ScopedComputeThreads& operator=(const ScopedComputeThreads&) = delete;

 private:
  int previous_ = 0;  // 0: nothing to restore
};

}  // namespace ac::dist

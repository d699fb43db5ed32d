// OpenMP wait policy for CPU runs: make it PASSIVE unless the user chose one.
//
// Debian's LibTorch runs fp32 GEMMs in OpenBLAS's own pthread pool while its other ops use
// libgomp's OpenMP pool. With the default (spinning) wait policy the idle OpenMP workers keep
// the cores busy after every parallel region and OpenBLAS's threads get only what is left:
// at 2 threads fp32 forward/backward runs at half speed (docs/benchmarks.md). libgomp reads
// OMP_WAIT_POLICY once, when it is loaded, so setting it from main() is too late: the process
// has to be started again with it in its environment.
#pragma once

namespace ac::dist {

// Call first thing in main(), before MPI is initialised and before any output. When
// OMP_WAIT_POLICY and AC_NO_REEXEC are both unset, sets OMP_WAIT_POLICY=PASSIVE and replaces
// the process image with /proc/self/exe and the same argv (execv keeps the PID, so mpirun,
// Slurm and debuggers keep tracking the same process). A value the user set is kept as it is.
// Returns (doing nothing) when the variable is already set, when AC_NO_REEXEC is set, when
// the run is single-threaded anyway (OMP_NUM_THREADS=1, one hardware thread), for a help /
// version call or no arguments (loading LibTorch twice costs ~0.5 s), or when the re-exec is
// impossible (no /proc, the program was started through the dynamic loader); then the run
// goes on with libgomp's default policy.
void default_passive_omp_wait(int argc, char** argv);

// Sets the compute threads of every pool the CPU path uses: ATen's intra-op (OpenMP) pool and
// OpenBLAS's own pthread pool, when the BLAS LibTorch runs on is OpenBLAS (found at run time
// by symbol; with MKL or another BLAS only ATen's pool is set, MKL follows it). Debian's
// LibTorch does not pass its thread count on to OpenBLAS, so without this a process told to
// use one thread still runs every large fp32 GEMM on all cores, plus OpenBLAS's spin-waiting
// workers: a run timed by process CPU time (cost calibrate/validate) counts both, and
// several MPI ranks on a node oversubscribe it (docs/costmodel.md, "OpenBLAS threads").
void set_compute_threads(int n);

// OpenBLAS's thread count, or 0 when LibTorch does not run on OpenBLAS.
int blas_threads();

}  // namespace ac::dist

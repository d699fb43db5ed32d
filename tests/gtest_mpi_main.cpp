// gtest main for suites that run under mpiexec: the launcher's CPU defaults (denormals flushed,
// dist/omp_env.h), then rank 0 prints the usual report, other ranks
// print only their failures (prefixed with the rank), and the exit code is non-zero when
// any rank failed. Also works without mpiexec (one rank).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "dist/mpi_singleton.h"
#include "dist/omp_env.h"

namespace {

class FailuresOnly : public testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  ac::dist::default_flush_denormals();  // as the launcher does (dist/omp_env.h)
  ac::dist::prefer_isolated_singleton();  // one-process runs: no orted (dist/runtime.h)
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  ac::dist::remove_singleton_session_base();
  return any_failed;
}

// Communicator benchmark: all_reduce and all_gather bus bandwidth of ac::dist's
// MpiCommunicator against raw MPI_Allreduce / MPI_Allgather on the same buffers, in one run.
#pragma once

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ac::bench {

struct CommBenchOptions {
  int64_t min_bytes = int64_t(1) << 20;
  int64_t max_bytes = int64_t(256) << 20;
  std::vector<std::string> dtypes = {"f32", "bf16"};
  std::vector<std::string> ops = {"all_reduce", "all_gather"};
  int min_iters = 3;
  double seconds_per_point = 1.0;  // per implementation, per size
};

struct CommBenchRow {
  std::string op, dtype;
  int64_t bytes = 0;           // buffer size (all_gather: the gathered output)
  double ours_busbw = 0, mpi_busbw = 0;  // GB/s, median over iterations
  double ratio() const { return mpi_busbw > 0 ? ours_busbw / mpi_busbw : 0; }
  nlohmann::json to_json() const;
};

// Collective over `comm`; every rank returns the same rows (rank 0's timings).
std::vector<CommBenchRow> run_comm_bench(MPI_Comm comm, const CommBenchOptions& opt);
std::string format_comm_table(const std::vector<CommBenchRow>& rows, int world_size);

}  // namespace ac::bench

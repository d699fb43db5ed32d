// Checkpoint benchmark: write and read throughput of save_checkpoint / CheckpointReader for a
// sharded state, against plain large sequential writes + fsync and reads of the same bytes
// on the same disk, and against writing the same slices as safetensors, in one run; also
// where the save spends its time (checkpoint::SaveTimings).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

namespace ac::bench {

struct CheckpointBenchOptions {
  std::string dir;                       // scratch directory on the disk to measure
  int64_t total_bytes = int64_t(1) << 30;  // state size over all ranks
  int64_t tensor_bytes = int64_t(64) << 20;  // split into tensors of about this size
  int repeats = 5;                       // alternating runs; medians of pairwise ratios are reported
  bool drop_caches = true;               // try /proc/sys/vm/drop_caches before reads (root)
  int64_t write_behind_bytes = int64_t(16) << 20;  // SaveOptions::write_behind_bytes; also the
                                                   // block size of the plain write-behind baseline
};

// Collective; rank 0 returns the printed report.
std::string run_checkpoint_bench(MPI_Comm comm, const CheckpointBenchOptions& opt);

}  // namespace ac::bench

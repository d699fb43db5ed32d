// ParallelLayout: the TP x DP rank grid in Megatron order (TP fastest):
//   world_rank = tp_rank + tp_size * dp_rank
// so a TP group is a run of consecutive ranks and stays inside a node.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace ac::dist {

struct LayoutSpec {
  int tp = 1;
  int dp = 0;          // 0: world / tp
  int num_heads = 0;   // > 0: also refuse tp > heads and heads % tp != 0
};

// The pure arithmetic of the grid, usable without MPI (e.g. to print a plan).
struct GridShape {
  int world = 1, tp = 1, dp = 1;
  int rank(int tp_rank, int dp_rank) const { return tp_rank + tp * dp_rank; }
  int tp_rank_of(int rank) const { return rank % tp; }
  int dp_rank_of(int rank) const { return rank / tp; }
  std::vector<std::vector<int>> tp_groups() const;  // ranks of each TP group
  std::vector<std::vector<int>> dp_groups() const;  // ranks of each DP group
};

// Checks a layout against a world size; throws ac::InputError with the reason
// ("--tp 2: world size 3 is not divisible by the tensor-parallel size 2").
GridShape resolve_grid(int world_size, const LayoutSpec& spec);

class ParallelLayout {
 public:
  // Collective over `world`: validates (every rank reaches the same verdict, so a bad layout
  // is refused everywhere without a hang) and splits the TP and DP sub-communicators.
  // backend "mpi" or "nccl" (NCCL needs CUDA tensors; it is only built with CUDA + NCCL).
  ParallelLayout(MPI_Comm world, const LayoutSpec& spec, const std::string& backend = "mpi",
                 int device_index = 0);
  ~ParallelLayout();
  ParallelLayout(const ParallelLayout&) = delete;
  ParallelLayout& operator=(const ParallelLayout&) = delete;

  const GridShape& grid() const { return grid_; }
  int world_size() const { return grid_.world; }
  int world_rank() const { return world_rank_; }
  int tp_size() const { return grid_.tp; }
  int dp_size() const { return grid_.dp; }
  int tp_rank() const { return world_rank_ % grid_.tp; }
  int dp_rank() const { return world_rank_ / grid_.tp; }
  Communicator& tp() const { return *tp_comm_; }
  Communicator& dp() const { return *dp_comm_; }
  Communicator& world_comm() const { return *world_comm_; }
  MPI_Comm tp_mpi_comm() const { return tp_mpi_; }
  MPI_Comm dp_mpi_comm() const { return dp_mpi_; }

 private:
  GridShape grid_;
  int world_rank_ = 0;
  MPI_Comm tp_mpi_ = MPI_COMM_NULL, dp_mpi_ = MPI_COMM_NULL;
  std::shared_ptr<Communicator> tp_comm_, dp_comm_, world_comm_;
};

}  // namespace ac::dist

// ParallelLayout: the TP x DP rank grid in Megatron order (TP fastest):
//   world_rank = tp_rank + tp_size * dp_rank
// so a TP group is a run of consecutive ranks and stays inside a node. Expert parallelism
// (EP) is folded onto the DP ranks as Megatron's MoE grid TP x EP x EDP does:
//   dp_rank = ep_rank + ep_size * edp_rank
// an EP group is EP consecutive DP ranks of one TP rank (they hold different experts), an
// expert-DP group the DP ranks of one TP rank and one EP rank (they hold the same experts), and
// a TP x EP group (Megatron's tp_ep group) the TP groups of one EP group, ranked
// tp_rank x EP + ep_rank (the order of the whole experts' owners; MoE dispatch with SP).
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
  int ep = 1;          // expert parallel over DP ranks: must divide DP
};

// The pure arithmetic of the grid, usable without MPI (e.g. to print a plan).
struct GridShape {
  int world = 1, tp = 1, dp = 1, ep = 1;
  int edp() const { return dp / ep; }  // expert data parallel: replicas of one expert shard
  int rank(int tp_rank, int dp_rank) const { return tp_rank + tp * dp_rank; }
  int tp_rank_of(int rank) const { return rank % tp; }
  int dp_rank_of(int rank) const { return rank / tp; }
  int ep_rank_of(int rank) const { return dp_rank_of(rank) % ep; }
  int edp_rank_of(int rank) const { return dp_rank_of(rank) / ep; }
  int tp_ep_rank_of(int rank) const { return tp_rank_of(rank) * ep + ep_rank_of(rank); }
  std::vector<std::vector<int>> tp_groups() const;   // ranks of each TP group
  std::vector<std::vector<int>> dp_groups() const;   // ranks of each DP group
  std::vector<std::vector<int>> ep_groups() const;   // ranks of each EP group
  std::vector<std::vector<int>> edp_groups() const;  // ranks of each expert-DP group
  std::vector<std::vector<int>> tp_ep_groups() const;  // ranks of each TP x EP group, in its rank order
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
  int ep_size() const { return grid_.ep; }
  int ep_rank() const { return grid_.ep_rank_of(world_rank_); }
  int edp_size() const { return grid_.edp(); }
  int edp_rank() const { return grid_.edp_rank_of(world_rank_); }
  Communicator& tp() const { return *tp_comm_; }
  Communicator& dp() const { return *dp_comm_; }
  Communicator& ep() const { return *ep_comm_; }    // self at EP 1
  Communicator& edp() const { return *edp_comm_; }  // the DP group at EP 1
  Communicator& world_comm() const { return *world_comm_; }
  MPI_Comm tp_mpi_comm() const { return tp_mpi_; }
  MPI_Comm dp_mpi_comm() const { return dp_mpi_; }
  MPI_Comm ep_mpi_comm() const { return ep_mpi_; }
  MPI_Comm edp_mpi_comm() const { return edp_mpi_; }
  // The TP x EP group as an MPI communicator only (no collective object: only SP at ETP 1
  // dispatches over it, on the model's backend; job::make_job_setup makes it then).
  MPI_Comm tp_ep_mpi_comm() const { return tp_ep_mpi_; }

 private:
  GridShape grid_;
  int world_rank_ = 0;
  MPI_Comm tp_mpi_ = MPI_COMM_NULL, dp_mpi_ = MPI_COMM_NULL, ep_mpi_ = MPI_COMM_NULL, edp_mpi_ = MPI_COMM_NULL,
           tp_ep_mpi_ = MPI_COMM_NULL;
  std::shared_ptr<Communicator> tp_comm_, dp_comm_, ep_comm_, edp_comm_, world_comm_;
};

}  // namespace ac::dist

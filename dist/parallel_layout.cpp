// The TP x DP grid: validation and MPI_Comm_split into sub-communicators.
#include "dist/parallel_layout.h"

#include "dist/error.h"

namespace ac::dist {

std::vector<std::vector<int>> GridShape::tp_groups() const {
  std::vector<std::vector<int>> groups(dp);
  for (int d = 0; d < dp; ++d)
    for (int t = 0; t < tp; ++t) groups[d].push_back(rank(t, d));
  return groups;
}

std::vector<std::vector<int>> GridShape::dp_groups() const {
  std::vector<std::vector<int>> groups(tp);
  for (int t = 0; t < tp; ++t)
    for (int d = 0; d < dp; ++d) groups[t].push_back(rank(t, d));
  return groups;
}

std::vector<std::vector<int>> GridShape::ep_groups() const {
  std::vector<std::vector<int>> groups;
  for (int e = 0; e < edp(); ++e)
    for (int t = 0; t < tp; ++t) {
      groups.emplace_back();
      for (int q = 0; q < ep; ++q) groups.back().push_back(rank(t, q + ep * e));
    }
  return groups;
}

std::vector<std::vector<int>> GridShape::edp_groups() const {
  std::vector<std::vector<int>> groups;
  for (int q = 0; q < ep; ++q)
    for (int t = 0; t < tp; ++t) {
      groups.emplace_back();
      for (int e = 0; e < edp(); ++e) groups.back().push_back(rank(t, q + ep * e));
    }
  return groups;
}

std::vector<std::vector<int>> GridShape::tp_ep_groups() const {
  std::vector<std::vector<int>> groups(static_cast<size_t>(edp()));
  for (int e = 0; e < edp(); ++e)
    for (int t = 0; t < tp; ++t)
      for (int q = 0; q < ep; ++q) groups[size_t(e)].push_back(rank(t, q + ep * e));
  return groups;
}

GridShape resolve_grid(int world_size, const LayoutSpec& spec) {
  const std::string where = "layout";
  if (world_size < 1) throw InputError(where, "world", "world size must be >= 1, got " + std::to_string(world_size));
  if (spec.tp < 1) throw InputError(where, "tp", "tensor-parallel size must be >= 1, got " + std::to_string(spec.tp));
  if (spec.dp < 0) throw InputError(where, "dp", "data-parallel size must be >= 1 (or 0 for world/tp), got " + std::to_string(spec.dp));
  if (world_size % spec.tp != 0)
    throw InputError(where, "tp", "world size " + std::to_string(world_size) +
                                      " is not divisible by the tensor-parallel size " + std::to_string(spec.tp));
  GridShape g;
  g.world = world_size;
  g.tp = spec.tp;
  g.dp = spec.dp == 0 ? world_size / spec.tp : spec.dp;
  if (g.tp * g.dp != world_size)
    throw InputError(where, "dp", "tp " + std::to_string(g.tp) + " x dp " + std::to_string(g.dp) + " = " +
                                      std::to_string(g.tp * g.dp) + " ranks, but the world has " +
                                      std::to_string(world_size));
  if (spec.ep < 1) throw InputError(where, "ep", "expert-parallel size must be >= 1, got " + std::to_string(spec.ep));
  if (g.dp % spec.ep != 0)
    throw InputError(where, "ep", "expert-parallel size " + std::to_string(spec.ep) +
                                      " does not divide the data-parallel size " + std::to_string(g.dp) +
                                      " (EP is folded onto the DP ranks)");
  g.ep = spec.ep;
  if (spec.num_heads > 0) {
    if (spec.tp > spec.num_heads)
      throw InputError(where, "tp", "tensor-parallel size " + std::to_string(spec.tp) + " is larger than the " +
                                        std::to_string(spec.num_heads) + " attention heads");
    if (spec.num_heads % spec.tp != 0)
      throw InputError(where, "tp", std::to_string(spec.num_heads) + " attention heads cannot be split evenly over " +
                                        std::to_string(spec.tp) + " tensor-parallel ranks");
  }
  return g;
}

ParallelLayout::ParallelLayout(MPI_Comm world, const LayoutSpec& spec, const std::string& backend,
                               int device_index) {
  int world_size = 1;
  MPI_Comm_size(world, &world_size);
  MPI_Comm_rank(world, &world_rank_);
  grid_ = resolve_grid(world_size, spec);  // deterministic: every rank throws or none does
  const int tp_rank = grid_.tp_rank_of(world_rank_);
  const int dp_rank = grid_.dp_rank_of(world_rank_);
  // Same dp_rank -> same TP group (ordered by tp_rank); same tp_rank -> same DP group.
  MPI_Comm_split(world, dp_rank, tp_rank, &tp_mpi_);
  MPI_Comm_split(world, tp_rank, dp_rank, &dp_mpi_);
  // Same TP rank and EDP rank -> one EP group; same TP rank and EP rank -> one expert-DP group.
  const int ep_rank = grid_.ep_rank_of(world_rank_), edp_rank = grid_.edp_rank_of(world_rank_);
  MPI_Comm_split(world, tp_rank + grid_.tp * edp_rank, ep_rank, &ep_mpi_);
  MPI_Comm_split(world, tp_rank + grid_.tp * ep_rank, edp_rank, &edp_mpi_);
  MPI_Comm_split(world, edp_rank, grid_.tp_ep_rank_of(world_rank_), &tp_ep_mpi_);
  // NCCL for a group of one would only cost a communicator (and need NCCL in the build):
  // the identity serves it, as the collectives of a group of one are.
  auto make = [&](MPI_Comm c, int size) {
    if (backend == "nccl" && size == 1) return make_self_communicator();
    return make_communicator(backend, c, device_index);
  };
  tp_comm_ = make(tp_mpi_, grid_.tp);
  dp_comm_ = make(dp_mpi_, grid_.dp);
  // At EP 1 the EP group is this rank alone and the expert-DP group is the DP group.
  ep_comm_ = grid_.ep == 1 ? make_self_communicator() : make(ep_mpi_, grid_.ep);
  edp_comm_ = grid_.ep == 1 ? dp_comm_ : make(edp_mpi_, grid_.edp());
  world_comm_ = make(world, grid_.world);
}

ParallelLayout::~ParallelLayout() {
  tp_comm_.reset();
  dp_comm_.reset();
  ep_comm_.reset();
  edp_comm_.reset();
  world_comm_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (tp_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&tp_mpi_);
    if (dp_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&dp_mpi_);
    if (ep_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&ep_mpi_);
    if (edp_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&edp_mpi_);
    if (tp_ep_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&tp_ep_mpi_);
  }
}

}  // namespace ac::dist

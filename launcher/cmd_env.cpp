// `autocompress env`: versions, build features, threads, and the TP x DP rank grid this
// job would use. Under mpirun it builds the real grid and reports every rank's place in it.
#include <nlohmann/json.hpp>

#include <iomanip>
#include <iostream>
#include <sstream>
#include <unistd.h>

#include "dist/device.h"
#include "dist/error.h"
#include "dist/parallel_layout.h"
#include "dist/runtime.h"
#include "launcher/build_info.h"
#include "launcher/command.h"
#include "launcher/hardware_arg.h"

namespace ac::launcher {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "SINGLE";
    case MPI_THREAD_FUNNELED: return "FUNNELED";
    case MPI_THREAD_SERIALIZED: return "SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MULTIPLE";
    default: return "?";
  }
}

std::string groups_text(const std::vector<std::vector<int>>& groups) {
  std::ostringstream os;
  for (const auto& g : groups) {
    os << " [";
    for (size_t i = 0; i < g.size(); ++i) os << (i ? " " : "") << g[i];
    os << "]";
  }
  return os.str();
}

int run_env(const po::variables_map& vm, RunContext& ctx) {
  dist::Runtime& rt = ctx.runtime;
  // The device this rank would use, by the resolver every stage uses (`--device cuda` where it
  // cannot be had: exit 2 on every rank, with the reason).
  const dist::DeviceChoice dev = dist::choose_device(vm["device"].as<std::string>(), rt.local_rank());
  dist::LayoutSpec spec{vm["tp"].as<int>(), vm["dp"].as<int>(), vm["heads"].as<int>(), vm["ep"].as<int>()};
  // A single process may plan for a larger world; under mpirun the grid must fit the world.
  const bool planning = rt.world_size() == 1 && spec.dp > 0;
  const int world = planning ? spec.tp * spec.dp : rt.world_size();
  const dist::GridShape grid = dist::resolve_grid(world, spec);

  // Where each real rank landed: (tp_rank, dp_rank, local_rank), gathered on rank 0.
  std::vector<int> placement;
  if (!planning) {
    dist::ParallelLayout layout(rt.world(), spec);
    int mine[3] = {layout.tp_rank(), layout.dp_rank(), rt.local_rank()};
    placement.resize(3 * static_cast<size_t>(rt.world_size()));
    MPI_Gather(mine, 3, MPI_INT, placement.data(), 3, MPI_INT, 0, rt.world());
    layout.world_comm().barrier();
  }

  nlohmann::json features = build_features();
  nlohmann::json layout_json = {{"world_size", grid.world}, {"tp", grid.tp}, {"dp", grid.dp},
                                {"order", "tp fastest: rank = tp_rank + tp * dp_rank"},
                                {"tp_groups", grid.tp_groups()}, {"dp_groups", grid.dp_groups()},
                                {"ep", grid.ep}, {"ep_groups", grid.ep_groups()}, {"edp_groups", grid.edp_groups()},
                                {"planned_only", planning}};
  if (!rt.is_root()) return kExitOk;

  if (vm["json"].as<bool>()) {
    std::cout << nlohmann::json{{"build", features}, {"layout", layout_json},
                                {"mpi_thread_level", thread_level_name(rt.thread_level())},
                                {"device", dev.device}, {"device_reason", dev.reason}}
                     .dump(2)
              << "\n";
  } else {
    auto row = [](const std::string& k, const std::string& v) {
      std::cout << "  " << std::left << std::setw(10) << k << v << "\n";
    };
    const auto& f = features;
    std::cout << "autocompress " << f["autocompress"]["version"].get<std::string>() << " ("
              << f["autocompress"]["git"].get<std::string>() << ", " << f["autocompress"]["build_type"].get<std::string>()
              << ")\n";
    row("LibTorch", f["libtorch"]["version"].get<std::string>() + (f["libtorch"]["cuda"].get<bool>() ? " (CUDA)" : " (CPU only)"));
    row("MPI", f["mpi"]["library"].get<std::string>() + " (MPI " + f["mpi"]["standard"].get<std::string>() +
                   ", thread level " + thread_level_name(rt.thread_level()) + ")");
    row("HDF5", f["hdf5"]["version"].get<std::string>() + (f["hdf5"]["parallel"].get<bool>() ? " (parallel)" : " (serial)"));
    row("NCCL", f["nccl"]["built"].get<bool>() ? "built, version " + f["nccl"]["version"].get<std::string>()
                                               : std::string("not built (CUDA/NCCL not found at configure time)"));
    row("CUDA", "toolkit " + (f["cuda"]["toolkit"].get<std::string>().empty() ? std::string("none") : f["cuda"]["toolkit"].get<std::string>()) +
                    "; LibTorch sees " + std::to_string(f["cuda"]["devices"].get<int64_t>()) + " CUDA device(s)");
    auto value = [](const nlohmann::json& v) { return v.get<std::string>().empty() ? std::string("unset") : v.get<std::string>(); };
    row("Threads", "intra-op " + std::to_string(f["threads"]["intra_op"].get<int>()) + ", inter-op " +
                       std::to_string(f["threads"]["inter_op"].get<int>()) + ", OMP_WAIT_POLICY " +
                       value(f["threads"]["omp_wait_policy"]) + ", GOMP_SPINCOUNT " +
                       value(f["threads"]["gomp_spincount"]) +
                       (f["threads"]["openblas"].get<int>() > 0
                            ? ", OpenBLAS " + std::to_string(f["threads"]["openblas"].get<int>())
                            : std::string()));
    row("oneDNN", "caches: ONEDNN_PRIMITIVE_CACHE_CAPACITY " + value(f["onednn_caches"]["primitive_cache_capacity"]) +
                      ", LRU_CACHE_CAPACITY " + value(f["onednn_caches"]["ideep_lru_cache_capacity"]));
    {
      const auto& c = f["cpu"];
      std::string isa;
      for (const char* k : {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
        isa += std::string(isa.empty() ? "" : ", ") + k + (c[k].get<bool>() ? " yes" : " no");
      row("CPU", c["model"].get<std::string>() + " (" + c["vendor"].get<std::string>() + "): " + isa);
      row("dtype", "auto -> " + c["dtype_auto"].get<std::string>() + " (" + c["dtype_auto_reason"].get<std::string>() + ")");
      row("Denormals", c["denormals_flushed"].get<bool>() ? "flushed to zero (FTZ + DAZ; AC_KEEP_DENORMALS=1 keeps them)"
                                                          : std::string("kept (AC_KEEP_DENORMALS=1, or not x86)"));
      row("Profile", local_profile_summary(default_cache_dir()));
      const auto& tc = f["cpu_tensor_cache"];
      row("Allocator", tc["limit_bytes"].get<int64_t>() > 0
                           ? "freed CPU blocks >= 1 MiB kept for reuse, up to " +
                                 std::to_string(tc["limit_bytes"].get<int64_t>() >> 20) + " MiB (AC_CPU_CACHE_MB)"
                           : std::string("no reuse of freed CPU blocks (AC_CPU_CACHE_MB=0)"));
    }
    row("World", std::to_string(rt.world_size()) + " rank(s), " + std::to_string(rt.local_size()) +
                     " on this node (local rank from " + rt.local_rank_source() + "), device " + dev.device +
                     " (" + dev.reason + ")");
    std::cout << "\nRank grid: TP " << grid.tp << " x DP " << grid.dp << " = " << grid.world
              << " ranks, TP fastest (Megatron order)" << (planning ? " [planned; run under mpirun to build it]" : "")
              << std::right << "\n  rank  tp_rank  dp_rank" << (planning ? "" : "  local_rank") << "\n";
    for (int r = 0; r < grid.world; ++r) {
      std::cout << "  " << std::setw(4) << r << "  " << std::setw(7) << grid.tp_rank_of(r) << "  " << std::setw(7)
                << grid.dp_rank_of(r);
      if (!planning) std::cout << "  " << std::setw(10) << placement[3 * r + 2];
      std::cout << "\n";
    }
    std::cout << "  TP groups:" << groups_text(grid.tp_groups()) << "\n  DP groups:" << groups_text(grid.dp_groups())
              << "\n";
    if (grid.ep > 1)  // MoE layers: experts over TP x EP, EP folded onto DP (dp_rank = ep_rank + EP x edp_rank)
      std::cout << "  EP " << grid.ep << " over DP ranks, expert DP " << grid.edp() << "\n  EP groups:"
                << groups_text(grid.ep_groups()) << "\n  expert-DP groups:" << groups_text(grid.edp_groups()) << "\n";
    if (!planning) {
      for (int r = 0; r < grid.world; ++r)
        if (placement[3 * r] != grid.tp_rank_of(r) || placement[3 * r + 1] != grid.dp_rank_of(r))
          throw std::runtime_error("rank " + std::to_string(r) + " landed at a different grid position");
    }
  }
  if (vm.count("out")) ctx.write_manifest(vm["out"].as<std::string>(), layout_json);
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "env", "versions, build features, threads and the TP x DP rank grid",
    [](po::options_description& d) {
      d.add_options()("tp", po::value<int>()->default_value(1), "tensor-parallel size")(
          "dp", po::value<int>()->default_value(0), "data-parallel size (0: world size / tp; set it without mpirun to plan a grid)")(
          "heads", po::value<int>()->default_value(0), "attention heads of the model: refuse a TP size they cannot be split over")(
          "device", po::value<std::string>()->default_value("auto")->value_name("auto|cpu|cuda"),
          "the device to report: what it resolves to on this rank, and why")(
          "ep", po::value<int>()->default_value(1), "expert-parallel size of MoE layers, folded onto the DP ranks (must divide DP)")(
          "json", po::bool_switch(), "print JSON")(
          "out", po::value<std::string>()->value_name("DIR"), "also write DIR/manifest.json");
    },
    run_env}));

}  // namespace
}  // namespace ac::launcher

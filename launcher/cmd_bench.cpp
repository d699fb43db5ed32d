// `autocompress bench comm`: the communicator benchmark from bench/comm_bench.h.
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench/checkpoint_bench.h"
#include "bench/comm_bench.h"
#include "dist/error.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "launcher/config_file.h"

namespace ac::launcher {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) if (!item.empty()) out.push_back(item);
  return out;
}

int run_bench_comm(const po::variables_map& vm, RunContext& ctx) {
  bench::CommBenchOptions opt;
  opt.min_bytes = parse_size(vm["min-bytes"].as<std::string>(), "--min-bytes");
  opt.max_bytes = parse_size(vm["max-bytes"].as<std::string>(), "--max-bytes");
  opt.dtypes = split_list(vm["dtypes"].as<std::string>());
  opt.ops = split_list(vm["ops"].as<std::string>());
  opt.min_iters = vm["iters"].as<int>();
  opt.seconds_per_point = vm["seconds"].as<double>();
  if (opt.min_bytes > opt.max_bytes) throw InputError("command line", "--min-bytes", "larger than --max-bytes");
  for (const auto& d : opt.dtypes)
    if (d != "f32" && d != "bf16") throw InputError("command line", "--dtypes", "unknown dtype '" + d + "' (f32, bf16)");
  for (const auto& o : opt.ops)
    if (o != "all_reduce" && o != "all_gather")
      throw InputError("command line", "--ops", "unknown op '" + o + "' (all_reduce, all_gather)");
  const int n = ctx.runtime.world_size();
  if (opt.min_bytes % (4 * n) != 0)
    throw InputError("command line", "--min-bytes", "must be a multiple of 4 x world size");

  const auto rows = bench::run_comm_bench(ctx.runtime.world(), opt);
  if (!ctx.runtime.is_root()) return kExitOk;
  std::cout << bench::format_comm_table(rows, n) << std::flush;
  if (vm.count("out")) {
    const std::string dir = vm["out"].as<std::string>();
    ctx.write_manifest(dir, {{"world_size", n}, {"tp", 1}, {"dp", n}});
    std::ofstream out(dir + "/comm_bench.jsonl");
    for (const auto& r : rows) out << r.to_json().dump() << "\n";
  }
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "bench comm", "all_reduce / all_gather bus bandwidth of the communicator vs raw MPI (run under mpirun)",
    [](po::options_description& d) {
      d.add_options()("min-bytes", po::value<std::string>()->default_value("1MiB"), "smallest buffer")(
          "max-bytes", po::value<std::string>()->default_value("256MiB"), "largest buffer (sizes double)")(
          "dtypes", po::value<std::string>()->default_value("f32,bf16"), "comma-separated: f32, bf16")(
          "ops", po::value<std::string>()->default_value("all_reduce,all_gather"), "comma-separated: all_reduce, all_gather")(
          "iters", po::value<int>()->default_value(3), "minimum timed iterations per point and implementation")(
          "seconds", po::value<double>()->default_value(1.0), "time budget per point and implementation")(
          "out", po::value<std::string>()->value_name("DIR"), "write DIR/manifest.json and DIR/comm_bench.jsonl");
    },
    run_bench_comm}));

int run_bench_checkpoint(const po::variables_map& vm, RunContext& ctx) {
  bench::CheckpointBenchOptions opt;
  opt.dir = vm["dir"].as<std::string>();
  opt.total_bytes = parse_size(vm["bytes"].as<std::string>(), "--bytes");
  opt.repeats = vm["repeats"].as<int>();
  opt.drop_caches = !vm["keep-cache"].as<bool>();
  const std::string wb = vm["write-behind"].as<std::string>();
  opt.write_behind_bytes = wb == "0" ? 0 : parse_size(wb, "--write-behind");
  if (opt.repeats < 1) throw InputError("command line", "--repeats", "must be >= 1");
  const std::string report = bench::run_checkpoint_bench(ctx.runtime.world(), opt);
  if (ctx.runtime.is_root()) std::cout << report << std::flush;
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "bench checkpoint", "checkpoint write/read GB/s vs plain sequential writes+fsync and reads of the same bytes, and vs safetensors writes",
    [](po::options_description& d) {
      d.add_options()("dir", po::value<std::string>()->default_value("runs/bench-checkpoint"), "scratch directory on the disk to measure")(
          "bytes", po::value<std::string>()->default_value("1GiB"), "state size over all ranks")(
          "repeats", po::value<int>()->default_value(5), "alternating repeats (medians of the per-repeat ratios reported)")(
          "keep-cache", po::bool_switch(), "do not drop the page cache before reads")(
          "write-behind", po::value<std::string>()->default_value("16MiB"),
          "write-behind batch of the checkpoint and of the plain write-behind baseline (0: off)");
    },
    run_bench_checkpoint}));

}  // namespace
}  // namespace ac::launcher

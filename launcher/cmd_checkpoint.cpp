// `autocompress checkpoint inspect|verify|import`: look inside an HDF5 checkpoint, or make
// one from a Hugging Face checkpoint.
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "dist/error.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "launcher/config_file.h"

namespace ac::launcher {
namespace {

// A directory means "the checkpoint its `latest` points to".
std::string resolve(const std::string& path) {
  return std::filesystem::is_directory(path) ? checkpoint::resolve_latest(path) : path;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  std::ostringstream os;
  os << std::fixed << std::setprecision(u ? 1 : 0) << b << " " << units[u];
  return os.str();
}

int run_checkpoint_inspect(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  const std::string path = resolve(vm["path"].as<std::string>());
  checkpoint::CheckpointReader r(path);
  if (vm["json"].as<bool>()) {
    nlohmann::json j{{"path", path}, {"attributes", r.attributes()}, {"datasets", nlohmann::json::array()}};
    for (const auto& d : r.datasets())
      j["datasets"].push_back({{"name", d.name}, {"shape", d.shape}, {"dtype", d.dtype}, {"bytes", d.bytes}});
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  int64_t total = 0;
  for (const auto& d : r.datasets()) total += d.bytes;
  std::cout << path << "\n  file size  " << human_bytes(double(std::filesystem::file_size(path))) << " ("
            << r.datasets().size() << " datasets, " << human_bytes(double(total)) << " of tensor data)\n";
  for (const auto& [k, v] : r.attributes().items()) {
    std::string s = v.is_string() ? v.get<std::string>() : v.dump();
    if (s.size() > 100) s = s.substr(0, 97) + "...";
    std::cout << "  " << std::left << std::setw(16) << k << " " << s << "\n";
  }
  std::cout << "\n  " << std::left << std::setw(48) << "dataset" << std::setw(10) << "dtype" << std::setw(22) << "shape"
            << "size\n";
  for (const auto& d : r.datasets()) {
    std::string shape = "[";
    for (size_t i = 0; i < d.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(d.shape[i]);
    shape += "]";
    std::cout << "  " << std::left << std::setw(48) << d.name << std::setw(10) << d.dtype << std::setw(22) << shape
              << human_bytes(double(d.bytes)) << "\n";
  }
  return kExitOk;
}

int run_verify(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  const bool checksums = !vm["no-checksums"].as<bool>();
  // Several paths: each is verified and reported on its own line; the exit code is 2 when any
  // of them has a problem (or does not open), after all were tried.
  const auto paths = vm["path"].as<std::vector<std::string>>();
  int rc = kExitOk;
  for (const auto& arg : paths) {
    std::vector<std::string> problems;
    std::string path = arg;
    size_t datasets = 0;
    bool model = false;
    try {
      path = resolve(arg);
      checkpoint::CheckpointReader r(path);
      problems = r.verify(checksums);
      model = r.attributes().contains(checkpoint::kArchSpecAttribute);
      for (auto& p : checkpoint::verify_model_shapes(r)) problems.push_back(std::move(p));
      datasets = r.datasets().size();
    } catch (const InputError& e) {
      if (paths.size() == 1) throw;
      problems.push_back(e.what());
    }
    for (const auto& p : problems) std::cerr << "autocompress: error: " << p << "\n";
    if (!problems.empty()) {
      rc = kExitUsage;
      continue;
    }
    std::cout << path << ": ok (" << datasets << " datasets readable" << (checksums ? ", checksums match" : "")
              << (model ? ", shapes match the ArchSpec" : "") << ")\n";
  }
  return rc;
}

int run_import(const po::variables_map& vm, RunContext& ctx) {
  checkpoint::ImportOptions opt;
  if (vm.count("dtype")) {
    opt.dtype = vm["dtype"].as<std::string>();
    if (checkpoint::parse_dtype(opt.dtype) == torch::kFloat16)
      throw InputError("command line", "--dtype", "'" + opt.dtype + "': expected bf16 or f32");
  }
  opt.tp = vm["tp"].as<int>();
  refuse_checkpoint_dir(vm["out"].as<std::string>(), "--out", vm["force"].as<bool>());
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = checkpoint::import_hf(ctx.runtime.world(), vm["hf"].as<std::string>(), vm["out"].as<std::string>(), opt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!ctx.runtime.is_root()) return kExitOk;
  std::cout << "imported " << vm["hf"].as<std::string>() << " (" << r.spec.layers.size() << " layers, "
            << r.spec.dtype << ") at TP " << r.tp << " x DP " << r.dp << " in " << secs << " s -> " << r.path << " ("
            << human_bytes(double(std::filesystem::file_size(r.path))) << ")\n";
  ctx.write_manifest(vm["out"].as<std::string>(), {{"world_size", ctx.runtime.world_size()}, {"tp", r.tp}, {"dp", r.dp}});
  return kExitOk;
}

void path_option(po::options_description& d) {
  d.add_options()("path", po::value<std::string>()->required(), "checkpoint file, or a directory (uses its `latest`)");
}
void path_positional(po::positional_options_description& p) { p.add("path", 1); }

AC_REGISTER_SUBCOMMAND((Subcommand{"checkpoint inspect", "layout, tensors, shapes, dtypes, attributes and size of a checkpoint",
                                   [](po::options_description& d) {
                                     path_option(d);
                                     d.add_options()("json", po::bool_switch(), "print JSON");
                                   },
                                   run_checkpoint_inspect, path_positional}));
AC_REGISTER_SUBCOMMAND((Subcommand{"checkpoint verify", "read every dataset of checkpoints, check their checksums and their shapes against the ArchSpec",
                                   [](po::options_description& d) {
                                     d.add_options()("path", po::value<std::vector<std::string>>()->multitoken()->required(),
                                                     "checkpoint files, or directories (each uses its `latest`); "
                                                     "exit 2 when any fails");
                                     d.add_options()("no-checksums", po::bool_switch(), "only check that every dataset reads");
                                   },
                                   run_verify, [](po::positional_options_description& p) { p.add("path", -1); }}));
AC_REGISTER_SUBCOMMAND((Subcommand{
    "checkpoint import", "a Hugging Face checkpoint (config.json + safetensors) into an HDF5 checkpoint (run under mpirun)",
    [](po::options_description& d) {
      d.add_options()("hf", po::value<std::string>()->required()->value_name("DIR"),
                      "Hugging Face checkpoint directory: config.json + model.safetensors or sharded with index")(
          "out", po::value<std::string>()->required()->value_name("DIR"),
          "checkpoint directory: gets step_0.h5, latest and manifest.json")(
          "force", po::bool_switch(), "replace the checkpoint --out already holds")(
          "dtype", po::value<std::string>()->value_name("bf16|f32"), "stored dtype (default: config.json's torch_dtype)")(
          "tp", po::value<int>()->default_value(0),
          "tensor-parallel size the ranks load at (0: the world size; world = tp x dp, DP replica 0 writes)");
    },
    run_import}));

}  // namespace
}  // namespace ac::launcher

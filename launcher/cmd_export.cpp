// `autocompress export`: a checkpoint as a deployment artifact, either one HDF5 file in this
// project's format at the serving dtype (with its ArchSpec), or the Hugging Face layout
// (safetensors + config.json with per-layer overrides) that transformers and vLLM load.
#include <chrono>
#include <filesystem>
#include <iostream>

#include "checkpoint/convert.h"
#include "dist/error.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "launcher/config_file.h"

namespace ac::launcher {
namespace {

int run_export(const po::variables_map& vm, RunContext& ctx) {
  const std::string format = vm["format"].as<std::string>();
  if (format != "hdf5" && format != "safetensors")
    throw InputError("command line", "--format", "unknown format '" + format + "' (hdf5 or safetensors)");
  const std::string dtype_arg = vm["dtype"].as<std::string>();
  const torch::Dtype dtype = checkpoint::parse_dtype(dtype_arg);
  if (dtype == torch::kFloat16) throw InputError("command line", "--dtype", "'" + dtype_arg + "': expected bf16 or f32");
  const int64_t shard = parse_size(vm["max-shard-size"].as<std::string>(), "--max-shard-size");
  const std::string source = vm["checkpoint"].as<std::string>();
  const std::string out = vm["out"].as<std::string>();
  // One process does the work (the model is rebuilt at TP = 1); other ranks have nothing to do.
  if (!ctx.runtime.is_root()) return kExitOk;

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> files;
  if (format == "hdf5") {
    files.push_back(checkpoint::export_hdf5(source, out, dtype));
  } else {
    for (const auto& f : checkpoint::export_safetensors(source, out, dtype, shard))
      files.push_back((std::filesystem::path(out) / f).string());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t bytes = 0;
  for (const auto& f : files) bytes += int64_t(std::filesystem::file_size(f));
  std::cout << "exported " << checkpoint::resolve_checkpoint(source) << " as " << format << " "
            << checkpoint::dtype_name(dtype) << " in " << secs << " s:\n";
  for (const auto& f : files) std::cout << "  " << f << "\n";
  std::cout << "  (" << bytes << " bytes)\n";
  ctx.write_manifest(out, {{"world_size", 1}, {"tp", 1}, {"dp", 1}});
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "export", "a checkpoint for serving: one HDF5 file at bf16/f32, or Hugging Face safetensors + config.json",
    [](po::options_description& d) {
      d.add_options()("checkpoint", po::value<std::string>()->required()->value_name("PATH"),
                      "checkpoint file, or a checkpoint directory (uses its `latest`)")(
          "format", po::value<std::string>()->required()->value_name("hdf5|safetensors"),
          "hdf5: DIR/step_<N>.h5 + DIR/latest in this project's format; safetensors: the Hugging Face layout")(
          "dtype", po::value<std::string>()->default_value("bf16")->value_name("bf16|f32"),
          "weight dtype of the export (MoE routers stay f32)")(
          "out", po::value<std::string>()->required()->value_name("DIR"), "output directory (not the source's)")(
          "max-shard-size", po::value<std::string>()->default_value("5GiB"),
          "safetensors: above this, model-0000i-of-0000n.safetensors + index");
    },
    run_export}));

}  // namespace
}  // namespace ac::launcher

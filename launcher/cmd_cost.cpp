// `autocompress cost predict` (memory, TTFT, TPOT, throughput of an architecture on a device,
// engine and workload) and `autocompress cost calibrate` (fit a hardware profile here).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dist/error.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "model/arch_spec.h"
#include "search/costmodel/calibrate.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/profiles.h"

namespace ac::launcher {
namespace {

std::string required(const po::variables_map& vm, const char* name, const char* cmd) {
  if (!vm.count(name))
    throw InputError(std::string("autocompress ") + cmd + ": missing --" + name + " (see --help)");
  return vm[name].as<std::string>();
}

int run_cost_predict(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  const std::string dir = vm["configs-dir"].as<std::string>();
  const model::ArchSpec spec = model::load_arch(required(vm, "arch", "cost predict"));
  const search::HardwareProfile hw = search::load_hardware(required(vm, "hardware", "cost predict"), dir);
  const search::EngineProfile engine = search::load_engine(vm["engine"].as<std::string>(), dir);
  const search::Workload workload = search::load_workload(required(vm, "workload", "cost predict"), dir);
  const search::Prediction p = search::predict(spec, hw, engine, workload);
  if (vm["json"].as<bool>()) std::cout << p.to_json(vm["per-layer"].as<bool>()).dump(2) << "\n";
  else std::cout << p.table(vm["per-layer"].as<bool>());
  return kExitOk;
}

int run_cost_calibrate(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  search::CalibrationOptions o;
  const std::string out = required(vm, "out", "cost calibrate");
  o.id = vm["id"].as<std::string>();
  o.device = vm["device"].as<std::string>();
  o.dtype = vm["dtype"].as<std::string>();
  o.quick = vm["quick"].as<bool>();
  o.memory_bytes = vm["memory-bytes"].as<double>();
  if (o.memory_bytes == 0 && o.device == "cpu")  // physical memory of this machine
    o.memory_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  const search::CalibrationResult r = search::calibrate(o);
  std::printf("calibrated %s: %s\n", r.profile.id.c_str(), r.profile.name.c_str());
  std::printf("  %-10s %-28s %12s %12s %8s\n", "kind", "shape", "measured ms", "fitted ms", "error");
  for (const auto& p : r.points)
    std::printf("  %-10s %-28s %12.4f %12.4f %7.1f%%\n", p.kind.c_str(), p.shape.c_str(), p.seconds * 1e3,
                p.predicted_s * 1e3, 100.0 * (p.predicted_s - p.seconds) / p.seconds);
  std::printf("  peak %.1f GFLOP/s, memory %.2f GB/s, attention max %.3f, scan max %.3f; fit MAPE %.1f%%\n",
              r.profile.peak_flops / 1e9, r.profile.memory_bandwidth / 1e9, r.profile.attention.max,
              r.profile.scan.max, 100 * r.mape);
  const std::string tmp = out + ".tmp";
  {
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) throw InputError("--out", out, "cannot write " + tmp);
    const std::string text = r.to_json().dump(2) + "\n";
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) throw std::runtime_error(out + ": write failed");
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) throw std::runtime_error(out + ": rename from " + tmp + " failed");
  std::printf("  wrote %s\n", out.c_str());
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "cost predict", "memory, max concurrency, TTFT, TPOT and throughput of an architecture on a device/engine/workload",
    [](po::options_description& d) {
      d.add_options()("arch", po::value<std::string>()->value_name("FILE"), "ArchSpec JSON or Hugging Face config.json")(
          "hardware", po::value<std::string>()->value_name("ID|FILE"),
          "b200 h100 h200 rtx5090 rtx5080 rtx5070 l40s a100, or a profile .json (e.g. from cost calibrate)")(
          "engine", po::value<std::string>()->value_name("ID|FILE")->default_value("vllm"), "vllm or trtllm, or a .json")(
          "workload", po::value<std::string>()->value_name("ID|FILE"),
          "long-context-coding batched-serving in-game long-context-128k, or a .json")(
          "configs-dir", po::value<std::string>()->value_name("DIR")->default_value(search::default_configs_dir()),
          "where ids are looked up (<dir>/hardware, engines, workloads)")(
          "per-layer", po::bool_switch(), "add the per-layer breakdown")("json", po::bool_switch(), "print JSON");
    },
    run_cost_predict}));

AC_REGISTER_SUBCOMMAND((Subcommand{
    "cost calibrate", "time GEMMs, attention, the Mamba scan and copies here and write a fitted hardware profile",
    [](po::options_description& d) {
      d.add_options()("out", po::value<std::string>()->value_name("FILE"), "profile to write (e.g. configs/hardware/cpu-local.json)")(
          "id", po::value<std::string>()->default_value("cpu-local"), "profile id")(
          "device", po::value<std::string>()->default_value("cpu"), "cpu or cuda")(
          "dtype", po::value<std::string>()->default_value("bfloat16"), "bfloat16, float16 or float32")(
          "memory-bytes", po::value<double>()->default_value(0), "device memory (0: this machine's RAM for cpu)")(
          "quick", po::bool_switch(), "fewer sizes (seconds instead of about a minute)");
    },
    run_cost_calibrate}));

}  // namespace
}  // namespace ac::launcher

// `autocompress cost predict` (memory, TTFT, TPOT, throughput of an architecture on a device,
// engine and workload), `autocompress cost calibrate` (fit a hardware profile here) and
// `autocompress cost validate` (predicted vs measured for 24 architectures on this machine).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dist/error.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "model/arch_spec.h"
#include "search/costmodel/calibrate.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/profiles.h"
#include "search/costmodel/validate.h"

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
  o.threads = vm["threads"].as<int>();
  o.memory_bytes = vm["memory-bytes"].as<double>();
  if (o.memory_bytes == 0 && o.device == "cpu")  // physical memory of this machine
    o.memory_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  const search::CalibrationResult r = search::calibrate(o);
  std::printf("calibrated %s: %s; timed with the %s\n", r.profile.id.c_str(), r.profile.name.c_str(), r.clock.c_str());
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

int run_cost_validate(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  const std::string dir = vm["configs-dir"].as<std::string>();
  const search::HardwareProfile hw = search::load_hardware(required(vm, "hardware", "cost validate"), dir);
  const search::EngineProfile engine = search::load_engine(vm["engine"].as<std::string>(), dir);
  search::ValidationOptions o;
  o.prompt_tokens = vm["prompt-tokens"].as<int64_t>();
  o.decode_steps = vm["decode-steps"].as<int64_t>();
  o.repeats = vm["repeats"].as<int>();
  o.sweeps = vm["sweeps"].as<int>();
  if (o.sweeps < 1) throw InputError("--sweeps", std::to_string(o.sweeps), "must be positive");
  o.dtype = vm["dtype"].as<std::string>();
  o.threads = vm["threads"].as<int>();
  if (o.threads < 0) throw InputError("--threads", std::to_string(o.threads), "must not be negative");
  if (o.prompt_tokens < 1) throw InputError("--prompt-tokens", std::to_string(o.prompt_tokens), "must be positive");
  if (o.decode_steps < 1) throw InputError("--decode-steps", std::to_string(o.decode_steps), "must be positive");
  if (o.repeats < 1) throw InputError("--repeats", std::to_string(o.repeats), "must be positive");
  if (o.dtype != "bfloat16" && o.dtype != "float32" && o.dtype != "float16")
    throw InputError("--dtype", o.dtype, "expected bfloat16, float16 or float32");
  std::vector<search::ValidationCase> all = search::validation_architectures(), cases;
  if (vm.count("archs")) {
    std::stringstream names(vm["archs"].as<std::string>());
    for (std::string name; std::getline(names, name, ',');) {
      auto it = std::find_if(all.begin(), all.end(), [&](const auto& c) { return c.name == name; });
      if (it == all.end()) {
        std::string known;
        for (const auto& c : all) known += (known.empty() ? "" : " ") + c.name;
        throw InputError("--archs", name, "unknown architecture (known: " + known + ")");
      }
      cases.push_back(*it);
    }
  } else {
    cases = all;
  }
  const int64_t limit = vm["limit"].as<int64_t>();
  if (limit < 0) throw InputError("--limit", std::to_string(limit), "must not be negative");
  if (limit > 0 && size_t(limit) < cases.size()) cases.resize(size_t(limit));
  const search::ValidationResult r = search::validate_cost_model(hw, engine, o, cases);
  std::cout << r.table() << std::flush;
  if (vm.count("out")) {
    const std::string out = vm["out"].as<std::string>(), tmp = out + ".tmp";
    {
      std::ofstream f(tmp);
      if (!f) throw InputError("--out", out, "cannot write " + tmp);
      f << r.to_json().dump(2) << "\n";
      if (!f.flush()) throw std::runtime_error(out + ": write failed");
    }
    if (std::rename(tmp.c_str(), out.c_str()) != 0) throw std::runtime_error(out + ": rename from " + tmp + " failed");
    std::printf("wrote %s\n", out.c_str());
  }
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
          "quick", po::bool_switch(), "fewer sizes (seconds instead of about a minute)")(
          "threads", po::value<int>()->default_value(1),
          "LibTorch intra-op threads (1: timed by process CPU time, robust on a shared machine; 0: LibTorch's default)");
    },
    run_cost_calibrate}));

AC_REGISTER_SUBCOMMAND((Subcommand{
    "cost validate", "measure prefill, decode and peak memory of 24 small architectures here vs the cost model (MAPE)",
    [](po::options_description& d) {
      d.add_options()("hardware", po::value<std::string>()->value_name("ID|FILE"),
                      "this machine's profile, e.g. configs/hardware/cpu-local.json (from cost calibrate)")(
          "engine", po::value<std::string>()->value_name("ID|FILE")->default_value("local-eager"),
          "engine the measurements correspond to (local-eager: this project's model code, one sequence)")(
          "configs-dir", po::value<std::string>()->value_name("DIR")->default_value(search::default_configs_dir()),
          "where ids are looked up")(
          "out", po::value<std::string>()->value_name("FILE"), "also write the report as JSON")(
          "archs", po::value<std::string>()->value_name("A,B,..."), "only these architectures (names as printed)")(
          "limit", po::value<int64_t>()->default_value(0), "only the first N architectures (0: all)")(
          "prompt-tokens", po::value<int64_t>()->default_value(256), "prompt length of the prefill")(
          "decode-steps", po::value<int64_t>()->default_value(16), "decode steps after the prefill")(
          "repeats", po::value<int>()->default_value(5), "timed prefills per architecture and sweep (one warm-up first)")(
          "sweeps", po::value<int>()->default_value(3),
          "passes over all architectures (load bursts from other jobs spread over all of them); medians over all")(
          "dtype", po::value<std::string>()->default_value("bfloat16"), "bfloat16, float16 or float32")(
          "threads", po::value<int>()->default_value(1),
          "LibTorch intra-op threads, as in the profile's calibration (1: timed by process CPU time; 0: LibTorch's default)");
    },
    run_cost_validate}));

}  // namespace
}  // namespace ac::launcher

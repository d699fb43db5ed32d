// `autocompress cost predict` (memory, TTFT, TPOT, throughput of an architecture on a device,
// engine and workload), `autocompress cost calibrate` (fit a hardware profile here) and
// `autocompress cost validate` (predicted vs measured for 24 architectures on this machine).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dist/cpu_features.h"
#include "dist/device.h"
#include "dist/error.h"
#include "dist/file_io.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "launcher/hardware_arg.h"
#include "launcher/int_list.h"
#include "model/arch_spec.h"
#include "search/costmodel/calibrate.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/local_profile.h"
#include "search/costmodel/profiles.h"
#include "search/costmodel/validate.h"

namespace ac::launcher {
namespace {

std::string required(const po::variables_map& vm, const char* name, const char* cmd) {
  if (!vm.count(name))
    throw InputError(std::string("autocompress ") + cmd + ": missing --" + name + " (see --help)");
  return vm[name].as<std::string>();
}

// --hardware for predict/validate: cpu-local calibrates on first use; a CPU profile of another
// machine is used as given with a warning (validate recalibrates instead, see below).
HardwareArg hardware_arg(const po::variables_map& vm, const std::string& value, const std::string& dir) {
  HardwareArg h;
  h.value = value;
  h.configs_dir = dir;
  h.cache_dir = vm["cache-dir"].as<std::string>();
  h.dtype = cost_dtype(vm["dtype"].as<std::string>());
  h.threads = vm.count("threads") ? std::max(1, vm["threads"].as<int>()) : 1;
  h.quick = vm.count("quick-calibration") && vm["quick-calibration"].as<bool>();
  return h;
}

search::HardwareProfile hardware_for(const po::variables_map& vm, const std::string& value, const std::string& dir,
                                     std::ostream& warn) {
  const ResolvedHardware r = resolve_hardware(hardware_arg(vm, value, dir));
  if (!r.mismatch.empty())
    warn << "warning: " << r.mismatch << ": its CPU predictions describe that machine, not this one "
         << "(--hardware cpu-local: this machine's own profile)\n";
  return r.profile;
}

int run_cost_predict(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  const std::string dir = vm["configs-dir"].as<std::string>();
  const model::ArchSpec spec = model::load_arch(required(vm, "arch", "cost predict"));
  const std::string hw_arg = required(vm, "hardware", "cost predict");
  const search::Workload workload = search::load_workload(required(vm, "workload", "cost predict"), dir);
  const search::HardwareProfile hw = hardware_for(vm, hw_arg, dir, std::cerr);
  const search::EngineProfile engine = search::load_engine(vm["engine"].as<std::string>(), dir);
  const search::Prediction p = search::predict(spec, hw, engine, workload);
  if (vm["json"].as<bool>()) std::cout << p.to_json(vm["per-layer"].as<bool>()).dump(2) << "\n";
  else std::cout << p.table(vm["per-layer"].as<bool>());
  return kExitOk;
}

int run_cost_calibrate(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  search::CalibrationOptions o;
  o.id = vm["id"].as<std::string>();
  // The one resolver: `--device cuda` without a GPU is refused with the reason.
  const dist::DeviceChoice dev = dist::choose_device(vm["device"].as<std::string>(), ctx.runtime.local_rank());
  dist::apply_tf32_policy(dev);
  o.device = dev.cuda ? "cuda" : "cpu";
  std::printf("device: %s (%s)\n", dev.device.c_str(), dev.reason.c_str());
  std::string dtype_reason;
  o.dtype = cost_dtype(vm["dtype"].as<std::string>(), &dtype_reason);
  o.quick = vm["quick"].as<bool>();
  o.passes = vm["passes"].as<int>();
  if (o.passes < 1) throw InputError("--passes", std::to_string(o.passes), "must be positive");
  o.threads = vm["threads"].as<int>();
  o.memory_bytes = vm["memory-bytes"].as<double>();
  if (o.memory_bytes == 0 && o.device == "cpu")  // physical memory of this machine
    o.memory_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  // Without --out: this machine's entry of the per-user cache, which `--hardware cpu-local` reads.
  const std::string out = vm.count("out") ? vm["out"].as<std::string>()
                                          : search::local_profile_path(vm["cache-dir"].as<std::string>(),
                                                                       dist::detect_cpu(), o.dtype, o.threads);
  if (!vm.count("out")) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(out).parent_path(), ec);
  }
  std::printf("calibrating in %s (%s) on %s (%s)\n", o.dtype.c_str(), dtype_reason.c_str(),
              dist::detect_cpu().model.c_str(), dist::detect_cpu().isa().c_str());
  const auto t0 = std::chrono::steady_clock::now();
  const search::CalibrationResult r = search::calibrate_recorded(o);
  const double calib_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("calibrated %s: %s; timed with the %s\n", r.profile.id.c_str(), r.profile.name.c_str(), r.clock.c_str());
  std::printf("  %-10s %-28s %12s %12s %8s\n", "kind", "shape", "measured ms", "fitted ms", "error");
  for (const auto& p : r.points)
    std::printf("  %-10s %-28s %12.4f %12.4f %7.1f%%\n", p.kind.c_str(), p.shape.c_str(), p.seconds * 1e3,
                p.predicted_s * 1e3, 100.0 * (p.predicted_s - p.seconds) / p.seconds);
  std::printf("  peak %.1f GFLOP/s, memory %.2f GB/s, attention max %.3f, scan max %.3f; fit MAPE %.1f%%\n",
              r.profile.peak_flops / 1e9, r.profile.memory_bandwidth / 1e9, r.profile.attention.max,
              r.profile.scan.max, 100 * r.mape);
  if (const auto& g = r.profile.gemm_line; g.measured)
    std::printf("  GEMM line: %.1f us per call + %.3f ns per weight byte + FLOPs at %.1f GFLOP/s\n", g.fixed * 1e6,
                g.per_weight_byte * 1e9, g.per_flop > 0 ? 1e-9 / g.per_flop : 0.0);
  std::printf("  time per group:");
  for (size_t i = 0; i < r.phase_s.size(); ++i)
    std::printf("%s %s %.1f s", i ? "," : "", r.phase_s[i].first.c_str(), r.phase_s[i].second);
  std::printf("\n");
  write_file_atomic(out, r.to_json().dump(2) + "\n", "--out");
  std::printf("  wrote %s (calibration took %.1f s; other processes used %.1f of %d cores meanwhile)\n", out.c_str(),
              calib_s, r.profile.calibrated_on.other_cores, r.profile.calibrated_on.cores);
  if (const std::string busy = search::busy_warning(r.profile); !busy.empty())
    std::printf("warning: %s; the profile records it, and `--hardware cpu-local` recalibrates on a quiet use\n", busy.c_str());
  return kExitOk;
}

// "128,512,2048" -> {128, 512, 2048}: positive integers, exit 2 naming the option otherwise.
std::vector<int64_t> positive_list(const po::variables_map& vm, const char* name) {
  const std::string option = std::string("--") + name, text = vm[name].as<std::string>();
  const std::string problem = "expected positive integers separated by commas";
  std::vector<int64_t> out = parse_int_list(option, text, problem);
  for (const int64_t v : out)
    if (v < 1) throw InputError(option, text, problem);
  return out;
}

int run_cost_validate(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  const std::string dir = vm["configs-dir"].as<std::string>();
  // The one resolver: `--device cuda` without a GPU is refused with the reason.
  const dist::DeviceChoice dev = dist::choose_device(vm["device"].as<std::string>(), ctx.runtime.local_rank());
  dist::apply_tf32_policy(dev);
  std::printf("device: %s (%s)\n", dev.device.c_str(), dev.reason.c_str());
  const std::string hw_value = required(vm, "hardware", "cost validate");
  if (dev.cuda && hw_value == search::kLocalProfileId)
    throw InputError("--hardware", hw_value,
                     "cpu-local is this machine's CPU profile; on " + dev.device +
                         " validate against a profile calibrated there (cost calibrate --device cuda --out FILE)");
  ResolvedHardware res = resolve_hardware(hardware_arg(vm, hw_value, dir));
  // A GPU's profile records no CPU, so the CPU-mismatch rule below does not apply to it.
  if (dev.cuda) res.mismatch.clear();
  if (!res.mismatch.empty()) {
    // Validating this machine's measurements against another machine's profile measures the
    // difference between the machines, not the model: recalibrate here unless told not to.
    if (vm["keep-profile"].as<bool>()) {
      std::printf("warning: %s; validating against it anyway (--keep-profile)\n", res.mismatch.c_str());
    } else {
      std::printf("warning: %s; using this machine's own profile instead (--keep-profile to validate against it)\n",
                  res.mismatch.c_str());
      res = resolve_hardware(hardware_arg(vm, search::kLocalProfileId, dir));
    }
  }
  std::printf("profile: %s (%s)\n", res.path.c_str(), res.profile.name.c_str());
  std::fflush(stdout);
  const search::HardwareProfile& hw = res.profile;
  const search::EngineProfile engine = search::load_engine(vm["engine"].as<std::string>(), dir);
  search::ValidationOptions o;
  o.prompt_tokens = vm["prompt-tokens"].as<int64_t>();
  o.decode_steps = vm["decode-steps"].as<int64_t>();
  o.repeats = vm["repeats"].as<int>();
  o.sweeps = vm["sweeps"].as<int>();
  if (o.sweeps < 1) throw InputError("--sweeps", std::to_string(o.sweeps), "must be positive");
  o.dtype = cost_dtype(vm["dtype"].as<std::string>());
  if (dev.cuda && vm["dtype"].as<std::string>() == "auto") o.dtype = "bfloat16";  // auto on CUDA (choose_dtype)
  o.device = dev.device;
  o.threads = vm["threads"].as<int>();
  if (o.threads < 0) throw InputError("--threads", std::to_string(o.threads), "must not be negative");
  if (o.prompt_tokens < 1) throw InputError("--prompt-tokens", std::to_string(o.prompt_tokens), "must be positive");
  if (o.decode_steps < 1) throw InputError("--decode-steps", std::to_string(o.decode_steps), "must be positive");
  if (o.repeats < 1) throw InputError("--repeats", std::to_string(o.repeats), "must be positive");
  if (o.dtype != "bfloat16" && o.dtype != "float32" && o.dtype != "float16")
    throw InputError("--dtype", o.dtype, "expected bfloat16, float16 or float32");
  o.prompts = positive_list(vm, "prompts");
  o.concurrency = positive_list(vm, "concurrency");
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
  // --arch alone: only those files; with --archs or --limit: beside the built-in ones chosen.
  if (vm.count("arch") && !vm.count("archs") && limit == 0) cases.clear();
  if (vm.count("arch"))
    for (const std::string& f : vm["arch"].as<std::vector<std::string>>()) cases.push_back(search::validation_case_from_file(f));
  const search::ValidationResult r = search::validate_cost_model(hw, engine, o, cases);
  std::cout << r.table() << std::flush;
  if (vm.count("out")) {
    const std::string out = vm["out"].as<std::string>();
    write_file_atomic(out, r.to_json().dump(2) + "\n", "--out");
    std::printf("wrote %s\n", out.c_str());
  }
  return kExitOk;
}

// Which profile `--hardware` names and where it came from, without calibrating: the file, the
// machine, time and load of its calibration, and whether it describes this machine and build.
int run_cost_show(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  const std::string dir = vm["configs-dir"].as<std::string>();
  HardwareArg h = hardware_arg(vm, vm["hardware"].as<std::string>(), dir);
  h.calibrate = false;
  if (h.value == search::kLocalProfileId) {
    std::printf("profile: %s\n", local_profile_summary(h.cache_dir, h.dtype, h.threads).c_str());
    return kExitOk;
  }
  const ResolvedHardware r = resolve_hardware(h);
  std::printf("profile: %s (%s): %s\n", r.path.c_str(), r.profile.name.c_str(), profile_provenance(r.profile).c_str());
  if (!r.mismatch.empty()) std::printf("warning: %s\n", r.mismatch.c_str());
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "cost predict", "memory, max concurrency, TTFT, TPOT and throughput of an architecture on a device/engine/workload",
    [](po::options_description& d) {
      d.add_options()("arch", po::value<std::string>()->value_name("FILE"), "ArchSpec JSON or Hugging Face config.json")(
          "hardware", po::value<std::string>()->value_name("ID|FILE"),
          "b200 h100 h200 rtx5090 rtx5080 rtx5070 l40s a100, cpu-local (this machine, calibrated on first use), or a profile .json")(
          "engine", po::value<std::string>()->value_name("ID|FILE")->default_value("vllm"), "vllm or trtllm, or a .json")(
          "workload", po::value<std::string>()->value_name("ID|FILE"),
          "long-context-coding batched-serving in-game long-context-128k, or a .json")(
          "configs-dir", po::value<std::string>()->value_name("DIR")->default_value(search::default_configs_dir()),
          "where ids are looked up (<dir>/hardware, engines, workloads)")(
          "per-layer", po::bool_switch(), "add the per-layer breakdown")("json", po::bool_switch(), "print JSON")(
          "dtype", po::value<std::string>()->default_value("auto"), "cpu-local: the dtype of the profile (auto, bf16, f32)")(
          "cache-dir", po::value<std::string>()->value_name("DIR")->default_value(default_cache_dir()),
          "per-user cache of this machine's calibrated profiles (cpu-local)")(
          "quick-calibration", po::bool_switch(), "cpu-local not calibrated yet: the quick calibration (seconds)");
    },
    run_cost_predict}));

AC_REGISTER_SUBCOMMAND((Subcommand{
    "cost calibrate", "time GEMMs, attention, the Mamba scan and copies here and write a fitted hardware profile",
    [](po::options_description& d) {
      d.add_options()("out", po::value<std::string>()->value_name("FILE"),
                      "profile to write (default: this machine's cpu-local entry in the cache)")(
          "cache-dir", po::value<std::string>()->value_name("DIR")->default_value(default_cache_dir()),
          "per-user cache of this machine's calibrated profiles")(
          "id", po::value<std::string>()->default_value("cpu-local"), "profile id")(
          "device", po::value<std::string>()->default_value("cpu"),
          "cpu | cuda | auto (cuda when there is a GPU; default cpu: the cpu-local profile is this machine's CPU)")(
          "dtype", po::value<std::string>()->default_value("auto"),
          "auto (bf16 where the CPU has native bf16, else f32), bfloat16, float16 or float32")(
          "memory-bytes", po::value<double>()->default_value(0), "device memory (0: this machine's RAM for cpu)")(
          "quick", po::bool_switch(), "fewer sizes, one pass (seconds instead of about two minutes)")(
          "passes", po::value<int>()->default_value(3),
          "passes over all measurements, each point keeping its fastest (a shared machine's slow spells last seconds)")(
          "threads", po::value<int>()->default_value(1),
          "LibTorch intra-op threads (1: timed by process CPU time, robust on a shared machine; 0: LibTorch's default)");
    },
    run_cost_calibrate}));

AC_REGISTER_SUBCOMMAND((Subcommand{
    "cost validate", "measure prefill, decode and peak memory of 24 small architectures here vs the cost model (MAPE)",
    [](po::options_description& d) {
      d.add_options()("hardware", po::value<std::string>()->value_name("ID|FILE"),
                      "cpu-local (this machine's own profile, calibrated on first use) or a profile .json")(
          "engine", po::value<std::string>()->value_name("ID|FILE")->default_value("local-eager"),
          "engine the measurements correspond to (local-eager: this project's model code, one sequence)")(
          "configs-dir", po::value<std::string>()->value_name("DIR")->default_value(search::default_configs_dir()),
          "where ids are looked up")(
          "out", po::value<std::string>()->value_name("FILE"), "also write the report as JSON")(
          "archs", po::value<std::string>()->value_name("A,B,..."), "only these architectures (names as printed)")(
          "limit", po::value<int64_t>()->default_value(0), "only the first N architectures (0: all)")(
          "arch", po::value<std::vector<std::string>>()->value_name("FILE")->composing(),
          "validate this architecture (ArchSpec JSON or config.json: e.g. a run's search/arch.json, minitron/arch.json; repeatable); "
          "alone: only these, with --archs or --limit: beside those")(
          "prompt-tokens", po::value<int64_t>()->default_value(256), "prompt length of the base row's prefill and of the batched decodes")(
          "prompts", po::value<std::string>()->value_name("N,N,..")->default_value("128,2048"),
          "regimes: TTFT of one prompt of each length (besides --prompt-tokens)")(
          "concurrency", po::value<std::string>()->value_name("B,B,..")->default_value("1,4,8"),
          "regimes: TPOT and tokens/s of B sequences decoding together")(
          "decode-steps", po::value<int64_t>()->default_value(16), "decode steps after the prefill")(
          "repeats", po::value<int>()->default_value(2), "timed prefills per architecture and sweep (one warm-up first)")(
          "sweeps", po::value<int>()->default_value(5),
          "passes over all architectures, the models kept loaded; each time is the fastest sweep's median (a slow spell "
          "of a shared machine spoils whole sweeps)")(
          "device", po::value<std::string>()->default_value("cpu"),
          "cpu | cuda | auto: where the architectures run (cuda: --hardware is a profile from cost calibrate --device cuda)")(
          "dtype", po::value<std::string>()->default_value("auto"),
          "auto (bf16 on CUDA and where the CPU has native bf16, else f32), bfloat16, float16 or float32")(
          "threads", po::value<int>()->default_value(1),
          "LibTorch intra-op threads, as in the profile's calibration (1: timed by process CPU time; 0: LibTorch's default)")(
          "cache-dir", po::value<std::string>()->value_name("DIR")->default_value(default_cache_dir()),
          "per-user cache of this machine's calibrated profiles (cpu-local)")(
          "keep-profile", po::bool_switch(),
          "validate against --hardware even when it was calibrated on another CPU or dtype (default: recalibrate here)")(
          "quick-calibration", po::bool_switch(), "when this machine has no profile yet: the quick calibration (seconds)");
    },
    run_cost_validate}));

AC_REGISTER_SUBCOMMAND((Subcommand{
    "cost show", "which hardware profile --hardware names: its file, and when, under what load and on which CPU and kernels it was calibrated",
    [](po::options_description& d) {
      d.add_options()("hardware", po::value<std::string>()->value_name("ID|FILE")->default_value("cpu-local"),
                      "cpu-local (this machine's cached profile; nothing is calibrated) or a profile id or .json")(
          "configs-dir", po::value<std::string>()->value_name("DIR")->default_value(search::default_configs_dir()),
          "where ids are looked up")(
          "dtype", po::value<std::string>()->default_value("auto"), "cpu-local: the dtype of the profile (auto, bf16, f32)")(
          "threads", po::value<int>()->default_value(1), "cpu-local: the thread count of the profile")(
          "cache-dir", po::value<std::string>()->value_name("DIR")->default_value(default_cache_dir()),
          "per-user cache of this machine's calibrated profiles (cpu-local)");
    },
    run_cost_show}));

}  // namespace
}  // namespace ac::launcher

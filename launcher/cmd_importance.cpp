// `autocompress importance`: Minitron-style importance scores of a teacher checkpoint from
// one calibration forward under TP x DP, written to an HDF5 file (docs/importance.md); and
// `autocompress bench importance`: the collection forward's tokens/s against the plain
// teacher forward at the same layout and micro-batch.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "dist/cpu_features.h"
#include "dist/device.h"
#include "dist/error.h"
#include "dist/progress.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "model/arch_spec.h"
#include "search/importance/importance.h"

namespace fs = std::filesystem;

namespace ac::launcher {
namespace {

void add_calibration_options(po::options_description& d) {
  search::ImportanceOptions c;
  auto o = d.add_options();
  o("teacher", po::value<std::string>(), "teacher checkpoint (directory with `latest`, or .h5)");
  o("data", po::value<std::vector<std::string>>()->multitoken(),
    "datasets: PATH or WEIGHT:PATH (Megatron .bin/.idx prefix or .h5 token store), repeatable");
  o("split", po::value<std::string>()->default_value(c.split),
    "train,calibration,eval document fractions; samples come from the calibration split");
  o("calib-samples", po::value<int64_t>()->default_value(c.calib_samples), "calibration sequences in total");
  o("seq-len", po::value<int64_t>()->default_value(c.seq_len), "tokens per sequence");
  o("micro-batch", po::value<int64_t>()->default_value(c.micro_batch), "sequences per DP rank per forward");
  o("tp", po::value<int>()->default_value(c.tp), "tensor-parallel size (DP = world / TP)");
  o("seed", po::value<uint64_t>()->default_value(c.seed), "sample order seed");
  o("dtype", po::value<std::string>()->default_value(c.dtype),
    "compute dtype: auto (bf16 where the device has native bf16, else f32) | bf16 | f32");
  o("device", po::value<std::string>()->default_value(c.device),
    "auto | cpu | cuda (auto: cuda:<local rank> when this build and node have one)");
}

search::ImportanceOptions read_options(const po::variables_map& vm) {
  search::ImportanceOptions c;
  if (vm.count("teacher")) c.teacher = vm["teacher"].as<std::string>();
  if (vm.count("data")) c.data = vm["data"].as<std::vector<std::string>>();
  c.split = vm["split"].as<std::string>();
  c.calib_samples = vm["calib-samples"].as<int64_t>();
  c.seq_len = vm["seq-len"].as<int64_t>();
  c.micro_batch = vm["micro-batch"].as<int64_t>();
  c.tp = vm["tp"].as<int>();
  c.seed = vm["seed"].as<uint64_t>();
  c.dtype = vm["dtype"].as<std::string>();
  c.device = vm["device"].as<std::string>();
  return c;
}

using dist::format_duration;

int run_importance(const po::variables_map& vm, RunContext& ctx) {
  search::ImportanceOptions c = read_options(vm);
  c.depth_loss = !vm["no-depth-loss"].as<bool>();
  c.depth_loss_samples = vm["depth-loss-samples"].as<int64_t>();
  if (!vm.count("out")) throw InputError("--out", "value", "an output file (FILE.h5) is required");
  const std::string out = vm["out"].as<std::string>();
  if (fs::is_directory(out)) throw InputError(out, "--out", "is a directory; give the scores file, e.g. " + out + "/importance.h5");
  const bool root = ctx.runtime.is_root();
  const int64_t tokens_per_sample = c.seq_len;
  auto last = std::chrono::steady_clock::now() - std::chrono::hours(1);
  c.on_progress = [&](int64_t done, int64_t total, double seconds) {
    const auto now = std::chrono::steady_clock::now();
    if (!root || (done < total && now - last < std::chrono::seconds(2))) return;
    last = now;
    const double rate = seconds > 0 ? double(done) / seconds : 0.0;
    std::cout << "importance: " << done << "/" << total << " samples (" << (100 * done / total) << "%), " << std::fixed
              << std::setprecision(2) << rate << " samples/s, " << std::setprecision(0) << rate * double(tokens_per_sample)
              << " tokens/s, ETA " << format_duration(rate > 0 ? double(total - done) / rate : -1.0) << std::endl;
  };
  c.local_rank = ctx.runtime.local_rank();
  const auto device = dist::choose_device(c.device, c.local_rank);  // refuses cuda without one, on every rank
  const auto choice = dist::choose_dtype(c.dtype, device.cuda);
  if (root)
    std::cout << "importance: teacher " << c.teacher << ", " << c.calib_samples << " samples x " << c.seq_len
              << " tokens, TP " << c.tp << " x DP " << ctx.runtime.world_size() / std::max(1, c.tp) << ", dtype "
              << choice.dtype << " (" << choice.reason << "), device " << device.device << " (" << device.reason
              << "), depth loss "
              << (c.depth_loss ? (c.depth_loss_samples > 0 ? std::to_string(c.depth_loss_samples) + " samples" : "all samples")
                               : "off")
              << std::endl;
  const auto t0 = std::chrono::steady_clock::now();
  const search::ImportanceScores scores = search::compute_importance(c, ctx.runtime.world());
  if (root) {
    search::save_importance(scores, out);
    const fs::path p(out);
    ctx.write_manifest(p.has_parent_path() ? p.parent_path().string() : ".",
                       {{"world", ctx.runtime.world_size()}, {"tp", c.tp}, {"dp", ctx.runtime.world_size() / c.tp}},
                       p.filename().string() + ".manifest.json");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "layer  kind  1-cos(in,out)  loss increase\n";
    for (size_t i = 0; i < scores.layers.size(); ++i)
      std::cout << std::setw(5) << i << "  " << std::setw(4) << model::layer_kind(scores.teacher_arch.layers[i]) << "  "
                << std::setw(13) << std::setprecision(6) << std::defaultfloat << scores.layers[i].depth_cosine << "  "
                << std::setw(13) << scores.layers[i].depth_loss_increase << "\n";
    std::cout << "wrote " << out << " (teacher fingerprint " << scores.teacher_fingerprint << ", base loss "
              << std::setprecision(6) << scores.base_loss << ", " << std::fixed << std::setprecision(1) << secs << " s)"
              << std::endl;
  }
  return kExitOk;
}

int run_bench_importance(const po::variables_map& vm, RunContext& ctx) {
  search::ImportanceOptions c = read_options(vm);
  c.local_rank = ctx.runtime.local_rank();
  const int repeats = vm["repeats"].as<int>();
  if (repeats < 1) throw InputError("command line", "--repeats", "must be >= 1");
  const search::ImportanceBench b = search::bench_importance(c, ctx.runtime.world(), repeats);
  if (!ctx.runtime.is_root()) return kExitOk;
  std::cout << std::fixed << std::setprecision(1) << "bench importance: TP " << b.tp << " x DP " << b.dp << ", " << b.dtype
            << ", " << c.calib_samples << " samples x " << c.seq_len << " tokens, micro-batch " << c.micro_batch << ", "
            << repeats << " alternating repeats (medians)\n"
            << "  plain teacher forward        " << std::setw(10) << b.plain_tokens_per_s << " tokens/s\n"
            << "  importance collection        " << std::setw(10) << b.collect_tokens_per_s << " tokens/s\n"
            << "  ratio (goal >= 0.80)         " << std::setw(10) << std::setprecision(3) << b.ratio << "\n"
            << "  with skipped-layer losses    " << std::setw(10) << std::setprecision(1) << b.depth_tokens_per_s
            << " tokens/s (one extra partial forward per layer)" << std::endl;
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "importance", "Minitron-style importance scores of a teacher from one calibration forward (TP x DP), to an HDF5 file",
    [](po::options_description& d) {
      add_calibration_options(d);
      d.add_options()("no-depth-loss", po::bool_switch(), "skip the one-layer-skipped calibration losses")(
          "depth-loss-samples", po::value<int64_t>()->default_value(0),
          "calibration samples the skipped-layer losses use (the first N; 0: all)")(
          "out", po::value<std::string>()->value_name("FILE.h5"), "scores file (written atomically; manifest next to it)");
    },
    run_importance}));

// Reads and checks a scores file (format, version, shapes against its ArchSpec, and with
// --teacher that it was computed for that checkpoint) and prints a summary per layer.
int run_importance_inspect(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  if (!vm.count("path")) throw InputError("importance inspect", "PATH", "a scores file is required");
  const std::string path = vm["path"].as<std::string>();
  std::string fingerprint;
  if (vm.count("teacher")) {
    checkpoint::CheckpointReader reader(checkpoint::resolve_checkpoint(vm["teacher"].as<std::string>()));
    fingerprint = checkpoint::model_fingerprint(reader);
  }
  const search::ImportanceScores s = search::load_importance(path, fingerprint);
  auto range = [](const std::vector<double>& v) {
    if (v.empty()) return std::string();
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    std::ostringstream o;
    o << std::setprecision(4) << "[" << v.size() << "] " << *lo << " .. " << *hi;
    return o.str();
  };
  std::cout << path << "\n  teacher      " << s.teacher_checkpoint << " (fingerprint " << s.teacher_fingerprint << ")"
            << (fingerprint.empty() ? "" : ", matches --teacher") << "\n  data         " << s.data << " (split " << s.split
            << ")\n  calibration  " << s.calib_samples << " samples x " << s.seq_len << " tokens, seed " << s.seed << ", "
            << s.dtype << ", base loss " << s.base_loss << "\n  hidden       " << range(s.hidden) << "\n";
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const auto& l = s.layers[i];
    std::cout << "  layer " << i << " (" << model::layer_kind(s.teacher_arch.layers[i]) << "): 1-cos " << l.depth_cosine
              << ", loss increase " << l.depth_loss_increase << "\n";
    const std::pair<const char*, const std::vector<double>*> axes[] = {
        {"attn_heads", &l.attn_heads},         {"attn_kv_groups", &l.attn_kv_groups},
        {"mlp_neurons", &l.mlp_neurons},       {"mamba_heads", &l.mamba_heads},
        {"mamba_head_dim", &l.mamba_head_dim}, {"moe_experts", &l.moe_experts},
        {"moe_expert_tokens", &l.moe_expert_tokens}, {"moe_expert_neurons", &l.moe_expert_neurons},
        {"moe_shared_neurons", &l.moe_shared_neurons}, {"moe_latent", &l.moe_latent}};
    for (const auto& [name, v] : axes)
      if (!v->empty()) std::cout << "    " << std::left << std::setw(20) << name << std::right << range(*v) << "\n";
  }
  std::cout << std::flush;
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "importance inspect", "check an importance file (format, shapes, and with --teacher its fingerprint) and summarise it",
    [](po::options_description& d) {
      d.add_options()("path", po::value<std::string>(), "importance file (.h5)")(
          "teacher", po::value<std::string>(), "teacher checkpoint the file must have been computed for");
    },
    run_importance_inspect, [](po::positional_options_description& p) { p.add("path", 1); }}));

AC_REGISTER_SUBCOMMAND((Subcommand{
    "bench importance", "importance collection tokens/s vs the plain teacher forward at the same layout and batch",
    [](po::options_description& d) {
      add_calibration_options(d);
      d.add_options()("repeats", po::value<int>()->default_value(3), "alternating timed repeats (medians reported)");
    },
    run_bench_importance}));

}  // namespace
}  // namespace ac::launcher

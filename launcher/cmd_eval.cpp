// `autocompress eval`: LM loss, perplexity, next-token accuracy, bits per byte, last-word
// accuracy and KL to a teacher of a checkpoint on the held-out split of a tokenized corpus
// (eval/evaluate.h), one table line + JSON.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dist/error.h"
#include "dist/file_io.h"
#include "dist/runtime.h"
#include "eval/evaluate.h"
#include "distill/trainer.h"
#include "launcher/command.h"
#include "launcher/config_file.h"
#include "launcher/tokenizer_arg.h"

namespace ac::launcher {
namespace {

// Where `eval --model` and `generate --model` look when not told: the checkpoint that
// scripts/teacher_smollm2.sh writes (relative to the working directory).
constexpr const char* kDefaultTeacher = "teachers/smollm2-135m";

std::string fmt3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", v);
  return b;
}

int run_eval(const po::variables_map& vm, RunContext& ctx) {
  eval::EvalConfig c;
  c.model = vm["model"].as<std::string>();
  if (!std::filesystem::exists(c.model))
    throw InputError(c.model, "--model", "no such checkpoint" + std::string(vm["model"].defaulted()
                                                                    ? " (the default teacher: make it with scripts/teacher_smollm2.sh)"
                                                                    : ""));
  if (vm.count("out")) refuse_checkpoint_dir(vm["out"].as<std::string>(), "--out", vm["force"].as<bool>());
  if (vm.count("data")) c.data = vm["data"].as<std::vector<std::string>>();
  c.split = vm["split"].as<std::string>();
  c.which = vm["on"].as<std::string>();
  c.seq_len = vm["seq-len"].as<int64_t>();
  c.samples = vm["samples"].as<int64_t>();
  c.micro_batch = vm["micro-batch"].as<int64_t>();
  c.seed = vm["seed"].as<uint64_t>();
  c.tp = vm["tp"].as<int>();
  c.dtype = vm["dtype"].as<std::string>();
  c.device = vm["device"].as<std::string>();
  c.local_rank = ctx.runtime.local_rank();
  if (vm.count("teacher")) {
    c.teacher = vm["teacher"].as<std::string>();
    if (!std::filesystem::exists(c.teacher)) throw InputError(c.teacher, "--teacher", "no such checkpoint");
  }
  c.tokenizer = vm.count("tokenizer") ? vm["tokenizer"].as<std::string>() : tokenizer_beside(c.model);
  if (!c.tokenizer.empty() && !std::filesystem::exists(c.tokenizer))
    throw InputError(c.tokenizer, "--tokenizer", "no such file");
  c.last_word_docs = vm["last-word-docs"].as<int64_t>();
  if (c.last_word_docs < 0) throw InputError("command line", "--last-word-docs", "must be >= 0");
  if (c.which != "eval" && c.which != "calibration" && c.which != "train")
    throw InputError("command line", "--on", "'" + c.which + "': expected eval, calibration or train");

  const bool quiet = vm["quiet"].as<bool>();
  auto last = std::chrono::steady_clock::now();
  const auto t0 = last;
  auto progress = [&](int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (quiet || (done < total && now - last < std::chrono::seconds(1))) return;
    last = now;
    const double secs = std::chrono::duration<double>(now - t0).count();
    const double rate = double(done) / std::max(secs, 1e-9);
    std::fprintf(stderr, "eval: %ld/%ld samples, %.1f tokens/s, ETA %.0f s\n", long(done), long(total),
                 rate * double(c.seq_len), double(total - done) / std::max(rate, 1e-9));
  };
  const eval::EvalResult r = eval::evaluate_lm(c, ctx.runtime.world(), progress);
  if (!ctx.runtime.is_root()) return kExitOk;

  nlohmann::json j = {{"model", c.model},       {"data", c.data},
                            {"split", c.split},       {"on", c.which},
                            {"seq_len", c.seq_len},   {"samples", r.samples},
                            {"split_samples", r.split_samples},
                            {"tokens", r.tokens},     {"loss", r.loss},
                            {"perplexity", r.perplexity},
                            {"accuracy", r.accuracy}, {"parameters", r.parameters},
                            {"dtype", r.dtype},       {"dtype_reason", r.dtype_reason},
                            {"device", r.device},     {"device_reason", r.device_reason},
                            {"tp", r.tp},             {"dp", r.dp},
                            {"seconds", r.seconds},   {"tokens_per_second", r.tokens_per_second}};
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  j["tokenizer"] = c.tokenizer.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.tokenizer);
  j["bits_per_byte"] = opt(r.bits_per_byte);
  j["bytes"] = r.bytes;
  j["teacher"] = c.teacher.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.teacher);
  j["kl_to_teacher"] = opt(r.kl_to_teacher);
  j["last_word_accuracy"] = opt(r.last_word_accuracy);
  j["last_word_docs"] = r.last_word_scored;
  j["last_word_examined"] = r.last_word_examined;
  if (vm["json"].as<bool>()) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << std::left << std::setw(40) << "model" << std::right << std::setw(12) << "params" << std::setw(10)
              << "tokens" << std::setw(10) << "loss" << std::setw(12) << "perplexity" << std::setw(10) << "accuracy"
              << std::setw(7) << "bpb" << std::setw(11) << "last-word" << std::setw(9) << "KL" << std::setw(7) << "dtype"
              << std::setw(11) << "tokens/s" << "\n";
    std::cout << std::left << std::setw(40) << c.model << std::right << std::setw(12) << r.parameters << std::setw(10)
              << r.tokens << std::fixed << std::setprecision(4) << std::setw(10) << r.loss << std::setprecision(3)
              << std::setw(12) << r.perplexity << std::setprecision(4) << std::setw(10) << r.accuracy << std::setprecision(3)
              << std::setw(7) << (r.bits_per_byte ? fmt3(*r.bits_per_byte) : "-") << std::setw(11)
              << (r.last_word_accuracy ? fmt3(*r.last_word_accuracy) : "-") << std::setw(9)
              << (r.kl_to_teacher ? fmt3(*r.kl_to_teacher) : "-") << std::setw(7) << r.dtype << std::setprecision(1) << std::setw(11) << r.tokens_per_second << "\n";
    std::cout << "json: " << j.dump() << "\n";
  }
  if (vm.count("out")) {
    const std::string out = vm["out"].as<std::string>();
    if (ctx.runtime.is_root()) write_file_atomic(out + "/eval.json", j.dump(2) + "\n", "--out");
    ctx.write_manifest(out, {{"world_size", ctx.runtime.world_size()}, {"tp", r.tp}, {"dp", r.dp}});
  }
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "eval", "LM loss, perplexity, accuracy, bits/byte, last-word accuracy, KL to a teacher on a corpus's held-out split (TP x DP)",
    [](po::options_description& d) {
      const distill::TrainerConfig t;
      const eval::EvalConfig e;
      d.add_options()("model", po::value<std::string>()->default_value(kDefaultTeacher)->value_name("CKPT"),
                      "checkpoint (directory with `latest`, or .h5); default: the teacher from scripts/teacher_smollm2.sh")(
          "data", po::value<std::vector<std::string>>()->multitoken()->value_name("[W:]PREFIX"),
          "tokenized corpus (Megatron .bin/.idx prefix or .h5 token store), repeatable; ids must be the model's tokenizer's")(
          "split", po::value<std::string>()->default_value(t.split), "train,calibration,eval document fractions (the trainer's)")(
          "on", po::value<std::string>()->default_value(e.which), "split scored: eval | calibration | train")(
          "seq-len", po::value<int64_t>()->default_value(e.seq_len), "tokens per sample")(
          "samples", po::value<int64_t>()->default_value(e.samples), "samples scored (0: all of the split, one epoch)")(
          "micro-batch", po::value<int64_t>()->default_value(e.micro_batch), "samples per DP rank per forward")(
          "seed", po::value<uint64_t>()->default_value(t.seed), "split and order seed (the trainer's)")(
          "tp", po::value<int>()->default_value(1), "tensor-parallel size (DP = world / TP)")(
          "dtype", po::value<std::string>()->default_value("auto"), "compute dtype: auto | bf16 | f32")(
          "device", po::value<std::string>()->default_value("auto"), "auto | cpu | cuda (auto: cuda:<local rank> when there is one)")(
          "teacher", po::value<std::string>()->value_name("CKPT"), "adds KL(teacher || model) per target token (same vocabulary)")(
          "tokenizer", po::value<std::string>()->value_name("FILE"),
          "tokenizer.json of the data (default: beside the checkpoint or in its hf/ folder): adds bits per byte and the "
          "last-word task")(
          "last-word-docs", po::value<int64_t>()->default_value(100),
          "documents of the split for the LAMBADA-style last-word accuracy (0: off; needs the tokenizer)")(
          "json", po::bool_switch(), "print only the JSON line")(
          "quiet", po::bool_switch(), "no progress lines")(
          "out", po::value<std::string>()->value_name("DIR"), "also write DIR/eval.json and DIR/manifest.json")(
          "force", po::bool_switch(), "write --out even into a directory that holds a checkpoint");
    },
    run_eval}));

}  // namespace
}  // namespace ac::launcher

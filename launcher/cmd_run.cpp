// `autocompress run`: the whole job in one command (docs/run.md). One INI file (top-level keys
// for the run, one section per stage) becomes a plan of stages, each one or more ordinary
// subcommand calls made inside this process under the same MPI world:
//
//   teacher -> data -> importance -> search | minitron (each ends by pruning its student)
//           -> distill-<method> -> eval -> scorecard -> samples -> export-<method> -> report
//
// Every stage writes into the run directory and records a key: a hash of its calls (paths in
// the run directory written relative to it), of the files outside the run it reads, and of
// the keys of the stages it reads from. A rerun skips a stage whose key is recorded as done;
// a stage recorded as started with the same key is rerun in place, so search and distill
// resume from their own checkpoints; a stage whose key changed is cleared and rerun, and with
// it everything downstream (their keys contain its key). Everything that can be checked is
// checked before the first stage starts: sections and keys, the teacher and data sources, and
// that every budget is reachable (`search --check`, `minitron --check`).
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "dist/error.h"
#include "dist/parallel_layout.h"
#include "dist/runtime.h"
#include "distill/trainer.h"
#include "job/signals.h"
#include "launcher/budget_args.h"
#include "launcher/command.h"
#include "launcher/config_file.h"
#include "launcher/hardware_arg.h"
#include "model/arch_spec.h"
#include "model/model.h"
#include "search/costmodel/profiles.h"
#include "search/das/das.h"

#ifndef AC_SOURCE_DIR
#define AC_SOURCE_DIR "."
#endif

namespace ac::launcher {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

const std::vector<std::string> kMethods = {"autocompress", "minitron"};
// The stage sections of a run config and the subcommand whose options each one takes ("" for
// the sections the run reads itself).
const std::map<std::string, std::string> kSections = {
    {"teacher", ""},          {"data", ""},          {"importance", "importance"}, {"search", "search"},
    {"minitron", "minitron"}, {"distill", "distill"}, {"eval", "eval"},             {"scorecard", "scorecard"},
    {"samples", ""},          {"export", "export"}};
// The keys of the sections the run reads itself.
const std::map<std::string, std::set<std::string>> kOwnKeys = {
    {"teacher", {"checkpoint", "hf", "gguf", "dtype", "tokenizer"}},
    {"data", {"prefix", "input", "corpus", "workers"}},
    {"samples", {"prompts", "max-new-tokens", "count"}}};
// Options the run sets on its calls and a config may not: they are the run's own wiring.
bool locked_option(const std::string& k) {
  static const std::set<std::string> locked = {"teacher", "importance", "data",       "out",   "student", "student-init",
                                               "model",   "checkpoint", "format",     "hardware", "engine", "workload",
                                               "configs-dir", "tokenizer", "json", "quiet", "check", "help", "config"};
  return locked.count(k) || k.rfind("target-", 0) == 0;
}

// ---- small helpers ----------------------------------------------------------------------

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}
std::string hex16(uint64_t h) {
  std::ostringstream o;
  o << std::hex << std::setw(16) << std::setfill('0') << h;
  return o.str();
}

// A file's identity for a stage key: path, size and modification time (a directory: its
// regular files, recursively).
json fingerprint(const std::string& path) {
  json j = {{"path", path}};
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(path, ec))
      if (e.is_regular_file()) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    json parts = json::array();
    for (const auto& f : files) parts.push_back(fingerprint(f));
    j["files"] = parts;
    return j;
  }
  if (!fs::exists(path, ec)) return j;
  j["size"] = int64_t(fs::file_size(path, ec));
  j["mtime"] = int64_t(std::chrono::duration_cast<std::chrono::seconds>(fs::last_write_time(path, ec).time_since_epoch()).count());
  return j;
}

std::string fmt_num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

std::string fmt_secs(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(s < 100 ? 1 : 0) << s << " s";
  return o.str();
}

// Single-quoted for a POSIX shell.
std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command on this process; throws (naming `what`) when it fails. The child
// ignores SIGUSR1 and SIGTERM (ignored signals stay ignored across exec): Slurm sends them to
// every process of the job, and the run, not a helper script, decides to stop.
void run_shell(const std::string& cmd, const std::string& what) {
  std::cout << "[run]   $ " << cmd << std::endl;
  const std::string guarded = "trap '' USR1 TERM; " + cmd;
  const int rc = std::system(guarded.c_str());
  if (rc != 0) throw std::runtime_error(what + ": '" + cmd + "' failed (status " + std::to_string(rc) + ")");
}

// Waits for every rank without spinning a core: the ranks that have nothing to do while rank 0
// works alone (a measurement, a Python step) sleep between polls of a non-blocking barrier.
void quiet_barrier(MPI_Comm world) {
  MPI_Request req;
  MPI_Ibarrier(world, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string bcast_string(MPI_Comm world, std::string s) {
  int n = int(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, world);
  s.resize(size_t(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, world);
  return s;
}

// ---- the plan ---------------------------------------------------------------------------

// One subcommand call: its words and its options in order (an option's tokens; empty = a flag).
struct Call {
  std::string subcommand;
  std::vector<std::pair<std::string, std::vector<std::string>>> options;
  bool root_only = false;  // rank 0 alone runs it (one-process commands, measurements)

  Call& set(const std::string& key, std::vector<std::string> tokens) {
    for (auto& [k, v] : options)
      if (k == key) {
        v = std::move(tokens);
        return *this;
      }
    options.emplace_back(key, std::move(tokens));
    return *this;
  }
  Call& set(const std::string& key, const std::string& value) { return set(key, std::vector<std::string>{value}); }
  Call& flag(const std::string& key) { return set(key, std::vector<std::string>{}); }
  void unset(const std::string& key) {
    options.erase(std::remove_if(options.begin(), options.end(), [&](const auto& o) { return o.first == key; }), options.end());
  }
  std::vector<std::string> args() const {
    std::vector<std::string> a;
    std::istringstream words(subcommand);
    for (std::string w; words >> w;) a.push_back(w);
    for (const auto& [k, v] : options) {
      a.push_back("--" + k);
      a.insert(a.end(), v.begin(), v.end());
    }
    return a;
  }
  std::string text() const {
    std::string t = "autocompress";
    for (const auto& w : args()) t += " " + (w.find_first_of(" \t'\"") == std::string::npos ? w : sh_quote(w));
    return t;
  }
};

struct Stage {
  std::string name;                // "distill-minitron"
  std::string dir;                 // its directory in the run ("" = none)
  std::vector<std::string> after;  // stages whose outputs it reads (their keys are in its key)
  std::vector<Call> calls;
  std::vector<std::string> shell;  // rank-0 shell steps before the calls
  std::function<void()> finish;    // rank 0, after the calls
  json inputs = json::array();     // fingerprints of what it reads from outside the run
  json extra = json::object();     // anything else its output depends on
  std::string key;
};

struct RunPlan {
  std::string config_path, out;
  std::vector<Stage> stages;
  json budgets = json::array();
  json resolved = json::object();
};

// A config's sections, keys and --set overrides, checked against what each section takes.
struct StageKeys {
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> by_section;
  std::map<std::string, std::string> where;  // "distill.steps" -> "FILE line 12" or "--set"

  std::string get(const std::string& section, const std::string& key, const std::string& fallback = "") const {
    auto it = by_section.find(section);
    if (it == by_section.end()) return fallback;
    for (const auto& [k, v] : it->second)
      if (k == key) return v;
    return fallback;
  }
  bool has(const std::string& section, const std::string& key) const {
    auto it = by_section.find(section);
    if (it == by_section.end()) return false;
    for (const auto& kv : it->second)
      if (kv.first == key) return true;
    return false;
  }
  void put(const std::string& section, const std::string& key, const std::string& value, const std::string& from) {
    auto& v = by_section[section];
    bool replaced = false;
    for (auto& kv : v)
      if (kv.first == key) kv.second = value, replaced = true;
    if (!replaced) v.emplace_back(key, value);
    where[section + "." + key] = from;
  }
};

// Applies a section's keys to a call of its subcommand: each key is one of that subcommand's
// options (a flag takes true/false; a multi-value option takes space-separated values).
void apply_section(Call& c, const StageKeys& keys, const std::string& section, const std::string& config_path) {
  auto it = keys.by_section.find(section);
  if (it == keys.by_section.end()) return;
  const Subcommand* cmd = find_subcommand(c.subcommand);
  po::options_description desc;
  cmd->add_options(desc);
  for (const auto& [k, v] : it->second) {
    const std::string field = "[" + section + "] " + k;
    const std::string from = keys.where.count(section + "." + k) ? keys.where.at(section + "." + k) : config_path;
    const po::option_description* o = desc.find_nothrow(k, false);
    if (!o) throw InputError(from, field, "unknown option of 'autocompress " + c.subcommand + "' (see autocompress " + c.subcommand + " --help)");
    if (locked_option(k))
      throw InputError(from, field, "set by autocompress run itself (the run wires teacher, data, outputs, target and budgets; set them at the top level)");
    if (o->semantic()->max_tokens() == 0) {
      if (v == "true" || v == "1" || v == "yes") c.flag(k);
      else if (v == "false" || v == "0" || v == "no") c.unset(k);
      else throw InputError(from, field, "'" + v + "': expected true or false");
      continue;
    }
    std::vector<std::string> tokens;
    if (o->semantic()->max_tokens() > 1) {
      std::istringstream in(v);
      for (std::string t; in >> t;) tokens.push_back(t);
    } else {
      tokens.push_back(v);
    }
    c.set(k, tokens);
  }
}

}  // namespace

// ---- the run command --------------------------------------------------------------------

namespace {

struct Top {  // the run's own options, resolved
  std::string out, method, split, dtype, hardware, engine, workload, configs_dir, scripts_dir, python;
  int tp = 1;
  uint64_t seed = 1234;
  search::SearchConstraints constraints;
};

void add_run_options(po::options_description& d) {
  add_budget_options(d);
  add_budget_ratio_options(d);
  d.add_options()("out", po::value<std::string>()->default_value("runs/demo")->value_name("DIR"), "run directory")(
      "method", po::value<std::string>()->default_value("both"), "autocompress | minitron | both")(
      "hardware", po::value<std::string>()->value_name("ID|FILE"), "hardware profile of the target (cpu-local: this machine's)")(
      "engine", po::value<std::string>()->default_value("local-eager")->value_name("ID|FILE"), "serving engine profile")(
      "workload", po::value<std::string>()->value_name("ID|FILE"), "workload profile")(
      "configs-dir", po::value<std::string>()->default_value(search::default_configs_dir())->value_name("DIR"),
      "where profile ids are looked up")(
      "scripts-dir", po::value<std::string>()->default_value(std::string(AC_SOURCE_DIR) + "/scripts")->value_name("DIR"),
      "the project's scripts/ (GGUF conversion, corpus, report)")(
      "python", po::value<std::string>()->default_value("python3"), "Python interpreter for those scripts")(
      "tp", po::value<int>()->default_value(1), "tensor-parallel size of every stage (DP = world / TP)")(
      "seed", po::value<uint64_t>()->default_value(1234), "seed of every stage (data order, search noise, init)")(
      "dtype", po::value<std::string>()->default_value("auto"), "compute dtype of every stage: auto | bf16 | f32")(
      "split", po::value<std::string>()->default_value("98,1,1"), "train,calibration,eval document fractions")(
      "set", po::value<std::vector<std::string>>()->multitoken()->value_name("SECTION.KEY=VALUE"),
      "override a stage key of the config (repeatable), e.g. --set distill.steps=200")(
      "check", po::bool_switch(), "check the config, sources and budgets, print the plan, run nothing");
}

std::string default_config_path() { return std::string(AC_SOURCE_DIR) + "/configs/demo.cfg"; }

// The teacher's architecture before any stage ran, and the path `--check` calls take for it.
struct TeacherSource {
  std::string kind;        // checkpoint | hf | gguf
  std::string source;      // as configured (gguf resolved to a file)
  std::string checkpoint;  // the checkpoint every stage reads
  std::string tokenizer;
  std::string arch_path;   // checkpoint, or a config.json (hf, gguf) for the checks
  model::ArchSpec arch;
};

// "pip:DIST/PATH" -> the file PATH inside the installed distribution DIST (rank 0 asks Python).
std::string resolve_pip_path(const std::string& v, const Top& t, const std::string& from) {
  const std::string rest = v.substr(4);
  const auto slash = rest.find('/');
  if (slash == std::string::npos || slash == 0) throw InputError(from, "[teacher] gguf", "'" + v + "': expected pip:DISTRIBUTION/PATH");
  const std::string code =
      "import importlib.metadata as m,sys\n"
      "try: print(m.distribution(sys.argv[1]).locate_file(sys.argv[2]))\n"
      "except m.PackageNotFoundError: sys.exit(3)\n";
  FILE* p = popen((t.python + " -c " + sh_quote(code) + " " + sh_quote(rest.substr(0, slash)) + " " +
                   sh_quote(rest.substr(slash + 1)) + " 2>/dev/null").c_str(), "r");
  std::string out;
  if (p) {
    char buf[1024];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    if (pclose(p) != 0) out.clear();
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  if (out.empty())
    throw InputError(from, "[teacher] gguf", "'" + v + "': the pip package " + rest.substr(0, slash) +
                                                 " is not installed for " + t.python + " (scripts/setup.sh installs it)");
  return out;
}

TeacherSource teacher_source(const StageKeys& keys, const Top& t, const std::string& run_dir, const std::string& from,
                             MPI_Comm world, bool root) {
  TeacherSource s;
  int given = 0;
  for (const char* k : {"checkpoint", "hf", "gguf"})
    if (keys.has("teacher", k)) s.kind = k, s.source = keys.get("teacher", k), ++given;
  if (given != 1) throw InputError(from, "[teacher]", "give exactly one of checkpoint = DIR, hf = DIR or gguf = FILE");
  const std::string field = "[teacher] " + s.kind;
  if (s.kind == "checkpoint") {
    try {
      s.arch = checkpoint::checkpoint_arch(checkpoint::CheckpointReader(checkpoint::resolve_checkpoint(s.source)));
    } catch (const std::exception& e) {
      throw InputError(from, field, std::string("not a teacher checkpoint: ") + e.what());
    }
    s.checkpoint = s.source;
    s.arch_path = s.source;
    const fs::path dir = fs::is_directory(s.source) ? fs::path(s.source) : fs::path(s.source).parent_path();
    s.tokenizer = keys.get("teacher", "tokenizer", fs::exists(dir / "hf/tokenizer.json") ? (dir / "hf/tokenizer.json").string()
                                                                                           : (dir / "tokenizer.json").string());
    return s;
  }
  s.checkpoint = run_dir + "/teacher";
  if (s.kind == "hf") {
    const fs::path cfg = fs::path(s.source) / "config.json";
    if (!fs::exists(cfg)) throw InputError(from, field, s.source + ": no config.json (a Hugging Face checkpoint directory)");
    s.arch_path = cfg.string();
    s.tokenizer = keys.get("teacher", "tokenizer", (fs::path(s.source) / "tokenizer.json").string());
  } else {
    std::string file;
    if (root) file = s.source.rfind("pip:", 0) == 0 ? resolve_pip_path(s.source, t, from) : s.source;
    s.source = bcast_string(world, file);
    if (!fs::is_regular_file(s.source)) throw InputError(from, field, s.source + ": no such file");
    // Its architecture without converting the weights: config.json from the metadata.
    const std::string check_dir = run_dir + "/.check/teacher";
    if (root)
      run_shell(t.python + " " + sh_quote(t.scripts_dir + "/gguf_to_hf.py") + " --gguf " + sh_quote(s.source) + " --out " +
                    sh_quote(check_dir) + " --config-only >/dev/null",
                from + ": " + field);
    MPI_Barrier(world);
    s.arch_path = check_dir + "/config.json";
    s.tokenizer = s.checkpoint + "/hf/tokenizer.json";
  }
  s.arch = model::load_arch(s.arch_path);
  return s;
}

// Run-dir-relative text of a call for its stage key (a run directory may be moved).
json call_for_key(const Call& c, const std::string& run_dir) {
  json a = json::array();
  for (std::string w : c.args()) {
    if (w.rfind(run_dir, 0) == 0) w = "$RUN" + w.substr(run_dir.size());
    a.push_back(w);
  }
  return a;
}

RunPlan make_plan(const Top& t, const StageKeys& keys, const TeacherSource& teacher, const std::string& config_path,
                  const search::CostTarget* target) {
  const search::EngineProfile engine = target ? target->engine : search::load_engine(t.engine, t.configs_dir);
  const std::string hf_layout = engine.heterogeneous_format.find("block_configs") != std::string::npos ? "auto" : "per-layer-config";
  RunPlan plan;
  plan.config_path = config_path;
  plan.out = t.out;
  const std::string R = t.out;
  std::vector<std::string> methods;
  if (t.method == "both") methods = kMethods;
  else if (t.method == "autocompress" || t.method == "minitron") methods = {t.method};
  else throw InputError(config_path, "method", "'" + t.method + "': expected autocompress, minitron or both");

  auto common = [&](Call& c, bool tp = true) {
    if (tp) c.set("tp", std::to_string(t.tp));
    c.set("seed", std::to_string(t.seed));
    c.set("dtype", t.dtype);
  };
  const std::string T = teacher.checkpoint;
  // ---- teacher
  {
    Stage s{"teacher", teacher.kind == "checkpoint" ? "" : "teacher"};
    s.extra = {{"kind", teacher.kind}, {"source", teacher.source}};
    if (teacher.kind == "checkpoint") {
      s.inputs.push_back(fingerprint(checkpoint::resolve_checkpoint(teacher.source)));
    } else {
      std::string hf = teacher.source;
      if (teacher.kind == "gguf") {
        hf = R + "/teacher/hf";
        s.shell.push_back(t.python + " " + sh_quote(t.scripts_dir + "/gguf_to_hf.py") + " --gguf " + sh_quote(teacher.source) +
                          " --out " + sh_quote(hf));
      }
      s.inputs.push_back(fingerprint(teacher.source));
      Call c{"checkpoint import"};
      c.set("hf", hf).set("out", T).set("dtype", keys.get("teacher", "dtype", "f32"));
      c.flag("force");  // the stage owns T: a stage continued in place replaces its own step_0.h5
      s.calls.push_back(c);
    }
    plan.stages.push_back(s);
  }
  // ---- data
  std::string D;
  {
    Stage s{"data", "data", {"teacher"}};
    int given = 0;
    for (const char* k : {"prefix", "input", "corpus"}) given += keys.has("data", k);
    if (given > 1) throw InputError(config_path, "[data]", "give one of prefix = PATH, input = FILE or corpus = fortunes");
    if (keys.has("data", "prefix")) {
      D = keys.get("data", "prefix");
      s.dir.clear();
      for (const char* ext : {".bin", ".idx"}) {
        if (!fs::exists(D + ext)) throw InputError(config_path, "[data] prefix", D + ext + ": no such file (a Megatron .bin/.idx pair)");
        s.inputs.push_back(fingerprint(D + ext));
      }
    } else {
      std::string input = keys.get("data", "input");
      if (input.empty()) {
        const std::string corpus = keys.get("data", "corpus", "fortunes");
        if (corpus != "fortunes") throw InputError(config_path, "[data] corpus", "'" + corpus + "': the built-in corpus is 'fortunes'");
        input = R + "/data/corpus.jsonl";
        s.shell.push_back(t.python + " " + sh_quote(t.scripts_dir + "/data_make_corpus.py") + " --output " + sh_quote(input));
        s.inputs.push_back(fingerprint(t.scripts_dir + "/data_make_corpus.py"));
      } else {
        if (!fs::exists(input)) throw InputError(config_path, "[data] input", input + ": no such file");
        s.inputs.push_back(fingerprint(input));
      }
      D = R + "/data/corpus";
      Call c{"data preprocess"};
      c.root_only = true;
      c.set("input", input).set("output", D).set("tokenizer", teacher.tokenizer).set("workers", keys.get("data", "workers", "2"));
      s.calls.push_back(c);
    }
    plan.stages.push_back(s);
  }
  // ---- importance
  const std::string I = R + "/importance/scores.h5";
  {
    Stage s{"importance", "importance", {"teacher", "data"}};
    Call c{"importance"};
    c.set("teacher", T).set("data", D).set("split", t.split).set("out", I);
    common(c);
    apply_section(c, keys, "importance", config_path);
    s.calls.push_back(c);
    plan.stages.push_back(s);
  }
  // ---- the budgets, resolved once so that both methods get the same numbers
  std::vector<std::pair<std::string, std::string>> budget_opts;
  {
    const auto budgets = search::resolve_budgets(t.constraints, teacher.arch, target);
    std::map<std::string, double> limit;  // absolute option -> tightest limit
    for (const auto& b : budgets) {
      std::string opt = b.option.substr(2);
      if (opt.size() > 6 && opt.compare(opt.size() - 6, 6, "-ratio") == 0) opt.resize(opt.size() - 6);
      // Budget values are in the cost model's units (bytes, seconds); options in GB and ms.
      const double scale = opt == "target-memory-gb" ? 1e-9 : (opt == "target-ttft-ms" || opt == "target-tpot-ms") ? 1e3 : 1.0;
      const double v = b.value * scale;
      if (!limit.count(opt)) limit[opt] = v;
      else limit[opt] = b.at_least ? std::max(limit[opt], v) : std::min(limit[opt], v);
      plan.budgets.push_back({{"option", b.option}, {"limit", v}, {"teacher", b.teacher * scale}, {"as", "--" + opt},
                              {"at_least", b.at_least}});
    }
    for (const auto& [k, v] : limit) budget_opts.emplace_back(k, fmt_num(v));
  }
  auto target_opts = [&](Call& c) {
    if (!t.hardware.empty()) c.set("hardware", t.hardware);
    c.set("engine", t.engine);
    if (!t.workload.empty()) c.set("workload", t.workload);
    c.set("configs-dir", t.configs_dir);
  };
  // ---- the searches
  for (const auto& m : methods) {
    const std::string sub = m == "autocompress" ? "search" : "minitron";
    Stage s{sub, sub, {"importance"}};
    Call c{sub};
    c.set("teacher", T).set("importance", I).set("data", D).set("split", t.split).set("out", R + "/" + sub);
    target_opts(c);
    for (const auto& [k, v] : budget_opts) c.set(k, v);
    common(c);
    apply_section(c, keys, sub, config_path);
    s.calls.push_back(c);
    plan.stages.push_back(s);
  }
  // ---- distillation
  std::vector<std::pair<std::string, std::string>> students;  // name -> distilled checkpoint dir
  for (const auto& m : methods) {
    const std::string sub = m == "autocompress" ? "search" : "minitron";
    Stage s{"distill-" + m, "distill-" + m, {sub, "teacher", "data"}};
    Call c{"distill"};
    c.set("student", R + "/" + sub + "/arch.json").set("student-init", R + "/" + sub + "/student").set("teacher", T);
    c.set("data", D).set("split", t.split).set("out", R + "/distill-" + m);
    common(c);
    apply_section(c, keys, "distill", config_path);
    s.calls.push_back(c);
    plan.stages.push_back(s);
    students.emplace_back(m, R + "/distill-" + m + "/checkpoints");
  }
  std::vector<std::string> distills;
  for (const auto& m : methods) distills.push_back("distill-" + m);
  // ---- eval: the teacher, each student before (pruned) and after distillation
  {
    Stage s{"eval", "eval", distills};
    for (const auto& m : methods) s.after.push_back(m == "autocompress" ? "search" : "minitron");
    auto add = [&](const std::string& name, const std::string& model, bool kl) {
      Call c{"eval"};
      c.set("model", model).set("data", D).set("split", t.split).set("tokenizer", teacher.tokenizer).set("out", R + "/eval/" + name);
      if (kl) c.set("teacher", T);
      c.flag("quiet");
      common(c);
      apply_section(c, keys, "eval", config_path);
      s.calls.push_back(c);
    };
    add("teacher", T, false);
    for (const auto& m : methods) {
      add(m + "-pruned", R + "/" + (m == "autocompress" ? "search" : "minitron") + "/student", true);
      add(m, R + "/distill-" + m + "/checkpoints", true);
    }
    plan.stages.push_back(s);
  }
  // ---- scorecard: measured here vs predicted, one process
  {
    Stage s{"scorecard", "scorecard", distills};
    Call c{"scorecard"};
    c.root_only = true;
    std::vector<std::string> cands = {T};
    for (const auto& st : students) cands.push_back(st.second);
    c.set("checkpoint", cands).set("data", D).set("split", t.split).set("teacher", T).set("tokenizer", teacher.tokenizer);
    target_opts(c);
    c.set("seed", std::to_string(t.seed)).set("dtype", t.dtype).set("out", R + "/scorecard");
    apply_section(c, keys, "scorecard", config_path);
    s.calls.push_back(c);
    plan.stages.push_back(s);
  }
  // ---- samples: greedy continuations of a few prompts by every model
  {
    Stage s{"samples", "samples", distills};
    std::vector<std::string> prompts;
    {
      const std::string p = keys.get("samples", "prompts", "The old man looked at the sea and|A computer is|Never trust a");
      std::stringstream in(p);
      for (std::string x; std::getline(in, x, '|');)
        if (!x.empty()) prompts.push_back(x);
    }
    const std::string max_new = keys.get("samples", "max-new-tokens", "24");
    std::vector<std::pair<std::string, std::string>> models = {{"teacher", T}};
    for (const auto& st : students) models.push_back(st);
    s.extra = {{"prompts", prompts}, {"max_new_tokens", max_new}};
    for (size_t i = 0; i < prompts.size(); ++i)
      for (const auto& [name, path] : models) {
        Call c{"generate"};
        c.root_only = true;
        c.set("model", path).set("prompt", prompts[i]).set("max-new-tokens", max_new).set("tokenizer", teacher.tokenizer);
        c.flag("greedy").flag("json").set("dtype", t.dtype);
        c.set("out", R + "/samples/" + name + "-" + std::to_string(i) + ".json");
        s.calls.push_back(c);
      }
    s.finish = [R, prompts, models]() {
      json all = json::array();
      for (size_t i = 0; i < prompts.size(); ++i) {
        json outputs = json::object();
        for (const auto& mp : models) {
          std::ifstream f(R + "/samples/" + mp.first + "-" + std::to_string(i) + ".json");
          outputs[mp.first] = json::parse(f).value("text", "");
        }
        all.push_back({{"prompt", prompts[i]}, {"outputs", outputs}});
      }
      write_json_atomic(R + "/samples/samples.json", all);
    };
    plan.stages.push_back(s);
  }
  // ---- export: Hugging Face safetensors and the single-file bf16 HDF5 of each student
  for (const auto& [m, ckpt] : students) {
    Stage s{"export-" + m, "export/" + m, {"distill-" + m}};
    Call hf{"export"};
    hf.root_only = true;
    hf.set("checkpoint", ckpt).set("format", "safetensors").set("out", R + "/export/" + m + "/hf").flag("force");
    // The per-layer format of the engine the student is for: block_configs (DeciLM /
    // nemotron_h_puzzle) where it serves them (vLLM), else transformers' per_layer_config, which
    // holds any shape this project's engine runs (a uniform student gets the plain config).
    hf.set("hf-layout", hf_layout);
    apply_section(hf, keys, "export", config_path);
    Call h5{"export"};
    h5.root_only = true;
    h5.set("checkpoint", ckpt).set("format", "hdf5").set("dtype", "bf16").set("out", R + "/export/" + m + "/hdf5").flag("force");
    s.calls = {hf, h5};
    plan.stages.push_back(s);
  }
  // ---- report
  {
    Stage s{"report", "plots"};
    for (const auto& st : plan.stages) s.after.push_back(st.name);
    s.shell.push_back(t.python + " " + sh_quote(t.scripts_dir + "/run_report.py") + " " + sh_quote(R));
    s.inputs.push_back(fingerprint(t.scripts_dir + "/run_report.py"));
    plan.stages.push_back(s);
  }
  // ---- keys, in order (each stage's after-stages come before it)
  std::map<std::string, std::string> key_of;
  for (auto& s : plan.stages) {
    json k = {{"stage", s.name}, {"inputs", s.inputs}, {"extra", s.extra}, {"shell", json::array()}, {"calls", json::array()}};
    for (const auto& c : s.calls) k["calls"].push_back(call_for_key(c, R));
    for (auto sh : s.shell) {
      for (size_t p; (p = sh.find(R)) != std::string::npos;) sh.replace(p, R.size(), "$RUN");
      k["shell"].push_back(sh);
    }
    for (const auto& a : s.after) k["after"][a] = key_of.at(a);
    s.key = hex16(fnv1a(k.dump()));
    key_of[s.name] = s.key;
  }
  return plan;
}

// One stage's record: RUN/stages/<name>.json {key, status: started|done, wall_s, ...}.
fs::path marker_path(const RunPlan& p, const Stage& s) { return fs::path(p.out) / "stages" / (s.name + ".json"); }

json read_marker(const fs::path& path) {
  std::ifstream f(path);
  if (!f) return json();
  try {
    return json::parse(f);
  } catch (const std::exception&) {
    return json();  // a torn record counts as none: the stage reruns
  }
}

int run_call(RunContext& ctx, const Call& c) {
  dist::Runtime& rt = ctx.runtime;
  const int threads = torch::get_num_threads();
  int rc = 0;
  if (c.root_only && rt.world_size() > 1) {
    if (rt.is_root()) {
      dist::Runtime self(dist::Runtime::SelfView{}, rt);
      rc = invoke_subcommand(self, c.args());
    }
    quiet_barrier(rt.world());
    MPI_Bcast(&rc, 1, MPI_INT, 0, rt.world());
  } else {
    rc = invoke_subcommand(rt, c.args());
    MPI_Barrier(rt.world());  // a command whose rank 0 works alone (export) returns early elsewhere
  }
  torch::set_num_threads(threads);  // a stage may change it (scorecard --threads)
  return rc;
}

int run_plan(RunContext& ctx, const RunPlan& plan, const json& manifest_base) {
  dist::Runtime& rt = ctx.runtime;
  const bool root = rt.is_root();
  job::StopSignals signals;  // between stages; each stage catches its own
  const auto t_run = clock_type::now();
  json manifest = manifest_base;
  manifest["stages"] = json::array();
  int done_before = 0, ran = 0;
  double ran_s = 0;
  const int n = int(plan.stages.size());
  for (int i = 0; i < n; ++i) {
    const Stage& s = plan.stages[size_t(i)];
    if (const int sig = signals.agree(rt.world())) {
      if (root) {
        std::cout << "[run] " << job::signal_name(sig) << ": stopping before stage " << s.name << " (exit 75: rerun to continue)"
                  << std::endl;
        job::requeue_after_signal(sig);
      }
      return job::kExitRequeue;
    }
    const fs::path mpath = marker_path(plan, s);
    int action = 0;  // 0 skip, 1 fresh, 2 continue in place
    if (root) {
      const json m = read_marker(mpath);
      const bool same = m.is_object() && m.value("key", "") == s.key;
      action = same && m.value("status", "") == "done" ? 0 : same ? 2 : 1;
      if (action == 1 && !s.dir.empty() && fs::exists(fs::path(plan.out) / s.dir)) {
        std::cout << "[run] " << s.name << ": its inputs or options changed (key "
                  << (m.is_object() ? m.value("key", "none") : std::string("none")) << " -> " << s.key
                  << "): clearing " << (fs::path(plan.out) / s.dir).string() << std::endl;
        fs::remove_all(fs::path(plan.out) / s.dir);
      }
    }
    MPI_Bcast(&action, 1, MPI_INT, 0, rt.world());
    json rec = {{"name", s.name}, {"key", s.key}, {"dir", s.dir}, {"after", s.after}};
    if (action == 0) {
      if (root) {
        const json m = read_marker(mpath);
        std::cout << "[run] stage " << i + 1 << "/" << n << " " << s.name << ": done earlier (key " << s.key << "), skipped" << std::endl;
        rec["status"] = "skipped";
        rec["wall_s"] = m.value("wall_s", 0.0);
        manifest["stages"].push_back(rec);
        write_json_atomic((fs::path(plan.out) / "manifest.json").string(), manifest);
      }
      ++done_before;
      continue;
    }
    const double elapsed = std::chrono::duration<double>(clock_type::now() - t_run).count();
    if (root) {
      std::cout << "\n[run] stage " << i + 1 << "/" << n << " " << s.name << (action == 2 ? ": continuing" : ": starting")
                << " (run elapsed " << fmt_secs(elapsed);
      if (ran > 0) std::cout << ", " << ran << " stages run at " << fmt_secs(ran_s / ran) << " each on average";
      std::cout << ")" << std::endl;
      write_json_atomic(mpath.string(), {{"name", s.name}, {"key", s.key}, {"status", "started"}, {"started_at_unix", int64_t(std::time(nullptr))}});
      if (!s.dir.empty()) fs::create_directories(fs::path(plan.out) / s.dir);
    }
    const auto t0 = clock_type::now();
    if (!s.shell.empty()) {
      if (root)
        for (const auto& cmd : s.shell) run_shell(cmd, "stage " + s.name);
      quiet_barrier(rt.world());
    }
    for (const auto& c : s.calls) {
      if (root) std::cout << "[run]   $ " << c.text() << std::endl;
      const int rc = run_call(ctx, c);
      if (rc == job::kExitRequeue) {
        if (root) std::cout << "[run] " << s.name << " stopped on a signal (exit 75): rerun the same command to continue" << std::endl;
        return rc;
      }
      if (rc != 0) throw std::runtime_error("stage " + s.name + ": '" + c.text() + "' exited with " + std::to_string(rc));
    }
    if (root && s.finish) s.finish();
    MPI_Barrier(rt.world());
    const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
    ++ran;
    ran_s += wall;
    if (root) {
      write_json_atomic(mpath.string(), {{"name", s.name}, {"key", s.key}, {"status", "done"}, {"wall_s", wall},
                                {"finished_at_unix", int64_t(std::time(nullptr))}});
      rec["status"] = "done";
      rec["wall_s"] = wall;
      manifest["stages"].push_back(rec);
      write_json_atomic((fs::path(plan.out) / "manifest.json").string(), manifest);
      std::cout << "[run] stage " << s.name << " done in " << fmt_secs(wall) << std::endl;
    }
  }
  if (root) {
    const double total = std::chrono::duration<double>(clock_type::now() - t_run).count();
    std::cout << "\n[run] finished in " << fmt_secs(total) << ": " << ran << " stages run, " << done_before
              << " done earlier; report: " << (fs::path(plan.out) / "report.md").string() << std::endl;
  }
  return kExitOk;
}

int run_run(const po::variables_map& vm_in, RunContext& ctx) {
  dist::Runtime& rt = ctx.runtime;
  const bool root = rt.is_root();
  // The config: --config, else the embedded default (configs/demo.cfg). Its top-level keys are
  // this command's options (the command line wins); its sections are the stages'.
  po::variables_map vm = vm_in;
  std::string config_path = vm.count("config") ? vm["config"].as<std::string>() : default_config_path();
  if (!vm.count("config")) {
    po::options_description desc;
    add_run_options(desc);
    desc.add_options()("help", "")("config", po::value<std::string>());
    po::variables_map dv;
    po::store(parse_ini_config(config_path, "run", desc), dv);
    for (const auto& [k, v] : dv)  // the default config's values where the command line gave none
      if (ctx.config.contains(k) && ctx.config[k]["source"] == "default") vm.at(k) = v;
      else if (!vm.count(k)) vm.insert({k, v});
    po::notify(vm);
  }
  StageKeys keys;
  for (const auto& e : read_ini(config_path)) {
    if (e.section.empty() || e.section == "run") continue;  // the run's own keys (parsed by the launcher)
    const std::string from = config_path + " line " + std::to_string(e.line);
    if (!kSections.count(e.section))
      throw InputError(config_path, "[" + e.section + "]", "unknown stage section (line " + std::to_string(e.line) +
                                                               "; stages: teacher data importance search minitron distill eval scorecard samples export)");
    if (kOwnKeys.count(e.section) && !kOwnKeys.at(e.section).count(e.key))
      throw InputError(config_path, "[" + e.section + "] " + e.key, "unknown key (line " + std::to_string(e.line) + ")");
    keys.put(e.section, e.key, e.value, config_path);
  }
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>()) {
      const auto dot = s.find('.'), eq = s.find('=');
      if (dot == std::string::npos || eq == std::string::npos || dot > eq)
        throw InputError("command line", "--set", "'" + s + "': expected SECTION.KEY=VALUE (e.g. distill.steps=200)");
      const std::string section = s.substr(0, dot), key = s.substr(dot + 1, eq - dot - 1);
      if (!kSections.count(section)) throw InputError("command line", "--set " + s, "unknown stage section '" + section + "'");
      if (kOwnKeys.count(section) && !kOwnKeys.at(section).count(key))
        throw InputError("command line", "--set " + s, "unknown key '" + key + "' of [" + section + "]");
      keys.put(section, key, s.substr(eq + 1), "command line --set");
    }

  Top t;
  t.out = fs::absolute(vm["out"].as<std::string>()).lexically_normal().string();
  while (t.out.size() > 1 && t.out.back() == '/') t.out.pop_back();
  t.method = vm["method"].as<std::string>();
  t.split = vm["split"].as<std::string>();
  t.dtype = vm["dtype"].as<std::string>();
  t.engine = vm["engine"].as<std::string>();
  if (vm.count("hardware")) t.hardware = vm["hardware"].as<std::string>();
  if (vm.count("workload")) t.workload = vm["workload"].as<std::string>();
  t.configs_dir = vm["configs-dir"].as<std::string>();
  t.scripts_dir = vm["scripts-dir"].as<std::string>();
  t.python = vm["python"].as<std::string>();
  t.tp = vm["tp"].as<int>();
  t.seed = vm["seed"].as<uint64_t>();
  read_budget_options(vm, t.constraints.absolute);
  read_budget_ratio_options(vm, t.constraints);
  if (!t.constraints.any())
    throw InputError(config_path, "target-*", "no budget: give one of target-{params,active-params,memory-gb,ttft-ms,tpot-ms,throughput} or its -ratio");
  if (!t.hardware.empty()) t.hardware = hardware_profile_path(t.hardware, t.configs_dir, t.dtype);

  // ---- every check before the first stage
  const TeacherSource teacher = teacher_source(keys, t, t.out, config_path, rt.world(), root);
  std::optional<search::CostTarget> target;
  if (!t.hardware.empty() && !t.workload.empty())
    target = search::CostTarget{search::load_hardware(t.hardware, t.configs_dir), search::load_engine(t.engine, t.configs_dir),
                                search::load_workload(t.workload, t.configs_dir)};
  if (t.constraints.needs_cost_model() && !target)
    throw InputError(config_path, t.hardware.empty() ? "hardware" : "workload", "latency and memory budgets need hardware and workload");
  const RunPlan plan = make_plan(t, keys, teacher, config_path, target ? &*target : nullptr);
  for (const auto& s : plan.stages)
    for (const auto& c : s.calls) {
      try {
        check_subcommand_args(c.args());
      } catch (const InputError& e) {
        throw InputError(config_path, "[" + s.name + "]", e.what());
      }
    }
  // The distill stages' expert layout ([distill] ep, etp): EP must divide DP and the teacher's
  // experts must split over it, or the run would stop only at distillation, after the search.
  // (The student's experts, known after the search, are checked by the stage itself.) A
  // one-process `run --check` checks the config for the job it will be (world unknown): there
  // the sizes are checked against the teacher but not against a world of 1.
  const bool world_known = !(vm["check"].as<bool>() && rt.world_size() == 1);
  for (const auto& s : plan.stages) {
    if (s.name.rfind("distill-", 0) != 0) continue;
    auto value = [&](const char* key, int fallback) {
      for (const auto& [k, v] : s.calls.front().options)
        if (k == key && !v.empty()) return std::stoi(v.front());
      return fallback;
    };
    const int tp = value("tp", 1), ep = value("ep", 1), etp = value("etp", 1);
    try {
      if (world_known) dist::resolve_grid(rt.world_size(), {tp, 0, 0, ep});
      if (etp != 1 && etp != tp) throw InputError("etp", std::to_string(etp), "must be 1 or the TP size " + std::to_string(tp));
      if (const std::string why = model::tp_split_problem(teacher.arch, tp, ep, etp > 1); !why.empty())
        throw InputError("teacher " + teacher.source, "ep " + std::to_string(ep), why);
    } catch (const InputError& e) {
      throw InputError(config_path, "[distill]", e.what());
    }
    break;  // one [distill] section serves every method
  }
  // Reachability on the teacher's architecture: the same options as the real calls, --check.
  for (const auto& s : plan.stages) {
    if (s.name != "search" && s.name != "minitron") continue;
    Call c = s.calls.front();
    c.unset("importance");
    c.unset("data");
    c.unset("out");
    c.set("teacher", teacher.arch_path).flag("check");
    try {
      if (invoke_subcommand(rt, c.args()) != 0) throw InputError(config_path, "target", s.name + " --check failed");
    } catch (const InputError& e) {
      throw InputError(config_path, "target (" + s.name + ")", std::string("no architecture meets it: ") + e.what());
    }
  }

  json manifest = {{"format", "autocompress.run"}, {"format_version", 1}, {"config_path", config_path}, {"argv", ctx.argv},
                   {"config", ctx.config}, {"out", t.out}, {"budgets", plan.budgets},
                   {"teacher", {{"kind", teacher.kind}, {"source", teacher.source}, {"checkpoint", teacher.checkpoint},
                                {"tokenizer", teacher.tokenizer}}},
                   {"world", {{"size", rt.world_size()}, {"tp", t.tp}, {"dp", rt.world_size() / std::max(1, t.tp)}}},
                   {"plan", json::array()}};
  json sections = json::object();
  for (const auto& [sec, kv] : keys.by_section)
    for (const auto& [k, v] : kv) sections[sec][k] = v;
  manifest["sections"] = sections;
  for (const auto& s : plan.stages) {
    json calls = json::array();
    for (const auto& c : s.calls) calls.push_back(c.text());
    manifest["plan"].push_back({{"name", s.name}, {"key", s.key}, {"dir", s.dir}, {"after", s.after}, {"shell", s.shell}, {"calls", calls}});
  }
  if (root) {
    std::cout << "[run] " << config_path << " -> " << t.out << ": " << plan.stages.size() << " stages, method " << t.method
              << ", teacher " << teacher.source << " (" << teacher.kind << "), world " << rt.world_size() << " (TP " << t.tp << ")\n";
    for (const auto& b : plan.budgets)
      std::cout << "[run] budget " << b["option"].get<std::string>() << ": " << b["as"].get<std::string>() << " "
                << fmt_num(b["limit"].get<double>()) << " (teacher " << fmt_num(b["teacher"].get<double>()) << ")\n";
    std::cout << std::flush;
  }
  if (vm["check"].as<bool>()) {
    if (root) {
      for (const auto& s : plan.stages) {
        std::cout << "  " << s.name << " (key " << s.key << ")\n";
        for (const auto& sh : s.shell) std::cout << "    $ " << sh << "\n";
        for (const auto& c : s.calls) std::cout << "    $ " << c.text() << "\n";
      }
      std::cout << "[run] check: the config, sources and budgets are good; nothing was run" << std::endl;
    }
    return kExitOk;
  }
  if (root) write_json_atomic((fs::path(t.out) / "manifest.json").string(), manifest);
  MPI_Barrier(rt.world());
  return run_plan(ctx, plan, manifest);
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "run",
    "the whole job in one command: teacher -> data -> importance -> search / minitron -> distill -> eval -> scorecard -> "
    "samples -> export -> report, resumable stage by stage (default config: configs/demo.cfg)",
    add_run_options, run_run}));

}  // namespace
}  // namespace ac::launcher

// `autocompress run`'s configuration: the run options, the stage sections and --set, the
// teacher source and the checks made before the first stage (launcher/run/run_config.h).
#include "launcher/run/run_config.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "dist/error.h"
#include "dist/file_io.h"
#include "dist/parallel_layout.h"
#include "dist/runtime.h"
#include "distill/trainer.h"
#include "job/setup.h"
#include "launcher/budget_args.h"
#include "launcher/config_file.h"
#include "launcher/hardware_arg.h"
#include "launcher/run/stage_runner.h"
#include "launcher/run/stages.h"
#include "model/model.h"
#include "search/costmodel/local_profile.h"
#include "search/costmodel/profiles.h"

#ifndef AC_SOURCE_DIR
#define AC_SOURCE_DIR "."
#endif

namespace ac::launcher::run {
namespace {

namespace fs = std::filesystem;

// The stage sections of a run config and the subcommand whose options each one takes ("" for
// the sections the run reads itself).
const std::map<std::string, std::string> kSections = {
    {"teacher", ""},          {"data", ""},          {"importance", "importance"}, {"search", "search"},
    {"minitron", "minitron"}, {"distill", "distill"}, {"eval", "eval"},             {"scorecard", "scorecard"},
    {"samples", ""},          {"export", "export"},  {"teacher.cache", "teacher-cache"}};  // [teacher-cache]
// The keys of the sections the run reads itself.
const std::map<std::string, std::set<std::string>> kOwnKeys = {
    {"teacher", {"checkpoint", "hf", "gguf", "dtype", "tokenizer"}},
    {"data", {"prefix", "input", "corpus", "workers"}},
    {"samples", {"prompts", "max-new-tokens", "count"}}};
// Options the run sets on its calls and a config may not: they are the run's own wiring.
bool locked_option(const std::string& k) {
  static const std::set<std::string> locked = {"teacher", "importance", "data",       "out",   "student", "student-init",
                                               "model",   "checkpoint", "format",     "hardware", "engine", "workload",
                                               "configs-dir", "tokenizer", "json", "quiet", "check", "help", "config",
                                               "teacher-tasks", "task-scores", "write-requests", "python", "teacher-cache"};
  return locked.count(k) || k.rfind("target-", 0) == 0;
}

std::string default_config_path() { return std::string(AC_SOURCE_DIR) + "/configs/demo.cfg"; }

std::string bcast_string(MPI_Comm world, std::string s) {
  int n = int(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, world);
  s.resize(size_t(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, world);
  return s;
}

// ---- the config -------------------------------------------------------------------------

// The default config's values where the command line gave none.
void merge_default_config(po::variables_map& vm, const std::string& config_path, const nlohmann::json& resolved) {
  po::options_description desc;
  add_run_options(desc);
  desc.add_options()("help", "")("config", po::value<std::string>());
  po::variables_map dv;
  po::store(parse_ini_config(config_path, "run", desc), dv);
  for (const auto& [k, v] : dv)
    if (resolved.contains(k) && resolved[k]["source"] == "default") vm.at(k) = v;
    else if (!vm.count(k)) vm.insert({k, v});
  po::notify(vm);
}

StageKeys read_stage_keys(const std::string& config_path) {
  StageKeys keys;
  for (const auto& e : read_ini(config_path)) {
    if (e.section.empty() || e.section == "run") continue;  // the run's own keys (parsed by the launcher)
    if (!kSections.count(e.section))
      throw InputError(config_path, "[" + e.section + "]", "unknown stage section (line " + std::to_string(e.line) +
                                                               "; stages: teacher data importance search minitron teacher-cache distill eval scorecard samples export)");
    if (kOwnKeys.count(e.section) && !kOwnKeys.at(e.section).count(e.key))
      throw InputError(config_path, "[" + e.section + "] " + e.key, "unknown key (line " + std::to_string(e.line) + ")");
    keys.put(e.section, e.key, e.value, config_path);
  }
  return keys;
}

// --set SECTION.KEY=VALUE, over the config's keys.
void apply_set_overrides(StageKeys& keys, const std::vector<std::string>& sets) {
  for (const auto& s : sets) {
    const auto dot = s.find('.'), eq = s.find('=');
    if (dot == std::string::npos || eq == std::string::npos || dot > eq)
      throw InputError("command line", "--set", "'" + s + "': expected SECTION.KEY=VALUE (e.g. distill.steps=200)");
    const std::string section = s.substr(0, dot), key = s.substr(dot + 1, eq - dot - 1);
    if (!kSections.count(section)) throw InputError("command line", "--set " + s, "unknown stage section '" + section + "'");
    if (kOwnKeys.count(section) && !kOwnKeys.at(section).count(key))
      throw InputError("command line", "--set " + s, "unknown key '" + key + "' of [" + section + "]");
    keys.put(section, key, s.substr(eq + 1), "command line --set");
  }
}

RunOptions read_run_options(const po::variables_map& vm, const std::string& config_path) {
  RunOptions t;
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
  t.check = vm["check"].as<bool>();
  read_budget_options(vm, t.constraints.absolute);
  read_budget_ratio_options(vm, t.constraints);
  if (!t.constraints.any())
    throw InputError(config_path, "target-*", "no budget: give one of target-{params,active-params,memory-gb,ttft-ms,tpot-ms,throughput} or its -ratio");
  return t;
}

// `hardware = cpu-local` in a run: the machine's profile as this run directory first used it,
// RUN/hardware/cpu-local.json. The cached profile is recalibrated when the machine's speed moves
// (a spot check, a busy calibration redone, new kernels), and a ratio budget resolved again on
// a resumed run would change, and with it every stage's key from the search on: a finished
// stage would be redone against another machine model. So the first (non --check) use copies
// the resolved profile into the run directory and every later use of that directory reads the
// copy; deleting it makes the next resume take the machine's current profile.
std::string pinned_hardware(const RunOptions& t, dist::Runtime& rt) {
  if (t.hardware != search::kLocalProfileId) return t.hardware;
  const fs::path pinned = fs::path(t.out) / "hardware" / (std::string(search::kLocalProfileId) + ".json");
  if (fs::is_regular_file(pinned)) return pinned.string();
  if (t.check) return hardware_profile_path(t.hardware, t.configs_dir, t.dtype);
  if (rt.is_root()) {
    const std::string resolved = hardware_profile_path(t.hardware, t.configs_dir, t.dtype);
    write_file_atomic(pinned.string(), read_regular_file(resolved, "cached cpu-local profile"), "hardware profile");
  }
  MPI_Barrier(rt.world());
  return pinned.string();
}

// ---- the teacher ------------------------------------------------------------------------

// "pip:DIST/PATH" -> the file PATH inside the installed distribution DIST (rank 0 asks Python).
std::string resolve_pip_path(const std::string& v, const RunOptions& t, const std::string& from) {
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

// A teacher checkpoint: read in place, its tokenizer beside it.
void checkpoint_teacher(TeacherSource& s, const StageKeys& keys, const std::string& from) {
  try {
    s.arch = checkpoint::checkpoint_arch(checkpoint::CheckpointReader(checkpoint::resolve_checkpoint(s.source)));
  } catch (const std::exception& e) {
    throw InputError(from, "[teacher] " + s.kind, std::string("not a teacher checkpoint: ") + e.what());
  }
  s.checkpoint = s.source;
  s.arch_path = s.source;
  const fs::path dir = fs::is_directory(s.source) ? fs::path(s.source) : fs::path(s.source).parent_path();
  s.tokenizer = keys.get("teacher", "tokenizer", fs::exists(dir / "hf/tokenizer.json") ? (dir / "hf/tokenizer.json").string()
                                                                                         : (dir / "tokenizer.json").string());
}

// A GGUF teacher: its architecture without converting the weights (config.json from the metadata).
void gguf_teacher(TeacherSource& s, const RunOptions& t, const std::string& from, MPI_Comm world, bool root) {
  const std::string field = "[teacher] " + s.kind;
  std::string file;
  if (root) file = s.source.rfind("pip:", 0) == 0 ? resolve_pip_path(s.source, t, from) : s.source;
  s.source = bcast_string(world, file);
  if (!fs::is_regular_file(s.source)) throw InputError(from, field, s.source + ": no such file");
  const std::string check_dir = t.out + "/.check/teacher";
  if (root)
    run_shell(t.python + " " + sh_quote(t.scripts_dir + "/gguf_to_hf.py") + " --gguf " + sh_quote(s.source) + " --out " +
                  sh_quote(check_dir) + " --config-only >/dev/null",
              from + ": " + field);
  MPI_Barrier(world);
  s.arch_path = check_dir + "/config.json";
  s.tokenizer = s.checkpoint + "/hf/tokenizer.json";
}

// ---- the checks before the first stage --------------------------------------------------

void check_calls(const RunPlan& plan, const std::string& config_path) {
  for (const auto& s : plan.stages)
    for (const auto& c : s.calls) {
      try {
        check_subcommand_args(c.args());
      } catch (const InputError& e) {
        throw InputError(config_path, "[" + s.name + "]", e.what());
      }
    }
}

// A call's integer option (checked by check_calls first), or `fallback` where it is not given.
int64_t call_int(const Call& c, const std::string& key, int64_t fallback) {
  for (const auto& [k, v] : c.options)
    if (k == key && !v.empty()) return std::stoll(v.front());
  return fallback;
}

bool call_flag(const Call& c, const std::string& key) {
  for (const auto& [k, v] : c.options)
    if (k == key && v.empty()) return true;
  return false;
}

// [search] / [distill] sequence-parallel: TP > 1 and the stage's --seq-len split over it
// (job::check_sequence_parallel), before the first stage: the distill stage would otherwise
// stop only after the search.
void check_sequence_parallel(const RunPlan& plan, const RunConfig& cfg) {
  for (const auto& s : plan.stages) {
    const bool distill = s.name.rfind("distill-", 0) == 0;
    if (s.name != "search" && !distill) continue;
    const Call& c = s.calls.front();
    if (!call_flag(c, "sequence-parallel")) continue;
    const int64_t seq_len = call_int(c, "seq-len", distill ? distill::TrainerConfig{}.seq_len : search::DasOptions{}.seq_len);
    try {
      job::check_sequence_parallel(true, int(call_int(c, "tp", 1)), seq_len);
    } catch (const InputError& e) {
      throw InputError(cfg.path, distill ? "[distill]" : "[search]", e.what());
    }
  }
}

// The distill stages' expert layout ([distill] ep, etp): EP must divide DP and the teacher's
// experts must split over it, or the run would stop only at distillation, after the search.
// (The student's experts, known after the search, are checked by the stage itself.) A
// one-process `run --check` checks the config for the job it will be (world unknown): there
// the sizes are checked against the teacher but not against a world of 1.
void check_expert_layout(const RunPlan& plan, const RunConfig& cfg, const TeacherSource& teacher, int world_size) {
  const bool world_known = !(cfg.options.check && world_size == 1);
  for (const auto& s : plan.stages) {
    if (s.name.rfind("distill-", 0) != 0) continue;
    const Call& c = s.calls.front();
    const int tp = int(call_int(c, "tp", 1)), ep = int(call_int(c, "ep", 1)), etp = int(call_int(c, "etp", 1));
    try {
      if (world_known) dist::resolve_grid(world_size, {tp, 0, 0, ep});
      if (etp != 1 && etp != tp) throw InputError("etp", std::to_string(etp), "must be 1 or the TP size " + std::to_string(tp));
      if (const std::string why = model::tp_split_problem(teacher.arch, tp, ep, etp > 1); !why.empty())
        throw InputError("teacher " + teacher.source, "ep " + std::to_string(ep), why);
    } catch (const InputError& e) {
      throw InputError(cfg.path, "[distill]", e.what());
    }
    break;  // one [distill] section serves every method
  }
}

// Reachability on the teacher's architecture: the same options as the real calls, --check.
void check_budgets_reachable(const RunPlan& plan, const std::string& config_path, const TeacherSource& teacher,
                             dist::Runtime& rt) {
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
}

}  // namespace

std::string StageKeys::get(const std::string& section, const std::string& key, const std::string& fallback) const {
  auto it = by_section.find(section);
  if (it == by_section.end()) return fallback;
  for (const auto& [k, v] : it->second)
    if (k == key) return v;
  return fallback;
}

bool StageKeys::has(const std::string& section, const std::string& key) const {
  auto it = by_section.find(section);
  if (it == by_section.end()) return false;
  for (const auto& kv : it->second)
    if (kv.first == key) return true;
  return false;
}

void StageKeys::put(const std::string& section, const std::string& key, const std::string& value, const std::string& from) {
  auto& v = by_section[section];
  bool replaced = false;
  for (auto& kv : v)
    if (kv.first == key) kv.second = value, replaced = true;
  if (!replaced) v.emplace_back(key, value);
  where[section + "." + key] = from;
}

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

RunConfig read_run_config(const po::variables_map& vm_in, const RunContext& ctx) {
  RunConfig cfg;
  po::variables_map vm = vm_in;
  cfg.path = vm.count("config") ? vm["config"].as<std::string>() : default_config_path();
  if (!vm.count("config")) merge_default_config(vm, cfg.path, ctx.config);
  cfg.keys = read_stage_keys(cfg.path);
  if (vm.count("set")) apply_set_overrides(cfg.keys, vm["set"].as<std::vector<std::string>>());
  cfg.options = read_run_options(vm, cfg.path);
  cfg.options.hardware = pinned_hardware(cfg.options, ctx.runtime);
  return cfg;
}

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

TeacherSource teacher_source(const RunConfig& cfg, MPI_Comm world, bool root) {
  const StageKeys& keys = cfg.keys;
  const std::string& from = cfg.path;
  TeacherSource s;
  int given = 0;
  for (const char* k : {"checkpoint", "hf", "gguf"})
    if (keys.has("teacher", k)) s.kind = k, s.source = keys.get("teacher", k), ++given;
  if (given != 1) throw InputError(from, "[teacher]", "give exactly one of checkpoint = DIR, hf = DIR or gguf = FILE");
  if (s.kind == "checkpoint") {
    checkpoint_teacher(s, keys, from);
    return s;
  }
  s.checkpoint = cfg.options.out + "/teacher";
  if (s.kind == "hf") {
    const fs::path config_json = fs::path(s.source) / "config.json";
    if (!fs::exists(config_json)) throw InputError(from, "[teacher] hf", s.source + ": no config.json (a Hugging Face checkpoint directory)");
    s.arch_path = config_json.string();
    s.tokenizer = keys.get("teacher", "tokenizer", (fs::path(s.source) / "tokenizer.json").string());
  } else {
    gguf_teacher(s, cfg.options, from, world, root);
  }
  s.arch = model::load_arch(s.arch_path);
  return s;
}

std::optional<search::CostTarget> cost_target(const RunConfig& cfg) {
  const RunOptions& t = cfg.options;
  std::optional<search::CostTarget> target;
  if (!t.hardware.empty() && !t.workload.empty())
    target = search::CostTarget{search::load_hardware(t.hardware, t.configs_dir), search::load_engine(t.engine, t.configs_dir),
                                search::load_workload(t.workload, t.configs_dir)};
  if (t.constraints.needs_cost_model() && !target)
    throw InputError(cfg.path, t.hardware.empty() ? "hardware" : "workload", "latency and memory budgets need hardware and workload");
  return target;
}

void preflight(const RunPlan& plan, const RunConfig& cfg, const TeacherSource& teacher, dist::Runtime& rt) {
  check_calls(plan, cfg.path);
  check_expert_layout(plan, cfg, teacher, rt.world_size());
  check_sequence_parallel(plan, cfg);
  check_budgets_reachable(plan, cfg.path, teacher, rt);
}

}  // namespace ac::launcher::run

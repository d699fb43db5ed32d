// `autocompress run`'s configuration (docs/run.md): its own options (the INI file's top level
// and the command line), the stage sections with their --set overrides, the teacher source,
// and every check made before the first stage starts.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/command.h"
#include "model/arch_spec.h"
#include "search/budget.h"
#include "search/das/das.h"

namespace ac::launcher::run {

struct Call;
struct RunPlan;

// The run's own options, resolved.
struct RunOptions {
  std::string out, method, split, dtype, hardware, engine, workload, configs_dir, scripts_dir, python;
  int tp = 1;
  uint64_t seed = 1234;
  bool check = false;  // --check: check and print the plan, run nothing
  search::SearchConstraints constraints;
};

// A config's sections, keys and --set overrides, checked against what each section takes.
struct StageKeys {
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> by_section;
  std::map<std::string, std::string> where;  // "distill.steps" -> "FILE line 12" or "--set"

  std::string get(const std::string& section, const std::string& key, const std::string& fallback = "") const;
  bool has(const std::string& section, const std::string& key) const;
  void put(const std::string& section, const std::string& key, const std::string& value, const std::string& from);
};

struct RunConfig {
  std::string path;  // the config file (--config, else configs/demo.cfg)
  RunOptions options;
  StageKeys keys;
};

// The teacher's architecture before any stage ran, and the path `--check` calls take for it.
struct TeacherSource {
  std::string kind;        // checkpoint | hf | gguf
  std::string source;      // as configured (gguf resolved to a file)
  std::string checkpoint;  // the checkpoint every stage reads
  std::string tokenizer;
  std::string arch_path;   // checkpoint, or a config.json (hf, gguf) for the checks
  model::ArchSpec arch;
};

void add_run_options(po::options_description& d);

// The config (its top-level keys are run options, the command line wins; without --config the
// default config's values fill what the command line left at its defaults), its stage
// sections and the --set overrides. Throws InputError naming the file, line or option.
RunConfig read_run_config(const po::variables_map& vm, const RunContext& ctx);

// Applies a section's keys to a call of its subcommand: each key is one of that subcommand's
// options (a flag takes true/false; a multi-value option takes space-separated values).
void apply_section(Call& c, const StageKeys& keys, const std::string& section, const std::string& config_path);

// The teacher of [teacher]: its architecture read now (a GGUF file's from its metadata).
TeacherSource teacher_source(const RunConfig& cfg, MPI_Comm world, bool root);
// The serving target when hardware and workload are given; InputError when a budget needs it.
std::optional<search::CostTarget> cost_target(const RunConfig& cfg);

// Every check before the first stage: each call parses, the distill stages' expert layout fits
// the world and the teacher, and every budget is reachable (`search --check`, `minitron --check`).
void preflight(const RunPlan& plan, const RunConfig& cfg, const TeacherSource& teacher, dist::Runtime& rt);

}  // namespace ac::launcher::run

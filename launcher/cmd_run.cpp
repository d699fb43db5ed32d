// `autocompress run`: the whole job in one command (docs/run.md). One INI file (top-level keys
// for the run, one section per stage) becomes a plan of stages, each one or more ordinary
// subcommand calls made inside this process under the same MPI world:
//
//   teacher -> data -> importance -> search | minitron (each ends by pruning its student)
//           -> distill-<method> -> eval -> scorecard -> samples -> export-<method> -> report
//
// The parts live in launcher/run/: run_config (options, sections, --set, the checks before the
// first stage), stages (one builder per stage), stage_runner (keys, markers, resume). Everything
// that can be checked is checked before the first stage starts: sections and keys, the teacher
// and data sources, and that every budget is reachable (`search --check`, `minitron --check`).
#include <mpi.h>

#include <filesystem>
#include <iostream>
#include <optional>

#include "dist/error.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "launcher/config_file.h"
#include "launcher/run/run_config.h"
#include "launcher/run/stage_runner.h"
#include "launcher/run/stages.h"

namespace ac::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// One line for the run, one per budget.
void print_summary(const run::RunConfig& cfg, const run::TeacherSource& teacher, const run::RunPlan& plan, int world) {
  const run::RunOptions& t = cfg.options;
  std::cout << "[run] " << cfg.path << " -> " << t.out << ": " << plan.stages.size() << " stages, method " << t.method
            << ", teacher " << teacher.source << " (" << teacher.kind << "), world " << world << " (TP " << t.tp << ")\n";
  if (!t.hardware.empty() && fs::path(t.hardware).parent_path() == fs::path(t.out) / "hardware")
    std::cout << "[run] hardware: " << t.hardware << " (this run's copy of the machine's profile, made on its first use; "
              << "delete it to take the current one)\n";
  for (const auto& b : plan.budgets)
    std::cout << "[run] budget " << b["option"].get<std::string>() << ": " << b["as"].get<std::string>() << " "
              << run::fmt_num(b["limit"].get<double>()) << " (teacher " << run::fmt_num(b["teacher"].get<double>()) << ")\n";
  std::cout << std::flush;
}

// --check: every stage with its key, shell steps and calls.
void print_plan(const run::RunPlan& plan) {
  for (const auto& s : plan.stages) {
    std::cout << "  " << s.name << " (key " << s.key << ")\n";
    for (const auto& sh : s.shell) std::cout << "    $ " << sh << "\n";
    for (const auto& c : s.calls) std::cout << "    $ " << c.text() << "\n";
  }
  std::cout << "[run] check: the config, sources and budgets are good; nothing was run" << std::endl;
}

int run_run(const po::variables_map& vm, RunContext& ctx) {
  dist::Runtime& rt = ctx.runtime;
  const bool root = rt.is_root();
  const run::RunConfig cfg = run::read_run_config(vm, ctx);
  // ---- every check before the first stage
  const run::TeacherSource teacher = run::teacher_source(cfg, rt.world(), root);
  const std::optional<search::CostTarget> target = run::cost_target(cfg);
  const run::RunPlan plan = run::make_plan(cfg, teacher, target ? &*target : nullptr);
  run::preflight(plan, cfg, teacher, rt);

  const json manifest = run::run_manifest(ctx, cfg, teacher, plan);
  if (root) print_summary(cfg, teacher, plan, rt.world_size());
  if (cfg.options.check) {
    if (root) print_plan(plan);
    return kExitOk;
  }
  if (root) write_json_atomic((fs::path(cfg.options.out) / "manifest.json").string(), manifest);
  MPI_Barrier(rt.world());
  return run::run_plan(ctx, plan, manifest);
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "run",
    "the whole job in one command: teacher -> data -> importance -> search / minitron -> distill -> eval -> scorecard -> "
    "samples -> export -> report, resumable stage by stage (default config: configs/demo.cfg)",
    run::add_run_options, run_run}));

}  // namespace
}  // namespace ac::launcher

// `autocompress run`'s stage runner (docs/run.md). Every stage records a key: a hash of its
// calls (paths in the run directory written relative to it), of the files outside the run it
// reads, and of the keys of the stages it reads from. A rerun skips a stage whose key is
// recorded as done; a stage recorded as started with the same key is rerun in place, so search
// and distill resume from their own checkpoints; a stage whose key changed is cleared and
// rerun, and with it everything downstream (their keys contain its key).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "launcher/command.h"
#include "launcher/run/run_config.h"
#include "launcher/run/stages.h"

namespace ac::launcher::run {

// Sets each stage's key, in order (each stage's after-stages come before it).
void assign_stage_keys(RunPlan& plan);

// The run's manifest.json before any stage ran: command line, config, sections, budgets,
// teacher, world and the plan; run_plan adds each stage's record as it goes.
nlohmann::json run_manifest(const RunContext& ctx, const RunConfig& cfg, const TeacherSource& teacher, const RunPlan& plan);

// Runs the stages in order, skipping or resuming by their markers (RUN/stages/<name>.json).
// Returns 0, or job::kExitRequeue when a signal stopped it (rerun to continue); throws when a
// call fails.
int run_plan(RunContext& ctx, const RunPlan& plan, const nlohmann::json& manifest);

// Runs a shell command on this process; throws (naming `what`) when it fails. The child
// ignores SIGUSR1 and SIGTERM: Slurm sends them to every process of the job, and the run,
// not a helper script, decides to stop.
void run_shell(const std::string& cmd, const std::string& what);

}  // namespace ac::launcher::run

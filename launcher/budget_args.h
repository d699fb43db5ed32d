// What `minitron` and `search` share: the budget options (--target-params,
// --target-active-params, --target-memory-gb, --target-ttft-ms, --target-tpot-ms,
// --target-throughput) and the teacher's importance scores (neutral ones for --check).
#pragma once

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "dist/error.h"
#include "model/arch_spec.h"
#include "search/importance/importance.h"
#include "search/das/das.h"
#include "search/minitron/minitron.h"

namespace ac::launcher {

inline void add_budget_options(boost::program_options::options_description& d) {
  namespace po = boost::program_options;
  d.add_options()("target-params", po::value<double>()->value_name("N"), "at most N parameters (ArchSpec count, without MTP)")(
      "target-active-params", po::value<double>()->value_name("N"), "at most N active parameters per token")(
      "target-memory-gb", po::value<double>()->value_name("X"),
      "at most X GB (1e9 bytes) of serving memory by the cost model: weights + activations + reserve + KV/state of the "
      "workload's concurrency (1 sequence when it asks for as many as fit); needs --hardware and --workload")(
      "target-ttft-ms", po::value<double>()->value_name("X"), "predicted TTFT at most X ms")(
      "target-tpot-ms", po::value<double>()->value_name("X"), "predicted TPOT at most X ms")(
      "target-throughput", po::value<double>()->value_name("X"), "predicted output throughput at least X tokens/s");
}

// The same budgets as ratios of the teacher's own value on the same target (search, run).
inline void add_budget_ratio_options(boost::program_options::options_description& d) {
  namespace po = boost::program_options;
  d.add_options()(
      "target-params-ratio", po::value<double>()->value_name("R"), "at most R x the teacher's parameters")(
      "target-active-params-ratio", po::value<double>()->value_name("R"), "at most R x the teacher's active parameters")(
      "target-memory-gb-ratio", po::value<double>()->value_name("R"), "at most R x the teacher's predicted memory")(
      "target-ttft-ms-ratio", po::value<double>()->value_name("R"), "at most R x the teacher's predicted TTFT")(
      "target-tpot-ms-ratio", po::value<double>()->value_name("R"), "at most R x the teacher's predicted TPOT")(
      "target-throughput-ratio", po::value<double>()->value_name("R"), "at least R x the teacher's predicted throughput");
}

// The value of budget option `name` (or `def` when absent): a positive finite number, else
// InputError naming the option and the value as given.
inline double budget_value(const boost::program_options::variables_map& vm, const char* name, double def) {
  if (!vm.count(name)) return def;
  const double v = vm[name].as<double>();
  if (!(v > 0) || !std::isfinite(v)) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    throw InputError("command line", std::string("--") + name, std::string(b) + " is not a budget: give a positive finite number");
  }
  return v;
}

inline void read_budget_ratio_options(const boost::program_options::variables_map& vm, search::SearchConstraints& c) {
  auto take = [&](const char* name, double& v) { v = budget_value(vm, name, v); };
  take("target-params-ratio", c.params_ratio);
  take("target-active-params-ratio", c.active_params_ratio);
  take("target-memory-gb-ratio", c.memory_ratio);
  take("target-ttft-ms-ratio", c.ttft_ratio);
  take("target-tpot-ms-ratio", c.tpot_ratio);
  take("target-throughput-ratio", c.throughput_ratio);
}

inline void read_budget_options(const boost::program_options::variables_map& vm, search::BudgetLimits& c) {
  auto take = [&](const char* name, double& v) { v = budget_value(vm, name, v); };
  take("target-params", c.params);
  take("target-active-params", c.active_params);
  take("target-memory-gb", c.memory_gb);
  take("target-ttft-ms", c.ttft_ms);
  take("target-tpot-ms", c.tpot_ms);
  take("target-throughput", c.throughput);
}

// The importance scores of `teacher` from `importance`; without a file (--check) neutral
// scores of its architecture (a checkpoint, or an ArchSpec JSON / config.json).
inline search::ImportanceScores teacher_scores(const std::string& teacher, const std::string& importance) {
  const bool arch_only = std::filesystem::path(teacher).extension() == ".json";
  if (importance.empty())
    return search::neutral_importance(arch_only ? model::load_arch(teacher)
                                                : checkpoint::checkpoint_arch(checkpoint::CheckpointReader(checkpoint::resolve_checkpoint(teacher))));
  if (arch_only) throw InputError("command line", "--teacher", teacher + ": a checkpoint is needed with --importance");
  checkpoint::CheckpointReader r(checkpoint::resolve_checkpoint(teacher));
  return search::load_importance(importance, checkpoint::model_fingerprint(r));
}

}  // namespace ac::launcher

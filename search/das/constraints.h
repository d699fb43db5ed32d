// The search's budgets: the --target-* options resolved to absolute limits on the teacher's
// exact cost, the exact cost of one ArchSpec, and how far a value is over a limit.
#pragma once

#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "search/budget.h"

namespace ac::search {

enum class Metric { Params, ActiveParams, Memory, Ttft, Tpot, Throughput };
const char* metric_name(Metric m);  // params active_params memory_gb ttft_ms tpot_ms throughput

// Absolute budgets (BudgetLimits: the same meaning as `minitron` gives them) and the same
// budgets as ratios of the teacher's own value on the same target (0 = not given).
struct SearchConstraints {
  BudgetLimits absolute;
  double params_ratio = 0, active_params_ratio = 0, memory_ratio = 0, ttft_ratio = 0, tpot_ratio = 0,
         throughput_ratio = 0;
  bool any() const;
  bool needs_cost_model() const;
};

// One budget, resolved to an absolute value in the metric's base unit (parameters, bytes,
// seconds, tokens/s).
struct Budget {
  Metric metric;
  std::string option;   // the command-line option it came from ("--target-tpot-ratio")
  double value = 0;     // the limit
  double teacher = 0;   // the teacher's exact value
  bool at_least = false;  // throughput: at least `value`
};

// The exact quantities a budget can bound, for one ArchSpec.
struct ExactCost {
  double params = 0, active_params = 0, memory_bytes = 0, ttft_s = 0, tpot_s = 0, throughput_tok_s = 0;
  bool fits = true;     // with a target: the cost model's `fits`
  std::string problem;  // why not
  double get(Metric m) const;
};
ExactCost exact_cost(const model::ArchSpec& spec, const CostTarget* target);

// Budgets of `c` for `teacher` (ratios times the teacher's exact value). Throws ac::InputError
// naming the option when a ratio is not in (0, 1] (throughput: >= 1), or when a cost-model
// budget has no target.
std::vector<Budget> resolve_budgets(const SearchConstraints& c, const model::ArchSpec& teacher, const CostTarget* target);

// Relative violation of one budget by value x: > 0 when exceeded (x / value - 1; throughput
// 1 - x / value).
double violation(const Budget& b, double x);

// A metric in the unit people read (M parameters, GB, ms, tokens/s), alone and as text with
// its unit; a number at `precision` significant digits; a parameter count as "1.2B" / "350M".
double shown(Metric m, double v);
std::string shown_text(Metric m, double v);
std::string number_text(double v, int precision = 4);
std::string params_text(double n);

}  // namespace ac::search

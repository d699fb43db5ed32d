// Discretize and repair: a pick evaluated on the exact cost model against every budget, moved
// one choice step at a time until every budget holds, then given back what the slack allows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "search/das/constraints.h"
#include "search/das/space.h"

namespace ac::search {

struct RepairStep {
  std::string action;  // "remove" | "give back"
  int decision = 0;
  int64_t from = 0, to = 0;
  std::string what;    // "layers[3].ffn 1024 -> 768"
};
struct RepairResult {
  std::vector<int> pick;
  std::vector<RepairStep> steps;
  ExactCost cost;
  // The budget closest to its limit and how close (value / limit; throughput limit / value).
  int binding = -1;
  double binding_use = 0;
  std::string slack_reason;  // when the binding budget is used below 95%: what stopped the give-back
};

// From `pick` (the argmax), removes units until every budget holds and the model fits, then gives
// back while every budget still holds. Moves are one choice step of one decision; the one taken
// costs the least log-probability under `log_probs` (per decision, [choices]) per unit of violation
// removed (remove) or adds the most log-probability per unit of budget used (give back). Throws
// std::runtime_error when no move can repair (cannot happen above the smallest pick).
RepairResult repair(const SearchSpace& space, std::vector<int> pick, const std::vector<std::vector<double>>& log_probs,
                    const std::vector<Budget>& budgets, const CostTarget* target);

// Refuses (ac::InputError naming the option and the smallest reachable value) a budget the
// smallest pick of the space does not meet, before any forward.
void check_reachable(const SearchSpace& space, const std::vector<Budget>& budgets, const CostTarget* target);

}  // namespace ac::search

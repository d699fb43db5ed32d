// Discretize and repair (search/das/repair.h): every move is one choice step of one decision,
// judged on the exact cost model; removals until every budget holds, then give-backs.
#include "search/das/repair.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include "dist/error.h"

namespace ac::search {

namespace {

struct Evaluated {
  ExactCost cost;
  double violation = 0;  // sum of positive violations, +1 when it does not fit
  bool ok() const { return violation <= 0; }
};

Evaluated evaluate(const SearchSpace& space, const std::vector<int>& pick, const std::vector<Budget>& budgets, const CostTarget* target) {
  Evaluated e;
  e.cost = exact_cost(space.spec(pick), target);
  for (const auto& b : budgets) e.violation += std::max(0.0, violation(b, e.cost.get(b.metric)));
  if (!e.cost.fits) e.violation += 1.0;
  return e;
}

std::string move_text(const SearchSpace& s, int d, int from, int to) {
  const Decision& x = s.decisions[size_t(d)];
  const std::string where = x.layer < 0 ? x.axis : "layers[" + std::to_string(x.layer) + "]." + x.axis;
  return where + " " + std::to_string(x.choices[size_t(from)]) + " -> " + std::to_string(x.choices[size_t(to)]);
}

double use_of(const Budget& b, double x) { return b.at_least ? b.value / std::max(x, 1e-30) : x / b.value; }

// Moves decision d of `pick` one step (`by` = -1: remove, +1: give back) and records it.
void take(const SearchSpace& space, std::vector<int>& pick, int d, int by, const char* action, RepairResult& r) {
  const auto& choices = space.decisions[size_t(d)].choices;
  const int from = pick[size_t(d)], to = from + by;
  r.steps.push_back({action, d, choices[size_t(from)], choices[size_t(to)], move_text(space, d, from, to)});
  pick[size_t(d)] = to;
}

// Remove: one step down at a time until every budget holds; the step that loses the least
// log-probability per unit of violation removed.
Evaluated remove_until_within(const SearchSpace& space, std::vector<int>& pick, const std::vector<std::vector<double>>& lp,
                              const std::vector<Budget>& budgets, const CostTarget* target, RepairResult& r) {
  Evaluated cur = evaluate(space, pick, budgets, target);
  for (int guard = 0; !cur.ok(); ++guard) {
    if (guard > 100000) throw std::runtime_error("search repair: no progress");
    int best = -1;
    double best_score = std::numeric_limits<double>::infinity();
    Evaluated best_eval;
    for (size_t d = 0; d < space.decisions.size(); ++d) {
      if (pick[d] == 0) continue;
      std::vector<int> p = pick;
      --p[d];
      Evaluated e = evaluate(space, p, budgets, target);
      // Violation removed, counted on the budgets exceeded now (continuous, also below 0).
      double gain = 0;
      for (const auto& b : budgets) {
        const double before = violation(b, cur.cost.get(b.metric));
        if (before > 0) gain += before - violation(b, e.cost.get(b.metric));
      }
      if (!cur.cost.fits) gain += (e.cost.fits ? 1.0 : 0.0) + 1e-12 * (cur.cost.memory_bytes - e.cost.memory_bytes);
      const double loss = std::max(0.0, lp[d][size_t(pick[d])] - lp[d][size_t(pick[d] - 1)]) + 1e-3;
      const double score = gain > 0 ? loss / gain : std::numeric_limits<double>::max() / 2 + loss;
      if (score < best_score) best_score = score, best = int(d), best_eval = e;
    }
    if (best < 0) throw std::runtime_error("search repair: every decision is at its smallest choice and a budget still fails");
    take(space, pick, best, -1, "remove", r);
    cur = best_eval;
  }
  return cur;
}

// Give back: one step up at a time while every budget still holds; the move the search's
// logits favour most first (ties: the one that uses the least budget).
Evaluated give_back(const SearchSpace& space, std::vector<int>& pick, const std::vector<std::vector<double>>& lp,
                    const std::vector<Budget>& budgets, const CostTarget* target, Evaluated cur, RepairResult& r) {
  for (int guard = 0;; ++guard) {
    if (guard > 100000) break;
    int best = -1;
    double best_gain = -std::numeric_limits<double>::infinity(), best_use = 0;
    Evaluated best_eval;
    // The gain of a move needs no cost model, so moves are tried in order of gain: the first
    // that holds every budget sets the best gain, and only moves tied with it (for the least
    // budget used) are evaluated after it.
    std::vector<std::pair<double, size_t>> order;
    for (size_t d = 0; d < space.decisions.size(); ++d)
      if (pick[d] + 1 < int(space.decisions[d].choices.size()))
        order.push_back({lp[d][size_t(pick[d] + 1)] - lp[d][size_t(pick[d])], d});
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [gain, d] : order) {
      if (best >= 0 && gain < best_gain - 1e-12) break;
      std::vector<int> p = pick;
      ++p[d];
      Evaluated e = evaluate(space, p, budgets, target);
      if (!e.ok()) continue;
      double use = 0;
      for (const auto& b : budgets) use = std::max(use, use_of(b, e.cost.get(b.metric)) - use_of(b, cur.cost.get(b.metric)));
      if (best < 0 || gain > best_gain + 1e-12 || (std::abs(gain - best_gain) <= 1e-12 && (use < best_use || (use == best_use && int(d) < best))))
        best = int(d), best_gain = gain, best_use = use, best_eval = e;
    }
    if (best < 0) break;
    take(space, pick, best, +1, "give back", r);
    cur = best_eval;
  }
  return cur;
}

// Why the binding budget is used below 95%: the teacher meets the budgets, or the smallest
// step up and what it would break.
std::string slack_reason(const SearchSpace& space, const std::vector<int>& pick, const std::vector<Budget>& budgets,
                         const CostTarget* target) {
  if (pick == space.teacher_pick()) return "every searched axis is at the teacher's value (the teacher itself meets the budgets)";
  double least = std::numeric_limits<double>::infinity();
  std::string why;
  for (size_t d = 0; d < space.decisions.size(); ++d) {
    if (pick[d] + 1 >= int(space.decisions[d].choices.size())) continue;
    std::vector<int> p = pick;
    ++p[d];
    Evaluated e = evaluate(space, p, budgets, target);
    for (const auto& b : budgets) {
      const double v = violation(b, e.cost.get(b.metric));
      if (v > 0 && v < least)
        least = v, why = move_text(space, int(d), pick[d], pick[d] + 1) + " would exceed " + b.option + " by " + number_text(100 * v, 3) + "%";
    }
    if (!e.cost.fits && why.empty()) why = move_text(space, int(d), pick[d], pick[d] + 1) + " would not fit: " + e.cost.problem;
  }
  return "the choice grid stops the give-back: the smallest step up, " + why;
}

}  // namespace

void check_reachable(const SearchSpace& space, const std::vector<Budget>& budgets, const CostTarget* target) {
  const auto pick = space.smallest_pick();
  const ExactCost c = exact_cost(space.spec(pick), target);
  for (const auto& b : budgets) {
    if (violation(b, c.get(b.metric)) > 0) {
      throw InputError(b.option, shown_text(b.metric, b.value),
                       std::string(b.at_least ? "above the largest" : "below the smallest") + " reachable value: the " +
                           (b.at_least ? "fastest" : "smallest") + " architecture of the search space (every searched axis at its smallest choice) has " +
                           shown_text(b.metric, c.get(b.metric)) + " (the teacher: " + shown_text(b.metric, b.teacher) + ")");
    }
  }
  if (target && !c.fits)
    throw InputError("--hardware", target->hardware.id, "even the smallest architecture of the search space does not fit: " + c.problem);
}

RepairResult repair(const SearchSpace& space, std::vector<int> pick, const std::vector<std::vector<double>>& lp,
                    const std::vector<Budget>& budgets, const CostTarget* target) {
  RepairResult r;
  Evaluated cur = remove_until_within(space, pick, lp, budgets, target, r);
  cur = give_back(space, pick, lp, budgets, target, cur, r);
  r.pick = pick;
  r.cost = cur.cost;
  for (size_t i = 0; i < budgets.size(); ++i) {
    const double u = use_of(budgets[i], cur.cost.get(budgets[i].metric));
    if (r.binding < 0 || u > r.binding_use) r.binding = int(i), r.binding_use = u;
  }
  if (r.binding >= 0 && r.binding_use < 0.95) r.slack_reason = slack_reason(space, pick, budgets, target);
  return r;
}

}  // namespace ac::search

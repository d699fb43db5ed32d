// The search's budgets (search/das/constraints.h).
#include "search/das/constraints.h"

#include <iomanip>
#include <sstream>

#include "dist/error.h"
#include "search/costmodel/cost_model.h"

namespace ac::search {

const char* metric_name(Metric m) {
  switch (m) {
    case Metric::Params: return "params";
    case Metric::ActiveParams: return "active_params";
    case Metric::Memory: return "memory_gb";
    case Metric::Ttft: return "ttft_ms";
    case Metric::Tpot: return "tpot_ms";
    case Metric::Throughput: return "throughput";
  }
  return "?";
}

double shown(Metric m, double v) {
  switch (m) {
    case Metric::Params:
    case Metric::ActiveParams: return v / 1e6;
    case Metric::Memory: return v / 1e9;
    case Metric::Ttft:
    case Metric::Tpot: return v * 1e3;
    case Metric::Throughput: return v;
  }
  return v;
}

namespace {
const char* unit(Metric m) {
  switch (m) {
    case Metric::Params:
    case Metric::ActiveParams: return "M";
    case Metric::Memory: return " GB";
    case Metric::Ttft:
    case Metric::Tpot: return " ms";
    case Metric::Throughput: return " tok/s";
  }
  return "";
}
}  // namespace

std::string number_text(double v, int precision) {
  std::ostringstream o;
  o << std::setprecision(precision) << v;
  return o.str();
}
std::string shown_text(Metric m, double v) { return number_text(shown(m, v), 5) + unit(m); }
std::string params_text(double n) { return n >= 1e9 ? number_text(n / 1e9, 4) + "B" : number_text(n / 1e6, 5) + "M"; }

bool SearchConstraints::any() const {
  return absolute.any() || params_ratio > 0 || active_params_ratio > 0 || memory_ratio > 0 || ttft_ratio > 0 ||
         tpot_ratio > 0 || throughput_ratio > 0;
}
bool SearchConstraints::needs_cost_model() const {
  return absolute.needs_cost_model() || memory_ratio > 0 || ttft_ratio > 0 || tpot_ratio > 0 || throughput_ratio > 0;
}

double ExactCost::get(Metric m) const {
  switch (m) {
    case Metric::Params: return params;
    case Metric::ActiveParams: return active_params;
    case Metric::Memory: return memory_bytes;
    case Metric::Ttft: return ttft_s;
    case Metric::Tpot: return tpot_s;
    case Metric::Throughput: return throughput_tok_s;
  }
  return 0;
}

ExactCost exact_cost(const model::ArchSpec& spec, const CostTarget* target) {
  ExactCost c;
  const model::ParamCounts pc = model::count_params(spec);
  c.params = double(pc.total());
  c.active_params = double(pc.active());
  if (target) {
    const Prediction p = predict(spec, target->hardware, target->engine, target->workload);
    c.memory_bytes = serving_memory_bytes(p, target->workload);
    c.ttft_s = p.ttft_s;
    c.tpot_s = p.tpot_s;
    c.throughput_tok_s = p.throughput_tok_s;
    c.fits = p.fits;
    c.problem = p.problem;
  }
  return c;
}

double violation(const Budget& b, double x) { return b.at_least ? 1.0 - x / b.value : x / b.value - 1.0; }

std::vector<Budget> resolve_budgets(const SearchConstraints& c, const model::ArchSpec& teacher, const CostTarget* target) {
  if (!c.any())
    throw InputError("search", "budget",
                     "give a budget: --target-{params,active-params,memory-gb,ttft-ms,tpot-ms,throughput} or the same as "
                     "--target-*-ratio of the teacher's value");
  if (c.needs_cost_model() && !target)
    throw InputError("search", "--hardware", "memory, TTFT, TPOT and throughput budgets need --hardware and --workload");
  const ExactCost t = exact_cost(teacher, target);
  std::vector<Budget> out;
  auto add = [&](Metric m, const char* option, double absolute, double scale, double ratio, bool at_least) {
    const std::string ratio_option = std::string(option) + "-ratio";
    if (ratio < 0) throw InputError(ratio_option, number_text(ratio), "must be positive");
    if (ratio > 0 && !at_least && ratio > 1)
      throw InputError(ratio_option, number_text(ratio), "a ratio above 1 asks for a student larger than the teacher");
    if (ratio > 0 && at_least && ratio < 1)
      throw InputError(ratio_option, number_text(ratio), "a throughput ratio below 1 asks for a student slower than the teacher");
    if (absolute < 0) throw InputError(option, number_text(absolute), "must be positive");
    if (absolute > 0) out.push_back({m, option, absolute * scale, t.get(m), at_least});
    if (ratio > 0) out.push_back({m, ratio_option, ratio * t.get(m), t.get(m), at_least});
  };
  const auto& a = c.absolute;
  add(Metric::Params, "--target-params", a.params, 1, c.params_ratio, false);
  add(Metric::ActiveParams, "--target-active-params", a.active_params, 1, c.active_params_ratio, false);
  add(Metric::Memory, "--target-memory-gb", a.memory_gb, 1e9, c.memory_ratio, false);
  add(Metric::Ttft, "--target-ttft-ms", a.ttft_ms, 1e-3, c.ttft_ratio, false);
  add(Metric::Tpot, "--target-tpot-ms", a.tpot_ms, 1e-3, c.tpot_ratio, false);
  add(Metric::Throughput, "--target-throughput", a.throughput, 1, c.throughput_ratio, true);
  return out;
}

}  // namespace ac::search

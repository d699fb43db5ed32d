// The budget types both search methods take (budget.h).
#include "search/budget.h"

#include <algorithm>

#include "search/costmodel/cost_model.h"

namespace ac::search {

bool BudgetLimits::any() const {
  return params > 0 || active_params > 0 || memory_gb > 0 || ttft_ms > 0 || tpot_ms > 0 || throughput > 0;
}
bool BudgetLimits::needs_cost_model() const { return memory_gb > 0 || ttft_ms > 0 || tpot_ms > 0 || throughput > 0; }

int64_t minitron_divisor(int64_t base, int64_t teacher_value) {
  int64_t d = base;
  while (d > 1 && teacher_value < 4 * d) d = std::max<int64_t>(1, d / 2);
  return d;
}

double target_memory_bytes(const model::ArchSpec& spec, const CostTarget& target) {
  return serving_memory_bytes(predict(spec, target.hardware, target.engine, target.workload), target.workload);
}

double serving_memory_bytes(const Prediction& p, const Workload& workload) {
  return p.weight_bytes + p.activation_bytes + p.reserved_bytes + double(std::max<int64_t>(1, workload.concurrency)) * p.bytes_per_seq;
}

}  // namespace ac::search

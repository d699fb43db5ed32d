// The budget both search methods take (the Minitron baseline and the AutoCompress search):
// absolute limits on counts and on the serving cost model's predictions for one target
// (hardware x engine x workload), and the width-grid rule their choices are drawn from.
#pragma once

#include <cstdint>

#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"

namespace ac::search {

struct Prediction;

// Limits; 0 = not given. Counts are ArchSpec counts without MTP; memory, TTFT, TPOT and
// throughput are cost-model predictions (they need a CostTarget).
struct BudgetLimits {
  double params = 0, active_params = 0;
  double memory_gb = 0;   // 1e9 bytes: weights + activations + reserve + KV/state of the workload's concurrency
  double ttft_ms = 0, tpot_ms = 0;
  double throughput = 0;  // output tokens/s, at least
  bool any() const;
  bool needs_cost_model() const;
};

// Where the student will be served: what the cost model prices.
struct CostTarget {
  HardwareProfile hardware;
  EngineProfile engine;
  Workload workload;
};

// Memory the limit compares: weights + activations + reserve + KV cache and state of
// max(1, workload concurrency) sequences of the workload's context.
double target_memory_bytes(const model::ArchSpec& spec, const CostTarget& target);
// The same from a prediction already made for that workload.
double serving_memory_bytes(const Prediction& p, const Workload& workload);

// The divisor rule of the width grids: Model-Optimizer's divisor, halved while the teacher's
// value is below 4x it.
int64_t minitron_divisor(int64_t base, int64_t teacher_value);

}  // namespace ac::search

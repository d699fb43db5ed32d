// Learning-rate schedule: linear warmup from 0, then cosine decay to min_lr (Megatron's
// "cosine" style). A pure function of the step, so resuming needs only the step.
#pragma once

#include <cstdint>

namespace ac::distill {

struct LrSchedule {
  double max_lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 1000;  // steps from the end of warmup to min_lr; constant after

  // The learning rate for optimizer step `step` (0-based).
  double at(int64_t step) const;
};

}  // namespace ac::distill

#include "distill/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace ac::distill {

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return max_lr * double(step + 1) / double(warmup_steps);
  const int64_t s = step - warmup_steps;
  if (decay_steps <= 0 || s >= decay_steps) return min_lr;
  const double progress = double(s) / double(decay_steps);
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace ac::distill

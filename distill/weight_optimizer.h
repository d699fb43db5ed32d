// The optimizer component of a training job: ZeRO-1 AdamW over a model's trainable weights
// (plus any extra parameters, e.g. a distillation projection), on the LR schedule, with the
// TP partial-gradient reduction before each step, the non-finite step guard, and its state
// in checkpoints. The trainer (pretrain, distill) and the search's joint weight training
// (search/das/das.h `weights_lr`) both step their weights through it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "dist/zero_optimizer.h"
#include "distill/lr_schedule.h"
#include "model/model.h"

namespace ac::distill {

struct WeightOptimConfig {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup = 10, steps = 100;  // the cosine schedule's warmup and length (LrSchedule)
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double clip_grad = 1.0;
  int max_skipped = 5;  // consecutive non-finite steps before the job stops
};

class WeightOptimizer {
 public:
  // `model`'s parameters that require grad, then `extra` (always TP-replicated), sharded over
  // `dp`; `tp` (null at TP = 1) counts TP-sharded gradients once in the norm. With expert
  // parallelism (`experts.edp` set) the model's routed experts are sharded over expert DP.
  WeightOptimizer(model::CausalLM model, std::vector<dist::OptimParam> extra, dist::Communicator& dp,
                  dist::Communicator* tp, int tp_size, const WeightOptimConfig& config,
                  dist::ExpertGroups experts = {});

  struct Step {
    double lr = 0, grad_norm = 0;
    bool applied = false;
  };
  // After the backward of step `step` (0-based): reduces the TP partial gradients, clips, and
  // takes one AdamW step at the schedule's LR, or skips a non-finite one. The max_skipped-th
  // consecutive skip throws std::runtime_error naming `last_good` (where to restart from).
  Step step(int64_t step, const std::string& last_good);

  int64_t skipped_total() const { return skipped_total_; }
  // Checkpoint: the state tensors, the `optimizer` and `lr_schedule` attributes, and back.
  std::vector<checkpoint::ShardedTensor> tensors() const;
  nlohmann::json attributes() const;
  nlohmann::json schedule_attributes() const;
  void load(const checkpoint::CheckpointReader& reader);
  // "optimizer state: X MiB on rank 0 (ZeRO-1 over DP n; ...)": what ZeRO-1 saves (rank 0 prints it).
  std::string describe(int dp) const;
  const dist::ZeroAdamW& adamw() const { return *opt_; }

 private:
  model::CausalLM model_;
  WeightOptimConfig cfg_;
  LrSchedule sched_;
  std::unique_ptr<dist::ZeroAdamW> opt_;
  std::vector<model::ParamShard> opt_map_;
  int64_t skipped_total_ = 0;
  int consecutive_skipped_ = 0;
};

}  // namespace ac::distill

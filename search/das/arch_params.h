// The architecture logits of the search: one flat vector over every decision's choices, their
// Gumbel-softmax samples, the Adam over them with the budgets' multipliers, and their state in
// a search checkpoint.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "search/das/space.h"

namespace ac::search {

class ArchParams {
 public:
  ArchParams(const SearchSpace& space, size_t num_budgets);

  torch::Tensor theta, m, v, lambda;  // flat logits [sum C], Adam moments, multipliers [budgets]
  int64_t step = 0, adam_steps = 0;

  int64_t size() const { return offset_.back(); }
  size_t decisions() const { return offset_.size() - 1; }
  int64_t offset(size_t d) const { return offset_[d]; }
  int64_t choices(size_t d) const { return offset_[d + 1] - offset_[d]; }
  // 1 where the gradient is a partial sum over TP (Decision::sharded), else 0; [sum C].
  const torch::Tensor& tp_summed() const { return tp_summed_; }

  // One architecture sample per step, the same on every rank: Gumbel noise from (seed, step),
  // a softmax at temperature tau per decision, and with probability hard_prob a straight-
  // through hard sample. `theta` is a leaf copy of the logits the sample's gradient lands in.
  struct Sample {
    torch::Tensor theta;
    std::vector<torch::Tensor> y;  // per decision [choices]
    bool hard = false;
  };
  Sample sample(int64_t step, uint64_t seed, double tau, double hard_prob) const;

  // Per decision softmax(theta); log_softmax(theta) and its argmax.
  std::vector<torch::Tensor> probs() const;
  void discretize(std::vector<int>& argmax, std::vector<std::vector<double>>& log_probs) const;
  // The mean normalised entropy of the decisions' distributions (1: uniform, 0: decided).
  double entropy() const;

  // One Adam step on the logits with gradient g (betas 0.9, 0.999); the multipliers by gradient
  // ascent on the budgets' violations (clamped at 0).
  void update(const torch::Tensor& g, double lr, double rho, const std::vector<double>& violation);

  // The search checkpoint's search/* datasets (written by `writer`), and back.
  std::vector<checkpoint::ShardedTensor> tensors(bool writer) const;
  void restore(checkpoint::CheckpointReader& r);

 private:
  std::vector<int64_t> offset_;  // decision d's choices at [offset_[d], offset_[d + 1])
  torch::Tensor tp_summed_;
};

}  // namespace ac::search

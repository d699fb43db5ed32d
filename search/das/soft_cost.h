// The soft (differentiable) cost of the search: every decision's probabilities as one flat
// vector, their expected cost on the differentiable cost model, and the budgets'
// augmented-Lagrangian penalty on it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "search/costmodel/differentiable.h"
#include "search/das/constraints.h"
#include "search/das/space.h"

namespace ac::search {

// Every decision's choice probabilities as one flat vector (decision d at offset[d]): one softmax
// over the [decisions, most choices] matrix of logits, padded with -inf.
class FlatSoftmax {
 public:
  explicit FlatSoftmax(const SearchSpace& s);
  torch::Tensor operator()(const torch::Tensor& theta) const;

 private:
  int64_t rows_ = 0, cols_ = 0;
  torch::Tensor gather_, valid_, pad_;
};

// The expected cost of a distribution over the space: per-layer expected dimensions on the
// differentiable cost model, mixed exactly over the hidden-width choices (the formulas are not
// linear in the hidden width, so E[cost] is taken over it, not cost(E[h])). Every hidden width is
// evaluated at once ([widths, layers] tensors), and each axis's per-layer expectations are one
// gather over the flat probabilities: a few dozen tensor operations per step whatever the depth
// (docs/benchmarks.md, the cost model's share of a search step).
class SoftCostFn {
 public:
  SoftCostFn(const SearchSpace& s, const CostTarget& target);
  // p: every decision's probabilities, flat ([sum of choices] float64, FlatSoftmax's order).
  // Returns per metric the expected value (0-dim).
  std::vector<torch::Tensor> operator()(const torch::Tensor& p) const;

 private:
  // The decisions of one axis: their layers, flat indices [n * most choices] (padding repeats the
  // first), choice values [n, most choices] (padding 0), P(choice 0) index and whether 0 is a
  // choice, the teacher's value where the expectation is undefined (nothing kept).
  struct Group {
    int64_t n = 0;
    torch::Tensor layers, first, second, idx, val, zero, base;
  };
  Group group(const std::vector<int>& per_layer, const std::vector<double>& scale, const std::vector<double>& base) const;
  SoftDims dims(const torch::Tensor& p) const;

  const SearchSpace& s_;
  DifferentiableCostModel model_;
  std::vector<int64_t> offset_;  // per decision its first flat index
  int64_t hidden_offset_ = 0;
  Group attn_, ffn_, mamba_, mamba_heads_, moe_, experts_, top_k_, expert_ffn_, shared_ffn_, latent_;
  torch::Tensor base_heads_, base_m_heads_, base_ffn_, base_experts_, base_top_k_, base_expert_ffn_, base_shared_ffn_, base_latent_, ones_;
  double reserved_ = 0, conc_ = 1;
};

// One step's budget term: per budget the augmented-Lagrangian penalty on the expected cost of
// softmax(theta), its limit ramped in from the teacher's value, and the gradient on theta.
struct BudgetPenalty {
  torch::Tensor grad;                 // d penalty / d theta (undefined without budgets)
  std::vector<double> soft, limit, violation;  // per budget: expected value, ramped limit, relative violation
};
BudgetPenalty budget_penalty(const SoftCostFn& cost, const FlatSoftmax& softmax, const std::vector<Budget>& budgets,
                             const torch::Tensor& theta, const torch::Tensor& lambda, double rho, double ramp);

}  // namespace ac::search

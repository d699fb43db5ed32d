// The cost-only search's quality proxy (das.h quality_proxy) over tensors, so that autograd
// reaches the probabilities, and of one pick.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "search/das/space.h"

namespace ac::search {

// quality_proxy() of per-decision probabilities `probs` (float64 [choices] each).
torch::Tensor proxy_tensor(const SearchSpace& s, const std::vector<torch::Tensor>& probs, double experts_weight);
// quality_proxy() of one pick (one-hot probabilities).
double pick_proxy(const SearchSpace& s, const std::vector<int>& pick, double experts_weight);

}  // namespace ac::search

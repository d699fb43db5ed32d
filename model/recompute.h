// Full activation recomputation (Megatron's --recompute-granularity full, per layer): the
// decoder layers keep only their inputs for the backward and run their forward again there,
// collectives included. Trades one more forward of the student for the activations of every
// layer but the one being back-propagated (docs/training.md, docs/plan.md).
#pragma once

#include <torch/types.h>

#include "model/model.h"

namespace ac::model {

// CausalLM::hidden_states with every decoder layer checkpointed: the same values and, after
// backward, the same gradients. Training only (no cache, no observer); without grad mode it is
// hidden_states itself.
torch::Tensor hidden_states_recomputed(CausalLM& model, const torch::Tensor& input_ids);

}  // namespace ac::model

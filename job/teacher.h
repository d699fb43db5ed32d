// The frozen teacher of a distillation or search job: a checkpoint loaded TP-sharded
// (and EP-sharded for MoE layers), in eval mode with no parameter requiring grad.
#pragma once

#include <torch/torch.h>
#include <string>

#include "model/model.h"

namespace ac::job {

// The teacher checkpoint `path` (file or directory with `latest`) as a frozen model sharded
// over `tp` at `dtype`: eval mode, no parameter requires grad. A teacher that cannot split
// over the TP size throws ac::InputError naming the file.
// `ep`: the expert-parallel group its MoE layers use (the trainer's; default EP 1).
model::CausalLM load_frozen_teacher(const std::string& path, const model::TpGroup& tp, torch::Dtype dtype,
                                    const model::EpGroup& ep = {});

}  // namespace ac::job

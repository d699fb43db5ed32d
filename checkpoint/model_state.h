// A (tensor-parallel) CausalLM in a checkpoint: its local parameters as slices of the
// logical TP = 1 tensors (via the model's shard map), saved under "model/<logical name>",
// and loaded back under any TP size, each rank reading only its slices.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/model.h"

namespace ac::checkpoint {

// The pieces of `model` this rank holds. `write` is false when this rank is a DP replica
// (dp_rank != 0); TP-replicated pieces are written once (save_checkpoint keeps the lowest rank).
// `write_experts` (default: `write`) is the same for the routed experts, which with expert
// parallelism are held by the first expert-DP replica (dp_rank < EP), not only dp_rank 0.
std::vector<ShardedTensor> model_tensors(model::CausalLM& model, bool write, const std::string& prefix = "model/",
                                         std::optional<bool> write_experts = std::nullopt);

// Fills `model` (any TP size) from a checkpoint. A missing tensor or a shape that differs
// from the model's ArchSpec throws ac::InputError naming the file and dataset.
// `rename` (optional) maps a logical tensor name of `model` to the one stored (e.g. when
// `model` is a renumbered copy of the checkpoint's architecture).
void load_model(model::CausalLM& model, const CheckpointReader& reader, const std::string& prefix = "model/",
                const std::function<std::string(const std::string&)>& rename = nullptr);

}  // namespace ac::checkpoint

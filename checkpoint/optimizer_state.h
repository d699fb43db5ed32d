// ZeRO-1 optimizer state in a checkpoint. Each DP rank owns whole rows of every local
// parameter (dist/zero_optimizer.h), and each local parameter is made of slices of logical
// tensors (the model's shard map), so a rank's state is a set of hyperslabs of the logical
// tensors. They are stored at the logical shapes, written by their owners:
//   optimizer/master/<logical>      fp32 master weights
//   optimizer/exp_avg/<logical>     Adam first moment
//   optimizer/exp_avg_sq/<logical>  Adam second moment
// and read back under any TP x DP layout, each rank reading only the rows it owns.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "dist/zero_optimizer.h"
#include "model/layers/common.h"

namespace ac::checkpoint {

// The shard-map entry of every optimizer parameter, in the optimizer's order. Parameters
// that are not part of a model (e.g. a distillation projection) get a whole-tensor entry
// named after the parameter.
std::vector<model::ParamShard> optimizer_shard_map(const dist::ZeroAdamW& opt,
                                                   const std::vector<model::ParamShard>& model_map);

// This rank's optimizer state as checkpoint tensors (copies; all written by their owner,
// TP-replicated slices are deduplicated by save_checkpoint).
std::vector<ShardedTensor> optimizer_tensors(const dist::ZeroAdamW& opt, const std::vector<model::ParamShard>& map);

// Fills the optimizer's state from a checkpoint (any layout) and re-derives the
// parameters from the masters. A missing dataset or wrong shape throws ac::InputError.
void load_optimizer(dist::ZeroAdamW& opt, const std::vector<model::ParamShard>& map, const CheckpointReader& reader);

}  // namespace ac::checkpoint

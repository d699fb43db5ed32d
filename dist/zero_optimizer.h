// AdamW with fp32 master weights and moments sharded across data-parallel ranks (ZeRO
// stage 1, as Megatron's distributed optimizer). Model parameters may be bf16; gradients
// are reduced in fp32.
//
// Sharding is per parameter along dim 0: a parameter with R rows gives DP rank r the rows
// [r * ceil(R / dp), min(R, (r + 1) * ceil(R / dp))). Because every rank owns whole rows
// of each parameter, its optimizer state is a set of hyperslabs of the model's logical
// tensors, so the checkpoint stores it at the logical shapes and any TP x DP layout can
// load it (checkpoint/optimizer_state.h).
//
// Communication is bucketed: parameters are grouped into buckets of ~bucket_bytes, and
// each bucket's flat buffer is laid out rank-major (all of rank 0's rows of the bucket's
// parameters, then rank 1's, ...), so one reduce-scatter leaves each rank its own gradient
// rows contiguously and one all-gather (in the parameters' dtype) returns the updated rows.
// With expert parallelism the routed experts' parameters form a second group: their rows are
// sharded (and their gradients reduced) over the expert-data-parallel group, the ranks that
// hold the same experts, and the rest over DP (Megatron's expert DP).
// Bytes per parameter: 2 (bf16 param) + 2 (grad) + 12 / dp (master, m, v), plus one bucket's
// fp32 staging buffer at a time: each bucket's gradients are freed once staged, so a step never
// holds a second full-size copy of them (autocompress plan counts the same: docs/plan.md).
// With NCCL the collectives are asynchronous (Communicator::*_async, a communication stream):
// bucket k's reduce-scatter runs while bucket k+1 is staged, and its all-gather while bucket
// k+1 is updated; at most two staging buffers are then alive. MPI runs them in the call.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace ac::dist {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  size_t bucket_bytes = size_t(25) << 20;  // fp32 gradient bytes per bucket (all ranks)
};

struct OptimParam {
  std::string name;
  torch::Tensor param;          // the model's parameter (f32 or bf16), a leaf that gets .grad
  bool decay = true;            // weight decay applies (not to norms and biases)
  bool tp_replicated = false;   // identical on every TP rank: counted once in the gradient norm
  bool expert = false;          // a routed expert's parameter (see ExpertGroups)
};

// Expert parallelism (EP > 1): expert parameters are sharded over `edp` (DP / EP ranks holding
// the same experts). Each holder's gradient already sums the EP group's tokens (the all-to-all's
// backward), so it is averaged over EDP and divided by EP: the DP mean of the dense parameters.
// The gradient norm sums expert parts over EDP, EP and TP, each expert once.
struct ExpertGroups {
  Communicator* edp = nullptr;  // null: no expert group (EP 1: experts are ordinary parameters)
  Communicator* ep = nullptr;
};

struct StepResult {
  bool applied = false;     // false: a non-finite gradient; nothing changed
  double grad_norm = 0.0;   // global L2 norm over TP and DP before clipping
};

class ZeroAdamW {
 public:
  // dp: the data-parallel group the state is sharded over; tp: the tensor-parallel group
  // (may be null at TP = 1), used only for the global gradient norm. Every rank of a DP
  // group must pass the same parameter list (names, shapes, dtypes, order).
  ZeroAdamW(std::vector<OptimParam> params, Communicator& dp, Communicator* tp, AdamWOptions options = {},
            ExpertGroups experts = {});

  // One optimizer step: averages gradients over DP (reduce-scatter), computes the global
  // norm, skips the step when it is not finite, clips to max_grad_norm (<= 0: no clipping),
  // updates the local fp32 shard with AdamW at `lr`, all-gathers the parameters and clears
  // the gradients. Collective over dp and tp.
  StepResult step(double lr, double max_grad_norm);
  void zero_grad();

  int64_t num_steps() const { return steps_; }  // steps applied (Adam's bias correction)
  void set_num_steps(int64_t s) { steps_ = s; }

  // This rank's state of parameter i: rows [row_start, row_start + rows) of the parameter
  // (rows == 0 when this rank owns none). Tensors are views of the optimizer's buffers,
  // shaped [rows, ...] like the parameter: write into them to restore a checkpoint, then
  // call sync_params_from_master().
  struct Shard {
    int64_t row_start = 0, rows = 0;
    torch::Tensor master, exp_avg, exp_avg_sq;
  };
  Shard shard(size_t i) const;
  const std::vector<OptimParam>& params() const { return params_; }
  // Copies the master rows into the parameters on every rank (all-gather): after loading
  // optimizer state, so that the bf16 parameters are exactly the rounded masters.
  void sync_params_from_master();

  // Bytes this rank holds for the optimizer state (master + moments).
  int64_t state_bytes() const;
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Slot {  // one parameter within a bucket
    size_t param = 0;
    int64_t row_numel = 0;    // elements per row
    int64_t rows_per_rank = 0;
    int64_t offset = 0;       // start of this parameter's rows within a rank's segment
  };
  struct Bucket {
    std::vector<Slot> slots;
    Communicator* comm = nullptr;  // DP, or the expert-DP group for expert parameters
    bool expert = false;
    int64_t segment = 0;      // elements per rank
    torch::ScalarType dtype;  // of its parameters
    torch::Tensor master, exp_avg, exp_avg_sq;  // [segment] fp32: this rank's rows
  };
  // A bucket's parameter all-gather in flight: start it, then finish it (copy the gathered
  // rows into the parameters) once the next bucket's update has been issued.
  struct Gather {
    Bucket* bucket = nullptr;
    torch::Tensor all;
    std::shared_ptr<Work> work;
  };
  Gather start_gather(Bucket& b);
  void finish_gather(Gather& g);
  void gather_params(Bucket& b);
  int64_t owned_rows(const Slot& s, int rank) const;
  Communicator& comm_of(size_t param) const;

  std::vector<OptimParam> params_;
  Communicator& dp_;
  Communicator* tp_;
  AdamWOptions opt_;
  ExpertGroups experts_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // param -> (bucket, slot)
  int64_t steps_ = 0;
};

}  // namespace ac::dist

// Pieces every layer shares: the tensor-parallel group a layer is sharded over, the map from
// a layer's local (sharded) parameters to logical TP-independent tensors, and the
// column-/row-parallel linear helpers built on dist/'s autograd-aware collectives.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace ac::model {

// The tensor-parallel group a model is sharded over (size 1 = unsharded), and whether the
// model runs Megatron's sequence parallelism over it: between the TP regions (residual
// stream, norms, embedding output) each rank holds 1/TP of the sequence, [batch, T/TP, hidden];
// a region's input is all-gathered along the sequence and its output reduce-scattered
// (tp_region_input / tp_region_output). Ignored at TP 1.
struct TpGroup {
  std::shared_ptr<dist::Communicator> comm;
  bool sequence_parallel = false;
  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
  bool sp() const { return sequence_parallel && comm && comm->size() > 1; }
};

// The expert-parallel group a MoE's routed experts are spread over, on top of their split over
// TP (null comm: EP 1). Its ranks hold the same TP rank and different experts.
struct EpGroup {
  std::shared_ptr<dist::Communicator> comm;
  // How the TP group splits the experts: whole experts (false, the default: rank r of TP t
  // holds experts [r E/t, (r+1) E/t)) or each expert's FFN width (true: Megatron's expert
  // tensor parallelism with ETP = TP; every TP rank holds a slice of the same experts).
  bool expert_tp = false;
  // With sequence parallelism and whole experts (expert_tp false) at TP > 1: the joint TP x EP
  // group (Megatron's tp_ep group), ranked TP rank x EP + EP rank as the experts' owners are,
  // over which each rank dispatches its sequence slice's routed copies. Null at EP 1, where the
  // TP group is that group; unused otherwise.
  std::shared_ptr<dist::Communicator> tp_ep;
  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
};

// A slice of one logical tensor (its name and full shape at TP = 1).
struct ShardPiece {
  std::string logical;                 // e.g. "layers.3.mamba.in_proj.weight"
  std::vector<int64_t> logical_shape;
  int64_t dim = 0, start = 0, size = 0;  // the slice along `dim`
};

// How one local parameter is made from logical tensors: the concatenation of `pieces`
// along their dim (or, with `stack`, stacked along a new dim 0: per-expert tensors), then
// `pad_rows` zero rows appended along dim 0 (padded vocabulary shards).
struct ParamShard {
  std::string param;  // name in named_parameters() of the module that reports it
  std::vector<ShardPiece> pieces;
  bool stack = false;
  int64_t pad_rows = 0;
};

// The whole logical tensor as one piece (replicated parameters, TP = 1).
ShardPiece whole(const std::string& logical, std::vector<int64_t> shape);
// Rows [start, start + size) along dim of a logical tensor.
ShardPiece slice(const std::string& logical, std::vector<int64_t> shape, int64_t dim,
                 int64_t start, int64_t size);

// y = x W^T (+ b), as torch::nn::functional::linear, except for fp32 CPU inputs of 1-16 rows
// when no gradient is recorded (decode steps):
// - one row (x.numel() == x.size(-1): one sequence): a matrix-vector product (torch::mv /
//   addmv). LibTorch 1.13's linear on a [1, K] row goes through a GEMM with M = 1 that is ~2x
//   slower than gemv on the same weights (5x for K > N; docs/benchmarks.md, tenth session);
// - 2-16 rows: small_linear (model/layers/small_gemm.h), which streams W once without the
//   GEMM's packed copy (1.4-1.5x at M = 8, twelfth session), where the CPU has a kernel for it.
// The sums are the same up to fp32 rounding order (~1e-7 relative).
// (When an ExactLinearGuard is alive on this thread: always torch's linear.)
torch::Tensor apply_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {});

// While alive, apply_linear on this thread is torch's linear whatever the grad mode. The first,
// gradient-free forward of a recomputed layer (model/recompute.cpp) holds one: its output must
// round exactly as the layer's recomputation with autograd in the backward, and as the same
// layer without recomputation (tested bitwise, test_model_ep).
class ExactLinearGuard {
 public:
  ExactLinearGuard();
  ~ExactLinearGuard();
  ExactLinearGuard(const ExactLinearGuard&) = delete;
  ExactLinearGuard& operator=(const ExactLinearGuard&) = delete;

 private:
  bool prev_;
};

// The input of a tensor-parallel region, x [batch, T(/TP), hidden], as the column-parallel
// weights take it: with sequence parallelism the all-gather of the sequence slices
// (reduce-scatter of the gradient), else x itself (all-reduce of the gradient). Identity at TP 1.
torch::Tensor tp_region_input(const torch::Tensor& x, const TpGroup& tp);
// The output of a region from each rank's partial sum y [batch, T, hidden]: its reduce-scatter
// along the sequence with SP, its all-reduce without.
torch::Tensor tp_region_output(const torch::Tensor& y, const TpGroup& tp);

// y = tp_region_input(x) W^T (+ b) with W the local rows of a column-parallel weight: output
// sharded along the last dim.
torch::Tensor column_parallel(const torch::Tensor& x, const torch::Tensor& w,
                              const torch::Tensor& b, const TpGroup& tp);
// y = tp_region_output(x_local W_local^T), bias added once after the reduction.
torch::Tensor row_parallel(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           const TpGroup& tp);

// SiLU as the layers use it: torch::silu, except that with LibTorch 1.x a bf16/fp16 CPU input
// is computed in fp32, forward and backward (cast, fp32 kernel, cast back). LibTorch 1.13's
// reduced-precision CPU SiLU kernels are scalar loops: forward ~2x and backward ~4x the
// vectorised fp32 kernel plus both casts (docs/benchmarks.md, model bench profile). Both
// round the fp32 result of the same formula once.
torch::Tensor act_silu(const torch::Tensor& x);

// A weight (and optional bias) that its parent applies; gives parameters Hugging-Face-like
// dotted names ("q_proj.weight"). Values come from a checkpoint or from init_weights().
class WeightsImpl : public torch::nn::Module {
 public:
  WeightsImpl(std::vector<int64_t> weight_shape, std::vector<int64_t> bias_shape,
              torch::Dtype dtype);
  torch::Tensor weight, bias;  // bias undefined when bias_shape is empty
};
TORCH_MODULE(Weights);

}  // namespace ac::model

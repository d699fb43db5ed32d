// Knowledge-distillation losses over logits whose vocabulary is sharded by tensor
// parallelism (each rank holds columns [vocab_start, vocab_start + shard) of the logits,
// padded columns past the vocabulary masked out; see dist::VocabShard). Nothing
// materialises a full-vocabulary fp32 copy per rank: the work is chunked over tokens.
// Formulas: ../shared/REFERENCE.md "Distillation losses".
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "dist/communicator.h"

namespace ac::distill {

struct KdOptions {
  double temperature = 1.0;     // applied to teacher and student; the loss is scaled by T^2
  int64_t top_k = 0;            // 0: KL over the full vocabulary; K > 0: over the teacher's top K
  int64_t token_chunk = 1024;   // tokens processed at once (bounds the fp32 workspace)
};

// Mean over tokens of T^2 * KL(p_T || p_S) = T^2 * sum_v p_T (log p_T - log p_S), with
// p = softmax(logits / T) over the whole (TP-sharded) vocabulary.
// student_local, teacher_local: [N, shard] (any float dtype, same shard layout);
// vocab_size: the true vocabulary (columns at or past it are padding and ignored);
// mask: optional [N] (bool or float), tokens with 0 are excluded from the mean.
// Differentiable with respect to student_local; the teacher gets no gradient. At TP = 1
// (tp.size() == 1) no collective is called.
torch::Tensor vocab_parallel_kl(const torch::Tensor& student_local, const torch::Tensor& teacher_local,
                                dist::Communicator& tp, int64_t vocab_size, const KdOptions& options = {},
                                const torch::Tensor& mask = {});

// Hidden-state (intermediate) loss between a student and a teacher layer output:
// cosine distance (1 - cos) or MSE, through a learned linear projection when the widths
// differ. Its scale follows REFERENCE.md: loss * (L_logit.detach() / L_int.detach()).
class IntermediateLossImpl : public torch::nn::Module {
 public:
  enum class Kind { Cosine, Mse };
  IntermediateLossImpl(int64_t student_hidden, int64_t teacher_hidden, Kind kind);
  // student [.., student_hidden], teacher [.., teacher_hidden]; mean over tokens.
  torch::Tensor forward(const torch::Tensor& student, const torch::Tensor& teacher);
  torch::nn::Linear projection{nullptr};  // null when the widths match
  Kind kind;
};
TORCH_MODULE(IntermediateLoss);

// l_int scaled so that it carries the same magnitude as l_logit (both scalars).
torch::Tensor scale_to(const torch::Tensor& l_int, const torch::Tensor& l_logit);

}  // namespace ac::distill

// Structured pruning: a student cut out of a teacher for any sub-architecture of it. The
// student keeps, per axis, the teacher's top-ranked units (importance.h scores), in their
// original order, and every tensor that touches a unit is sliced consistently. Rules and
// per-axis slicing: docs/pruning.md.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "search/importance/importance.h"

namespace ac::checkpoint { class CheckpointReader; }
namespace ac::model { class CausalLMImpl; }

namespace ac::search {

// "" when `student` is a sub-architecture of `teacher`, else the first reason, naming the
// layer and field: "layers[3].attention.num_kv_heads: 5 exceeds the teacher's 4". Layers map
// one to one (same layer count); a dropped layer is an empty LayerSpec (kind "."), a dropped
// sublayer is an absent one.
std::string is_sub_architecture(const model::ArchSpec& teacher, const model::ArchSpec& student);

// The teacher indices one student dimension keeps, ascending. Null: the whole dimension.
using IndexList = std::shared_ptr<const std::vector<int64_t>>;

// How one logical student tensor is made: source[keep[0], keep[1], ...] * scale.
struct TensorPlan {
  std::string name;                   // logical student tensor ("layers.3.mlp.up_proj.weight")
  std::string source;                 // logical teacher tensor (experts are renumbered)
  std::vector<int64_t> source_shape;  // the teacher tensor's shape
  std::vector<IndexList> keep;        // one per dimension
  // RMSNorm weights whose normalised width shrinks from n to m are scaled by sqrt(n / m):
  // the mean of squares then runs over m channels, and a removed channel that was zero
  // leaves the normalised output unchanged (docs/pruning.md).
  double scale = 1.0;

  std::vector<int64_t> shape() const;  // the student tensor's shape
  std::vector<int64_t> indices(size_t dim) const;  // keep[dim] materialised
  bool identity() const;               // a plain copy of the same tensor
};

struct PrunePlan {
  model::ArchSpec teacher, student;
  std::vector<TensorPlan> tensors;  // sorted by name; exactly the student's logical tensors
  const TensorPlan* find(const std::string& name) const;  // nullptr when absent
  // The kept units per layer, for reports and tests (empty: the axis is not pruned there).
  struct LayerUnits {
    std::vector<int64_t> attn_heads, attn_kv_groups, mlp_neurons, mamba_heads, mamba_head_dim,
        moe_experts, moe_shared_neurons, moe_latent;
  };
  std::vector<int64_t> hidden;  // kept hidden channels (empty: all)
  std::vector<LayerUnits> layers;
};

// The plan for `student` (checked with is_sub_architecture and validate) from `scores`.
// Scores are needed only for axes that are pruned; a missing or wrongly sized score vector
// throws ac::InputError(scores_source, "layers[3].attn_heads", ...). A student that is not a
// sub-architecture throws ac::InputError(student_source, field, why).
PrunePlan plan_prune(const model::ArchSpec& teacher, const model::ArchSpec& student, const ImportanceScores& scores,
                     const std::string& student_source = "student ArchSpec",
                     const std::string& scores_source = "importance");

// Fills `student` (built from plan.student at any TP size) from the teacher checkpoint: each
// rank reads only the teacher rows its own shards need (hyperslabs around the kept indices),
// then selects and converts. Not collective. A teacher dataset with another shape than the
// plan's teacher ArchSpec throws ac::InputError naming the file and dataset.
void load_pruned(model::CausalLMImpl& student, const checkpoint::CheckpointReader& teacher, const PrunePlan& plan);

struct PruneOptions {
  int tp = 1;                                      // world = tp x dp; DP replica 0 reads and writes
  std::string student_source = "student ArchSpec";  // names the student in messages (its file)
  std::string scores_source = "importance";        // names the scores in messages (their file)
};
struct PruneResult {
  std::string path;  // <out_dir>/step_0.h5
  int tp = 1, dp = 1;
  int64_t tensors = 0, bytes = 0;  // student logical tensors and their bytes at the student dtype
  // plan_s: open, checks and plan; build_s: constructing the student's TP shard (its
  // constructor draws random initial values); load_s: sliced reads; save_s: the write.
  double plan_s = 0, build_s = 0, load_s = 0, save_s = 0;
};

// Collective over `world`: plans, has every rank of DP replica 0 build its TP shard of the
// student and fill it from `teacher_checkpoint` (a file or a directory with `latest`), then
// writes `out_dir`/step_0.h5 (+ `latest`) whose "arch_spec" is the student's. Every check
// (sub-architecture, scores, TP split, teacher shapes) runs before anything is written.
PruneResult prune_checkpoint(MPI_Comm world, const std::string& teacher_checkpoint, const ImportanceScores& scores,
                             const model::ArchSpec& student, const std::string& out_dir, const PruneOptions& options = {});

}  // namespace ac::search

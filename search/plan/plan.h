// Memory and communication planner for the training-side stages at cluster scale: per-GPU
// bytes (teacher and student weights, gradients, optimizer states, activations per layer
// kind, vocabulary-parallel KD logits, communication buffers), communication volume per step
// per collective and a step-time estimate for a layout TP x DP x EP (x ETP) on a cluster
// NODESxGPUSxKIND. Formulas and their sources: docs/plan.md. Plain data, no torch.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"

namespace ac::search {

// "8x8xh100": nodes x GPUs per node x hardware profile id (or a profile .json path).
struct Cluster {
  int nodes = 1, gpus_per_node = 1;
  std::string kind;
  int world() const { return nodes * gpus_per_node; }
  std::string to_string() const;
};
// Throws InputError(field, text, "...") naming what is malformed.
Cluster parse_cluster(const std::string& text, const std::string& field = "--cluster");

enum class Recompute { None, Selective, Full };  // Megatron --recompute-granularity
enum class PlanStage { Distill, Importance, Search };
Recompute parse_recompute(const std::string& s, const std::string& field = "--recompute");
PlanStage parse_stage(const std::string& s, const std::string& field = "--stage");
std::string to_string(Recompute r);
std::string to_string(PlanStage s);

// The rank grid. Dense parts are sharded over TP and replicated over DP = world / TP (PP = 1);
// routed experts are sharded over EP x ETP (Megatron's parallel folding: the MoE grid is
// ETP x EP x EDP with EDP = world / (ETP x EP)), so EP may reuse TP and DP ranks.
struct PlanLayout {
  int tp = 1;
  int dp = 0;          // 0: world / tp; otherwise must equal it
  int ep = 1;          // expert parallel, for the student (and the teacher unless teacher_ep)
  int etp = 0;         // expert tensor parallel; 0: = tp (Megatron's default); ModelOpt KD uses 1
  int teacher_ep = 0;  // 0: = ep (teacher and student in the same layout, as ModelOpt distils)
  int zero = 1;        // 0 replicated optimizer, 1 optimizer states sharded (ZeRO-1), 2 + gradients (ZeRO-2)
  std::string to_string() const;
};

struct PlanOptions {
  PlanStage stage = PlanStage::Distill;
  int64_t seq_len = 8192;
  int64_t micro_batch = 1;       // sequences per DP rank per micro-step
  int64_t global_batch = 0;      // sequences per optimizer step; 0: micro_batch x DP
  Recompute recompute = Recompute::Selective;
  bool flash_attention = true;   // the s^2 score tensors are never stored
  bool sequence_parallel = true; // Megatron SP with TP > 1 (required with TP + EP)
  bool dropout = false;          // Nemotron trains without dropout; Korthikanti's formulas have it
  int grad_bytes = 2;            // gradient storage: 2 (bf16) or 4 (fp32, Megatron grad_reduce_in_fp32)
  int dp_reduce_bytes = 4;       // gradients are reduced in fp32 (dist/zero_optimizer.h)
  bool include_mtp = true;       // MTP layers' weights are part of the checkpoint and are trained
  int64_t kd_token_chunk = 1024; // distill::KdOptions::token_chunk
  double bucket_bytes = 25.0 * (1 << 20);  // dist::AdamWOptions::bucket_bytes (fp32)
  double reserve_bytes = 2.0 * (1 << 30);  // CUDA context, cuBLAS/NCCL workspaces, allocator slack
};

// Per-layer activation bytes on one GPU of the tensors saved for backward (training) and the
// layer's transient working set (what exists while it runs).
struct ActivationShape {
  int64_t seq_len = 0, micro_batch = 1;
  int tp = 1, etp = 1;
  bool sequence_parallel = true, flash_attention = true, dropout = false;
  Recompute recompute = Recompute::None;
  double element_bytes = 2;  // of activations: the model's dtype (bf16 as clusters train; fp32 on a CPU without bf16)
};
struct LayerActivation {
  double saved = 0;    // kept until this layer's backward
  double working = 0;  // everything the layer creates in one forward (no recompute): the peak of
                       // a no-grad forward, and of a full-recompute backward
};
LayerActivation layer_activations(const model::LayerSpec& layer, int64_t hidden, const ActivationShape& shape);

// When an item is live during a training step. The per-GPU peak is the items live throughout
// plus the largest phase's (the trainer frees gradients at every step and the KD loss's logits
// after its backward, so not every item coexists; distill/trainer.cpp, dist/zero_optimizer.cpp).
enum Phase : unsigned {
  kAlways = 0,          // weights and optimizer states
  kForward = 1,         // the teacher's and the student's forward, and the KD loss's
  kKdBackward = 2,      // the KD loss's backward: the logits' gradient (no weight gradient yet)
  kBackward = 4,        // the layers' backward: the weight gradients grow while activations free
  kStep = 8,            // the optimizer step: gradients staged into DP buckets and reduced
};
std::string phase_names(unsigned phases);  // "forward, backward"; "always" for 0

struct MemoryItem {
  std::string name;   // "teacher weights", "student optimizer states", ...
  double bytes = 0;
  std::string note;   // how it was counted
  unsigned phases = kAlways;  // Phase bits; kAlways: live throughout
};

struct ActivationRow {  // one layer kind of one model
  std::string model, kind;  // "student", "M" / "*" / "E" / "-"
  int layers = 0;
  double saved_per_layer = 0, working_per_layer = 0;
};

struct CommItem {
  std::string collective;  // "all-gather + reduce-scatter (SP)", "all-to-all", ...
  std::string group;       // "TP", "DP", "EP", "ETP", "EDP"
  std::string what;        // which tensors
  int group_size = 1;
  bool inter_node = false;
  double bytes_per_step = 0;  // sent per GPU per optimizer step
  double seconds = 0;         // 0 when the profile has no interconnect
};

struct Plan {
  Cluster cluster;
  PlanLayout layout;   // resolved: dp, etp, teacher_ep filled in
  int edp = 1, teacher_edp = 1;
  PlanOptions options;
  std::string hardware_id, hardware_name;
  int64_t grad_accum = 1;
  // Parameters (whole model) and on one GPU.
  double teacher_params = 0, student_params = 0;
  double teacher_params_gpu = 0, student_dense_gpu = 0, student_expert_gpu = 0;
  std::vector<MemoryItem> memory;
  std::vector<ActivationRow> activations;
  // total = always + the largest phase (peak_phase), by Phase bit
  double always_bytes = 0, phase_bytes[4] = {0, 0, 0, 0};
  unsigned peak_phase = kForward;
  double total_bytes = 0, device_bytes = 0, usable_bytes = 0;
  bool fits = false;
  std::vector<CommItem> comm;
  bool has_interconnect = false;
  // Step estimate: FLOPs per GPU, time at the profile's efficiencies, communication.
  double flops_per_gpu = 0, compute_s = 0, tp_comm_s = 0, ep_comm_s = 0, dp_comm_s = 0, step_s = 0;
  double tokens_per_step = 0, tokens_per_s = 0;

  double item(const std::string& name) const;  // bytes of a memory item (0 if absent)
  // "student optimizer states 31.2 GiB, ..." sorted by size, and by how much the total exceeds
  // usable memory.
  std::string overflow() const;
  std::string table() const;
  nlohmann::json to_json() const;
};

// Checks the layout against the cluster and the models (InputError naming the option and the
// model field: "--tp: 16 does not divide the 32 attention heads of teacher layers[7]") and
// computes the plan. `student` may be null for the importance and search stages (the search's
// masked student is the teacher's architecture with its weights frozen: one copy of weights).
Plan make_plan(const model::ArchSpec& teacher, const model::ArchSpec* student, const Cluster& cluster,
               const HardwareProfile& hw, const PlanLayout& layout, const PlanOptions& options);

// Every valid layout of this cluster (TP in {1,2,4,8} within a node, ETP in {1, TP}, EP
// dividing both models' expert counts, ZeRO 0/1/2) that fits, least model parallelism first
// (TP x EP x ETP, then ZeRO stage, then memory). At most `max_results`.
// Every valid layout of the enumeration below, fitting or not, in no particular order.
std::vector<Plan> candidate_layouts(const model::ArchSpec& teacher, const model::ArchSpec* student,
                                    const Cluster& cluster, const HardwareProfile& hw, const PlanOptions& options);

std::vector<Plan> fitting_layouts(const model::ArchSpec& teacher, const model::ArchSpec* student,
                                  const Cluster& cluster, const HardwareProfile& hw, const PlanOptions& options,
                                  size_t max_results = 5);

// When nothing fits: the fewest nodes of the same kind (nodes x 2^k up to max_nodes) on which
// fitting_layouts finds a layout; its first layout, or nothing.
std::vector<Plan> smallest_fitting_cluster(const model::ArchSpec& teacher, const model::ArchSpec* student,
                                           const Cluster& cluster, const HardwareProfile& hw,
                                           const PlanOptions& options, int max_nodes = 1024);

}  // namespace ac::search

// The AutoCompress search: differentiable architecture search of a heterogeneous student
// inside the teacher, against the serving cost model (docs/search.md).
//
// Architecture logits per decision (one global hidden width; per layer the MLP width, the
// attention heads per KV group, the Mamba heads per group, whether a Mamba / MoE sublayer stays,
// and per MoE layer the
// routed experts kept, each expert's FFN width, top-k, the shared expert's width and the latent
// width) are sampled with
// Gumbel-softmax at an annealed temperature; each decision's soft mask is the expected prefix
// mask over the teacher's importance-ranked units, applied to the frozen teacher through the
// model's observer hooks, so the masked teacher is the student. The objective is the KD loss
// of the masked model against the teacher's logits plus one augmented-Lagrangian term per
// budget on the differentiable cost model's expected value. At the end the logits are
// discretized, every budget is checked on the exact cost model and repaired (units removed
// where a budget is exceeded, given back where there is slack), and the student is pruned.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "model/layers/observer.h"
#include "search/budget.h"
#include "search/costmodel/profiles.h"
#include "search/importance/importance.h"

namespace ac::search {

// ---- budgets ------------------------------------------------------------------------------

enum class Metric { Params, ActiveParams, Memory, Ttft, Tpot, Throughput };
const char* metric_name(Metric m);  // params active_params memory_gb ttft_ms tpot_ms throughput

// Absolute budgets (BudgetLimits: the same meaning as `minitron` gives them) and the same
// budgets as ratios of the teacher's own value on the same target (0 = not given).
struct SearchConstraints {
  BudgetLimits absolute;
  double params_ratio = 0, active_params_ratio = 0, memory_ratio = 0, ttft_ratio = 0, tpot_ratio = 0,
         throughput_ratio = 0;
  bool any() const;
  bool needs_cost_model() const;
};

// One budget, resolved to an absolute value in the metric's base unit (parameters, bytes,
// seconds, tokens/s).
struct Budget {
  Metric metric;
  std::string option;   // the command-line option it came from ("--target-tpot-ratio")
  double value = 0;     // the limit
  double teacher = 0;   // the teacher's exact value
  bool at_least = false;  // throughput: at least `value`
};

// The exact quantities a budget can bound, for one ArchSpec.
struct ExactCost {
  double params = 0, active_params = 0, memory_bytes = 0, ttft_s = 0, tpot_s = 0, throughput_tok_s = 0;
  bool fits = true;     // with a target: the cost model's `fits`
  std::string problem;  // why not
  double get(Metric m) const;
};
ExactCost exact_cost(const model::ArchSpec& spec, const CostTarget* target);

// Budgets of `c` for `teacher` (ratios times the teacher's exact value). Throws ac::InputError
// naming the option when a ratio is not in (0, 1] (throughput: >= 1), or when a cost-model
// budget has no target.
std::vector<Budget> resolve_budgets(const SearchConstraints& c, const model::ArchSpec& teacher, const CostTarget* target);

// Relative violation of one budget by value x: > 0 when exceeded (x / value - 1; throughput
// 1 - x / value).
double violation(const Budget& b, double x);

// ---- the search space -----------------------------------------------------------------------

// One categorical decision. Choices are ascending; the mask of choice c keeps the units whose
// rank is below choices[c].
struct Decision {
  std::string axis;   // hidden | ffn | attn_heads | mamba | mamba_heads | moe | experts | expert_ffn | top_k | shared_ffn | latent
  int layer = -1;     // -1: global (hidden)
  std::vector<int64_t> choices;  // hidden, ffn: widths (ffn 0 = the MLP removed); attn_heads: heads
                                 // per KV group (0 = attention removed); mamba, moe: 0 (removed) or 1;
                                 // mamba_heads: Mamba heads per group (n_groups);
                                 // experts: routed experts kept; expert_ffn: each expert's FFN width;
                                 // top_k: routed experts per token; shared_ffn: the shared expert's
                                 // FFN width; latent: a latent MoE's latent width
  std::vector<int64_t> rank;     // per unit its importance rank (0 = most important; heads: within
                                 // their KV group, Mamba heads within their group); one unit for
                                 // mamba / moe; experts: per expert;
                                 // expert_ffn: per neuron of every expert, [num_experts * expert_ffn]
                                 // ranks within the expert (what prune keeps; empty without
                                 // SpaceOptions::unit_ranks); top_k: the routing slots 0..k-1;
                                 // shared_ffn: per shared-expert neuron; latent: per latent channel
  int teacher_choice() const { return int(choices.size()) - 1; }
  // The gradient of its logits is a partial sum over TP: its units are split over the TP ranks
  // (FFN and shared-expert neurons, attention and Mamba heads; routed experts, so also the
  // routing slots of their tokens and the latent channels they read and write).
  bool sharded() const {
    return axis == "ffn" || axis == "attn_heads" || axis == "mamba_heads" || axis == "experts" || axis == "expert_ffn" ||
           axis == "top_k" || axis == "shared_ffn" || axis == "latent";
  }
};

struct SpaceOptions {
  // Axes searched: hidden ffn attn_heads mamba_heads skip experts expert_ffn top_k shared_ffn latent (empty: every one the
  // engine serves). "skip" adds the choice 0 (sublayer removed) to per-layer decisions and the
  // mamba / moe keep decisions. Experts and top-k are not searched under grouped routing.
  std::vector<std::string> axes;
  // Explicit choices per axis (absolute values; the teacher's value is added when missing):
  // hidden=384,512 ffn=512,1024 attn_heads=1,2 (heads per KV group).
  std::map<std::string, std::vector<int64_t>> choices;
  double min_width = 0.25;  // default grid: engine-friendly multiples from this fraction up
  int max_choices = 8;      // per decision, besides 0 (evenly thinned when the grid is longer)
  int tp = 1;               // every choice must split over this TP size
  // Rank every expert FFN neuron per expert for the KD search's masks. The cost-only search
  // needs no ranks (and [experts x expert FFN] per layer is large for a 512-expert teacher).
  bool unit_ranks = true;
};

struct SearchSpace {
  model::ArchSpec teacher;
  std::vector<Decision> decisions;
  int hidden = -1;                                 // index of the hidden decision (-1: held)
  std::vector<int> attn, ffn, mamba, mamba_heads, moe;  // per layer: its decision (-1: none / held)
  std::vector<int> experts, expert_ffn, top_k, shared_ffn, latent;  // per MoE layer: its decision (-1: held)
  std::vector<std::string> notes;                  // what is held and why
  // The student of one pick (a choice index per decision).
  model::ArchSpec spec(const std::vector<int>& pick) const;
  std::vector<int> teacher_pick() const;
  std::vector<int> smallest_pick() const;
  nlohmann::json to_json() const;
};

// The decisions for `teacher` on `engine` (nullptr: every axis per layer). Unknown axes, an axis
// the engine cannot vary per layer, and choices that do not split over TP (or exceed the teacher)
// throw ac::InputError naming the option (--axes, --choices).
SearchSpace build_space(const model::ArchSpec& teacher, const ImportanceScores& scores, const EngineProfile* engine,
                        const SpaceOptions& options, const std::string& scores_source = "importance");

// The search's expected cost of a distribution over the space (per decision, probabilities of
// its choices): params, active params, memory bytes, TTFT s, TPOT s, throughput tokens/s, in
// Metric order. At one-hot probabilities it is the exact cost model's value (tested).
std::vector<double> expected_cost(const SearchSpace& space, const CostTarget& target,
                                  const std::vector<std::vector<double>>& probs);

// The cost-only quality proxy of a distribution over the space (per decision, probabilities of
// its choices; one-hot: of one pick), in [0, 1], 1 at the teacher: the mean over the teacher's
// sublayers (attention, Mamba, MLP, MoE) of the fraction of the sublayer kept, times the hidden
// fraction kept. Attention: heads kept / heads (0 removed); MLP: width / width; Mamba: kept or
// not; MoE: kept x ((1 - s) x routed + s x shared-FFN fraction), routed = expert-FFN fraction x
// (w x experts fraction + (1 - w) x top-k fraction), with w = `experts_weight` (the experts count
// sets what the layer knows, top-k what each token uses; times the latent fraction in a latent
// MoE) and s the shared expert's share of the
// teacher layer's active FFN width (shared / (shared + top-k x expert FFN); 0 without one).
// Each factor is linear in one decision's probabilities, so this is the exact expectation.
double quality_proxy(const SearchSpace& space, const std::vector<std::vector<double>>& probs, double experts_weight);

// ---- discretize and repair ------------------------------------------------------------------

struct RepairStep {
  std::string action;  // "remove" | "give back"
  int decision = 0;
  int64_t from = 0, to = 0;
  std::string what;    // "layers[3].ffn 1024 -> 768"
};
struct RepairResult {
  std::vector<int> pick;
  std::vector<RepairStep> steps;
  ExactCost cost;
  // The budget closest to its limit and how close (value / limit; throughput limit / value).
  int binding = -1;
  double binding_use = 0;
  std::string slack_reason;  // when the binding budget is used below 95%: what stopped the give-back
};

// From `pick` (the argmax), removes units until every budget holds and the model fits, then gives
// back while every budget still holds. Moves are one choice step of one decision; the one taken
// costs the least log-probability under `log_probs` (per decision, [choices]) per unit of violation
// removed (remove) or adds the most log-probability per unit of budget used (give back). Throws
// std::runtime_error when no move can repair (cannot happen above the smallest pick).
RepairResult repair(const SearchSpace& space, std::vector<int> pick, const std::vector<std::vector<double>>& log_probs,
                    const std::vector<Budget>& budgets, const CostTarget* target);

// Refuses (ac::InputError naming the option and the smallest reachable value) a budget the
// smallest pick of the space does not meet, before any forward.
void check_reachable(const SearchSpace& space, const std::vector<Budget>& budgets, const CostTarget* target);

// ---- the masked teacher ---------------------------------------------------------------------

// The soft masks of one distribution over the space (per decision, probabilities of its
// choices) as an observer for this TP rank's shard of the teacher (model->set_observer): each
// decision's mask is the expected prefix mask over its importance-ranked units; the experts
// and top-k decisions give the router their choices' sets with the probabilities (the expected
// routing, model/layers/observer.h modify_routing). At one-hot
// probabilities the masked teacher computes what the pruned student of that pick computes
// (tested for every axis). The masks live on the host (CPU).
std::unique_ptr<model::ActivationObserver> search_masks(const SearchSpace& space, const std::vector<std::vector<double>>& probs,
                                                        int tp_rank = 0, int tp_size = 1);

// ---- the search -----------------------------------------------------------------------------

struct DasOptions {
  std::string teacher, importance, out;
  SearchConstraints constraints;
  std::string hardware, engine = "vllm", workload, configs_dir = default_configs_dir();
  SpaceOptions space;
  std::vector<std::string> data;
  std::string split = "98,1,1";
  int64_t seq_len = 128, micro_batch = 2;  // per DP rank
  int64_t steps = 100;
  uint64_t seed = 1234;
  int tp = 1;
  std::string dtype = "auto";
  std::string device = "auto";  // auto | cpu | cuda: the teacher and its masks (router state stays on the host)
  int local_rank = 0;           // node-local rank: which GPU
  // Optimisation (docs/search.md says why these defaults).
  double lr = 0.1;                       // Adam on the architecture logits
  double tau_start = 1.0, tau_end = 0.1; // Gumbel-softmax temperature, exponential decay
  double hard_prob = 0.1;                // fraction of steps with a hard straight-through sample
  double rho = 1.0;                      // augmented-Lagrangian penalty and multiplier step
  double warmup = 0.3;                   // fraction of the steps over which budgets ramp in
  double temperature = 1.0;              // KD temperature
  // Weights trained jointly with the logits (`--weights-lr`): 0 keeps the masked model the
  // frozen teacher. Above 0 the masked model is a trainable copy of the teacher (the teacher
  // itself stays frozen for the KD targets), stepped by distill::WeightOptimizer (ZeRO-1 AdamW
  // over DP, no weight decay, cosine from this LR to a tenth of it after a warmup of
  // min(10, steps / 10) steps); its weights and optimizer state are in the search checkpoint,
  // and the candidates are scored and the student is pruned from the trained weights.
  double weights_lr = 0.0;
  // Discretization: the argmax and `candidates - 1` samples of the final distribution, each
  // repaired to meet every budget, are scored as hard models by KD loss on `score_batches`
  // micro-batches of the calibration split; the lowest wins (1: the argmax alone).
  int candidates = 8;
  int64_t score_batches = 4;
  int64_t log_interval = 5, save_interval = 25;
  std::string scores_source = "importance";
  // Cost only (`search --cost-only`): no weights and no data. The teacher may be an ArchSpec JSON
  // or config.json; the KD term is replaced by the stated quality proxy of quality_proxy() below
  // (every sublayer as important as any other, every unit of a sublayer as any other), and the
  // candidates are scored by it. The result is <out>/arch.json and search_report.json, no student
  // checkpoint and no resumable state (it takes seconds). docs/scale.md.
  bool cost_only = false;
  double proxy_experts_weight = 0.5;
  // What `search --cost-only` uses unless told otherwise (docs/scale.md: the KD defaults above
  // overshoot on the linear proxy): more, smaller steps and a stiffer, slower-ramped budget.
  static constexpr int64_t kCostOnlySteps = 200;
  static constexpr double kCostOnlyLr = 0.05, kCostOnlyRho = 5.0, kCostOnlyWarmup = 0.6;
  // Check only: the teacher (a checkpoint, or an ArchSpec JSON / config.json), the target, the
  // space and the budgets' reachability, then return (nothing is read beyond the teacher's
  // architecture, nothing is written). `search --check`, and `autocompress run` before any stage.
  bool check_only = false;
};

struct DasCandidate {
  std::string source;        // "argmax" | "sample N"
  std::vector<int> pick;     // before repair
  RepairResult repaired;
  double kd = 0;             // hard-model KD loss of the repaired pick (calibration batches)
  double proxy = 0;          // cost only: the quality proxy of the repaired pick (higher is better)
};

struct DasResult {
  SearchSpace space;
  std::vector<DasCandidate> candidates;  // distinct repaired picks, in the order scored
  int chosen = -1;                       // index into candidates
  std::vector<Budget> budgets;
  std::vector<int> argmax;        // the search's own pick
  RepairResult repaired;
  model::ArchSpec student;
  std::string student_path;       // <out>/student/step_0.h5 (empty: cost only)
  int64_t steps_done = 0;
  bool stopped = false;           // a stop signal ended it (checkpoint written; exit 75)
};

// Collective over `world`: the search (TP x DP), checkpoints in <out>/search (resumed from
// `latest` when present), then <out>/arch.json, <out>/search_report.json and <out>/student.
// `on_layout` (the manifest) is called once every budget is known to be reachable.
DasResult run_search(const DasOptions& options, const ImportanceScores& scores, MPI_Comm world,
                     const std::function<void(const nlohmann::json& layout)>& on_layout = nullptr);

}  // namespace ac::search

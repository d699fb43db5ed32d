// The search space: the axes the search can vary (one table: name, --axes / --choices,
// default grid divisor, the engine's per-layer field), the decisions of one teacher on them,
// and the student ArchSpec of one pick.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"
#include "search/importance/importance.h"

namespace ac::search {

// Every axis; the first ten are what --axes names, in the order the default space takes them.
enum class Axis { Hidden, Ffn, AttnHeads, MambaHeads, Skip, Experts, ExpertFfn, TopK, SharedFfn, Latent, Mamba, Moe };

struct AxisInfo {
  Axis axis;
  const char* name;     // in --axes, --choices and Decision::axis
  bool option;          // named in --axes (mamba, moe: the keep decisions "skip" adds)
  bool choices;         // takes --choices
  int64_t divisor;      // default grid: multiples of minitron_divisor(divisor, teacher value); 0: every value
  const char* engine;   // the engine profile's per-layer axis that serves it ("": global, every engine)
  bool sharded;         // its units are split over TP (Decision::sharded)
  bool moe;             // acts in MoE layers only
};
// The table, in enum order.
const std::vector<AxisInfo>& axis_table();
const AxisInfo& axis_info(Axis a);
const AxisInfo* find_axis(const std::string& name);  // nullptr: no such axis

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
  bool sharded() const;
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
  // Per layer the decisions of one per-layer axis (attn, ffn, ...; not hidden or skip).
  std::vector<int>& per_layer(Axis a);
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

}  // namespace ac::search

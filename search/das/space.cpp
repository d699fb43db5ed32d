// The search space (search/das/space.h): the axis table, the decisions build_space makes from
// it per axis kind (global hidden, attention, MLP, Mamba, MoE), and the student of a pick.
#include "search/das/space.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>

#include "dist/error.h"
#include "model/model.h"
#include "search/budget.h"
#include "search/das/constraints.h"

using nlohmann::json;

namespace ac::search {

// ---- the axes -------------------------------------------------------------------------------

const std::vector<AxisInfo>& axis_table() {
  // axis, name, --axes, --choices, grid divisor, engine per-layer field, split over TP, MoE only
  static const std::vector<AxisInfo> table = {
      {Axis::Hidden, "hidden", true, true, 256, "", false, false},
      {Axis::Ffn, "ffn", true, true, 512, "ffn", true, false},
      {Axis::AttnHeads, "attn_heads", true, true, 0, "attn_heads", true, false},
      {Axis::MambaHeads, "mamba_heads", true, true, 1, "mamba_heads", true, false},
      {Axis::Skip, "skip", true, false, 0, "skip", false, false},
      {Axis::Experts, "experts", true, true, 8, "experts", true, true},
      {Axis::ExpertFfn, "expert_ffn", true, true, 128, "expert_ffn", true, true},
      {Axis::TopK, "top_k", true, true, 1, "top_k", true, true},
      {Axis::SharedFfn, "shared_ffn", true, true, 128, "shared_ffn", true, true},
      {Axis::Latent, "latent", true, true, 128, "latent", true, true},
      {Axis::Mamba, "mamba", false, false, 0, "skip", false, false},
      {Axis::Moe, "moe", false, false, 0, "skip", false, false},
  };
  return table;
}

const AxisInfo& axis_info(Axis a) { return axis_table()[size_t(a)]; }

const AxisInfo* find_axis(const std::string& name) {
  for (const auto& x : axis_table())
    if (name == x.name) return &x;
  return nullptr;
}

bool Decision::sharded() const {
  const AxisInfo* a = find_axis(axis);
  return a && a->sharded;
}

// ---- the student of a pick ------------------------------------------------------------------

std::vector<int>& SearchSpace::per_layer(Axis a) {
  switch (a) {
    case Axis::Ffn: return ffn;
    case Axis::AttnHeads: return attn;
    case Axis::MambaHeads: return mamba_heads;
    case Axis::Experts: return experts;
    case Axis::ExpertFfn: return expert_ffn;
    case Axis::TopK: return top_k;
    case Axis::SharedFfn: return shared_ffn;
    case Axis::Latent: return latent;
    case Axis::Mamba: return mamba;
    case Axis::Moe: return moe;
    case Axis::Hidden:
    case Axis::Skip: break;
  }
  throw std::logic_error(std::string("SearchSpace::per_layer: ") + axis_info(a).name + " is not a per-layer axis");
}

model::ArchSpec SearchSpace::spec(const std::vector<int>& pick) const {
  model::ArchSpec s = teacher;
  s.name = teacher.name + "-autocompress";
  auto value = [&](int d) { return decisions[size_t(d)].choices[size_t(pick[size_t(d)])]; };
  if (hidden >= 0) s.hidden_size = value(hidden);
  for (size_t l = 0; l < s.layers.size(); ++l) {
    auto& L = s.layers[l];
    if (attn[l] >= 0) {
      const int64_t q = value(attn[l]);
      if (q == 0) L.attention.reset();
      else L.attention->num_heads = int(q) * L.attention->num_kv_heads;
    }
    if (ffn[l] >= 0) {
      const int64_t f = value(ffn[l]);
      if (f == 0) L.mlp.reset();
      else L.mlp->ffn_size = f;
    }
    if (mamba[l] >= 0 && value(mamba[l]) == 0) L.mamba.reset();
    if (L.mamba && mamba_heads[l] >= 0) L.mamba->num_heads = int(value(mamba_heads[l])) * L.mamba->n_groups;
    if (moe[l] >= 0 && value(moe[l]) == 0) L.moe.reset();
    if (L.moe) {
      if (experts[l] >= 0) L.moe->num_experts = int(value(experts[l]));
      if (expert_ffn[l] >= 0) L.moe->expert_ffn = value(expert_ffn[l]);
      if (top_k[l] >= 0) L.moe->top_k = int(value(top_k[l]));
      if (shared_ffn[l] >= 0) L.moe->shared_ffn = value(shared_ffn[l]);
      if (latent[l] >= 0) L.moe->latent_size = value(latent[l]);
    }
  }
  return s;
}

std::vector<int> SearchSpace::teacher_pick() const {
  std::vector<int> p;
  for (const auto& d : decisions) p.push_back(d.teacher_choice());
  return p;
}
std::vector<int> SearchSpace::smallest_pick() const { return std::vector<int>(decisions.size(), 0); }

json SearchSpace::to_json() const {
  json d = json::array();
  for (const auto& x : decisions) d.push_back({{"axis", x.axis}, {"layer", x.layer}, {"choices", x.choices}});
  return {{"decisions", d}, {"notes", notes}};
}

// ---- which axes are searched ----------------------------------------------------------------

namespace {

// Rank of every unit: 0 for the highest score, ties to the lower index (as prune's top_k).
std::vector<int64_t> ranks(const std::vector<double>& score, int64_t offset, int64_t n) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return score[size_t(offset + a)] > score[size_t(offset + b)]; });
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[size_t(idx[size_t(i)])] = i;
  return r;
}

// Multiples of `divisor` from min_fraction * teacher up to below the teacher, then the teacher;
// thinned evenly to at most `max_choices` (the smallest and the teacher kept).
std::vector<int64_t> width_grid(int64_t teacher, int64_t divisor, double min_fraction, int max_choices) {
  std::vector<int64_t> v;
  const int64_t lo = std::max<int64_t>(divisor, int64_t(std::ceil(min_fraction * double(teacher) / double(divisor))) * divisor);
  for (int64_t x = lo; x < teacher; x += divisor) v.push_back(x);
  v.push_back(teacher);
  if (int(v.size()) > max_choices && max_choices >= 2) {
    std::vector<int64_t> t;
    for (int i = 0; i < max_choices; ++i) {
      const size_t j = size_t(std::llround(double(i) * double(v.size() - 1) / double(max_choices - 1)));
      if (t.empty() || t.back() != v[j]) t.push_back(v[j]);
    }
    v = t;
  }
  return v;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// The --axes names (with or without "skip"), space-separated, in table order.
std::string axis_names(bool with_skip) {
  std::string n;
  for (const auto& a : axis_table())
    if (a.option && (with_skip || a.axis != Axis::Skip)) n += (n.empty() ? "" : " ") + std::string(a.name);
  return n;
}

// Why an axis has nothing to act on in teacher `t` ("" when it has): refused when asked for,
// left out of the default space.
std::string absent(Axis a, const model::ArchSpec& t) {
  bool moe = false, shared = false, mamba = false, latent = false;
  for (const auto& layer : t.layers)
    moe = moe || layer.moe, shared = shared || (layer.moe && layer.moe->shared_ffn > 0), mamba = mamba || layer.mamba,
    latent = latent || (layer.moe && layer.moe->latent_size > 0);
  if (a == Axis::Latent && !latent) return "the teacher's MoE layers have no latent projection";
  if (a == Axis::MambaHeads && !mamba) return "the teacher has no Mamba layer";
  if (axis_info(a).moe && !moe) return "the teacher has no MoE layer";
  if (a == Axis::SharedFfn && !shared) return "the teacher's MoE layers have no shared expert";
  return "";
}

// --axes and --choices name known axes the teacher has, --min-width is a fraction.
void check_requests(const model::ArchSpec& t, const SpaceOptions& o) {
  for (const auto& a : o.axes) {
    const AxisInfo* x = find_axis(a);
    if (!x || !x->option) throw InputError("--axes", a, "unknown axis (searchable: " + axis_names(true) + ")");
    if (const std::string why = absent(x->axis, t); !why.empty()) throw InputError("--axes", a, why);
  }
  for (const auto& [a, v] : o.choices) {
    const AxisInfo* x = find_axis(a);
    if (!x || !x->choices) throw InputError("--choices", a, "unknown axis (choices can be given for " + axis_names(false) + ")");
    if (v.empty()) throw InputError("--choices", a, "no values");
  }
  if (o.min_width <= 0 || o.min_width > 1) throw InputError("--min-width", number_text(o.min_width), "must be in (0, 1]");
}

std::string format_note(const EngineProfile* engine, const char* before, const char* otherwise) {
  return engine && !engine->heterogeneous_format.empty() ? before + engine->heterogeneous_format + ")" : otherwise;
}

// The axes searched, in order: --axes (each served per layer by the engine), or every axis the
// teacher has and the engine serves (the rest noted as held).
std::vector<Axis> searched_axes(const model::ArchSpec& t, const SpaceOptions& o, const EngineProfile* engine,
                                std::vector<std::string>& notes) {
  const std::string eng = engine ? engine->id : "any engine";
  auto served = [&](const AxisInfo& a) { return !engine || engine->serves_per_layer(a.engine); };
  std::vector<Axis> axes;
  if (o.axes.empty()) {
    axes.push_back(Axis::Hidden);
    for (const auto& a : axis_table()) {
      if (!a.option || a.axis == Axis::Hidden || !absent(a.axis, t).empty()) continue;
      if (served(a)) axes.push_back(a.axis);
      else notes.push_back(std::string(a.name) + ": held, " + eng + " cannot serve per-layer " + a.name + format_note(engine, " (", ""));
    }
    return axes;
  }
  for (const auto& name : o.axes) {
    const AxisInfo& a = *find_axis(name);
    if (a.axis != Axis::Hidden && !served(a))
      throw InputError("--axes", name, "the engine " + eng + " cannot serve a per-layer " + name +
                                           format_note(engine, " (its format: ", " (it lists no heterogeneous format)") +
                                           "; leave the axis out or choose another --engine");
    axes.push_back(a.axis);
  }
  return axes;
}

}  // namespace

// ---- the decisions per axis kind ------------------------------------------------------------

namespace {

// Builds the decisions of one teacher, layer by layer, in the order the search has always
// numbered them (the logits, the RNG draws and the checkpoints follow it).
class SpaceBuilder {
 public:
  SpaceBuilder(const model::ArchSpec& t, const ImportanceScores& scores, const EngineProfile* engine, const SpaceOptions& o,
               const std::string& src, std::vector<Axis> axes, SearchSpace& s)
      : t_(t), scores_(scores), o_(o), src_(src), eng_(engine ? engine->id : "any engine"), axes_(std::move(axes)), s_(s) {
    tp_ = std::max(1, o.tp);
    skip_ = searched(Axis::Skip);
    // Per-layer FFN widths of a Llama-family student must be what the engine's format can write
    // (DeciLM block_configs: multiples of 256); Nemotron-H Puzzle writes any MLP width.
    bool hybrid = t.family == model::ModelFamily::NemotronH;
    for (const auto& layer : t.layers) hybrid = hybrid || layer.mamba || layer.moe;
    ffn_multiple_ = engine && !hybrid ? std::max<int64_t>(1, engine->per_layer_ffn_multiple) : 1;
  }

  void build() {
    if (ffn_multiple_ > 1 && searched(Axis::Ffn))
      s_.notes.push_back("ffn: per-layer widths are multiples of " + std::to_string(ffn_multiple_) + " (" + eng_ + "'s per-layer format)");
    for (const auto& a : axis_table())
      if (a.axis != Axis::Hidden && a.axis != Axis::Skip) s_.per_layer(a.axis).assign(t_.layers.size(), -1);
    if (searched(Axis::Hidden)) add_hidden();
    for (size_t l = 0; l < t_.layers.size(); ++l) {
      where_ = "layers[" + std::to_string(l) + "]";
      if (t_.layers[l].attention) add_attention(l);
      if (t_.layers[l].mlp) add_mlp(l);
      if (t_.layers[l].mamba) add_mamba(l);
      if (t_.layers[l].moe) add_moe(l);
    }
  }

 private:
  bool searched(Axis a) const { return std::find(axes_.begin(), axes_.end(), a) != axes_.end(); }
  bool explicit_choices(Axis a) const { return o_.choices.count(axis_info(a).name) > 0; }

  // The choices wanted: --choices (checked, the teacher's value added) or the default grid.
  std::vector<int64_t> wanted(Axis a, int64_t teacher_value) const {
    const char* name = axis_info(a).name;
    auto it = o_.choices.find(name);
    if (it == o_.choices.end()) return grid(a, teacher_value);
    std::vector<int64_t> v = it->second;
    for (int64_t x : v)
      if (x <= 0 || x > teacher_value)
        throw InputError("--choices", name + ("=" + join(v)),
                         std::to_string(x) + " is not in [1, the teacher's " + std::to_string(teacher_value) + "]");
    if (std::find(v.begin(), v.end(), teacher_value) == v.end()) v.push_back(teacher_value);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  }
  std::vector<int64_t> grid(Axis a, int64_t teacher_value) const {
    const int64_t divisor = axis_info(a).divisor;
    if (divisor > 0) return width_grid(teacher_value, minitron_divisor(divisor, teacher_value), o_.min_width, o_.max_choices);
    std::vector<int64_t> all;  // every count, 1 .. the teacher's
    for (int64_t q = 1; q <= teacher_value; ++q) all.push_back(q);
    return all;
  }

  // The wanted choices without a problem; one with a problem is dropped from the default grid
  // and refused when --choices names it.
  std::vector<int64_t> valid(Axis a, const std::vector<int64_t>& want, const std::function<std::string(int64_t)>& problem) const {
    std::vector<int64_t> ok;
    for (int64_t x : want) {
      const std::string why = problem(x);
      if (why.empty()) ok.push_back(x);
      else if (explicit_choices(a)) throw InputError("--choices", axis_info(a).name + ("=" + join(want)), why);
    }
    return ok;
  }

  // A choice is valid when the teacher with only that change splits over TP.
  bool splits(const std::function<void(model::ArchSpec&)>& edit) const {
    model::ArchSpec probe = t_;
    edit(probe);
    return model::tp_split_problem(probe, tp_).empty();
  }
  std::string no_split(int64_t x) const { return std::to_string(x) + " does not split over TP " + std::to_string(tp_) + " in " + where_; }

  // The scores of one layer's units, checked against the teacher's count.
  const std::vector<double>& sized(const std::vector<double>& v, size_t n, const std::string& field) const {
    if (v.size() != n)
      throw InputError(src_, where_ + "." + field, "has " + std::to_string(v.size()) + " scores for " + std::to_string(n) + " units");
    return v;
  }

  void add(Axis a, int layer, std::vector<int64_t> choices, std::vector<int64_t> rank) {
    if (layer < 0) s_.hidden = int(s_.decisions.size());
    else s_.per_layer(a)[size_t(layer)] = int(s_.decisions.size());
    s_.decisions.push_back({axis_info(a).name, layer, std::move(choices), std::move(rank)});
  }

  void add_hidden() {
    std::vector<int64_t> choices = wanted(Axis::Hidden, t_.hidden_size);
    if (choices.size() > 1) add(Axis::Hidden, -1, std::move(choices), ranks(scores_.hidden, 0, t_.hidden_size));
  }

  void add_attention(size_t l) {
    const auto& a = *t_.layers[l].attention;
    const int g = a.num_heads / a.num_kv_heads;
    const std::vector<int64_t> per_group = searched(Axis::AttnHeads) ? wanted(Axis::AttnHeads, g) : std::vector<int64_t>{g};
    std::vector<int64_t> ok = valid(Axis::AttnHeads, per_group, [&](int64_t q) -> std::string {
      if (splits([&](model::ArchSpec& p) { p.layers[l].attention->num_heads = int(q) * a.num_kv_heads; })) return "";
      return std::to_string(q) + " heads per group (" + std::to_string(q * a.num_kv_heads) + " heads) do not split over TP " +
             std::to_string(tp_) + " in " + where_;
    });
    if (skip_) ok.insert(ok.begin(), 0);
    if (ok.size() < 2) return;
    const auto& sc = scores_.layers[l].attn_heads;
    if (int64_t(sc.size()) != a.num_heads)
      throw InputError(src_, where_ + ".attn_heads", "has " + std::to_string(sc.size()) + " scores for " + std::to_string(a.num_heads) + " heads");
    std::vector<int64_t> rank;
    for (int k = 0; k < a.num_kv_heads; ++k)
      for (int64_t r : ranks(sc, int64_t(k) * g, g)) rank.push_back(r);
    add(Axis::AttnHeads, int(l), std::move(ok), std::move(rank));
  }

  void add_mlp(size_t l) {
    const int64_t F = t_.layers[l].mlp->ffn_size;
    const std::vector<int64_t> widths = searched(Axis::Ffn) ? wanted(Axis::Ffn, F) : std::vector<int64_t>{F};
    std::vector<int64_t> ok = valid(Axis::Ffn, widths, [&](int64_t f) -> std::string {
      if (f != F && f % ffn_multiple_ != 0)  // a width the engine's per-layer format cannot write
        return std::to_string(f) + " is not a multiple of " + std::to_string(ffn_multiple_) + ", which " + eng_ +
               " needs for per-layer FFN widths (its heterogeneous.ffn_multiple)";
      return splits([&](model::ArchSpec& p) { p.layers[l].mlp->ffn_size = f; }) ? "" : no_split(f);
    });
    if (skip_) ok.insert(ok.begin(), 0);
    if (ok.size() < 2) return;
    const auto& sc = scores_.layers[l].mlp_neurons;
    if (int64_t(sc.size()) != F)
      throw InputError(src_, where_ + ".mlp_neurons", "has " + std::to_string(sc.size()) + " scores for " + std::to_string(F) + " neurons");
    add(Axis::Ffn, int(l), std::move(ok), ranks(sc, 0, F));
  }

  void add_mamba(size_t l) {
    if (skip_) add(Axis::Mamba, int(l), {0, 1}, {0});
    if (!searched(Axis::MambaHeads)) return;
    // Heads per group (B and C are per group, so every group keeps the same number of heads,
    // its best ones, as prune does); the head dim is held.
    const auto& m = *t_.layers[l].mamba;
    const int64_t G = m.n_groups, R = m.num_heads / G;
    const std::vector<int64_t> want = wanted(Axis::MambaHeads, R);
    std::vector<int64_t> ok = valid(Axis::MambaHeads, want, [&](int64_t r) -> std::string {
      if (splits([&](model::ArchSpec& p) { p.layers[l].mamba->num_heads = int(r * G); })) return "";
      return std::to_string(r) + " heads per group (" + std::to_string(r * G) + " heads) do not split over TP " +
             std::to_string(tp_) + " in " + where_;
    });
    if (ok.size() < 2) return;
    const auto& sc = scores_.layers[l].mamba_heads;
    if (int64_t(sc.size()) != m.num_heads)
      throw InputError(src_, where_ + ".mamba_heads", "has " + std::to_string(sc.size()) + " scores for " + std::to_string(m.num_heads) + " heads");
    std::vector<int64_t> rank;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r : ranks(sc, g * R, R)) rank.push_back(r);
    add(Axis::MambaHeads, int(l), std::move(ok), std::move(rank));
  }

  // One MoE axis: its choices (the default grid or --choices, kept where they give a valid
  // layer that splits over TP), and its decision when more than one is left.
  void add_moe_axis(size_t l, Axis a, int64_t teacher_value, int64_t min_value,
                    const std::function<void(model::MoeSpec&, int64_t)>& set, std::vector<int64_t> rank) {
    const std::vector<int64_t> want = wanted(a, teacher_value);
    std::vector<int64_t> ok = valid(a, want, [&](int64_t x) -> std::string {
      if (x >= min_value && splits([&](model::ArchSpec& p) { set(*p.layers[l].moe, x); })) return "";
      return std::to_string(x) + " is not valid in " + where_ +
             (x < min_value ? " (below " + std::to_string(min_value) + ")" : " (does not split over TP " + std::to_string(tp_) + ")");
    });
    if (ok.size() >= 2) add(a, int(l), std::move(ok), std::move(rank));
  }

  void add_moe(size_t l) {
    if (skip_) add(Axis::Moe, int(l), {0, 1}, {0});
    const auto& m = *t_.layers[l].moe;
    const auto& sc = scores_.layers[l];
    const bool grouped = m.n_group > 1;  // grouped routing: the expert count is tied to the groups
    if (grouped && (searched(Axis::Experts) || searched(Axis::TopK)) && !noted_grouped_) {
      s_.notes.push_back("experts / top-k: held in MoE layers with grouped routing (n_group > 1: the expert count is tied to the groups)");
      noted_grouped_ = true;
    }
    if (!grouped && searched(Axis::Experts)) {
      const auto& sc_e = sized(sc.moe_experts, size_t(m.num_experts), "moe_experts");
      // At least the teacher's top_k experts stay, so every top_k choice stays valid.
      add_moe_axis(l, Axis::Experts, m.num_experts, m.top_k, [](model::MoeSpec& x, int64_t v) { x.num_experts = int(v); },
                   ranks(sc_e, 0, m.num_experts));
    }
    if (searched(Axis::ExpertFfn)) {
      // Each expert keeps its own best neurons, as prune does.
      std::vector<int64_t> rank;
      if (o_.unit_ranks) {
        const auto& sc_n = sized(sc.moe_expert_neurons, size_t(m.num_experts) * size_t(m.expert_ffn), "moe_expert_neurons");
        rank.reserve(sc_n.size());
        for (int64_t e = 0; e < m.num_experts; ++e)
          for (int64_t r : ranks(sc_n, e * m.expert_ffn, m.expert_ffn)) rank.push_back(r);
      }
      add_moe_axis(l, Axis::ExpertFfn, m.expert_ffn, 1, [](model::MoeSpec& x, int64_t v) { x.expert_ffn = v; }, std::move(rank));
    }
    if (!grouped && searched(Axis::TopK)) {
      std::vector<int64_t> slots(size_t(m.top_k));
      std::iota(slots.begin(), slots.end(), 0);
      add_moe_axis(l, Axis::TopK, m.top_k, 1, [](model::MoeSpec& x, int64_t v) { x.top_k = int(v); }, slots);
    }
    if (m.shared_ffn > 0 && searched(Axis::SharedFfn)) {
      // The shared expert keeps its best neurons, as prune does (it runs on every token, like a
      // dense MLP; no choice 0: the layer keeps its shared expert).
      std::vector<int64_t> rank;
      if (o_.unit_ranks) rank = ranks(sized(sc.moe_shared_neurons, size_t(m.shared_ffn), "moe_shared_neurons"), 0, m.shared_ffn);
      add_moe_axis(l, Axis::SharedFfn, m.shared_ffn, 1, [](model::MoeSpec& x, int64_t v) { x.shared_ffn = v; }, std::move(rank));
    }
    if (m.latent_size > 0 && searched(Axis::Latent)) {
      // The latent channels the routed experts read (fc1_latent_proj's rows) and write
      // (fc2_latent_proj's columns), the best kept, as prune does.
      add_moe_axis(l, Axis::Latent, m.latent_size, 1, [](model::MoeSpec& x, int64_t v) { x.latent_size = v; },
                   ranks(sized(sc.moe_latent, size_t(m.latent_size), "moe_latent"), 0, m.latent_size));
    }
  }

  const model::ArchSpec& t_;
  const ImportanceScores& scores_;
  const SpaceOptions& o_;
  const std::string& src_;
  const std::string eng_;
  const std::vector<Axis> axes_;
  SearchSpace& s_;
  int tp_ = 1;
  bool skip_ = false, noted_grouped_ = false;
  int64_t ffn_multiple_ = 1;
  std::string where_;  // "layers[3]": the layer being built, for messages
};

}  // namespace

SearchSpace build_space(const model::ArchSpec& t, const ImportanceScores& scores, const EngineProfile* engine,
                        const SpaceOptions& o, const std::string& src) {
  check_requests(t, o);
  if (scores.layers.size() != t.layers.size() || int64_t(scores.hidden.size()) != t.hidden_size)
    throw InputError(src, "layers", "the scores do not describe this teacher (" + std::to_string(scores.layers.size()) +
                                        " layers, hidden " + std::to_string(scores.hidden.size()) + ")");
  SearchSpace s;
  s.teacher = t;
  const std::vector<Axis> axes = searched_axes(t, o, engine, s.notes);
  for (const auto& [a, v] : o.choices)
    if (std::find(axes.begin(), axes.end(), find_axis(a)->axis) == axes.end())
      throw InputError("--choices", a, "the axis is not searched (add it to --axes)");
  SpaceBuilder(t, scores, engine, o, src, axes, s).build();
  bool any_mamba = false;
  for (const auto& layer : t.layers) any_mamba = any_mamba || layer.mamba;
  if (any_mamba) s.notes.push_back("mamba head dim: held (the search varies the Mamba heads per group where the engine serves them, not the head dim)");
  if (s.decisions.empty())
    throw InputError("--axes", axis_info(axes[0]).name, "leaves nothing to search for this teacher on " + std::string(engine ? engine->id : "any engine"));
  return s;
}

}  // namespace ac::search

// The AutoCompress search (see das.h, docs/search.md).
#include "search/das/das.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "data/sampler.h"
#include "data/token_source.h"
#include "dist/cpu_features.h"
#include "dist/device.h"
#include "dist/error.h"
#include "dist/file_io.h"
#include "dist/parallel_layout.h"
#include "dist/progress.h"
#include "dist/tensor_parallel.h"
#include "distill/kd_loss.h"
#include "distill/objective.h"
#include "distill/trainer.h"
#include "distill/weight_optimizer.h"
#include "job/device.h"
#include "job/metrics.h"
#include "job/run_checkpoints.h"
#include "job/signals.h"
#include "job/step_loop.h"
#include "job/teacher.h"
#include "job/token_data.h"
#include "model/layers/observer.h"
#include "model/model.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/differentiable.h"
#include "search/prune/prune.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ac::search {

// ---- budgets --------------------------------------------------------------------------------

const char* metric_name(Metric m) {
  switch (m) {
    case Metric::Params: return "params";
    case Metric::ActiveParams: return "active_params";
    case Metric::Memory: return "memory_gb";
    case Metric::Ttft: return "ttft_ms";
    case Metric::Tpot: return "tpot_ms";
    case Metric::Throughput: return "throughput";
  }
  return "?";
}

namespace {
// A metric in the unit people read (M parameters, GB, ms, tokens/s).
double shown(Metric m, double v) {
  switch (m) {
    case Metric::Params:
    case Metric::ActiveParams: return v / 1e6;
    case Metric::Memory: return v / 1e9;
    case Metric::Ttft:
    case Metric::Tpot: return v * 1e3;
    case Metric::Throughput: return v;
  }
  return v;
}
const char* unit(Metric m) {
  switch (m) {
    case Metric::Params:
    case Metric::ActiveParams: return "M";
    case Metric::Memory: return " GB";
    case Metric::Ttft:
    case Metric::Tpot: return " ms";
    case Metric::Throughput: return " tok/s";
  }
  return "";
}
std::string fmt(double v, int precision = 4) {
  std::ostringstream o;
  o << std::setprecision(precision) << v;
  return o.str();
}
std::string shown_text(Metric m, double v) { return fmt(shown(m, v), 5) + unit(m); }
std::string params_text(double n) { return n >= 1e9 ? fmt(n / 1e9, 4) + "B" : fmt(n / 1e6, 5) + "M"; }
}  // namespace

bool SearchConstraints::any() const {
  return absolute.any() || params_ratio > 0 || active_params_ratio > 0 || memory_ratio > 0 || ttft_ratio > 0 ||
         tpot_ratio > 0 || throughput_ratio > 0;
}
bool SearchConstraints::needs_cost_model() const {
  return absolute.needs_cost_model() || memory_ratio > 0 || ttft_ratio > 0 || tpot_ratio > 0 || throughput_ratio > 0;
}

double ExactCost::get(Metric m) const {
  switch (m) {
    case Metric::Params: return params;
    case Metric::ActiveParams: return active_params;
    case Metric::Memory: return memory_bytes;
    case Metric::Ttft: return ttft_s;
    case Metric::Tpot: return tpot_s;
    case Metric::Throughput: return throughput_tok_s;
  }
  return 0;
}

ExactCost exact_cost(const model::ArchSpec& spec, const CostTarget* target) {
  ExactCost c;
  const model::ParamCounts pc = model::count_params(spec);
  c.params = double(pc.total());
  c.active_params = double(pc.active());
  if (target) {
    const Prediction p = predict(spec, target->hardware, target->engine, target->workload);
    c.memory_bytes = serving_memory_bytes(p, target->workload);
    c.ttft_s = p.ttft_s;
    c.tpot_s = p.tpot_s;
    c.throughput_tok_s = p.throughput_tok_s;
    c.fits = p.fits;
    c.problem = p.problem;
  }
  return c;
}

double violation(const Budget& b, double x) { return b.at_least ? 1.0 - x / b.value : x / b.value - 1.0; }

std::vector<Budget> resolve_budgets(const SearchConstraints& c, const model::ArchSpec& teacher, const CostTarget* target) {
  if (!c.any())
    throw InputError("search", "budget",
                     "give a budget: --target-{params,active-params,memory-gb,ttft-ms,tpot-ms,throughput} or the same as "
                     "--target-*-ratio of the teacher's value");
  if (c.needs_cost_model() && !target)
    throw InputError("search", "--hardware", "memory, TTFT, TPOT and throughput budgets need --hardware and --workload");
  const ExactCost t = exact_cost(teacher, target);
  std::vector<Budget> out;
  auto add = [&](Metric m, const char* option, double absolute, double scale, double ratio, bool at_least) {
    const std::string ratio_option = std::string(option) + "-ratio";
    if (ratio < 0) throw InputError(ratio_option, fmt(ratio), "must be positive");
    if (ratio > 0 && !at_least && ratio > 1)
      throw InputError(ratio_option, fmt(ratio), "a ratio above 1 asks for a student larger than the teacher");
    if (ratio > 0 && at_least && ratio < 1)
      throw InputError(ratio_option, fmt(ratio), "a throughput ratio below 1 asks for a student slower than the teacher");
    if (absolute < 0) throw InputError(option, fmt(absolute), "must be positive");
    if (absolute > 0) out.push_back({m, option, absolute * scale, t.get(m), at_least});
    if (ratio > 0) out.push_back({m, ratio_option, ratio * t.get(m), t.get(m), at_least});
  };
  const auto& a = c.absolute;
  add(Metric::Params, "--target-params", a.params, 1, c.params_ratio, false);
  add(Metric::ActiveParams, "--target-active-params", a.active_params, 1, c.active_params_ratio, false);
  add(Metric::Memory, "--target-memory-gb", a.memory_gb, 1e9, c.memory_ratio, false);
  add(Metric::Ttft, "--target-ttft-ms", a.ttft_ms, 1e-3, c.ttft_ratio, false);
  add(Metric::Tpot, "--target-tpot-ms", a.tpot_ms, 1e-3, c.tpot_ratio, false);
  add(Metric::Throughput, "--target-throughput", a.throughput, 1, c.throughput_ratio, true);
  return out;
}

// ---- the search space -----------------------------------------------------------------------

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

bool has(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

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

SearchSpace build_space(const model::ArchSpec& t, const ImportanceScores& scores, const EngineProfile* engine,
                        const SpaceOptions& o, const std::string& src) {
  // Every axis, in the order the default space takes them; all but "skip" take --choices.
  static const std::vector<std::string> known = {"hidden", "ffn", "attn_heads", "mamba_heads", "skip", "experts", "expert_ffn", "top_k", "shared_ffn", "latent"};
  static const std::vector<std::string> moe_axes = {"experts", "expert_ffn", "top_k", "shared_ffn", "latent"};
  auto names = [](bool with_skip) {
    std::string n;
    for (const auto& a : known)
      if (with_skip || a != "skip") n += (n.empty() ? "" : " ") + a;
    return n;
  };
  bool any_moe_layer = false, any_shared = false, any_mamba = false, any_latent = false;
  for (const auto& layer : t.layers)
    any_moe_layer = any_moe_layer || layer.moe, any_shared = any_shared || (layer.moe && layer.moe->shared_ffn > 0),
    any_mamba = any_mamba || layer.mamba, any_latent = any_latent || (layer.moe && layer.moe->latent_size > 0);
  // Why an axis has nothing to act on in this teacher ("" when it has): refused when asked for,
  // left out of the default space.
  auto absent = [&](const std::string& a) -> std::string {
    if (a == "latent" && !any_latent) return "the teacher's MoE layers have no latent projection";
    if (a == "mamba_heads" && !any_mamba) return "the teacher has no Mamba layer";
    if (has(moe_axes, a) && !any_moe_layer) return "the teacher has no MoE layer";
    if (a == "shared_ffn" && !any_shared) return "the teacher's MoE layers have no shared expert";
    return "";
  };
  for (const auto& a : o.axes) {
    if (!has(known, a)) throw InputError("--axes", a, "unknown axis (searchable: " + names(true) + ")");
    if (const std::string why = absent(a); !why.empty()) throw InputError("--axes", a, why);
  }
  for (const auto& [a, v] : o.choices) {
    if (!has(known, a) || a == "skip")
      throw InputError("--choices", a, "unknown axis (choices can be given for " + names(false) + ")");
    if (v.empty()) throw InputError("--choices", a, "no values");
  }
  if (o.min_width <= 0 || o.min_width > 1) throw InputError("--min-width", fmt(o.min_width), "must be in (0, 1]");
  if (scores.layers.size() != t.layers.size() || int64_t(scores.hidden.size()) != t.hidden_size)
    throw InputError(src, "layers", "the scores do not describe this teacher (" + std::to_string(scores.layers.size()) +
                                        " layers, hidden " + std::to_string(scores.hidden.size()) + ")");
  const std::string eng = engine ? engine->id : "any engine";
  auto served = [&](const std::string& axis) { return !engine || engine->serves_per_layer(axis); };
  std::vector<std::string> axes = o.axes;
  SearchSpace s;
  s.teacher = t;
  if (axes.empty()) {
    axes.push_back("hidden");
    for (const auto& a : known) {
      if (a == "hidden" || !absent(a).empty()) continue;
      if (served(a)) axes.push_back(a);
      else s.notes.push_back(a + ": held, " + eng + " cannot serve per-layer " + a +
                             (engine && !engine->heterogeneous_format.empty() ? " (" + engine->heterogeneous_format + ")" : ""));
    }
  } else {
    for (const auto& a : axes)
      if (a != "hidden" && !served(a))
        throw InputError("--axes", a, "the engine " + eng + " cannot serve a per-layer " + a +
                                          (engine && !engine->heterogeneous_format.empty() ? " (its format: " + engine->heterogeneous_format + ")"
                                                                                           : " (it lists no heterogeneous format)") +
                                          "; leave the axis out or choose another --engine");
  }
  for (const auto& [a, v] : o.choices)
    if (!has(axes, a)) throw InputError("--choices", a, "the axis is not searched (add it to --axes)");
  const bool skip = has(axes, "skip");
  const int tp = std::max(1, o.tp);
  // Per-layer FFN widths of a Llama-family student must be what the engine's format can write
  // (DeciLM block_configs: multiples of 256); Nemotron-H Puzzle writes any MLP width.
  bool hybrid = t.family == model::ModelFamily::NemotronH;
  for (const auto& layer : t.layers) hybrid = hybrid || layer.mamba || layer.moe;
  const int64_t ffn_multiple = engine && !hybrid ? std::max<int64_t>(1, engine->per_layer_ffn_multiple) : 1;
  if (ffn_multiple > 1 && has(axes, "ffn"))
    s.notes.push_back("ffn: per-layer widths are multiples of " + std::to_string(ffn_multiple) + " (" + eng + "'s per-layer format)");
  const size_t L = t.layers.size();
  s.attn.assign(L, -1);
  s.ffn.assign(L, -1);
  s.mamba.assign(L, -1);
  s.mamba_heads.assign(L, -1);
  s.moe.assign(L, -1);
  s.experts.assign(L, -1);
  s.expert_ffn.assign(L, -1);
  s.top_k.assign(L, -1);
  s.shared_ffn.assign(L, -1);
  s.latent.assign(L, -1);
  // A choice is valid when the teacher with only that change splits over TP.
  auto splits = [&](const std::function<void(model::ArchSpec&)>& edit) {
    model::ArchSpec probe = t;
    edit(probe);
    return model::tp_split_problem(probe, tp).empty();
  };
  auto given = [&](const std::string& axis, int64_t teacher_value, std::vector<int64_t> dflt) {
    auto it = o.choices.find(axis);
    if (it == o.choices.end()) return dflt;
    std::vector<int64_t> v = it->second;
    for (int64_t x : v)
      if (x <= 0 || x > teacher_value)
        throw InputError("--choices", axis + "=" + join(v), std::to_string(x) + " is not in [1, the teacher's " + std::to_string(teacher_value) + "]");
    if (std::find(v.begin(), v.end(), teacher_value) == v.end()) v.push_back(teacher_value);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  };
  if (has(axes, "hidden")) {
    Decision d{"hidden", -1, {}, ranks(scores.hidden, 0, t.hidden_size)};
    d.choices = given("hidden", t.hidden_size, width_grid(t.hidden_size, minitron_divisor(256, t.hidden_size), o.min_width, o.max_choices));
    if (d.choices.size() > 1) {
      s.hidden = int(s.decisions.size());
      s.decisions.push_back(std::move(d));
    }
  }
  bool noted_grouped = false;
  for (size_t l = 0; l < L; ++l) {
    const auto& layer = t.layers[l];
    const auto& sc = scores.layers[l];
    const int li = int(l);
    const std::string where = "layers[" + std::to_string(l) + "]";
    if (layer.attention) {
      const auto& a = *layer.attention;
      const int g = a.num_heads / a.num_kv_heads;
      std::vector<int64_t> per_group;
      if (has(axes, "attn_heads")) {
        std::vector<int64_t> all;
        for (int q = 1; q <= g; ++q) all.push_back(q);
        per_group = given("attn_heads", g, all);
      } else {
        per_group = {g};
      }
      std::vector<int64_t> ok;
      for (int64_t q : per_group) {
        if (splits([&](model::ArchSpec& p) { p.layers[l].attention->num_heads = int(q) * a.num_kv_heads; })) ok.push_back(q);
        else if (o.choices.count("attn_heads"))
          throw InputError("--choices", "attn_heads=" + join(per_group),
                           std::to_string(q) + " heads per group (" + std::to_string(q * a.num_kv_heads) + " heads) do not split over TP " + std::to_string(tp) + " in " + where);
      }
      if (skip) ok.insert(ok.begin(), 0);
      if (ok.size() > 1) {
        if (int64_t(sc.attn_heads.size()) != a.num_heads)
          throw InputError(src, where + ".attn_heads", "has " + std::to_string(sc.attn_heads.size()) + " scores for " + std::to_string(a.num_heads) + " heads");
        Decision d{"attn_heads", li, ok, {}};
        for (int k = 0; k < a.num_kv_heads; ++k)
          for (int64_t r : ranks(sc.attn_heads, int64_t(k) * g, g)) d.rank.push_back(r);
        s.attn[l] = int(s.decisions.size());
        s.decisions.push_back(std::move(d));
      }
    }
    if (layer.mlp) {
      const int64_t F = layer.mlp->ffn_size;
      std::vector<int64_t> widths = has(axes, "ffn") ? given("ffn", F, width_grid(F, minitron_divisor(512, F), o.min_width, o.max_choices))
                                                      : std::vector<int64_t>{F};
      std::vector<int64_t> ok;
      for (int64_t f : widths) {
        if (f != F && f % ffn_multiple != 0) {  // a width the engine's per-layer format cannot write
          if (o.choices.count("ffn"))
            throw InputError("--choices", "ffn=" + join(widths), std::to_string(f) + " is not a multiple of " + std::to_string(ffn_multiple) +
                                                                    ", which " + eng + " needs for per-layer FFN widths (its heterogeneous.ffn_multiple)");
          continue;
        }
        if (splits([&](model::ArchSpec& p) { p.layers[l].mlp->ffn_size = f; })) ok.push_back(f);
        else if (o.choices.count("ffn"))
          throw InputError("--choices", "ffn=" + join(widths), std::to_string(f) + " does not split over TP " + std::to_string(tp) + " in " + where);
      }
      if (skip) ok.insert(ok.begin(), 0);
      if (ok.size() > 1) {
        if (int64_t(sc.mlp_neurons.size()) != F)
          throw InputError(src, where + ".mlp_neurons", "has " + std::to_string(sc.mlp_neurons.size()) + " scores for " + std::to_string(F) + " neurons");
        s.ffn[l] = int(s.decisions.size());
        s.decisions.push_back({"ffn", li, ok, ranks(sc.mlp_neurons, 0, F)});
      }
    }
    if (layer.mamba && skip) {
      s.mamba[l] = int(s.decisions.size());
      s.decisions.push_back({"mamba", li, {0, 1}, {0}});
    }
    if (layer.mamba && has(axes, "mamba_heads")) {
      // Heads per group (B and C are per group, so every group keeps the same number of heads,
      // its best ones, as prune does); the head dim is held.
      const auto& m = *layer.mamba;
      const int64_t G = m.n_groups, R = m.num_heads / G;
      const std::vector<int64_t> want = given("mamba_heads", R, width_grid(R, 1, o.min_width, o.max_choices));
      std::vector<int64_t> ok;
      for (int64_t r : want) {
        if (splits([&](model::ArchSpec& p) { p.layers[l].mamba->num_heads = int(r * G); })) ok.push_back(r);
        else if (o.choices.count("mamba_heads"))
          throw InputError("--choices", "mamba_heads=" + join(want),
                           std::to_string(r) + " heads per group (" + std::to_string(r * G) + " heads) do not split over TP " + std::to_string(tp) + " in " + where);
      }
      if (ok.size() > 1) {
        if (int64_t(sc.mamba_heads.size()) != m.num_heads)
          throw InputError(src, where + ".mamba_heads", "has " + std::to_string(sc.mamba_heads.size()) + " scores for " + std::to_string(m.num_heads) + " heads");
        Decision d{"mamba_heads", li, ok, {}};
        for (int64_t g = 0; g < G; ++g)
          for (int64_t r : ranks(sc.mamba_heads, g * R, R)) d.rank.push_back(r);
        s.mamba_heads[l] = int(s.decisions.size());
        s.decisions.push_back(std::move(d));
      }
    }
    if (layer.moe && skip) {
      s.moe[l] = int(s.decisions.size());
      s.decisions.push_back({"moe", li, {0, 1}, {0}});
    }
    if (layer.moe) {
      const auto& m = *layer.moe;
      const bool grouped = m.n_group > 1;  // grouped routing: the expert count is tied to the groups
      // One MoE axis: its choices (the default grid or --choices, kept where they give a valid
      // layer that splits over TP), and its decision when more than one is left.
      auto moe_axis = [&](const std::string& axis, int64_t teacher_value, int64_t divisor, int64_t min_value,
                          const std::function<void(model::MoeSpec&, int64_t)>& set, std::vector<int64_t> rank, std::vector<int>& slot) {
        if (!has(axes, axis)) return;
        const std::vector<int64_t> want = given(axis, teacher_value, width_grid(teacher_value, divisor, o.min_width, o.max_choices));
        std::vector<int64_t> ok;
        for (int64_t x : want) {
          const bool valid = x >= min_value && splits([&](model::ArchSpec& p) { set(*p.layers[l].moe, x); });
          if (valid) ok.push_back(x);
          else if (o.choices.count(axis))
            throw InputError("--choices", axis + "=" + join(want), std::to_string(x) + " is not valid in " + where +
                                                                     (x < min_value ? " (below " + std::to_string(min_value) + ")" : " (does not split over TP " + std::to_string(tp) + ")"));
        }
        if (ok.size() < 2) return;
        slot[l] = int(s.decisions.size());
        s.decisions.push_back({axis, li, ok, std::move(rank)});
      };
      auto sized = [&](const std::vector<double>& v, size_t n, const std::string& field) {
        if (v.size() != n)
          throw InputError(src, where + "." + field, "has " + std::to_string(v.size()) + " scores for " + std::to_string(n) + " units");
        return v;
      };
      if (grouped && (has(axes, "experts") || has(axes, "top_k")) && !noted_grouped) {
        s.notes.push_back("experts / top-k: held in MoE layers with grouped routing (n_group > 1: the expert count is tied to the groups)");
        noted_grouped = true;
      }
      if (!grouped && has(axes, "experts")) {
        const auto sc_e = sized(sc.moe_experts, size_t(m.num_experts), "moe_experts");
        // At least the teacher's top_k experts stay, so every top_k choice stays valid.
        moe_axis("experts", m.num_experts, minitron_divisor(8, m.num_experts), m.top_k,
                 [](model::MoeSpec& x, int64_t v) { x.num_experts = int(v); }, ranks(sc_e, 0, m.num_experts), s.experts);
      }
      if (has(axes, "expert_ffn")) {
        // Each expert keeps its own best neurons, as prune does.
        std::vector<int64_t> rank;
        if (o.unit_ranks) {
          const auto& sc_n = sized(sc.moe_expert_neurons, size_t(m.num_experts) * size_t(m.expert_ffn), "moe_expert_neurons");
          rank.reserve(sc_n.size());
          for (int64_t e = 0; e < m.num_experts; ++e)
            for (int64_t r : ranks(sc_n, e * m.expert_ffn, m.expert_ffn)) rank.push_back(r);
        }
        moe_axis("expert_ffn", m.expert_ffn, minitron_divisor(128, m.expert_ffn), 1,
                 [](model::MoeSpec& x, int64_t v) { x.expert_ffn = v; }, std::move(rank), s.expert_ffn);
      }
      if (!grouped && has(axes, "top_k")) {
        std::vector<int64_t> slots(size_t(m.top_k));
        std::iota(slots.begin(), slots.end(), 0);
        moe_axis("top_k", m.top_k, 1, 1, [](model::MoeSpec& x, int64_t v) { x.top_k = int(v); }, slots, s.top_k);
      }
      if (m.shared_ffn > 0 && has(axes, "shared_ffn")) {
        // The shared expert keeps its best neurons, as prune does (it runs on every token, like a
        // dense MLP; no choice 0: the layer keeps its shared expert).
        std::vector<int64_t> rank;
        if (o.unit_ranks) rank = ranks(sized(sc.moe_shared_neurons, size_t(m.shared_ffn), "moe_shared_neurons"), 0, m.shared_ffn);
        moe_axis("shared_ffn", m.shared_ffn, minitron_divisor(128, m.shared_ffn), 1,
                 [](model::MoeSpec& x, int64_t v) { x.shared_ffn = v; }, std::move(rank), s.shared_ffn);
      }
      if (m.latent_size > 0 && has(axes, "latent")) {
        // The latent channels the routed experts read (fc1_latent_proj's rows) and write
        // (fc2_latent_proj's columns), the best kept, as prune does.
        moe_axis("latent", m.latent_size, minitron_divisor(128, m.latent_size), 1,
                 [](model::MoeSpec& x, int64_t v) { x.latent_size = v; },
                 ranks(sized(sc.moe_latent, size_t(m.latent_size), "moe_latent"), 0, m.latent_size), s.latent);
      }
    }
  }
  if (any_mamba) s.notes.push_back("mamba head dim: held (the search varies the Mamba heads per group where the engine serves them, not the head dim)");
  if (s.decisions.empty())
    throw InputError("--axes", axes.empty() ? "(default)" : axes[0], "leaves nothing to search for this teacher on " + eng);
  return s;
}

// ---- discretize and repair ------------------------------------------------------------------

namespace {

struct Evaluated {
  ExactCost cost;
  double violation = 0;  // sum of positive violations, +1 when it does not fit
  bool ok() const { return violation <= 0; }
};

Evaluated evaluate(const SearchSpace& space, const std::vector<int>& pick, const std::vector<Budget>& budgets, const CostTarget* target) {
  Evaluated e;
  e.cost = exact_cost(space.spec(pick), target);
  for (const auto& b : budgets) e.violation += std::max(0.0, violation(b, e.cost.get(b.metric)));
  if (!e.cost.fits) e.violation += 1.0;
  return e;
}

std::string move_text(const SearchSpace& s, int d, int from, int to) {
  const Decision& x = s.decisions[size_t(d)];
  const std::string where = x.layer < 0 ? x.axis : "layers[" + std::to_string(x.layer) + "]." + x.axis;
  return where + " " + std::to_string(x.choices[size_t(from)]) + " -> " + std::to_string(x.choices[size_t(to)]);
}

double use_of(const Budget& b, double x) { return b.at_least ? b.value / std::max(x, 1e-30) : x / b.value; }

}  // namespace

void check_reachable(const SearchSpace& space, const std::vector<Budget>& budgets, const CostTarget* target) {
  const auto pick = space.smallest_pick();
  const ExactCost c = exact_cost(space.spec(pick), target);
  for (const auto& b : budgets) {
    if (violation(b, c.get(b.metric)) > 0) {
      throw InputError(b.option, shown_text(b.metric, b.value),
                       std::string(b.at_least ? "above the largest" : "below the smallest") + " reachable value: the " +
                           (b.at_least ? "fastest" : "smallest") + " architecture of the search space (every searched axis at its smallest choice) has " +
                           shown_text(b.metric, c.get(b.metric)) + " (the teacher: " + shown_text(b.metric, b.teacher) + ")");
    }
  }
  if (target && !c.fits)
    throw InputError("--hardware", target->hardware.id, "even the smallest architecture of the search space does not fit: " + c.problem);
}

RepairResult repair(const SearchSpace& space, std::vector<int> pick, const std::vector<std::vector<double>>& lp,
                    const std::vector<Budget>& budgets, const CostTarget* target) {
  RepairResult r;
  Evaluated cur = evaluate(space, pick, budgets, target);
  const size_t D = space.decisions.size();
  // Remove: one step down at a time until every budget holds.
  for (int guard = 0; !cur.ok(); ++guard) {
    if (guard > 100000) throw std::runtime_error("search repair: no progress");
    int best = -1;
    double best_score = std::numeric_limits<double>::infinity();
    Evaluated best_eval;
    for (size_t d = 0; d < D; ++d) {
      if (pick[d] == 0) continue;
      std::vector<int> p = pick;
      --p[d];
      Evaluated e = evaluate(space, p, budgets, target);
      // Violation removed, counted on the budgets exceeded now (continuous, also below 0).
      double gain = 0;
      for (const auto& b : budgets) {
        const double before = violation(b, cur.cost.get(b.metric));
        if (before > 0) gain += before - violation(b, e.cost.get(b.metric));
      }
      if (!cur.cost.fits) gain += (e.cost.fits ? 1.0 : 0.0) + 1e-12 * (cur.cost.memory_bytes - e.cost.memory_bytes);
      const double loss = std::max(0.0, lp[d][size_t(pick[d])] - lp[d][size_t(pick[d] - 1)]) + 1e-3;
      const double score = gain > 0 ? loss / gain : std::numeric_limits<double>::max() / 2 + loss;
      if (score < best_score) best_score = score, best = int(d), best_eval = e;
    }
    if (best < 0) throw std::runtime_error("search repair: every decision is at its smallest choice and a budget still fails");
    r.steps.push_back({"remove", best, space.decisions[size_t(best)].choices[size_t(pick[size_t(best)])],
                       space.decisions[size_t(best)].choices[size_t(pick[size_t(best)] - 1)], move_text(space, best, pick[size_t(best)], pick[size_t(best)] - 1)});
    --pick[size_t(best)];
    cur = best_eval;
  }
  // Give back: one step up at a time while every budget still holds; the move the search's
  // logits favour most first (ties: the one that uses the least budget).
  for (int guard = 0;; ++guard) {
    if (guard > 100000) break;
    int best = -1;
    double best_gain = -std::numeric_limits<double>::infinity(), best_use = 0;
    Evaluated best_eval;
    // The gain of a move needs no cost model, so moves are tried in order of gain: the first
    // that holds every budget sets the best gain, and only moves tied with it (for the least
    // budget used) are evaluated after it.
    std::vector<std::pair<double, size_t>> order;
    for (size_t d = 0; d < D; ++d)
      if (pick[d] + 1 < int(space.decisions[d].choices.size()))
        order.push_back({lp[d][size_t(pick[d] + 1)] - lp[d][size_t(pick[d])], d});
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [gain, d] : order) {
      if (best >= 0 && gain < best_gain - 1e-12) break;
      std::vector<int> p = pick;
      ++p[d];
      Evaluated e = evaluate(space, p, budgets, target);
      if (!e.ok()) continue;
      double use = 0;
      for (const auto& b : budgets) use = std::max(use, use_of(b, e.cost.get(b.metric)) - use_of(b, cur.cost.get(b.metric)));
      if (best < 0 || gain > best_gain + 1e-12 || (std::abs(gain - best_gain) <= 1e-12 && (use < best_use || (use == best_use && int(d) < best))))
        best = int(d), best_gain = gain, best_use = use, best_eval = e;
    }
    if (best < 0) break;
    r.steps.push_back({"give back", best, space.decisions[size_t(best)].choices[size_t(pick[size_t(best)])],
                       space.decisions[size_t(best)].choices[size_t(pick[size_t(best)] + 1)], move_text(space, best, pick[size_t(best)], pick[size_t(best)] + 1)});
    ++pick[size_t(best)];
    cur = best_eval;
  }
  r.pick = pick;
  r.cost = cur.cost;
  for (size_t i = 0; i < budgets.size(); ++i) {
    const double u = use_of(budgets[i], cur.cost.get(budgets[i].metric));
    if (r.binding < 0 || u > r.binding_use) r.binding = int(i), r.binding_use = u;
  }
  if (r.binding >= 0 && r.binding_use < 0.95) {
    if (pick == space.teacher_pick()) {
      r.slack_reason = "every searched axis is at the teacher's value (the teacher itself meets the budgets)";
    } else {
      // The smallest step up and what it would break.
      double least = std::numeric_limits<double>::infinity();
      std::string why;
      for (size_t d = 0; d < D; ++d) {
        if (pick[d] + 1 >= int(space.decisions[d].choices.size())) continue;
        std::vector<int> p = pick;
        ++p[d];
        Evaluated e = evaluate(space, p, budgets, target);
        for (const auto& b : budgets) {
          const double v = violation(b, e.cost.get(b.metric));
          if (v > 0 && v < least) least = v, why = move_text(space, int(d), pick[d], pick[d] + 1) + " would exceed " + b.option + " by " + fmt(100 * v, 3) + "%";
        }
        if (!e.cost.fits && why.empty()) why = move_text(space, int(d), pick[d], pick[d] + 1) + " would not fit: " + e.cost.problem;
      }
      r.slack_reason = "the choice grid stops the give-back: the smallest step up, " + why;
    }
  }
  return r;
}

// ---- soft cost and masks --------------------------------------------------------------------

namespace {

// The expected value of decision d's choice under its probabilities.
torch::Tensor expected_choice(const SearchSpace& s, const std::vector<torch::Tensor>& probs, int d) {
  return expected_value(probs[size_t(d)], torch::tensor(s.decisions[size_t(d)].choices, torch::kFloat64));
}

// Every decision's choice probabilities as one flat vector (decision d at offset[d]): one softmax
// over the [decisions, most choices] matrix of logits, padded with -inf.
class FlatSoftmax {
 public:
  explicit FlatSoftmax(const SearchSpace& s) {
    int64_t cmax = 1, n = 0;
    for (const auto& d : s.decisions) cmax = std::max<int64_t>(cmax, int64_t(d.choices.size()));
    const int64_t D = int64_t(s.decisions.size());
    std::vector<int64_t> gather(size_t(D * cmax), 0), valid;
    std::vector<uint8_t> pad(size_t(D * cmax), 1);
    for (int64_t d = 0; d < D; ++d) {
      const int64_t c = int64_t(s.decisions[size_t(d)].choices.size());
      for (int64_t j = 0; j < c; ++j) {
        gather[size_t(d * cmax + j)] = n + j;
        pad[size_t(d * cmax + j)] = 0;
        valid.push_back(d * cmax + j);
      }
      n += c;
    }
    rows_ = D, cols_ = cmax;
    gather_ = torch::tensor(gather, torch::kLong);
    valid_ = torch::tensor(valid, torch::kLong);
    pad_ = torch::tensor(std::vector<int64_t>(pad.begin(), pad.end()), torch::kLong).to(torch::kBool).view({D, cmax});
  }
  torch::Tensor operator()(const torch::Tensor& theta) const {
    torch::Tensor x = theta.index_select(0, gather_).view({rows_, cols_}).masked_fill(pad_, -std::numeric_limits<double>::infinity());
    return torch::softmax(x, 1).reshape({-1}).index_select(0, valid_);
  }

 private:
  int64_t rows_ = 0, cols_ = 0;
  torch::Tensor gather_, valid_, pad_;
};

// The expected cost of a distribution over the space: per-layer expected dimensions on the
// differentiable cost model, mixed exactly over the hidden-width choices (the formulas are not
// linear in the hidden width, so E[cost] is taken over it, not cost(E[h])). Every hidden width is
// evaluated at once ([widths, layers] tensors), and each axis's per-layer expectations are one
// gather over the flat probabilities: a few dozen tensor operations per step whatever the depth
// (docs/benchmarks.md, the cost model's share of a search step).
class SoftCostFn {
 public:
  SoftCostFn(const SearchSpace& s, const CostTarget& target)
      : s_(s),
        model_(s.teacher, target.hardware, target.engine, target.workload,
               s.hidden >= 0 ? s.decisions[size_t(s.hidden)].choices : std::vector<int64_t>{s.teacher.hidden_size}) {
    const auto& t = s.teacher;
    const size_t L = t.layers.size();
    std::vector<int64_t> offset(s.decisions.size() + 1, 0);
    for (size_t d = 0; d < s.decisions.size(); ++d) offset[d + 1] = offset[d] + int64_t(s.decisions[d].choices.size());
    if (s.hidden >= 0) hidden_offset_ = offset[size_t(s.hidden)];
    std::vector<double> heads(L, 1.0), ffn(L, 1.0), kv(L, 1.0), experts(L, 1.0), top_k(L, 1.0), expert_ffn(L, 1.0), shared(L, 0.0);
    std::vector<double> m_heads(L, 1.0), m_groups(L, 1.0), latent(L, 0.0);
    for (size_t l = 0; l < L; ++l) {
      const auto& x = t.layers[l];
      if (x.attention) heads[l] = double(x.attention->num_heads), kv[l] = double(x.attention->num_kv_heads);
      if (x.mlp) ffn[l] = double(x.mlp->ffn_size);
      if (x.mamba) m_heads[l] = double(x.mamba->num_heads), m_groups[l] = double(x.mamba->n_groups);
      if (x.moe)
        experts[l] = double(x.moe->num_experts), top_k[l] = double(x.moe->top_k), expert_ffn[l] = double(x.moe->expert_ffn),
        shared[l] = double(x.moe->shared_ffn), latent[l] = double(x.moe->latent_size);
    }
    auto group = [&](const std::vector<int>& per_layer, const std::vector<double>& scale, const std::vector<double>& base) {
      Group g;
      std::vector<int64_t> layers, first;
      std::vector<double> zero, b;
      std::vector<std::vector<int64_t>> idx;
      std::vector<std::vector<double>> val;
      size_t cmax = 1;
      for (size_t l = 0; l < L; ++l) {
        const int d = per_layer[l];
        if (d < 0) continue;
        const Decision& x = s.decisions[size_t(d)];
        layers.push_back(int64_t(l));
        first.push_back(offset[size_t(d)]);
        zero.push_back(x.choices[0] == 0 ? 1.0 : 0.0);
        b.push_back(base[l]);
        idx.emplace_back();
        val.emplace_back();
        for (size_t c = 0; c < x.choices.size(); ++c) {
          idx.back().push_back(offset[size_t(d)] + int64_t(c));
          val.back().push_back(double(x.choices[c]) * scale[l]);
        }
        cmax = std::max(cmax, x.choices.size());
      }
      g.n = int64_t(layers.size());
      if (g.n == 0) return g;
      std::vector<int64_t> fi;
      std::vector<double> fv;
      for (size_t r = 0; r < idx.size(); ++r)
        for (size_t c = 0; c < cmax; ++c) {
          fi.push_back(c < idx[r].size() ? idx[r][c] : idx[r][0]);
          fv.push_back(c < val[r].size() ? val[r][c] : 0.0);  // padding weighs nothing
        }
      g.layers = torch::tensor(layers, torch::kLong);
      g.first = torch::tensor(first, torch::kLong);
      g.second = g.first + 1;
      g.idx = torch::tensor(fi, torch::kLong);
      g.val = torch::tensor(fv, torch::kFloat64).view({g.n, int64_t(cmax)});
      g.zero = torch::tensor(zero, torch::kFloat64);
      g.base = torch::tensor(b, torch::kFloat64);
      return g;
    };
    const std::vector<double> ones(L, 1.0);
    attn_ = group(s.attn, kv, heads);
    ffn_ = group(s.ffn, ones, ffn);
    mamba_ = group(s.mamba, ones, ones);
    mamba_heads_ = group(s.mamba_heads, m_groups, m_heads);
    moe_ = group(s.moe, ones, ones);
    experts_ = group(s.experts, ones, experts);
    top_k_ = group(s.top_k, ones, top_k);
    expert_ffn_ = group(s.expert_ffn, ones, expert_ffn);
    shared_ffn_ = group(s.shared_ffn, ones, shared);
    latent_ = group(s.latent, ones, latent);
    base_heads_ = torch::tensor(heads, torch::kFloat64);
    base_m_heads_ = torch::tensor(m_heads, torch::kFloat64);
    base_ffn_ = torch::tensor(ffn, torch::kFloat64);
    base_experts_ = torch::tensor(experts, torch::kFloat64);
    base_top_k_ = torch::tensor(top_k, torch::kFloat64);
    base_expert_ffn_ = torch::tensor(expert_ffn, torch::kFloat64);
    base_shared_ffn_ = torch::tensor(shared, torch::kFloat64);
    base_latent_ = torch::tensor(latent, torch::kFloat64);
    ones_ = torch::ones({int64_t(L)}, torch::kFloat64);
    reserved_ = target.engine.cuda_graph_bytes + target.engine.non_torch_bytes;
    conc_ = double(std::max<int64_t>(1, target.workload.concurrency));
  }

  // p: every decision's probabilities, flat ([sum of choices] float64, FlatSoftmax's order).
  // Returns per metric the expected value (0-dim).
  std::vector<torch::Tensor> operator()(const torch::Tensor& p) const {
    // Per row of a group: the expected choice (scaled), and P(choice 0) where 0 is a choice.
    auto expected = [&](const Group& g) { return (p.index_select(0, g.idx).view(g.val.sizes()) * g.val).sum(1); };
    // A sublayer's keep probability and its expected width given kept, scattered over the layers.
    auto keep_and_width = [&](const Group& g, const torch::Tensor& base, torch::Tensor& keep, torch::Tensor& width) {
      const torch::Tensor k = 1.0 - g.zero * p.index_select(0, g.first);
      const torch::Tensor w = torch::where(k > 1e-6, expected(g) / k.clamp_min(1e-6), g.base);
      keep = ones_.index_copy(0, g.layers, k);
      width = base.index_copy(0, g.layers, w);
    };
    SoftDims d;
    if (attn_.n) keep_and_width(attn_, base_heads_, d.attn_keep, d.heads);
    if (ffn_.n) keep_and_width(ffn_, base_ffn_, d.mlp_keep, d.ffn);
    if (mamba_.n) d.mamba_keep = ones_.index_copy(0, mamba_.layers, p.index_select(0, mamba_.second));
    if (mamba_heads_.n) d.mamba_heads = base_m_heads_.index_copy(0, mamba_heads_.layers, expected(mamba_heads_));
    if (moe_.n) d.moe_keep = ones_.index_copy(0, moe_.layers, p.index_select(0, moe_.second));
    if (experts_.n || top_k_.n || expert_ffn_.n || shared_ffn_.n || latent_.n) {
      auto dim = [&](const Group& g, const torch::Tensor& base) { return g.n ? base.index_copy(0, g.layers, expected(g)) : base; };
      d.experts = dim(experts_, base_experts_), d.top_k = dim(top_k_, base_top_k_), d.expert_ffn = dim(expert_ffn_, base_expert_ffn_);
      d.shared_ffn = dim(shared_ffn_, base_shared_ffn_), d.latent = dim(latent_, base_latent_);
    }
    const SoftCost c = model_(d);  // [widths] each
    const torch::Tensor w = s_.hidden >= 0 ? p.narrow(0, hidden_offset_, model_.num_widths()) : torch::ones({1}, torch::kFloat64);
    const torch::Tensor mem = c.weight_bytes + c.activation_bytes + reserved_ + conc_ * c.bytes_per_seq;
    const torch::Tensor m[6] = {c.params, c.active_params, mem, c.ttft_s, c.tpot_s, c.throughput_tok_s};
    std::vector<torch::Tensor> out;
    for (const auto& x : m) out.push_back((w * x).sum());
    return out;
  }

 private:
  // The decisions of one axis: their layers, flat indices [n * most choices] (padding repeats the
  // first), choice values [n, most choices] (padding 0), P(choice 0) index and whether 0 is a
  // choice, the teacher's value where the expectation is undefined (nothing kept).
  struct Group {
    int64_t n = 0;
    torch::Tensor layers, first, second, idx, val, zero, base;
  };
  const SearchSpace& s_;
  DifferentiableCostModel model_;
  int64_t hidden_offset_ = 0;
  Group attn_, ffn_, mamba_, mamba_heads_, moe_, experts_, top_k_, expert_ffn_, shared_ffn_, latent_;
  torch::Tensor base_heads_, base_m_heads_, base_ffn_, base_experts_, base_top_k_, base_expert_ffn_, base_shared_ffn_, base_latent_, ones_;
  double reserved_ = 0, conc_ = 1;
};

// quality_proxy() over tensors (autograd reaches the probabilities).
torch::Tensor proxy_tensor(const SearchSpace& s, const std::vector<torch::Tensor>& probs, double w) {
  auto frac = [&](int d, double teacher_value) {
    return d >= 0 ? expected_choice(s, probs, d) / teacher_value : torch::ones({}, torch::kFloat64);
  };
  const auto& t = s.teacher;
  torch::Tensor sum = torch::zeros({}, torch::kFloat64);
  int n = 0;
  for (size_t l = 0; l < t.layers.size(); ++l) {
    const auto& L = t.layers[l];
    if (L.attention) sum = sum + frac(s.attn[l], double(L.attention->num_heads / L.attention->num_kv_heads)), ++n;
    if (L.mlp) sum = sum + frac(s.ffn[l], double(L.mlp->ffn_size)), ++n;
    if (L.mamba) sum = sum + frac(s.mamba[l], 1.0) * frac(s.mamba_heads[l], double(L.mamba->num_heads / L.mamba->n_groups)), ++n;
    if (L.moe) {
      const auto& m = *L.moe;
      const torch::Tensor routed = frac(s.expert_ffn[l], double(m.expert_ffn)) *
                                   frac(s.latent[l], double(m.latent_size)) *
                                   (w * frac(s.experts[l], double(m.num_experts)) + (1.0 - w) * frac(s.top_k[l], double(m.top_k)));
      // The shared expert's share of the layer's active FFN width in the teacher.
      const double sh = double(m.shared_ffn) / double(m.shared_ffn + int64_t(m.top_k) * m.expert_ffn);
      sum = sum + frac(s.moe[l], 1.0) * ((1.0 - sh) * routed + sh * frac(s.shared_ffn[l], double(m.shared_ffn)));
      ++n;
    }
  }
  return frac(s.hidden, double(t.hidden_size)) * sum / double(std::max(1, n));
}

// The soft masks of one sample, applied to the teacher's forward (model/layers/observer.h).
class SearchMasks : public model::ActivationObserver {
 public:
  torch::Tensor hidden;                                   // [hidden] or undefined
  std::vector<torch::Tensor> heads, ffn, mixer, channel;  // per layer: this rank's o_proj-input / down-input mask, sublayer gates
  // Per MoE layer: the experts decision's sets of kept experts [C, E] and their weights [C], the
  // top-k decision's slot prefixes [C', top_k] and weights [C'] (the routing's expectation over
  // them), each expert's FFN mask [E, expert_ffn].
  std::vector<torch::Tensor> expert_sets, expert_weights, slot_sets, slot_weights, expert_ffn;
  std::vector<torch::Tensor> shared;  // per MoE layer: this rank's shared-expert down-input mask
  std::vector<torch::Tensor> mamba_y;  // per Mamba layer: this rank's mask of the SSM output, per channel
  std::vector<torch::Tensor> latent;   // per latent MoE layer: the latent channels' mask (in and out)
  void activation(int, model::ObservePoint, const at::Tensor&) override {}
  void expert(int, int64_t, const at::Tensor&, const at::Tensor&, const at::Tensor&) override {}
  void modify(int layer, model::ObservePoint p, at::Tensor& x) override {
    using P = model::ObservePoint;
    auto mul = [&](const torch::Tensor& m) {
      if (m.defined()) x = x * m.to(x.scalar_type());
    };
    switch (p) {
      case P::EmbedOut: mul(hidden); break;
      case P::MixerOut: mul(mixer[size_t(layer)]), mul(hidden); break;
      case P::FfnOut: mul(channel[size_t(layer)]), mul(hidden); break;
      case P::AttnOProjInput: mul(heads[size_t(layer)]); break;
      case P::MlpDownInput: mul(ffn[size_t(layer)]); break;
      case P::SharedDownInput: mul(shared[size_t(layer)]); break;
      case P::MambaY: mul(mamba_y[size_t(layer)]); break;
      case P::MoeLatent:
      case P::MoeLatentOut: mul(latent[size_t(layer)]); break;
      default: break;
    }
  }
  void modify_routing(int layer, at::Tensor& sets, at::Tensor& weights, at::Tensor& slots, at::Tensor& slot_w) override {
    sets = expert_sets[size_t(layer)], weights = expert_weights[size_t(layer)];
    slots = slot_sets[size_t(layer)], slot_w = slot_weights[size_t(layer)];
  }
  void modify_expert(int layer, int64_t e, at::Tensor& x) override {
    const auto& m = expert_ffn[size_t(layer)];
    if (m.defined()) x = x * m[e].to(x.scalar_type());
  }

  // The masks of one sample `y` (per decision, [choices] weights; `prefix`: prefix_matrix of
  // each decision) for TP rank `tp_rank` of `tp_size`, on `dev`. Their gradient flows back to y.
  void set(const SearchSpace& space, const std::vector<torch::Tensor>& prefix, const std::vector<torch::Tensor>& y,
           int64_t tp_rank, int64_t tp_size, const torch::Device& dev) {
    const model::ArchSpec& t = space.teacher;
    const size_t L = t.layers.size();
    for (auto* v : {&heads, &ffn, &mixer, &channel, &expert_sets, &expert_weights, &slot_sets, &slot_weights, &expert_ffn, &shared, &mamba_y, &latent})
      v->assign(L, {});
    hidden = torch::Tensor();
    auto unit_mask = [&](int d) { return torch::matmul(y[size_t(d)].to(torch::kFloat32), prefix[size_t(d)]).to(dev); };
    // This rank's contiguous block of units split over TP (heads, FFN and shared-expert neurons).
    auto local = [&](int d) {
      const torch::Tensor m = unit_mask(d);
      const int64_t n = m.size(0) / tp_size;
      return m.narrow(0, tp_rank * n, n);
    };
    if (space.hidden >= 0) hidden = unit_mask(space.hidden);
    for (size_t l = 0; l < L; ++l) {
      if (space.attn[l] >= 0) heads[l] = local(space.attn[l]).repeat_interleave(t.layers[l].attention->head_dim);
      if (space.ffn[l] >= 0) ffn[l] = local(space.ffn[l]);
      if (space.mamba[l] >= 0) mixer[l] = y[size_t(space.mamba[l])][1].to(dev, torch::kFloat32);
      if (space.mamba_heads[l] >= 0) mamba_y[l] = local(space.mamba_heads[l]).repeat_interleave(t.layers[l].mamba->head_dim);
      if (space.moe[l] >= 0) channel[l] = y[size_t(space.moe[l])][1].to(dev, torch::kFloat32);
      // The routing takes the choices' sets with their weights (an exact expectation: a soft
      // per-expert mask would stop routing to a fading expert and so lose its gradient).
      if (space.experts[l] >= 0) {
        expert_sets[l] = prefix[size_t(space.experts[l])].to(dev);
        expert_weights[l] = y[size_t(space.experts[l])].to(dev, torch::kFloat32);
      }
      if (space.top_k[l] >= 0) {
        slot_sets[l] = prefix[size_t(space.top_k[l])].to(dev);
        slot_weights[l] = y[size_t(space.top_k[l])].to(dev, torch::kFloat32);
      }
      // Routed experts are whole on the rank that holds them: global expert ids index the masks.
      if (space.expert_ffn[l] >= 0) expert_ffn[l] = unit_mask(space.expert_ffn[l]).view({t.layers[l].moe->num_experts, -1});
      // The latent space is whole on every rank (the experts' partial sums are masked before
      // fc2_latent_proj).
      if (space.latent[l] >= 0) latent[l] = unit_mask(space.latent[l]);
      // The shared expert is split over TP like a dense MLP.
      if (space.shared_ffn[l] >= 0) shared[l] = local(space.shared_ffn[l]);
    }
  }
};

// Per decision the [choices, units] matrix of prefix masks: M[c, j] = 1 when rank_j < choices[c].
torch::Tensor prefix_matrix(const Decision& d) {
  const int64_t C = int64_t(d.choices.size()), U = int64_t(d.rank.size());
  auto r = torch::tensor(d.rank, torch::kLong).unsqueeze(0).expand({C, U});
  auto c = torch::tensor(d.choices, torch::kLong).unsqueeze(1).expand({C, U});
  return (r < c).to(torch::kFloat32);
}

}  // namespace

std::unique_ptr<model::ActivationObserver> search_masks(const SearchSpace& space, const std::vector<std::vector<double>>& probs,
                                                        int tp_rank, int tp_size) {
  if (probs.size() != space.decisions.size()) throw std::invalid_argument("search_masks: one probability vector per decision");
  std::vector<torch::Tensor> prefix, y;
  for (size_t d = 0; d < probs.size(); ++d) {
    prefix.push_back(prefix_matrix(space.decisions[d]));
    y.push_back(torch::tensor(probs[d], torch::kFloat64));
  }
  auto m = std::make_unique<SearchMasks>();
  m->set(space, prefix, y, tp_rank, tp_size, torch::kCPU);
  return m;
}

double quality_proxy(const SearchSpace& space, const std::vector<std::vector<double>>& probs, double experts_weight) {
  std::vector<torch::Tensor> p;
  for (const auto& v : probs) p.push_back(torch::tensor(v, torch::kFloat64));
  return proxy_tensor(space, p, experts_weight).item<double>();
}

std::vector<double> expected_cost(const SearchSpace& space, const CostTarget& target, const std::vector<std::vector<double>>& probs) {
  const SoftCostFn f(space, target);
  std::vector<double> flat;
  for (const auto& v : probs) flat.insert(flat.end(), v.begin(), v.end());
  std::vector<double> out;
  for (const auto& t : f(torch::tensor(flat, torch::kFloat64))) out.push_back(t.item<double>());
  return out;
}

// ---- the search loop ------------------------------------------------------------------------

namespace {

struct State {
  torch::Tensor theta, m, v, lambda;  // flat logits [sum C], Adam moments, multipliers [budgets]
  int64_t step = 0, adam_steps = 0;
};

json budgets_json(const std::vector<Budget>& budgets) {
  json j = json::array();
  for (const auto& b : budgets)
    j.push_back({{"metric", metric_name(b.metric)}, {"option", b.option}, {"limit", shown(b.metric, b.value)},
                 {"teacher", shown(b.metric, b.teacher)}, {"at_least", b.at_least}});
  return j;
}

json cost_json(const ExactCost& c, const std::vector<Budget>& budgets) {
  json j = {{"params", c.params}, {"active_params", c.active_params}, {"fits", c.fits}};
  if (c.memory_bytes > 0 || c.ttft_s > 0) {
    j["memory_gb"] = c.memory_bytes / 1e9;
    j["ttft_ms"] = c.ttft_s * 1e3;
    j["tpot_ms"] = c.tpot_s * 1e3;
    j["throughput"] = c.throughput_tok_s;
  }
  json per = json::array();
  for (const auto& b : budgets)
    per.push_back({{"option", b.option}, {"value", shown(b.metric, c.get(b.metric))}, {"limit", shown(b.metric, b.value)},
                   {"meets", violation(b, c.get(b.metric)) <= 1e-12}});
  j["budgets"] = per;
  return j;
}

}  // namespace

DasResult run_search(const DasOptions& o, const ImportanceScores& scores, MPI_Comm world,
                     const std::function<void(const json&)>& on_layout) {
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  if (o.out.empty() && !o.check_only) throw InputError("--out", "value", "an output directory is required");
  if (o.data.empty() && !o.check_only && !o.cost_only) throw InputError("--data", "value", "at least one dataset is required");
  if (o.proxy_experts_weight < 0 || o.proxy_experts_weight > 1)
    throw InputError("--proxy-experts-weight", fmt(o.proxy_experts_weight), "must be in [0, 1]");
  if (o.steps <= 0) throw InputError("--steps", std::to_string(o.steps), "must be positive");
  if (o.seq_len <= 0 || o.micro_batch <= 0) throw InputError("--seq-len/--micro-batch", "value", "must be positive");
  if (!(o.tau_start > 0 && o.tau_end > 0)) throw InputError("--tau-start/--tau-end", "value", "must be positive");
  if (o.hard_prob < 0 || o.hard_prob > 1) throw InputError("--hard-prob", fmt(o.hard_prob), "must be in [0, 1]");
  if (o.warmup < 0 || o.warmup > 1) throw InputError("--budget-warmup", fmt(o.warmup), "must be in [0, 1]");
  if (!(o.weights_lr >= 0)) throw InputError("--weights-lr", fmt(o.weights_lr), "must be 0 (frozen teacher) or positive");
  if (o.weights_lr > 0 && o.cost_only) throw InputError("--weights-lr", fmt(o.weights_lr), "--cost-only has no weights to train");
  // The device first: `--device cuda` without one stops every rank before any model.
  const job::RunDevice rd = job::choose_run_device(o.device, o.local_rank, o.dtype);
  const torch::Device dev = rd.device;
  const torch::Dtype dtype = rd.dtype;

  // ---- teacher, target, space, budgets: every check before any forward
  const bool arch_only = (o.check_only || o.cost_only) && fs::path(o.teacher).extension() == ".json";
  const std::string teacher_path = arch_only ? o.teacher : checkpoint::resolve_checkpoint(o.teacher);
  model::ArchSpec teacher_spec;
  if (arch_only) {
    teacher_spec = model::load_arch(teacher_path);
  } else {
    checkpoint::CheckpointReader r(teacher_path);
    teacher_spec = checkpoint::checkpoint_arch(r);
  }
  std::optional<CostTarget> target;
  const bool needs_target = o.constraints.needs_cost_model() || !o.hardware.empty() || !o.workload.empty();
  if (needs_target) {
    if (o.hardware.empty()) throw InputError("search", "--hardware", "memory, TTFT, TPOT and throughput budgets need --hardware");
    if (o.workload.empty()) throw InputError("search", "--workload", "memory, TTFT, TPOT and throughput budgets need --workload");
    target = CostTarget{load_hardware(o.hardware, o.configs_dir), load_engine(o.engine, o.configs_dir), load_workload(o.workload, o.configs_dir)};
  }
  const EngineProfile engine = target ? target->engine : load_engine(o.engine, o.configs_dir);
  SpaceOptions so = o.space;
  so.tp = o.tp;
  so.unit_ranks = !o.cost_only;
  const SearchSpace space = build_space(teacher_spec, scores, &engine, so, o.scores_source);
  const std::vector<Budget> budgets = resolve_budgets(o.constraints, teacher_spec, target ? &*target : nullptr);
  check_reachable(space, budgets, target ? &*target : nullptr);
  if (o.check_only) {
    int rank = 0;
    MPI_Comm_rank(world, &rank);
    if (rank == 0) {
      const ExactCost small = exact_cost(space.spec(space.smallest_pick()), target ? &*target : nullptr);
      std::cout << "search check: " << teacher_path << ": " << space.decisions.size() << " decisions; every budget is reachable:\n";
      for (const auto& b : budgets)
        std::cout << "  " << b.option << ": limit " << shown_text(b.metric, b.value) << ", teacher "
                  << shown_text(b.metric, b.teacher) << ", smallest architecture " << shown_text(b.metric, small.get(b.metric))
                  << "\n";
      std::cout << std::flush;
    }
    DasResult res;
    res.space = space;
    res.budgets = budgets;
    return res;
  }

  dist::ParallelLayout layout(world, {o.tp, 0, 0});
  if (const std::string why = model::tp_split_problem(teacher_spec, layout.tp_size()); !why.empty())
    throw InputError(teacher_path, "arch_spec (--tp " + std::to_string(layout.tp_size()) + ")", why);
  const bool root = layout.world_rank() == 0;
  const int dp = layout.dp_size(), dp_rank = layout.dp_rank(), tp_rank = layout.tp_rank(), tp_size = layout.tp_size();
  const json layout_j = job::layout_json(layout, rd);
  if (on_layout) on_layout(layout_j);
  // The teacher's TP collectives take device tensors; the router's (host, float64) go over MPI.
  model::TpGroup tp{dist::make_device_communicator(layout.tp_mpi_comm(), rd.choice)};
  model::CausalLM teacher{nullptr};  // cost only: no weights
  if (!o.cost_only) {
    teacher = job::load_frozen_teacher(teacher_path, tp, dtype);
    teacher->to(dev);
  }
  // With --weights-lr: the masked model is a trainable copy of the teacher (loaded before the
  // optimizer takes its fp32 masters); the teacher stays frozen and gives the KD targets.
  const bool train_weights = o.weights_lr > 0;
  model::CausalLM student{nullptr};
  std::unique_ptr<distill::WeightOptimizer> wopt;
  if (train_weights) {
    student = job::load_frozen_teacher(teacher_path, tp, dtype);
    for (auto& p : student->parameters()) p.requires_grad_(true);
    student->to(dev);
    distill::WeightOptimConfig wc;
    wc.lr = o.weights_lr;
    wc.min_lr = o.weights_lr / 10;
    wc.steps = o.steps;
    wc.warmup = std::min<int64_t>(10, o.steps / 10);
    wc.weight_decay = 0;  // a search step, not pretraining: nothing pulls the teacher's weights toward 0
    wopt = std::make_unique<distill::WeightOptimizer>(student, std::vector<dist::OptimParam>{}, layout.dp(), &layout.tp(),
                                                      tp_size, wc);
  }
  // The model the masks act on: the trainable copy, or the frozen teacher itself.
  model::CausalLM& masked = train_weights ? student : teacher;
  const json teacher_arch_j = model::arch_to_json(teacher_spec);

  // ---- parameters
  const size_t D = space.decisions.size();
  std::vector<int64_t> offset(D + 1, 0);
  for (size_t d = 0; d < D; ++d) offset[d + 1] = offset[d] + int64_t(space.decisions[d].choices.size());
  const int64_t N = offset[D];
  std::vector<torch::Tensor> prefix;
  for (const auto& d : space.decisions) prefix.push_back(prefix_matrix(d));
  torch::Tensor tp_summed = torch::zeros({N}, torch::kFloat64);  // 1 where the gradient is a partial sum over TP
  for (size_t d = 0; d < D; ++d)
    if (space.decisions[d].sharded()) tp_summed.narrow(0, offset[d], offset[d + 1] - offset[d]).fill_(1.0);
  State st;
  st.theta = torch::zeros({N}, torch::kFloat64);
  for (size_t d = 0; d < D; ++d) st.theta[offset[d + 1] - 1] = 2.0;  // the teacher's choice starts at e^2 : 1
  st.m = torch::zeros({N}, torch::kFloat64);
  st.v = torch::zeros({N}, torch::kFloat64);
  st.lambda = torch::zeros({int64_t(budgets.size())}, torch::kFloat64);

  // Cost only takes seconds: nothing to resume, no checkpoints.
  std::optional<job::RunCheckpoints> checkpoints;
  if (!o.cost_only) checkpoints.emplace(world, o.out + "/search", 2, "search checkpoint");
  if (o.cost_only && root) fs::create_directories(o.out);
  const std::string metrics_path = o.out + "/metrics.jsonl";
  const json space_json = space.to_json();
  const json budgets_j = budgets_json(budgets);

  std::shared_ptr<data::BlendedSampler> sampler, cal;
  std::optional<data::DataCursor> cursor;
  if (!o.cost_only) {
    const job::TokenData token_data(o.data, o.split, o.seq_len, o.seed);
    sampler = token_data.sampler(data::Split::Train);
    cursor = data::DataCursor::start(*sampler);
    // The candidates' scoring batches (checked here, before any forward).
    if (o.candidates > 1) cal = token_data.sampler(data::Split::Calibration);
  }
  if (checkpoints && checkpoints->resuming()) {
    const std::string path = checkpoints->latest();
    checkpoint::CheckpointReader r(path);
    const json& a = r.attributes();
    if (a.value("space", json()) != space_json || a.value("budgets", json()) != budgets_j)
      throw InputError(path, "space", "the search checkpoint is of another search space or other budgets (a different search in the same --out?)");
    if (a.value("weights_lr", 0.0) != o.weights_lr)
      throw InputError(path, "--weights-lr", "the search checkpoint was written with --weights-lr " + fmt(a.value("weights_lr", 0.0)) +
                                                 ", this search has " + fmt(o.weights_lr) + " (a different search in the same --out?)");
    if (train_weights) {
      checkpoint::load_model(student, r);
      wopt->load(r);
    }
    st.theta = r.read("search/theta").to(torch::kFloat64);
    st.m = r.read("search/adam_m").to(torch::kFloat64);
    st.v = r.read("search/adam_v").to(torch::kFloat64);
    if (!budgets.empty()) st.lambda = r.read("search/lambda").to(torch::kFloat64);
    st.step = r.step();
    st.adam_steps = a.at("adam_steps").get<int64_t>();
    cursor = job::restore_cursor(a, *sampler, path);
    if (root) {
      job::truncate_metrics(metrics_path, st.step);
      std::cout << "resumed the search from " << path << " at step " << st.step << std::endl;
    }
  }
  std::optional<data::DataLoader> loader;
  if (!o.cost_only) loader.emplace(sampler, data::LoaderConfig{o.micro_batch, dp_rank, dp}, *cursor);

  auto save = [&](const char* why) {
    if (o.cost_only) return;  // seconds long: nothing to resume
    const bool w = layout.world_rank() == 0;
    std::vector<checkpoint::ShardedTensor> tensors = {
        {"search/theta", {N}, {}, st.theta.contiguous(), w},
        {"search/adam_m", {N}, {}, st.m.contiguous(), w},
        {"search/adam_v", {N}, {}, st.v.contiguous(), w},
    };
    if (!budgets.empty()) tensors.push_back({"search/lambda", {int64_t(budgets.size())}, {}, st.lambda.contiguous(), w});
    json attrs = {{"kind", "search"}, {"space", space_json}, {"budgets", budgets_j}, {"adam_steps", st.adam_steps},
                  {"data_cursor", loader->cursor().to_json()}, {"teacher", teacher_path}, {"layout", layout_j},
                  {"weights_lr", o.weights_lr}};
    if (train_weights) {
      // The trained weights as a model checkpoint (its arch_spec is the teacher's): the student
      // is pruned from the final one.
      for (auto& t : checkpoint::model_tensors(student, dp_rank == 0, "model/", true)) tensors.push_back(std::move(t));
      for (auto& t : wopt->tensors()) tensors.push_back(std::move(t));
      attrs[checkpoint::kArchSpecAttribute] = teacher_arch_j;
      attrs["optimizer"] = wopt->attributes();
      attrs["lr_schedule"] = wopt->schedule_attributes();
    }
    checkpoints->save(st.step, tensors, attrs, nullptr, why);
  };

  // ---- cost
  CostTarget cost_target = target ? *target
                                   : CostTarget{load_hardware("h100", o.configs_dir), engine, load_workload("in-game", o.configs_dir)};
  const SoftCostFn soft_cost(space, cost_target);  // parameter counts do not depend on the target
  const FlatSoftmax flat_softmax(space);
  auto proxy_of = [&](const std::vector<int>& pick) {
    std::vector<std::vector<double>> onehot;
    for (size_t d = 0; d < pick.size(); ++d) {
      onehot.emplace_back(space.decisions[d].choices.size(), 0.0);
      onehot.back()[size_t(pick[d])] = 1.0;
    }
    return quality_proxy(space, onehot, o.proxy_experts_weight);
  };
  auto probs_of = [&](const torch::Tensor& logits) {
    std::vector<torch::Tensor> p;
    for (size_t d = 0; d < D; ++d) p.push_back(torch::softmax(logits.narrow(0, offset[d], offset[d + 1] - offset[d]), 0));
    return p;
  };

  // ---- masks of one sample for this rank
  SearchMasks masks;
  auto set_masks = [&](const std::vector<torch::Tensor>& y) { masks.set(space, prefix, y, tp_rank, tp_size, dev); };

  distill::ObjectiveConfig kd_cfg;
  kd_cfg.kd.temperature = o.temperature;
  const int64_t vocab = teacher_spec.vocab_size;
  distill::DistillObjective kd_loss(*tp.comm, vocab, kd_cfg);
  const int64_t tokens_per_step = o.micro_batch * o.seq_len * dp;
  job::MetricsLog metrics(metrics_path, root);
  if (root) {
    std::cout << "search: " << D << " decisions (" << N << " logits) over " << teacher_spec.layers.size() << " layers, TP "
              << tp_size << " x DP " << dp << ", " << tokens_per_step << " tokens per step, steps " << st.step << " -> "
              << o.steps << "\n"
              << "dtype: " << rd.dtype_choice.dtype << " (" << rd.dtype_choice.reason << ")\n"
              << (train_weights ? "weights: a trainable copy of the teacher, AdamW at lr " + fmt(o.weights_lr) +
                                      " (--weights-lr); the student is cut from the trained weights"
                                : std::string("weights: the frozen teacher (--weights-lr 0)"))
              << "\n";
    if (train_weights)
      if (const std::string d = wopt->describe(dp); !d.empty()) std::cout << d << "\n";
    for (const auto& n : space.notes) std::cout << "  " << n << "\n";
    for (const auto& b : budgets)
      std::cout << "  budget " << b.option << ": " << (b.at_least ? ">= " : "<= ") << shown_text(b.metric, b.value)
                << " (teacher " << shown_text(b.metric, b.teacher) << ")\n";
    std::cout << std::flush;
  }

  DasResult res;
  int64_t interval_steps = 0;
  double interval_kd = 0, cost_s = 0;  // cost_s: time in the cost model and its Lagrangian (this interval)
  double tau = o.tau_start;
  bool hard = false;
  distill::WeightOptimizer::Step last_weights;  // --weights-lr: the last weight step
  std::vector<double> soft_values(budgets.size()), limits(budgets.size());  // of the last step
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  job::StepLoop loop;
  loop.steps = o.steps;
  loop.log_interval = o.log_interval;
  loop.save_interval = o.save_interval;
  loop.save = save;
  loop.step = [&](int64_t step) {
    const double frac = o.steps > 1 ? double(step) / double(o.steps - 1) : 1.0;
    tau = o.tau_start * std::pow(o.tau_end / o.tau_start, frac);
    // One architecture sample per step, the same on every rank: noise from (seed, step).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed * 1000003ULL + uint64_t(step) * 7919ULL + 17ULL);
    torch::Tensor u = torch::rand({N + 1}, gen, torch::kFloat64).clamp(1e-12, 1.0 - 1e-12);
    hard = u[N].item<double>() < o.hard_prob;
    torch::Tensor gumbel = -torch::log(-torch::log(u.narrow(0, 0, N)));

    torch::Tensor theta = st.theta.clone().requires_grad_(true);
    std::vector<torch::Tensor> y;
    for (size_t d = 0; d < D; ++d) {
      const int64_t c = offset[d + 1] - offset[d];
      torch::Tensor s = torch::softmax((theta.narrow(0, offset[d], c) + gumbel.narrow(0, offset[d], c)) / tau, 0);
      if (hard) {
        torch::Tensor h = torch::zeros_like(s);
        h[s.argmax().item<int64_t>()] = 1.0;
        s = h - s.detach() + s;
      }
      y.push_back(s);
    }
    torch::Tensor g;
    double kd_value = 0;  // cost only: minus the quality proxy
    if (o.cost_only) {
      // The quality proxy of the sample (DasOptions::cost_only, quality_proxy()).
      torch::Tensor loss = -proxy_tensor(space, y, o.proxy_experts_weight);
      loss.backward();
      g = theta.grad().clone();
      kd_value = loss.item<double>();
    } else {
      // The batch, the teacher's logits, the masked teacher's.
      const job::Batch batch = job::next_batch(*loader, o.micro_batch, o.seq_len, dev);
      distill::Forward t;
      {
        torch::NoGradGuard ng;
        teacher->set_observer(nullptr);
        t = distill::forward_logits(teacher, batch.input);
      }
      set_masks(y);
      masked->set_observer(&masks);
      const distill::Forward s = distill::forward_logits(masked, batch.input);
      masked->set_observer(nullptr);
      distill::LossParts parts;
      torch::Tensor kd = kd_loss(s, t, batch.labels, parts);
      kd.backward();
      g = theta.grad().clone();
      // The weights: ZeRO-1 AdamW over DP (TP partial gradients reduced first).
      if (train_weights) last_weights = wopt->step(step, checkpoints->dir());
      // Units split over TP: each rank saw its own; the rest is replicated and already whole.
      if (tp_size > 1) {
        torch::Tensor part = g * tp_summed;
        layout.tp().all_reduce(part, dist::ReduceOp::Sum);
        g = g * (1.0 - tp_summed) + part;
      }
      kd_value = parts.kd;
      {
        torch::Tensor pack = torch::cat({g, torch::full({1}, kd_value, torch::kFloat64)});
        if (dp > 1) layout.dp().all_reduce(pack, dist::ReduceOp::Avg);
        g = pack.narrow(0, 0, N).clone();
        kd_value = pack[N].item<double>();
      }
    }
    // Budgets on the expected cost of the current distribution, ramped from the teacher's value.
    const auto t_cost = clock::now();
    torch::Tensor theta_c = st.theta.clone().requires_grad_(true);
    const std::vector<torch::Tensor> soft = soft_cost(flat_softmax(theta_c));
    const double ramp = o.warmup > 0 ? std::min(1.0, double(step) / (o.warmup * double(o.steps))) : 1.0;
    torch::Tensor penalty = torch::zeros({}, torch::kFloat64);
    std::vector<double> viol(budgets.size());
    for (size_t i = 0; i < budgets.size(); ++i) {
      const Budget& b = budgets[i];
      Budget now = b;
      // From the teacher's value where the teacher is over the budget; a budget the teacher
      // already meets holds from the start.
      const double start = b.at_least ? std::min(b.teacher, b.value) : std::max(b.teacher, b.value);
      now.value = start + (b.value - start) * ramp;
      limits[i] = now.value;
      const torch::Tensor& x = soft[size_t(b.metric)];
      soft_values[i] = x.item<double>();
      torch::Tensor v = b.at_least ? 1.0 - x / now.value : x / now.value - 1.0;
      viol[i] = v.item<double>();
      const double lam = st.lambda[int64_t(i)].item<double>();
      penalty = penalty + (torch::relu(lam + o.rho * v).pow(2) - lam * lam) / (2.0 * o.rho);
    }
    if (!budgets.empty()) {
      penalty.backward();
      g = g + theta_c.grad();
    }
    cost_s += std::chrono::duration<double>(clock::now() - t_cost).count();
    // Adam on the logits; multipliers by gradient ascent (clamped at 0).
    ++st.adam_steps;
    st.m = beta1 * st.m + (1 - beta1) * g;
    st.v = beta2 * st.v + (1 - beta2) * g * g;
    const double bc1 = 1 - std::pow(beta1, double(st.adam_steps)), bc2 = 1 - std::pow(beta2, double(st.adam_steps));
    st.theta = st.theta - o.lr * (st.m / bc1) / ((st.v / bc2).sqrt() + eps);
    for (size_t i = 0; i < budgets.size(); ++i)
      st.lambda[int64_t(i)] = std::max(0.0, st.lambda[int64_t(i)].item<double>() + o.rho * viol[i]);
    // Bitwise the same logits on every rank.
    MPI_Bcast(st.theta.data_ptr<double>(), int(N), MPI_DOUBLE, 0, world);
    interval_kd += kd_value;
    ++interval_steps;
  };
  loop.log = [&](int64_t step, double dt, int64_t) {
    const double tok_s = double(tokens_per_step * interval_steps) / std::max(dt, 1e-9);
    const double eta = dt / double(interval_steps) * double(o.steps - step);
    double entropy = 0;
    for (const auto& p : probs_of(st.theta)) {
      const double n = double(p.numel());
      entropy += n > 1 ? -(p * (p + 1e-30).log()).sum().item<double>() / std::log(n) : 0.0;
    }
    entropy /= double(D);
    if (root) {
      json line = {{"step", step}, {o.cost_only ? "proxy" : "kd_loss", (o.cost_only ? -1.0 : 1.0) * interval_kd / double(interval_steps)}, {"tau", tau},
                   {"entropy", entropy}, {"tokens_per_s", tok_s}, {"hard", hard}, {"cost_model_share", cost_s / std::max(dt, 1e-9)},
                   {"elapsed_s", std::chrono::duration<double>(clock::now() - t_start).count()}};
      if (train_weights) line["weights"] = {{"lr", last_weights.lr}, {"grad_norm", last_weights.grad_norm}, {"skipped", wopt->skipped_total()}};
      std::ostringstream os;
      os << "search " << step << "/" << o.steps << (o.cost_only ? " | proxy " : " | kd ") << std::fixed << std::setprecision(4)
         << (o.cost_only ? -1.0 : 1.0) * interval_kd / double(interval_steps);
      json cons = json::array();
      for (size_t i = 0; i < budgets.size(); ++i) {
        const Budget& b = budgets[i];
        cons.push_back({{"option", b.option}, {"soft", shown(b.metric, soft_values[i])}, {"limit", shown(b.metric, limits[i])},
                        {"budget", shown(b.metric, b.value)}, {"multiplier", st.lambda[int64_t(i)].item<double>()}});
        os << " | " << metric_name(b.metric) << " " << std::setprecision(4) << shown(b.metric, soft_values[i]) << "/"
           << shown(b.metric, limits[i]) << " (lambda " << std::setprecision(3) << st.lambda[int64_t(i)].item<double>() << ")";
      }
      line["budgets"] = cons;
      metrics.write(line);
      if (train_weights)
        os << " | weights lr " << std::scientific << std::setprecision(2) << last_weights.lr << " gnorm " << last_weights.grad_norm
           << std::fixed;
      os << " | tau " << std::setprecision(3) << tau << " | entropy " << std::setprecision(3) << entropy << " | ";
      if (o.cost_only)  // no tokens: the step rate
        os << std::setprecision(1) << double(interval_steps) / std::max(dt, 1e-9) << " steps/s";
      else
        os << std::setprecision(0) << tok_s << " tok/s | cost model " << std::setprecision(2) << 100.0 * cost_s / std::max(dt, 1e-9) << "%";
      os << " | ETA " << dist::format_duration(eta);
      std::cout << os.str() << std::endl;
    }
    interval_kd = 0;
    cost_s = 0;
    interval_steps = 0;
  };
  if (job::run_steps(loop, st.step, world) == job::kExitRequeue) {
    res.space = space;
    res.budgets = budgets;
    res.steps_done = st.step;
    res.stopped = true;
    return res;
  }

  // ---- discretize, verify, repair, prune
  std::vector<int> pick(D);
  std::vector<std::vector<double>> lp(D);
  for (size_t d = 0; d < D; ++d) {
    torch::Tensor l = torch::log_softmax(st.theta.narrow(0, offset[d], offset[d + 1] - offset[d]), 0).contiguous();
    lp[d].assign(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
    pick[d] = int(l.argmax().item<int64_t>());
  }
  res.space = space;
  res.budgets = budgets;
  res.argmax = pick;
  res.steps_done = st.step;
  const CostTarget* tgt = target ? &*target : nullptr;
  // Candidates: the argmax and samples of the final distribution (the same on every rank),
  // each repaired; duplicates after repair are scored once.
  {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed * 7777ULL + 3ULL);
    std::vector<std::pair<std::string, std::vector<int>>> raw = {{"argmax", pick}};
    const auto probs = probs_of(st.theta);
    for (int k = 1; k < std::max(1, o.candidates); ++k) {
      std::vector<int> p(D);
      for (size_t d = 0; d < D; ++d) p[d] = int(torch::multinomial(probs[d], 1, false, gen).item<int64_t>());
      raw.push_back({"sample " + std::to_string(k), p});
    }
    for (auto& [src, p] : raw) {
      RepairResult rr = repair(space, p, lp, budgets, tgt);
      bool seen = false;
      for (const auto& c : res.candidates) seen = seen || c.repaired.pick == rr.pick;
      if (!seen) res.candidates.push_back({src, p, std::move(rr), 0.0});
    }
  }
  // Score them as hard models (one-hot masks) on calibration batches: the teacher's logits once
  // per batch, then each candidate's.
  if (o.cost_only) {
    for (auto& c : res.candidates) c.proxy = proxy_of(c.repaired.pick);
  } else if (res.candidates.size() > 1) {
    const auto t0 = clock::now();
    data::DataLoader cal_loader(cal, {o.micro_batch, dp_rank, dp}, data::DataCursor::start(*cal));
    torch::NoGradGuard ng;
    std::vector<double> kd_sum(res.candidates.size(), 0.0);
    for (int64_t b = 0; b < o.score_batches; ++b) {
      const job::Batch batch = job::next_batch(cal_loader, o.micro_batch, o.seq_len, dev);
      const distill::Forward t = distill::forward_logits(teacher, batch.input);
      for (size_t c = 0; c < res.candidates.size(); ++c) {
        std::vector<torch::Tensor> y;
        for (size_t d = 0; d < D; ++d) {
          torch::Tensor h = torch::zeros({offset[d + 1] - offset[d]}, torch::kFloat64);
          h[res.candidates[c].repaired.pick[d]] = 1.0;
          y.push_back(h);
        }
        set_masks(y);
        masked->set_observer(&masks);
        const distill::Forward s = distill::forward_logits(masked, batch.input);
        masked->set_observer(nullptr);
        distill::LossParts parts;
        kd_loss(s, t, batch.labels, parts);
        kd_sum[c] += parts.kd;
      }
    }
    torch::Tensor k = torch::tensor(kd_sum, torch::kFloat64);
    if (dp > 1) layout.dp().all_reduce(k, dist::ReduceOp::Avg);
    for (size_t c = 0; c < res.candidates.size(); ++c) res.candidates[c].kd = k[int64_t(c)].item<double>() / double(o.score_batches);
    if (root)
      std::cout << "scored " << res.candidates.size() << " distinct candidates as hard models on " << o.score_batches
                << " calibration batches in " << dist::format_duration(std::chrono::duration<double>(clock::now() - t0).count())
                << std::endl;
  }
  res.chosen = 0;
  for (size_t c = 1; c < res.candidates.size(); ++c)
    if (o.cost_only ? res.candidates[c].proxy > res.candidates[size_t(res.chosen)].proxy
                    : res.candidates[c].kd < res.candidates[size_t(res.chosen)].kd)
      res.chosen = int(c);
  res.repaired = res.candidates[size_t(res.chosen)].repaired;
  res.student = space.spec(res.repaired.pick);
  model::validate(res.student, "search student");
  if (root) {
    const ExactCost tc = exact_cost(teacher_spec, tgt), ac = exact_cost(space.spec(pick), tgt);
    json layers = json::array();
    for (size_t l = 0; l < teacher_spec.layers.size(); ++l) {
      const auto& t = teacher_spec.layers[l];
      const auto& s = res.student.layers[l];
      json e = {{"layer", l}, {"teacher_kind", model::layer_kind(t)}, {"student_kind", model::layer_kind(s)}};
      if (t.attention) e["attn_heads"] = {t.attention->num_heads, s.attention ? s.attention->num_heads : 0};
      if (t.mlp) e["ffn"] = {t.mlp->ffn_size, s.mlp ? s.mlp->ffn_size : 0};
      if (t.mamba) e["mamba"] = {1, s.mamba ? 1 : 0};
      if (t.moe) e["moe"] = {1, s.moe ? 1 : 0};
      if (t.moe && s.moe) {
        e["experts"] = {t.moe->num_experts, s.moe->num_experts};
        e["expert_ffn"] = {t.moe->expert_ffn, s.moe->expert_ffn};
        e["top_k"] = {t.moe->top_k, s.moe->top_k};
      }
      layers.push_back(e);
    }
    json steps = json::array();
    for (const auto& r : res.repaired.steps) steps.push_back({{"action", r.action}, {"move", r.what}});
    json probs = json::array();
    for (size_t d = 0; d < D; ++d) {
      std::vector<double> p;
      for (double x : lp[d]) p.push_back(std::exp(x));
      probs.push_back({{"axis", space.decisions[d].axis}, {"layer", space.decisions[d].layer}, {"choices", space.decisions[d].choices},
                       {"probs", p}});
    }
    json report = {{"format", "autocompress.search_report"},
                   {"version", 1},
                   {"teacher", teacher_path},
                   {"weights", train_weights ? json{{"lr", o.weights_lr}, {"source", checkpoints->latest()}}
                                             : json{{"lr", 0.0}, {"source", teacher_path}}},
                   {"hardware", target ? target->hardware.id : ""},
                   {"engine", engine.id},
                   {"workload", target ? target->workload.id : ""},
                   {"hidden", {teacher_spec.hidden_size, res.student.hidden_size}},
                   {"steps", st.step},
                   {"budgets", budgets_j},
                   {"space", space_json},
                   {"teacher_cost", cost_json(tc, budgets)},
                   {"argmax_cost", cost_json(ac, budgets)},
                   {"student_cost", cost_json(res.repaired.cost, budgets)},
                   {"repair", steps},
                   {"binding", res.repaired.binding >= 0 ? budgets[size_t(res.repaired.binding)].option : ""},
                   {"binding_use", res.repaired.binding_use},
                   {"slack_reason", res.repaired.slack_reason},
                   {"layers", layers},
                   {"final_probs", probs}};
    json cands = json::array();
    for (size_t c = 0; c < res.candidates.size(); ++c) {
      const auto& x = res.candidates[c];
      cands.push_back({{"source", x.source}, {o.cost_only ? "proxy" : "kd_loss", o.cost_only ? x.proxy : x.kd}, {"chosen", int(c) == res.chosen},
                       {"repair_steps", x.repaired.steps.size()}, {"params", x.repaired.cost.params},
                       {"binding_use", x.repaired.binding_use}});
    }
    report["candidates"] = cands;
    report["chosen"] = res.candidates[size_t(res.chosen)].source;
    report["objective"] = o.cost_only ? "proxy" : "kd";
    if (o.cost_only)
      report["proxy"] = {{"experts_weight", o.proxy_experts_weight}, {"importance", o.scores_source},
                         {"student", res.candidates[size_t(res.chosen)].proxy}, {"argmax", proxy_of(pick)}};
    if (target) {
      report["teacher_prediction"] = predict(teacher_spec, target->hardware, target->engine, target->workload).to_json();
      report["student_prediction"] = predict(res.student, target->hardware, target->engine, target->workload).to_json();
    }
    model::save_arch(res.student, o.out + "/arch.json");
    write_file_atomic(o.out + "/search_report.json", report.dump(2) + "\n", "--out");
    std::cout << "search done in " << dist::format_duration(std::chrono::duration<double>(clock::now() - t_start).count())
              << ": chose " << res.candidates[size_t(res.chosen)].source << " of " << res.candidates.size()
              << (o.cost_only ? " candidates (quality proxy " + fmt(res.candidates[size_t(res.chosen)].proxy, 4) + ")"
                  : res.candidates.size() > 1 ? " candidates (hard KD " + fmt(res.candidates[size_t(res.chosen)].kd, 4) + ")"
                                              : " candidates (the only distinct one after repair: not scored)")
              << ", " << res.repaired.steps.size()
              << " repair steps; student "
              << params_text(res.repaired.cost.params) << " parameters (teacher " << params_text(tc.params) << ")";
    for (const auto& b : budgets)
      std::cout << "; " << b.option << " " << shown_text(b.metric, res.repaired.cost.get(b.metric)) << " <= "
                << shown_text(b.metric, b.value);
    std::cout << "\n";
    if (!res.repaired.slack_reason.empty()) std::cout << "budget use " << fmt(100 * res.repaired.binding_use, 3) << "%: " << res.repaired.slack_reason << "\n";
    std::cout << std::flush;
  }
  MPI_Barrier(world);
  if (o.cost_only) return res;  // no weights to prune
  PruneOptions po;
  po.tp = o.tp;
  po.student_source = o.out + "/arch.json";
  po.scores_source = o.scores_source;
  // With --weights-lr the student is cut from the trained weights (the final search checkpoint
  // holds them as a model checkpoint of the teacher's architecture), else from the teacher.
  const std::string weights_path = train_weights ? checkpoints->latest() : teacher_path;
  res.student_path = prune_checkpoint(world, weights_path, scores, res.student, o.out + "/student", po).path;
  return res;
}

}  // namespace ac::search

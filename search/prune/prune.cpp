// Structured pruning (see prune.h): the sub-architecture rules, the per-axis plan of kept
// teacher indices, and the sliced reads that fill a (TP-sharded) student from the teacher's
// checkpoint.
#include "search/prune/prune.h"

#include "model/layers/init.h"

#include <optional>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/communicator.h"
#include "dist/error.h"
#include "dist/parallel_layout.h"
#include "model/model.h"

namespace fs = std::filesystem;

namespace ac::search {
namespace {

using checkpoint::shape_text;

std::string where(size_t i) { return "layers[" + std::to_string(i) + "]"; }
std::string num(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// ---- sub-architecture rules -----------------------------------------------------------

// Checks one field: student value `s` against the teacher's `t`. Returns "" or the message.
template <typename T>
std::string at_most(const std::string& field, T s, T t) {
  if (s > t) return field + ": " + std::to_string(s) + " exceeds the teacher's " + std::to_string(t);
  if (s <= 0) return field + ": " + std::to_string(s) + " must be positive";
  return "";
}
template <typename T>
std::string same(const std::string& field, const T& s, const T& t, const std::string& text_s, const std::string& text_t) {
  if (s != t) return field + ": " + text_s + " differs from the teacher's " + text_t + " (not prunable)";
  return "";
}
std::string same_bool(const std::string& field, bool s, bool t) {
  return same(field, s, t, s ? "true" : "false", t ? "true" : "false");
}
std::string same_int(const std::string& field, int64_t s, int64_t t) {
  return same(field, s, t, std::to_string(s), std::to_string(t));
}
std::string same_double(const std::string& field, double s, double t) { return same(field, s, t, num(s), num(t)); }

std::string sub_attention(const std::string& w, const model::AttentionSpec& s, const model::AttentionSpec& t) {
  std::string e;
  if (!(e = same_int(w + ".head_dim", s.head_dim, t.head_dim)).empty()) return e;
  if (!(e = at_most(w + ".num_kv_heads", s.num_kv_heads, t.num_kv_heads)).empty()) return e;
  if (!(e = at_most(w + ".num_heads", s.num_heads, t.num_heads)).empty()) return e;
  if (s.num_heads % s.num_kv_heads != 0)
    return w + ".num_heads: " + std::to_string(s.num_heads) + " is not a multiple of num_kv_heads " +
           std::to_string(s.num_kv_heads);
  const int gs = s.num_heads / s.num_kv_heads, gt = t.num_heads / t.num_kv_heads;
  if (gs > gt)
    return w + ".num_heads: " + std::to_string(gs) + " query heads per KV group exceed the teacher's " +
           std::to_string(gt) + " (heads are kept within their KV group)";
  if (!(e = same_bool(w + ".qkv_bias", s.qkv_bias, t.qkv_bias)).empty()) return e;
  if (!(e = same_bool(w + ".o_bias", s.o_bias, t.o_bias)).empty()) return e;
  return same_bool(w + ".qk_norm", s.qk_norm, t.qk_norm);
}

std::string sub_mamba(const std::string& w, const model::MambaSpec& s, const model::MambaSpec& t) {
  std::string e;
  if (!(e = same_int(w + ".n_groups", s.n_groups, t.n_groups)).empty()) return e;
  if (!(e = same_int(w + ".state_size", s.state_size, t.state_size)).empty()) return e;
  if (!(e = same_int(w + ".conv_kernel", s.conv_kernel, t.conv_kernel)).empty()) return e;
  if (!(e = at_most(w + ".num_heads", s.num_heads, t.num_heads)).empty()) return e;
  if (s.num_heads % s.n_groups != 0)
    return w + ".num_heads: " + std::to_string(s.num_heads) + " is not a multiple of n_groups " +
           std::to_string(s.n_groups) + " (heads are kept within their B/C group)";
  if (!(e = at_most(w + ".head_dim", s.head_dim, t.head_dim)).empty()) return e;
  if (!(e = same_bool(w + ".conv_bias", s.conv_bias, t.conv_bias)).empty()) return e;
  if (!(e = same_bool(w + ".proj_bias", s.proj_bias, t.proj_bias)).empty()) return e;
  if (!(e = same_double(w + ".time_step_limit[0]", s.time_step_limit_min, t.time_step_limit_min)).empty()) return e;
  return same_double(w + ".time_step_limit[1]", s.time_step_limit_max, t.time_step_limit_max);
}

std::string sub_mlp(const std::string& w, const model::MlpSpec& s, const model::MlpSpec& t) {
  std::string e;
  if (!(e = at_most(w + ".ffn_size", s.ffn_size, t.ffn_size)).empty()) return e;
  if (!(e = same(w + ".activation", s.activation, t.activation, to_string(s.activation), to_string(t.activation))).empty())
    return e;
  return same_bool(w + ".bias", s.bias, t.bias);
}

std::string sub_moe(const std::string& w, const model::MoeSpec& s, const model::MoeSpec& t) {
  std::string e;
  if (!(e = at_most(w + ".num_experts", s.num_experts, t.num_experts)).empty()) return e;
  if (!(e = at_most(w + ".expert_ffn", s.expert_ffn, t.expert_ffn)).empty()) return e;
  if (s.shared_ffn > t.shared_ffn)
    return w + ".shared_ffn: " + std::to_string(s.shared_ffn) + " exceeds the teacher's " + std::to_string(t.shared_ffn);
  if (s.shared_ffn < 0) return w + ".shared_ffn: must not be negative";
  if ((s.latent_size > 0) != (t.latent_size > 0))
    return w + ".latent_size: " + std::to_string(s.latent_size) + " vs the teacher's " + std::to_string(t.latent_size) +
           " (a latent MoE stays latent and a plain one plain)";
  if (s.latent_size > t.latent_size)
    return w + ".latent_size: " + std::to_string(s.latent_size) + " exceeds the teacher's " + std::to_string(t.latent_size);
  if (!(e = same(w + ".router", s.router, t.router, to_string(s.router), to_string(t.router))).empty()) return e;
  if (!(e = same(w + ".activation", s.activation, t.activation, to_string(s.activation), to_string(t.activation))).empty())
    return e;
  if (!(e = same_double(w + ".routed_scaling", s.routed_scaling, t.routed_scaling)).empty()) return e;
  if (!(e = same_bool(w + ".norm_topk_prob", s.norm_topk_prob, t.norm_topk_prob)).empty()) return e;
  if (!(e = same_int(w + ".n_group", s.n_group, t.n_group)).empty()) return e;
  if (!(e = same_int(w + ".topk_group", s.topk_group, t.topk_group)).empty()) return e;
  if (t.n_group > 1 && s.num_experts != t.num_experts)
    return w + ".num_experts: " + std::to_string(s.num_experts) + " differs from the teacher's " +
           std::to_string(t.num_experts) + "; experts of grouped routing (n_group " + std::to_string(t.n_group) +
           ") are not pruned";
  return "";
}

// ---- ranking ----------------------------------------------------------------------------

// The k best of score[offset, offset + n) (higher first, ties to the lower index), returned
// as ascending positions relative to offset.
std::vector<int64_t> top_k(const std::vector<double>& score, int64_t offset, int64_t n, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    return score[size_t(offset + a)] > score[size_t(offset + b)];
  });
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}
std::vector<int64_t> iota(int64_t n, int64_t start = 0) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}
IndexList as_list(std::vector<int64_t> v, int64_t full) {
  if (int64_t(v.size()) == full) return nullptr;  // an ascending subset of full size is everything
  return std::make_shared<const std::vector<int64_t>>(std::move(v));
}
std::vector<int64_t> materialise(const IndexList& l, int64_t full) {
  return l ? *l : iota(full);
}

struct Planner {
  const model::ArchSpec& t;
  const model::ArchSpec& s;
  const ImportanceScores& scores;
  const std::string& source;
  PrunePlan plan;

  // The score vector `v` of layer `layer` (field `field`), checked to have `n` entries.
  void need(const std::vector<double>& v, const std::string& field, int64_t n, const std::string& what) const {
    if (int64_t(v.size()) != n)
      throw InputError(source, field,
                       "has " + std::to_string(v.size()) + " scores, the teacher has " + std::to_string(n) + " " + what +
                           " (scores of another teacher?)");
  }
  const LayerImportance& layer_scores(size_t i) const {
    if (scores.layers.size() != t.layers.size())
      throw InputError(source, "layers", "has " + std::to_string(scores.layers.size()) + " layers, the teacher has " +
                                             std::to_string(t.layers.size()) + " (scores of another teacher?)");
    return scores.layers[i];
  }

  void add(const std::string& name, const std::string& src, std::vector<int64_t> shape, std::vector<IndexList> keep,
           double scale = 1.0) {
    keep.resize(shape.size());
    plan.tensors.push_back({name, src, std::move(shape), std::move(keep), scale});
  }
  void add(const std::string& name, std::vector<int64_t> shape, std::vector<IndexList> keep, double scale = 1.0) {
    add(name, name, std::move(shape), std::move(keep), scale);
  }

  void run() {
    plan.teacher = t;
    plan.student = s;
    const int64_t Ht = t.hidden_size, Hs = s.hidden_size, V = t.vocab_size;
    IndexList hid;
    if (Hs < Ht) {
      need(scores.hidden, "hidden", Ht, "hidden channels");
      plan.hidden = top_k(scores.hidden, 0, Ht, Hs);
      hid = as_list(plan.hidden, Ht);
    }
    const double hscale = std::sqrt(double(Ht) / double(Hs));
    add("embed.weight", {V, Ht}, {nullptr, hid});
    if (!t.tie_embeddings) add("lm_head.weight", {V, Ht}, {nullptr, hid});
    add("final_norm.weight", {Ht}, {hid}, hscale);
    plan.layers.resize(s.layers.size());
    for (size_t i = 0; i < s.layers.size(); ++i) layer(i, hid, hscale);
    std::sort(plan.tensors.begin(), plan.tensors.end(),
              [](const TensorPlan& a, const TensorPlan& b) { return a.name < b.name; });
  }

  void layer(size_t i, const IndexList& hid, double hscale) {
    const model::LayerSpec& ls = s.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t Ht = t.hidden_size;
    if (ls.attention || ls.mamba) add(p + "mixer_norm.weight", {Ht}, {hid}, hscale);
    if (ls.mlp || ls.moe) add(p + "ffn_norm.weight", {Ht}, {hid}, hscale);
    if (ls.attention) attention(i, p + "attention.", hid);
    if (ls.mamba) mamba(i, p + "mamba.", hid);
    if (ls.mlp) dense_mlp(i, p + "mlp.", hid);
    if (ls.moe) moe(i, p + "moe.", hid);
  }

  // The heads kept within each of `groups` (teacher head indices, group-major, `per` heads a
  // group): all of a group's, or its `keep` best by the layer's `score` (one per teacher head,
  // `heads_total` of them).
  std::vector<int64_t> heads_in_groups(size_t i, const std::vector<int64_t>& groups, int64_t per, int64_t keep,
                                       std::vector<double> LayerImportance::*score, const char* field, int64_t heads_total,
                                       const char* what) const {
    std::vector<int64_t> heads;
    for (int64_t k : groups) {
      if (keep < per) {
        const std::vector<double>& sc = layer_scores(i).*score;
        need(sc, where(i) + "." + field, heads_total, what);
        for (int64_t h : top_k(sc, k * per, per, keep)) heads.push_back(k * per + h);
      } else {
        for (int64_t h = 0; h < per; ++h) heads.push_back(k * per + h);
      }
    }
    return heads;
  }

  // Attention: whole KV groups, then query heads within each kept group.
  void attention(size_t i, const std::string& w, const IndexList& hid) {
    const model::LayerSpec &ls = s.layers[i], &lt = t.layers[i];
    const int64_t Ht = t.hidden_size;
    auto& units = plan.layers[i];
    const auto &a = *ls.attention, &b = *lt.attention;
    const int64_t d = b.head_dim, K = b.num_kv_heads, g = b.num_heads / K;
    const int64_t Ks = a.num_kv_heads, gs = a.num_heads / a.num_kv_heads;
    std::vector<int64_t> groups = iota(K);
    if (Ks < K) {
      const auto& sc = layer_scores(i);
      need(sc.attn_kv_groups, where(i) + ".attn_kv_groups", K, "KV groups");
      groups = top_k(sc.attn_kv_groups, 0, K, Ks);
      units.attn_kv_groups = groups;
    }
    const std::vector<int64_t> heads =
        heads_in_groups(i, groups, g, gs, &LayerImportance::attn_heads, "attn_heads", b.num_heads, "attention heads");
    if (gs < g) units.attn_heads = heads;
    std::vector<int64_t> qrows, kvrows;
    for (int64_t h : heads)
      for (int64_t c = 0; c < d; ++c) qrows.push_back(h * d + c);
    for (int64_t k : groups)
      for (int64_t c = 0; c < d; ++c) kvrows.push_back(k * d + c);
    const int64_t hq = b.num_heads * d, hkv = K * d;
    IndexList q = as_list(qrows, hq), kv = as_list(kvrows, hkv);
    add(w + "q_proj.weight", {hq, Ht}, {q, hid});
    add(w + "k_proj.weight", {hkv, Ht}, {kv, hid});
    add(w + "v_proj.weight", {hkv, Ht}, {kv, hid});
    if (b.qkv_bias) {
      add(w + "q_proj.bias", {hq}, {q});
      add(w + "k_proj.bias", {hkv}, {kv});
      add(w + "v_proj.bias", {hkv}, {kv});
    }
    add(w + "o_proj.weight", {Ht, hq}, {hid, q});
    if (b.o_bias) add(w + "o_proj.bias", {Ht}, {hid});
    if (b.qk_norm) {
      add(w + "q_norm.weight", {d}, {nullptr});
      add(w + "k_norm.weight", {d}, {nullptr});
    }
  }

  // Mamba-2: heads within each group, head-dim channels shared by all heads.
  void mamba(size_t i, const std::string& w, const IndexList& hid) {
    const model::LayerSpec &ls = s.layers[i], &lt = t.layers[i];
    const int64_t Ht = t.hidden_size;
    auto& units = plan.layers[i];
    const auto &a = *ls.mamba, &b = *lt.mamba;
    const int64_t H = b.num_heads, P = b.head_dim, G = b.n_groups, N = b.state_size, R = H / G;
    const int64_t Hs = a.num_heads, Ps = a.head_dim, Rs = Hs / G;
    const std::vector<int64_t> heads =
        heads_in_groups(i, iota(G), R, Rs, &LayerImportance::mamba_heads, "mamba_heads", H, "Mamba heads");
    std::vector<int64_t> chans = iota(P);
    if (Rs < R) units.mamba_heads = heads;
    if (Ps < P) {
      const auto& sc = layer_scores(i);
      need(sc.mamba_head_dim, where(i) + ".mamba_head_dim", P, "head-dim channels");
      chans = top_k(sc.mamba_head_dim, 0, P, Ps);
      units.mamba_head_dim = chans;
    }
    const int64_t DI = H * P, GN = G * N, proj = 2 * DI + 2 * GN + H, conv = DI + 2 * GN;
    std::vector<int64_t> dch;  // kept d_inner channels, head-major
    for (int64_t h : heads)
      for (int64_t c : chans) dch.push_back(h * P + c);
    std::vector<int64_t> in_rows, conv_rows;
    for (int64_t c : dch) in_rows.push_back(c);                        // z
    for (int64_t c : dch) in_rows.push_back(DI + c);                   // x
    for (int64_t c = 0; c < 2 * GN; ++c) in_rows.push_back(2 * DI + c);  // B, C
    for (int64_t h : heads) in_rows.push_back(2 * DI + 2 * GN + h);    // dt
    for (int64_t c : dch) conv_rows.push_back(c);                      // x
    for (int64_t c = 0; c < 2 * GN; ++c) conv_rows.push_back(DI + c);  // B, C
    IndexList in = as_list(in_rows, proj), cv = as_list(conv_rows, conv), hd = as_list(heads, H), di = as_list(dch, DI);
    add(w + "in_proj.weight", {proj, Ht}, {in, hid});
    if (b.proj_bias) add(w + "in_proj.bias", {proj}, {in});
    add(w + "conv1d.weight", {conv, 1, b.conv_kernel}, {cv, nullptr, nullptr});
    if (b.conv_bias) add(w + "conv1d.bias", {conv}, {cv});
    for (const char* n : {"dt_bias", "A_log", "D"}) add(w + n, {H}, {hd});
    // The gated norm normalises groups of d_inner / G channels: R P -> Rs Ps.
    add(w + "norm.weight", {DI}, {di}, std::sqrt(double(R * P) / double(Rs * Ps)));
    add(w + "out_proj.weight", {Ht, DI}, {hid, di});
    if (b.proj_bias) add(w + "out_proj.bias", {Ht}, {hid});
  }

  // Dense MLP: FFN neurons.
  void dense_mlp(size_t i, const std::string& w, const IndexList& hid) {
    const model::LayerSpec &ls = s.layers[i], &lt = t.layers[i];
    auto& units = plan.layers[i];
    const auto &a = *ls.mlp, &b = *lt.mlp;
    const int64_t F = b.ffn_size;
    IndexList n;
    if (a.ffn_size < F) {
      const auto& sc = layer_scores(i);
      need(sc.mlp_neurons, where(i) + ".mlp_neurons", F, "FFN neurons");
      units.mlp_neurons = top_k(sc.mlp_neurons, 0, F, a.ffn_size);
      n = as_list(units.mlp_neurons, F);
    }
    mlp(w, F, b.activation, b.bias, n, hid);
  }

  // MoE: routed experts, the latent channels, each kept expert's neurons, the shared expert's.
  void moe(size_t i, const std::string& w, const IndexList& hid) {
    const model::LayerSpec &ls = s.layers[i], &lt = t.layers[i];
    const int64_t Ht = t.hidden_size;
    auto& units = plan.layers[i];
    const auto &a = *ls.moe, &b = *lt.moe;
    const int64_t E = b.num_experts, F = b.expert_ffn, L = b.latent_size;
    std::vector<int64_t> experts = iota(E);
    if (a.num_experts < E) {
      const auto& sc = layer_scores(i);
      need(sc.moe_experts, where(i) + ".moe_experts", E, "experts");
      experts = top_k(sc.moe_experts, 0, E, a.num_experts);
      units.moe_experts = experts;
    }
    IndexList ex = as_list(experts, E);
    add(w + "gate.weight", {E, Ht}, {ex, hid});
    if (b.router == model::RouterKind::SigmoidBias) add(w + "gate.e_score_correction_bias", {E}, {ex});
    IndexList in = hid;
    int64_t in_full = Ht;
    if (L > 0) {
      in_full = L;
      in = nullptr;
      if (a.latent_size < L) {
        const auto& sc = layer_scores(i);
        need(sc.moe_latent, where(i) + ".moe_latent", L, "latent channels");
        units.moe_latent = top_k(sc.moe_latent, 0, L, a.latent_size);
        in = as_list(units.moe_latent, L);
      }
      add(w + "fc1_latent_proj.weight", {L, Ht}, {in, hid});
      add(w + "fc2_latent_proj.weight", {Ht, L}, {hid, in});
    }
    for (size_t j = 0; j < experts.size(); ++j) {
      const int64_t e = experts[j];
      IndexList n;
      if (a.expert_ffn < F) {
        const auto& sc = layer_scores(i);
        need(sc.moe_expert_neurons, where(i) + ".moe_expert_neurons", E * F, "expert FFN neurons");
        n = as_list(top_k(sc.moe_expert_neurons, e * F, F, a.expert_ffn), F);
      }
      const std::string sn = w + "experts." + std::to_string(j) + ".", tn = w + "experts." + std::to_string(e) + ".";
      add(sn + "up_proj.weight", tn + "up_proj.weight", {F, in_full}, {n, in});
      add(sn + "down_proj.weight", tn + "down_proj.weight", {in_full, F}, {in, n});
      if (b.activation == model::MlpActivation::SwiGLU)
        add(sn + "gate_proj.weight", tn + "gate_proj.weight", {F, in_full}, {n, in});
    }
    if (a.shared_ffn > 0) {
      const int64_t Fs = b.shared_ffn;
      IndexList n;
      if (a.shared_ffn < Fs) {
        const auto& sc = layer_scores(i);
        need(sc.moe_shared_neurons, where(i) + ".moe_shared_neurons", Fs, "shared-expert neurons");
        units.moe_shared_neurons = top_k(sc.moe_shared_neurons, 0, Fs, a.shared_ffn);
        n = as_list(units.moe_shared_neurons, Fs);
      }
      mlp(w + "shared_experts.", Fs, b.activation, false, n, hid);
    }
  }

  void mlp(const std::string& w, int64_t F, model::MlpActivation act, bool bias, const IndexList& n, const IndexList& hid) {
    const int64_t Ht = t.hidden_size;
    for (const char* name : {"gate_proj", "up_proj"}) {
      if (std::string(name) == "gate_proj" && act != model::MlpActivation::SwiGLU) continue;
      add(w + name + ".weight", {F, Ht}, {n, hid});
      if (bias) add(w + name + ".bias", {F}, {n});
    }
    add(w + "down_proj.weight", {Ht, F}, {hid, n});
    if (bias) add(w + "down_proj.bias", {Ht}, {hid});
  }
};

// ---- sliced reads ---------------------------------------------------------------------

// One dimension of a selection: all of it, or these ascending indices.
struct Sel {
  bool all = true;
  std::vector<int64_t> idx;
};

constexpr size_t kMaxReadsPerTensor = 32;

// source[sel[0], sel[1], ...] from the dataset, reading hyperslabs: along dim 0 the runs of
// consecutive kept rows (neighbouring runs merged until there are at most 32 reads), along the
// other dims the kept indices' bounding range; then index_select for what is left.
torch::Tensor read_selected(const checkpoint::CheckpointReader& r, const std::string& ds,
                            const std::vector<int64_t>& shape, const std::vector<Sel>& sel) {
  const size_t nd = shape.size();
  bool all = true;
  for (const auto& s : sel) all = all && s.all;
  if (all) return r.read(ds);
  std::vector<int64_t> off(nd, 0), cnt(shape);
  for (size_t d = 1; d < nd; ++d)
    if (!sel[d].all) {
      off[d] = sel[d].idx.front();
      cnt[d] = sel[d].idx.back() - off[d] + 1;
    }
  std::vector<std::pair<int64_t, int64_t>> runs;  // [lo, hi)
  if (sel[0].all) {
    runs.push_back({0, shape[0]});
  } else {
    for (int64_t i : sel[0].idx) {
      if (!runs.empty() && runs.back().second == i) runs.back().second = i + 1;
      else runs.push_back({i, i + 1});
    }
    if (runs.size() > kMaxReadsPerTensor) {
      std::vector<int64_t> gaps;
      for (size_t k = 0; k + 1 < runs.size(); ++k) gaps.push_back(runs[k + 1].first - runs[k].second);
      std::vector<int64_t> sorted = gaps;
      std::nth_element(sorted.begin(), sorted.begin() + long(runs.size() - kMaxReadsPerTensor - 1), sorted.end());
      const int64_t limit = sorted[runs.size() - kMaxReadsPerTensor - 1];
      std::vector<std::pair<int64_t, int64_t>> merged{runs[0]};
      for (size_t k = 1; k < runs.size(); ++k) {
        if (gaps[k - 1] <= limit) merged.back().second = runs[k].second;
        else merged.push_back(runs[k]);
      }
      runs = std::move(merged);
    }
  }
  std::vector<torch::Tensor> parts;
  for (const auto& [lo, hi] : runs) {
    off[0] = lo;
    cnt[0] = hi - lo;
    parts.push_back(r.read(ds, off, cnt));
  }
  torch::Tensor t = parts.size() == 1 ? parts[0] : torch::cat(parts, 0);
  auto select = [&](int64_t d, std::vector<int64_t> local) {
    bool plain = int64_t(local.size()) == t.size(d);
    for (size_t k = 0; plain && k < local.size(); ++k) plain = local[k] == int64_t(k);
    if (!plain) t = t.index_select(d, torch::tensor(local, torch::kLong));
  };
  if (!sel[0].all) {
    std::vector<int64_t> local;
    size_t k = 0;
    int64_t base = 0;
    for (int64_t i : sel[0].idx) {
      while (i >= runs[k].second) base += runs[k].second - runs[k].first, ++k;
      local.push_back(base + i - runs[k].first);
    }
    select(0, std::move(local));
  }
  for (size_t d = 1; d < nd; ++d) {
    if (sel[d].all) continue;
    std::vector<int64_t> local;
    for (int64_t i : sel[d].idx) local.push_back(i - off[d]);
    select(int64_t(d), std::move(local));
  }
  return t;
}

void check_source(const checkpoint::CheckpointReader& r, const TensorPlan& t) {
  const std::string ds = "model/" + t.source;
  if (!r.has(ds))
    throw InputError(r.path(), ds, "missing (the teacher ArchSpec has it, shape " + shape_text(t.source_shape) + ")");
  const auto& info = r.info(ds);
  if (info.shape != t.source_shape)
    throw InputError(r.path(), ds, "has shape " + shape_text(info.shape) + ", the teacher ArchSpec wants " +
                                       shape_text(t.source_shape));
}

}  // namespace

std::vector<int64_t> TensorPlan::shape() const {
  std::vector<int64_t> s = source_shape;
  for (size_t d = 0; d < s.size(); ++d)
    if (d < keep.size() && keep[d]) s[d] = int64_t(keep[d]->size());
  return s;
}
std::vector<int64_t> TensorPlan::indices(size_t dim) const { return materialise(keep.at(dim), source_shape.at(dim)); }
bool TensorPlan::identity() const {
  if (name != source || scale != 1.0) return false;
  for (const auto& k : keep)
    if (k) return false;
  return true;
}

const TensorPlan* PrunePlan::find(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorPlan& t, const std::string& n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

std::string is_sub_architecture(const model::ArchSpec& t, const model::ArchSpec& s) {
  std::string e;
  if (!(e = at_most("hidden_size", s.hidden_size, t.hidden_size)).empty()) return e;
  if (!(e = same_int("vocab_size", s.vocab_size, t.vocab_size)).empty()) return e;
  if (!(e = same_bool("tie_embeddings", s.tie_embeddings, t.tie_embeddings)).empty()) return e;
  if (!(e = same_double("norm_eps", s.norm_eps, t.norm_eps)).empty()) return e;
  if (!(e = same_double("rope_theta", s.rope_theta, t.rope_theta)).empty()) return e;
  if ((s.family == model::ModelFamily::NemotronH) != (t.family == model::ModelFamily::NemotronH))
    return "family: " + to_string(s.family) + " vs the teacher's " + to_string(t.family) +
           " (Nemotron-H and other families normalise differently)";
  if (s.layers.size() != t.layers.size())
    return "layers: " + std::to_string(s.layers.size()) + " layers, the teacher has " + std::to_string(t.layers.size()) +
           " (a student keeps one entry per teacher layer; a dropped layer is {\"kind\": \".\"})";
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const auto &ls = s.layers[i], &lt = t.layers[i];
    const std::string w = where(i);
    auto missing = [&](const char* part) {
      return w + "." + part + ": the teacher's layer " + std::to_string(i) + " (" + model::layer_kind(lt) +
             ") has no " + part;
    };
    if (ls.attention && !lt.attention) return missing("attention");
    if (ls.mamba && !lt.mamba) return missing("mamba");
    if (ls.mlp && !lt.mlp) return missing("mlp");
    if (ls.moe && !lt.moe) return missing("moe");
    if (ls.attention && !(e = sub_attention(w + ".attention", *ls.attention, *lt.attention)).empty()) return e;
    if (ls.mamba && !(e = sub_mamba(w + ".mamba", *ls.mamba, *lt.mamba)).empty()) return e;
    if (ls.mlp && !(e = sub_mlp(w + ".mlp", *ls.mlp, *lt.mlp)).empty()) return e;
    if (ls.moe && !(e = sub_moe(w + ".moe", *ls.moe, *lt.moe)).empty()) return e;
  }
  // MTP depths are not part of the model the checkpoint holds: keep the teacher's or none.
  if (s.mtp.num_predict_layers != 0) {
    bool equal = s.mtp.num_predict_layers == t.mtp.num_predict_layers && s.mtp.layers.size() == t.mtp.layers.size();
    for (size_t i = 0; equal && i < s.mtp.layers.size(); ++i)
      equal = model::layer_kind(s.mtp.layers[i]) == model::layer_kind(t.mtp.layers[i]);
    if (!equal) return "mtp: differs from the teacher's (MTP depths are not pruned: keep the teacher's or drop them)";
  }
  return "";
}

PrunePlan plan_prune(const model::ArchSpec& teacher, const model::ArchSpec& student, const ImportanceScores& scores,
                     const std::string& student_source, const std::string& scores_source) {
  model::validate(student, student_source);
  if (auto why = is_sub_architecture(teacher, student); !why.empty()) {
    const size_t colon = why.find(": ");
    throw InputError(student_source, why.substr(0, colon),
                     (colon == std::string::npos ? why : why.substr(colon + 2)) + " (not a sub-architecture of the teacher)");
  }
  Planner p{teacher, student, scores, scores_source, {}};
  p.run();
  return std::move(p.plan);
}

void load_pruned(model::CausalLMImpl& student, const checkpoint::CheckpointReader& r, const PrunePlan& plan) {
  for (const auto& t : plan.tensors) check_source(r, t);
  student.load([&](const model::ShardPiece& piece) {
    const TensorPlan* t = plan.find(piece.logical);
    if (!t) throw std::runtime_error("prune: the student has tensor " + piece.logical + " that the plan lacks");
    const std::vector<int64_t> shape = t->shape();
    if (shape != piece.logical_shape)
      throw std::runtime_error("prune: " + piece.logical + ": the plan gives " + shape_text(shape) + ", the model wants " +
                               shape_text(piece.logical_shape));
    std::vector<Sel> sel(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      const bool sliced = int64_t(d) == piece.dim && !piece.logical_shape.empty() &&
                          !(piece.start == 0 && piece.size == shape[d]);
      if (!sliced && !t->keep[d]) continue;
      sel[d].all = false;
      if (!sliced) {
        sel[d].idx = *t->keep[d];
      } else if (!t->keep[d]) {
        sel[d].idx = iota(piece.size, piece.start);
      } else {
        sel[d].idx.assign(t->keep[d]->begin() + piece.start, t->keep[d]->begin() + piece.start + piece.size);
      }
    }
    torch::Tensor v = read_selected(r, "model/" + t->source, t->source_shape, sel);
    if (t->scale != 1.0) v = v.to(torch::kFloat32) * t->scale;
    return v;
  });
}

PruneResult prune_checkpoint(MPI_Comm world, const std::string& teacher_checkpoint, const ImportanceScores& scores,
                             const model::ArchSpec& student, const std::string& out_dir, const PruneOptions& options) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  PruneResult res;
  const std::string path = checkpoint::resolve_checkpoint(teacher_checkpoint);
  checkpoint::CheckpointReader reader(path);
  const model::ArchSpec teacher = checkpoint::checkpoint_arch(reader);
  const PrunePlan plan = plan_prune(teacher, student, scores, options.student_source, options.scores_source);
  if (options.tp < 1) throw InputError("--tp", std::to_string(options.tp), "must be positive");
  if (auto why = model::tp_split_problem(student, options.tp); !why.empty())
    throw InputError(options.student_source, "--tp " + std::to_string(options.tp), why);
  const torch::Dtype dtype = checkpoint::parse_dtype(student.dtype, options.student_source + ": dtype");
  for (const auto& t : plan.tensors) check_source(reader, t);  // on every rank, before any write
  dist::ParallelLayout layout(world, {options.tp, 0, 0});
  res.tp = layout.tp_size();
  res.dp = layout.dp_size();
  const auto tb = clock::now();
  // Every parameter is loaded from the teacher below (or, on DP replicas, never read), so the
  // constructor's random fill would be wasted work: it was most of a prune's time.
  std::optional<model::SkipInitGuard> no_init(std::in_place);
  model::CausalLM m(student, model::TpGroup{dist::make_mpi_communicator(layout.tp_mpi_comm())}, model::ModelOptions{dtype});
  no_init.reset();
  const auto t1 = clock::now();
  if (layout.dp_rank() == 0) load_pruned(*m, reader, plan);  // DP replicas write nothing: they read nothing
  const auto t2 = clock::now();
  const nlohmann::json attributes = {
      {checkpoint::kArchSpecAttribute, model::arch_to_json(student)},
      {"layout", {{"tp", res.tp}, {"dp", res.dp}}},
      {"source",
       {{"format", "pruned"},
        {"teacher", fs::absolute(path).lexically_normal().string()},
        {"teacher_fingerprint", scores.teacher_fingerprint},
        {"importance", options.scores_source}}},
  };
  res.path = checkpoint::save_checkpoint(world, out_dir, 0, checkpoint::model_tensors(m, layout.dp_rank() == 0), attributes);
  const auto t3 = clock::now();
  res.tensors = int64_t(plan.tensors.size());
  for (const auto& t : plan.tensors) {
    int64_t n = 1;
    for (int64_t v : t.shape()) n *= v;
    res.bytes += n * int64_t(torch::elementSize(dtype));
  }
  res.plan_s = std::chrono::duration<double>(tb - t0).count();
  res.build_s = std::chrono::duration<double>(t1 - tb).count();
  res.load_s = std::chrono::duration<double>(t2 - t1).count();
  res.save_s = std::chrono::duration<double>(t3 - t2).count();
  return res;
}

}  // namespace ac::search

// The training-side planner (search/plan/plan.h): per-GPU memory, communication per step and a
// step-time estimate for distillation, importance and search jobs. Formulas: docs/plan.md.
#include "search/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "dist/error.h"

namespace ac::search {

using model::ArchSpec;
using model::LayerSpec;
using nlohmann::json;

namespace {

constexpr double kGiB = double(1 << 30);

std::string fmt(const char* f, double a) {
  char b[256];
  std::snprintf(b, sizeof b, f, a);
  return b;
}
std::string gib_text(double bytes) { return fmt("%.2f GiB", bytes / kGiB); }

double dtype_bytes(const std::string& dtype) {
  if (dtype == "float32") return 4;
  if (dtype == "bfloat16" || dtype == "float16") return 2;
  throw InputError("ArchSpec", "dtype", "\"" + dtype + "\" is not float32, bfloat16 or float16");
}

bool relu2(model::MlpActivation a) { return a == model::MlpActivation::ReLU2; }

// Every layer of a model the plan holds: the decoder layers, then (optionally) the MTP blocks
// once per predicted depth. `where` names a layer for error messages.
struct NamedLayer {
  const LayerSpec* layer;
  std::string where;
  bool mtp;
};
std::vector<NamedLayer> plan_layers(const ArchSpec& a, const std::string& who, bool include_mtp) {
  std::vector<NamedLayer> v;
  for (size_t i = 0; i < a.layers.size(); ++i) v.push_back({&a.layers[i], who + " layers[" + std::to_string(i) + "]", false});
  if (include_mtp)
    for (int d = 0; d < a.mtp.num_predict_layers; ++d)
      for (size_t i = 0; i < a.mtp.layers.size(); ++i)
        v.push_back({&a.mtp.layers[i], who + " mtp.layers[" + std::to_string(i) + "]", true});
  return v;
}

// ---- layout checks ------------------------------------------------------------------------
void check_model(const ArchSpec& a, const std::string& who, int tp, int ep, int etp, const PlanOptions& o) {
  for (const auto& nl : plan_layers(a, who, o.include_mtp)) {
    const LayerSpec& l = *nl.layer;
    auto refuse = [&](const std::string& opt, int v, const std::string& what) {
      throw InputError(opt, std::to_string(v), "does not divide " + what + " of " + nl.where);
    };
    if (l.attention) {
      const auto& at = *l.attention;
      if (at.num_heads % tp) refuse("--tp", tp, "the " + std::to_string(at.num_heads) + " attention heads");
      if (at.num_kv_heads >= tp ? at.num_kv_heads % tp : tp % at.num_kv_heads)
        throw InputError("--tp", std::to_string(tp),
                         "and the " + std::to_string(at.num_kv_heads) + " KV heads of " + nl.where +
                             ": one must divide the other (KV heads are replicated when fewer than TP)");
    }
    if (l.mamba) {
      if (l.mamba->num_heads % tp) refuse("--tp", tp, "the " + std::to_string(l.mamba->num_heads) + " Mamba heads");
      if (l.mamba->n_groups % tp) refuse("--tp", tp, "the " + std::to_string(l.mamba->n_groups) + " Mamba groups");
    }
    if (l.mlp && l.mlp->ffn_size % tp) refuse("--tp", tp, "the MLP width " + std::to_string(l.mlp->ffn_size));
    if (l.moe) {
      const auto& m = *l.moe;
      if (m.num_experts % ep)
        throw InputError(who == "teacher" ? "--teacher-ep" : "--ep", std::to_string(ep),
                         "does not divide the " + std::to_string(m.num_experts) + " experts of " + nl.where);
      if (m.expert_ffn % etp) refuse("--etp", etp, "the expert FFN width " + std::to_string(m.expert_ffn));
      if (m.shared_ffn % tp) refuse("--tp", tp, "the shared-expert FFN width " + std::to_string(m.shared_ffn));
    }
  }
}

// ---- parameters on one GPU ----------------------------------------------------------------
struct Shards {
  double total = 0;       // whole model
  double dense_gpu = 0;   // non-expert parameters on one GPU (TP-sharded + replicated)
  double expert_gpu = 0;  // routed experts on one GPU
  double expert_total = 0;
};

Shards shard_params(const ArchSpec& a, int tp, int ep, int etp, bool include_mtp) {
  const model::ParamCounts pc = model::count_params(a);
  Shards s;
  const double h = double(a.hidden_size);
  const double vocab_shard = std::ceil(double(a.vocab_size) / tp);  // dist::VocabShard: ceil(V / tp) rows
  s.dense_gpu += vocab_shard * h * (pc.head > 0 ? 2 : 1) + double(pc.final_norm);
  s.total += double(pc.embedding + pc.head + pc.final_norm);
  double mtp_layer_params = 0;
  for (const auto& nl : plan_layers(a, "", include_mtp)) {
    const model::LayerParams p = model::count_layer_params(*nl.layer, a.hidden_size);
    if (nl.mtp) mtp_layer_params += double(p.total());
    s.total += double(p.total());
    double kv = 0;
    if (nl.layer->attention) {
      const auto& at = *nl.layer->attention;
      kv = 2.0 * double(at.num_kv_heads) * at.head_dim * (h + (at.qkv_bias ? 1 : 0));
    }
    const int kv_shards = nl.layer->attention ? std::min(tp, nl.layer->attention->num_kv_heads) : 1;
    s.dense_gpu += double(p.norms) + double(p.moe_router) + double(p.moe_latent)  // replicated over TP
                   + (double(p.attention) - kv) / tp + kv / kv_shards + double(p.mamba) / tp + double(p.mlp) / tp +
                   double(p.moe_shared) / tp;
    s.expert_total += double(p.moe_routed);
    s.expert_gpu += double(p.moe_routed) / (double(ep) * etp);
  }
  if (include_mtp) {  // eh_proj and the MTP norms: counted as replicated
    const double rest = double(pc.mtp) - mtp_layer_params;
    s.total += rest;
    s.dense_gpu += rest;
  }
  return s;
}

// ---- FLOPs per token (forward) split by the efficiency that applies -----------------------
struct Flops {
  double gemm = 0, attention = 0, ssm = 0;
  double total() const { return gemm + attention + ssm; }
};
Flops forward_flops(const ArchSpec& a, int64_t seq_len) {
  Flops f;
  double layers = 0;
  for (const auto& l : a.layers) {
    const model::LayerFlops lf = model::layer_flops_prefill(l, a.hidden_size, seq_len);
    f.gemm += lf.dense + lf.experts;
    f.attention += lf.attention;
    f.ssm += lf.ssm;
    layers += lf.total();
  }
  f.gemm += model::prefill_flops_per_token(a, seq_len) - layers;  // LM head (and embedding)
  return f;
}
double seconds_for(const Flops& f, const HardwareProfile& hw) {
  return f.gemm / (hw.peak_flops * hw.gemm.max) + f.attention / (hw.peak_flops * hw.attention.max) +
         f.ssm / (hw.peak_flops * hw.scan.max);
}

// ---- activations of one model ---------------------------------------------------------------
struct ModelActivations {
  std::vector<ActivationRow> rows;
  double saved = 0;        // all layers (training)
  double max_working = 0;  // the largest single layer working set
};
ModelActivations model_activations(const ArchSpec& a, const std::string& who, const ActivationShape& shape,
                                   bool include_mtp) {
  ModelActivations m;
  for (const auto& nl : plan_layers(a, who, include_mtp)) {
    if (nl.mtp) continue;  // MTP blocks run on the same tokens; not counted (docs/plan.md)
    const LayerActivation la = layer_activations(*nl.layer, a.hidden_size, shape);
    const std::string kind = model::layer_kind(*nl.layer);
    auto it = std::find_if(m.rows.begin(), m.rows.end(), [&](const ActivationRow& r) {
      return r.kind == kind && r.saved_per_layer == la.saved && r.working_per_layer == la.working;
    });
    if (it == m.rows.end()) m.rows.push_back({who, kind, 1, la.saved, la.working});
    else it->layers++;
    m.saved += la.saved;
    m.max_working = std::max(m.max_working, la.working);
  }
  // Final norm input and the LM head's input, sequence-sharded like every layer input.
  const double ts = shape.sequence_parallel ? shape.tp : 1;
  m.saved += 2.0 * 2.0 * double(shape.seq_len) * shape.micro_batch * a.hidden_size / ts;
  return m;
}

// Routed token copies one GPU processes per micro-batch (balanced routing, dropless).
double routed_copies_per_gpu(const model::MoeSpec& m, double tokens, int tp, int etp, bool sp) {
  return sp ? tokens * m.top_k * double(etp) / tp : tokens * m.top_k;
}

int max_expert_width(const ArchSpec& a) {
  int64_t w = 0;
  for (const auto& l : a.layers)
    if (l.moe) w = std::max(w, l.moe->latent_size > 0 ? l.moe->latent_size : a.hidden_size);
  return int(w);
}

// ---- communication --------------------------------------------------------------------------
struct GroupPlace {
  int size = 1, stride = 1;
  bool inter = false;
};
GroupPlace place(int size, int stride, int gpn) { return {size, stride, size > 1 && size * stride > gpn}; }

double ring_seconds(double bytes, const GroupPlace& g, const HardwareProfile& hw) {
  const auto& ic = hw.interconnect;
  if (!ic.present() || bytes <= 0) return 0;
  return bytes / ((g.inter ? ic.inter_node_bandwidth : ic.intra_node_bandwidth) * ic.efficiency);
}
// All-to-all: the share of peers on the same node goes over NVLink, the rest over the NIC.
double alltoall_seconds(double bytes, const GroupPlace& g, int gpn, const HardwareProfile& hw) {
  const auto& ic = hw.interconnect;
  if (!ic.present() || bytes <= 0 || g.size <= 1) return 0;
  const int local = g.inter ? std::max(1, std::min(g.size, gpn / std::max(1, g.stride))) : g.size;
  const double f_intra = double(local - 1) / (g.size - 1), f_inter = 1 - f_intra;
  return bytes * (f_intra / ic.intra_node_bandwidth + f_inter / ic.inter_node_bandwidth) / ic.efficiency;
}

// Blocks that gather/scatter the sequence under SP (all-reduce their output without). With
// `dispatch_from_slice` (SP, no observer: the trainer's MoE at any ETP) the routed experts take
// their tokens from the sequence slice (all-to-all, priced apart), so a MoE block is a TP region
// only through its shared expert.
int sublayers_with_tp(const ArchSpec& a, bool dispatch_from_slice) {
  int n = 2;  // embedding, LM head
  for (const auto& l : a.layers)
    n += int(bool(l.attention)) + int(bool(l.mamba)) + int(bool(l.mlp)) +
         int(l.moe && (!dispatch_from_slice || l.moe->shared_ffn > 0));
  return n;
}

// Search masks / importance accumulators: one entry per scored or masked unit.
double unit_count(const ArchSpec& a) {
  double n = double(a.hidden_size);
  for (const auto& l : a.layers) {
    n += 1;  // depth
    if (l.attention) n += l.attention->num_heads + l.attention->num_kv_heads;
    if (l.mamba) n += l.mamba->num_heads + l.mamba->head_dim;
    if (l.mlp) n += double(l.mlp->ffn_size);
    if (l.moe)
      n += 2.0 * l.moe->num_experts + double(l.moe->num_experts) * l.moe->expert_ffn + double(l.moe->shared_ffn) +
           double(l.moe->latent_size);
  }
  return n;
}

int experts_gcd(const ArchSpec& a, int g) {
  for (const auto& l : a.layers)
    if (l.moe) g = std::gcd(g, l.moe->num_experts);
  for (const auto& l : a.mtp.layers)
    if (l.moe) g = std::gcd(g, l.moe->num_experts);
  return g;
}

}  // namespace

// ---- public helpers -----------------------------------------------------------------------
std::string phase_names(unsigned phases) {
  if (phases == kAlways) return "always";
  std::string s;
  for (auto [bit, name] : {std::pair{kForward, "forward"}, std::pair{kKdBackward, "KD backward"},
                           std::pair{kBackward, "backward"}, std::pair{kStep, "step"}})
    if (phases & bit) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

std::string Cluster::to_string() const {
  return std::to_string(nodes) + "x" + std::to_string(gpus_per_node) + "x" + kind;
}

Cluster parse_cluster(const std::string& text, const std::string& field) {
  static const std::regex re(R"(^\s*([0-9]+)x([0-9]+)x([A-Za-z0-9_./-]+)\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw InputError(field, text, "expected NODESxGPUSxKIND, e.g. 8x8xh100 (KIND a hardware profile id)");
  Cluster c;
  try {
    c.nodes = std::stoi(m[1]);
    c.gpus_per_node = std::stoi(m[2]);
  } catch (const std::exception&) {
    throw InputError(field, text, "node or GPU count out of range");
  }
  if (c.nodes < 1) throw InputError(field, text, "NODES must be at least 1");
  if (c.gpus_per_node < 1) throw InputError(field, text, "GPUS per node must be at least 1");
  if (double(c.nodes) * c.gpus_per_node > 1e6) throw InputError(field, text, "more than a million GPUs");
  c.kind = m[3];
  return c;
}

Recompute parse_recompute(const std::string& s, const std::string& field) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  throw InputError(field, s, "expected none, selective or full");
}
PlanStage parse_stage(const std::string& s, const std::string& field) {
  if (s == "distill") return PlanStage::Distill;
  if (s == "importance") return PlanStage::Importance;
  if (s == "search") return PlanStage::Search;
  throw InputError(field, s, "expected distill, importance or search");
}
std::string to_string(Recompute r) {
  return r == Recompute::None ? "none" : r == Recompute::Selective ? "selective" : "full";
}
std::string to_string(PlanStage s) {
  return s == PlanStage::Distill ? "distill" : s == PlanStage::Importance ? "importance" : "search";
}

std::string PlanLayout::to_string() const {
  std::string s = "TP " + std::to_string(tp) + " x DP " + std::to_string(dp) + ", EP " + std::to_string(ep) +
                  " x ETP " + std::to_string(etp);
  if (teacher_ep != ep) s += " (teacher EP " + std::to_string(teacher_ep) + ")";
  return s + ", ZeRO-" + std::to_string(zero);
}

LayerActivation layer_activations(const LayerSpec& l, int64_t hidden, const ActivationShape& sh) {
  const double s = double(sh.seq_len), b = double(sh.micro_batch), sb = s * b, h = double(hidden);
  const double t = sh.tp, ts = sh.sequence_parallel ? sh.tp : 1;
  const double drop = sh.dropout ? 1.0 : 0.0;  // 1-byte dropout mask of h per token per sublayer
  double seq = 0, ten = 0, scores = 0;          // bytes per token (seq-sharded, TP-sharded), per micro-batch
  if (l.attention) {
    const auto& at = *l.attention;
    const double qd = double(at.num_heads) * at.head_dim, kvd = double(at.num_kv_heads) * at.head_dim;
    const double kv_shards = std::min<double>(t, at.num_kv_heads);
    seq += 2 * h + 2 * h + drop * h;              // norm input, QKV input (norm output), dropout mask
    ten += (2 * qd + 2 * qd) / t + 2 * 2 * kvd / kv_shards;  // Q, out-proj input; K, V
    scores = sh.flash_attention ? 4.0 * at.num_heads * sb / t  // fp32 log-sum-exp per head and token
                                : (2.0 + 3.0 * drop) * at.num_heads * s * s * b / t;  // softmax (+ dropout mask, output)
  }
  if (l.mamba) {
    const auto& m = *l.mamba;
    const double di = double(m.d_inner()), gn = double(m.n_groups) * m.state_size;
    seq += 2 * h + 2 * h + drop * h;                              // norm input, in_proj input
    ten += (2 * (2 * di + 2 * gn + m.num_heads) + 2 * di + 4.0 * m.n_groups) / t;  // zxbcdt, out_x, rstd
  }
  if (l.mlp) {
    const double f = double(l.mlp->ffn_size);
    seq += 2 * h + 2 * h + drop * h;  // norm input, fc1 input
    ten += (relu2(l.mlp->activation) ? 4 : 6) * f / t;  // fc1 output(s), fc2 input
  }
  double routed = 0;  // bytes per micro-batch for the routed experts
  if (l.moe) {
    const auto& m = *l.moe;
    const double lat = double(m.latent_size), width = lat > 0 ? lat : h;
    seq += 2 * h + 2 * h + drop * h + 4.0 * m.num_experts + 12.0 * m.top_k;  // norm in/out, fp32 router scores, top-k
    if (lat > 0) seq += 2 * lat + 2 * lat;  // fc1_latent_proj output, fc2_latent_proj input
    ten += (relu2(m.activation) ? 4 : 6) * double(m.shared_ffn) / t;
    const double copies = routed_copies_per_gpu(m, sb, sh.tp, sh.etp, sh.sequence_parallel);
    // per copy: permuted input, fc1 output and activation (sliced by ETP); the expert output (kept
    // for the gradient of the routing probabilities) after fc2's reduce-scatter over ETP -- without
    // SP (this project's trainer) the TP ranks reduce the layer output after the combine, so each
    // keeps its partial expert outputs at full width
    const double out_width = sh.sequence_parallel ? width / sh.etp : width;
    routed = copies * (2 * width + (relu2(m.activation) ? 4 : 6) * double(m.expert_ffn) / sh.etp + 2 * out_width);
  }
  LayerActivation r;
  if (!l.attention && !l.mamba && !l.mlp && !l.moe) return r;
  r.working = sb * (seq / ts + ten) + scores + routed;
  switch (sh.recompute) {
    case Recompute::None: r.saved = r.working; break;
    case Recompute::Selective: r.saved = r.working - scores; break;  // core attention recomputed
    case Recompute::Full: r.saved = 2 * sb * h / ts; break;          // the layer input only
  }
  // The byte counts above are of bf16 activations (Korthikanti et al.); fp32 ones are twice that.
  r.working *= sh.element_bytes / 2;
  r.saved *= sh.element_bytes / 2;
  return r;
}

double Plan::item(const std::string& name) const {
  for (const auto& m : memory)
    if (m.name == name) return m.bytes;
  return 0;
}

std::string Plan::overflow() const {
  if (fits) return "";
  std::vector<MemoryItem> v = memory;
  std::sort(v.begin(), v.end(), [](const MemoryItem& a, const MemoryItem& b) { return a.bytes > b.bytes; });
  std::string s = layout.to_string() + " needs " + gib_text(total_bytes) + " per GPU, " +
                  gib_text(total_bytes - usable_bytes) + " more than the usable " + gib_text(usable_bytes) + " of a " +
                  hardware_id + " (";
  for (size_t i = 0; i < v.size() && i < 3; ++i) s += (i ? ", " : "") + v[i].name + " " + gib_text(v[i].bytes);
  return s + ")";
}

namespace {

// The layout with its defaults filled in (DP = world / TP, ETP = TP, teacher EP = EP), checked
// against the cluster.
PlanLayout resolve_layout(const Cluster& cluster, const PlanLayout& layout_in) {
  PlanLayout L = layout_in;
  const int world = cluster.world();
  if (L.tp < 1) throw InputError("--tp", std::to_string(L.tp), "must be at least 1");
  if (world % L.tp) throw InputError("--tp", std::to_string(L.tp), "does not divide the " + std::to_string(world) + " GPUs of " + cluster.to_string());
  if (L.dp != 0 && L.dp != world / L.tp)
    throw InputError("--dp", std::to_string(L.dp),
                     "must be GPUs / TP = " + std::to_string(world) + " / " + std::to_string(L.tp) + " = " +
                         std::to_string(world / L.tp) + " (no pipeline parallelism)");
  L.dp = world / L.tp;
  if (L.etp == 0) L.etp = L.tp;
  if (L.teacher_ep == 0) L.teacher_ep = L.ep;
  if (L.ep < 1) throw InputError("--ep", std::to_string(L.ep), "must be at least 1");
  if (L.teacher_ep < 1) throw InputError("--teacher-ep", std::to_string(L.teacher_ep), "must be at least 1");
  if (L.etp < 1 || L.tp % L.etp)
    throw InputError("--etp", std::to_string(L.etp), "must divide TP " + std::to_string(L.tp));
  if (L.zero < 0 || L.zero > 2) throw InputError("--zero", std::to_string(L.zero), "expected 0, 1 or 2");
  for (auto [ep, opt] : {std::pair{L.ep, "--ep"}, std::pair{L.teacher_ep, "--teacher-ep"}})
    if (world % (ep * L.etp))
      throw InputError(opt, std::to_string(ep),
                       "EP x ETP = " + std::to_string(ep * L.etp) + " does not divide the " + std::to_string(world) + " GPUs");
  return L;
}

// Sequences per optimizer step, checked with the other batch options.
int64_t global_batch(const PlanOptions& o, const PlanLayout& L) {
  if (o.seq_len < 1) throw InputError("--seq-len", std::to_string(o.seq_len), "must be positive");
  if (o.micro_batch < 1) throw InputError("--micro-batch", std::to_string(o.micro_batch), "must be positive");
  if (o.grad_bytes != 2 && o.grad_bytes != 4) throw InputError("--grad-dtype", std::to_string(o.grad_bytes), "gradients are bf16 (2) or fp32 (4)");
  const int64_t per_step_min = o.micro_batch * L.dp;
  const int64_t gbs = o.global_batch > 0 ? o.global_batch : per_step_min;
  if (gbs % per_step_min)
    throw InputError("--global-batch", std::to_string(gbs),
                     "is not a multiple of micro-batch x DP = " + std::to_string(per_step_min));
  return gbs;
}

// A plan under construction: the sizes every item shares, and how items are added. The parts
// below fill its memory items, compute and communication; finish() sums them up.
struct PlanBuilder {
  Plan& p;
  const ArchSpec& teacher;
  const ArchSpec* student;  // distill only
  const HardwareProfile& hw;
  const PlanOptions& o;
  const PlanLayout& L;
  int tp = 1, gpn = 1, world = 1;
  double s = 0, b = 0, sb = 0, ts = 1;  // sequence, micro-batch, tokens per micro-batch, SP shards
  double eb = 2;                        // bytes per activation element (the trained model's dtype)
  double tokens_step = 0, vshard_t = 0, layer_tensor = 0;
  ActivationShape shape;  // of the trained model (with recompute)
  ModelActivations teacher_act;
  Flops f_teacher;
  GroupPlace g_tp, g_dp;
  double buffers = 0;        // live in the forward and backward
  double train_flops_s = 0;  // seconds of the trained model's compute (what DP communication can hide behind)

  PlanBuilder(Plan& plan, const ArchSpec& teacher_, const ArchSpec* student_, const HardwareProfile& hw_, int64_t gbs)
      : p(plan), teacher(teacher_), student(student_), hw(hw_), o(plan.options), L(plan.layout) {
    tp = L.tp, gpn = p.cluster.gpus_per_node, world = p.cluster.world();
    s = double(o.seq_len), b = double(o.micro_batch), sb = s * b, ts = o.sequence_parallel ? tp : 1;
    // Activations, logits and SP buffers are in the trained model's dtype (the teacher's for importance).
    eb = dtype_bytes(student ? student->dtype : teacher.dtype);
    shape = ActivationShape{o.seq_len, o.micro_batch, tp, L.etp, o.sequence_parallel, o.flash_attention, o.dropout, o.recompute, eb};
    ActivationShape fwd_shape = shape;
    fwd_shape.recompute = Recompute::None;
    teacher_act = model_activations(teacher, "teacher", fwd_shape, o.include_mtp);
    vshard_t = std::ceil(double(teacher.vocab_size) / tp);
    f_teacher = forward_flops(teacher, o.seq_len);
    tokens_step = double(gbs) * s;
    p.tokens_per_step = tokens_step;
    g_tp = place(tp, 1, gpn), g_dp = place(L.dp, tp, gpn);
    layer_tensor = eb * sb * double(teacher.hidden_size);  // [s, b, h]
    if (tp > 1 && o.sequence_parallel) buffers += 2 * layer_tensor;  // the gathered sequence and its gradient
  }

  void add(const std::string& name, double bytes, const std::string& note, unsigned phases = kAlways) {
    if (bytes > 0) p.memory.push_back({name, bytes, note, phases});
  }
  void add_comm(const std::string& coll, const std::string& group, const std::string& what, const GroupPlace& g,
                double bytes, bool alltoall) {
    if (bytes <= 0 || g.size <= 1) return;
    CommItem c{coll, group, what, g.size, g.inter, bytes,
               alltoall ? alltoall_seconds(bytes, g, gpn, hw) : ring_seconds(bytes, g, hw)};
    p.comm.push_back(c);
    if (group == "TP" || group == "ETP") p.tp_comm_s += c.seconds;
    else if (group == "EP") p.ep_comm_s += c.seconds;
    else p.dp_comm_s += c.seconds;
  }
  // masked: the search's masked model, whose MoE observers see it as a TP region under SP too.
  double tp_volume(const ArchSpec& a, double passes, bool masked = false) const {
    const bool from_slice = o.sequence_parallel && tp > 1 && !masked;
    return passes * p.grad_accum * sublayers_with_tp(a, from_slice) * 2.0 * (tp - 1) / tp * (2 * sb * double(a.hidden_size));
  }
  void ep_volumes(const ArchSpec& a, int ep, double passes, const std::string& who) {
    double a2a = 0, etp_bytes = 0;
    for (const auto& l : a.layers) {
      if (!l.moe) continue;
      const double width = double(l.moe->latent_size > 0 ? l.moe->latent_size : a.hidden_size);
      const double local = sb / ts * l.moe->top_k;  // copies of the tokens this GPU holds
      a2a += passes * p.grad_accum * 2.0 * local * width * 2 * (ep - 1) / ep;  // dispatch + combine
      const double copies = routed_copies_per_gpu(*l.moe, sb, tp, L.etp, o.sequence_parallel);
      // Without SP every TP rank already holds every token: no gather of routed copies over ETP.
      if (o.sequence_parallel) etp_bytes += passes * p.grad_accum * 2.0 * copies * width * 2 * (L.etp - 1) / L.etp;
    }
    add_comm("all-to-all (dispatch + combine)", "EP", who + " routed tokens", place(ep, L.etp, gpn), a2a, true);
    add_comm("all-gather + reduce-scatter", "ETP", who + " routed tokens to the expert-TP ranks", place(L.etp, 1, gpn),
             etp_bytes, false);
  }

  void teacher_weights() {
    const Shards ts_t = shard_params(teacher, tp, L.teacher_ep, L.etp, o.include_mtp);
    p.teacher_params = ts_t.total;
    p.teacher_params_gpu = ts_t.dense_gpu + ts_t.expert_gpu;
    add("teacher weights", p.teacher_params_gpu * dtype_bytes(teacher.dtype),
        fmt("%.3gB params on this GPU, ", p.teacher_params_gpu / 1e9) + teacher.dtype + ", frozen" +
            (o.stage == PlanStage::Search ? "; shared by the masked student" : ""));
  }

  // Importance: a no-grad teacher forward and the score accumulators.
  void importance() {
    add("activations (forward workspace)", teacher_act.max_working + 2 * layer_tensor / ts,
        "largest layer of a no-grad forward + residual stream", kForward);
    add("teacher logits", eb * sb * vshard_t, fmt("%.0f-byte [tokens, vocab / TP]", eb), kForward);
    add("importance accumulators", unit_count(teacher) * 8, "fp64 per scored unit, replicated");
    for (auto& r : teacher_act.rows) p.activations.push_back(r);
    p.flops_per_gpu = tokens_step * f_teacher.total() / world;
    p.compute_s = tokens_step * seconds_for(f_teacher, hw) / world;
    add_comm("all-gather + reduce-scatter (SP) / all-reduce", "TP", "teacher layer inputs and outputs", g_tp,
             tp_volume(teacher, 1), false);
    ep_volumes(teacher, L.teacher_ep, 1, "teacher");
  }

  // The student's weights, gradients and optimizer states (distill); the masks (search).
  void trained_state() {
    if (!student) {
      const double masks = unit_count(teacher);
      add("search masks + optimizer", masks * 16, "fp32 mask logits + master + Adam m, v, replicated");
      return;
    }
    const Shards ss = shard_params(*student, tp, L.ep, L.etp, o.include_mtp);
    p.student_params = ss.total;
    p.student_dense_gpu = ss.dense_gpu;
    p.student_expert_gpu = ss.expert_gpu;
    const double sbytes = dtype_bytes(student->dtype);
    const double dp_g = L.zero >= 2 ? L.dp : 1, edp_g = L.zero >= 2 ? p.edp : 1;
    const double dp_o = L.zero >= 1 ? L.dp : 1, edp_o = L.zero >= 1 ? p.edp : 1;
    add("student weights", (ss.dense_gpu + ss.expert_gpu) * sbytes,
        fmt("dense %.3gB", ss.dense_gpu / 1e9) + fmt(" + experts %.3gB params on this GPU, ", ss.expert_gpu / 1e9) +
            student->dtype);
    add("student gradients", o.grad_bytes * (ss.dense_gpu / dp_g + ss.expert_gpu / edp_g),
        std::string(o.grad_bytes == 2 ? "bf16" : "fp32") +
            (L.zero >= 2 ? ", sharded over DP (dense) / EDP (experts)" : ", not sharded") + "; freed at every step",
        kBackward | kStep);
    add("student optimizer states", 12 * (ss.dense_gpu / dp_o + ss.expert_gpu / edp_o),
        std::string("fp32 master + Adam m, v (12 B/param)") +
            (L.zero >= 1 ? fmt(", sharded over DP %.0f", L.dp) + fmt(" / EDP %.0f", p.edp) : ", replicated"));
  }

  // Activations, the layer workspace and the vocabulary-parallel KD loss (distill/kd_loss.cpp):
  // both models' logits are kept for its backward; its forward works in 3 fp32 [chunk, vocab /
  // TP] buffers, its backward writes the logits' gradient with 2.
  void activations_and_kd(const ArchSpec& trained, const std::string& who) {
    const ModelActivations act = model_activations(trained, who, shape, o.include_mtp);
    for (auto& r : act.rows) p.activations.push_back(r);
    for (auto& r : teacher_act.rows) p.activations.push_back(r);
    trained_state();
    add(who + " activations", act.saved,
        "saved for backward, recompute " + to_string(o.recompute) + (o.flash_attention ? ", flash attention" : ", eager attention"),
        kForward | kKdBackward | kBackward);
    add("layer workspace", std::max(teacher_act.max_working, act.max_working),
        "largest single layer's tensors: the teacher's no-grad forward, a recomputed or backward layer", kForward | kBackward);
    const double vshard_s = std::ceil(double(trained.vocab_size) / tp);
    const double chunk = std::min<double>(double(o.kd_token_chunk), sb);
    const double ws = chunk * vshard_s * 4;
    add("KD logits", eb * sb * (vshard_t + vshard_s),
        fmt("%.0f-byte teacher + student logits [tokens, vocab / TP], kept for the KD backward", eb), kForward | kKdBackward);
    add("KD loss forward workspace", 3 * ws, fmt("3 fp32 [chunk %.0f, vocab / TP]", chunk), kForward);
    add("KD logits gradient", eb * sb * vshard_s + 2 * ws,
        fmt("%.0f-byte [tokens, vocab / TP] + 2 fp32 [chunk, vocab / TP]", eb), kKdBackward);
  }

  // The student's DP buckets and EP all-to-all buffers. One bucket at a time (no larger than
  // the fp32 gradients on this GPU): the fp32 reduce-scatter staging + the all-gather in the
  // weights' dtype; and the reduced fp32 gradient rows this rank owns, until the update.
  void student_buffers() {
    const double bucket = std::min(o.bucket_bytes, 4 * (p.student_dense_gpu + p.student_expert_gpu));
    if (L.dp > 1 || p.edp > 1) {
      add("DP buckets", bucket * (1 + dtype_bytes(student->dtype) / 4),
          "one fp32 reduce-scatter bucket + one all-gather bucket", kStep);
      add("reduced gradient shards", 4 * (p.student_dense_gpu / L.dp + p.student_expert_gpu / p.edp),
          "fp32, this rank's rows", kStep);
    }
    const int width = max_expert_width(*student);
    double copies = 0;
    for (const auto& l : student->layers)
      if (l.moe) copies = std::max(copies, routed_copies_per_gpu(*l.moe, sb, tp, L.etp, o.sequence_parallel));
    if (L.ep > 1) buffers += 2 * copies * width * 2;  // all-to-all send + receive
  }

  // Compute: the trained model forward + backward (frozen weights in search: no weight
  // gradients), recomputation, and the teacher's forward.
  void trained_compute(const ArchSpec& trained) {
    const Flops f_tr = forward_flops(trained, o.seq_len);
    double mult = student ? 3 : 2;
    if (o.recompute == Recompute::Full) mult += 1;
    Flops tr{f_tr.gemm * mult, f_tr.attention * mult, f_tr.ssm * mult};
    if (o.recompute == Recompute::Selective) tr.attention += f_tr.attention;
    p.flops_per_gpu = tokens_step * (tr.total() + f_teacher.total()) / world;
    train_flops_s = tokens_step * seconds_for(tr, hw) / world;
    p.compute_s = train_flops_s + tokens_step * seconds_for(f_teacher, hw) / world;
  }

  void trained_comm(const ArchSpec& trained, const std::string& who) {
    const double passes = 2 + (o.recompute == Recompute::Full ? 1 : 0);
    add_comm("all-gather + reduce-scatter (SP) / all-reduce", "TP", who + " layer inputs and outputs", g_tp,
             tp_volume(trained, passes, /*masked=*/student == nullptr), false);
    add_comm("all-gather + reduce-scatter (SP) / all-reduce", "TP", "teacher layer inputs and outputs", g_tp,
             tp_volume(teacher, 1), false);
    add_comm("all-reduce", "TP", "KD loss row max and exp-sums (fp32)", g_tp,
             p.grad_accum * 2.0 * (tp - 1) / tp * 16 * sb, false);
    ep_volumes(trained, student ? L.ep : L.teacher_ep, passes, who);
    ep_volumes(teacher, L.teacher_ep, 1, "teacher");
    if (!student) return;
    auto dp_sync = [&](double params, const GroupPlace& g, const std::string& group, const std::string& what) {
      const double f = double(g.size - 1) / g.size;
      if (L.zero == 0) add_comm("all-reduce", group, what + " gradients (fp32)", g, 2 * f * o.dp_reduce_bytes * params, false);
      else {
        add_comm("reduce-scatter", group, what + " gradients (fp32)", g, f * o.dp_reduce_bytes * params, false);
        add_comm("all-gather", group, what + " updated bf16 weights", g, f * 2 * params, false);
      }
    };
    dp_sync(p.student_dense_gpu, g_dp, "DP", "dense");
    dp_sync(p.student_expert_gpu, place(p.edp, L.ep * L.etp, gpn), "EDP", "expert");
  }

  // Distill or search: the trained model is the student (distill) or the teacher's
  // architecture with masks (search).
  void training() {
    const ArchSpec& trained = student ? *student : teacher;
    const std::string who = student ? "student" : "masked student";
    activations_and_kd(trained, who);
    if (student) student_buffers();
    trained_compute(trained);
    trained_comm(trained, who);
  }

  // The per-GPU peak (always + the largest phase), whether it fits, and the step time.
  void finish() {
    add("communication buffers", buffers, "SP gathered sequence, EP all-to-all send/receive",
        o.stage == PlanStage::Importance ? kForward : kForward | kBackward);
    for (const auto& m : p.memory) {
      if (m.phases == kAlways) p.always_bytes += m.bytes;
      for (int k = 0; k < 4; ++k)
        if (m.phases & (1u << k)) p.phase_bytes[k] += m.bytes;
    }
    int peak = 0;
    for (int k = 1; k < 4; ++k)
      if (p.phase_bytes[k] > p.phase_bytes[peak]) peak = k;
    p.peak_phase = 1u << peak;
    p.total_bytes = p.always_bytes + p.phase_bytes[peak];
    p.device_bytes = hw.memory_bytes;
    p.usable_bytes = hw.memory_bytes * hw.usable_fraction - o.reserve_bytes;
    p.fits = p.total_bytes <= p.usable_bytes;
    p.has_interconnect = hw.interconnect.present();
    // DP communication overlaps the trained model's backward (Megatron overlap_grad_reduce);
    // TP and EP collectives sit on the critical path.
    const double dp_exposed = std::max(0.0, p.dp_comm_s - train_flops_s * 2.0 / 3.0);
    p.step_s = p.compute_s + p.tp_comm_s + p.ep_comm_s + dp_exposed;
    p.tokens_per_s = p.step_s > 0 ? tokens_step / p.step_s : 0;
  }
};

}  // namespace

Plan make_plan(const ArchSpec& teacher, const ArchSpec* student_in, const Cluster& cluster, const HardwareProfile& hw,
               const PlanLayout& layout_in, const PlanOptions& o) {
  if (o.stage == PlanStage::Distill && !student_in) throw InputError("--student", "(missing)", "the distill stage needs a student");
  // The search's masked student is the teacher's architecture; importance has no student.
  const ArchSpec* student = o.stage == PlanStage::Distill ? student_in : nullptr;
  Plan p;
  p.cluster = cluster;
  p.options = o;
  p.hardware_id = hw.id;
  p.hardware_name = hw.name;
  const PlanLayout L = resolve_layout(cluster, layout_in);
  const int64_t gbs = global_batch(o, L);
  p.grad_accum = gbs / (o.micro_batch * L.dp);
  check_model(teacher, "teacher", L.tp, L.teacher_ep, L.etp, o);
  if (student) check_model(*student, "student", L.tp, L.ep, L.etp, o);
  p.layout = L;
  p.edp = cluster.world() / (L.ep * L.etp);
  p.teacher_edp = cluster.world() / (L.teacher_ep * L.etp);

  PlanBuilder build(p, teacher, student, hw, gbs);
  build.teacher_weights();
  if (o.stage == PlanStage::Importance) build.importance();
  else build.training();
  build.finish();
  return p;
}

std::vector<Plan> candidate_layouts(const ArchSpec& teacher, const ArchSpec* student, const Cluster& cluster,
                                    const HardwareProfile& hw, const PlanOptions& options) {
  std::vector<Plan> all;
  const int world = cluster.world();
  int g = experts_gcd(teacher, 0);
  if (student && options.stage == PlanStage::Distill) g = experts_gcd(*student, g);
  std::vector<int> eps;
  for (int e = 1; e <= std::max(1, g); ++e)
    if (g == 0 ? e == 1 : g % e == 0) eps.push_back(e);
  for (int tp : {1, 2, 4, 8}) {
    if (tp > cluster.gpus_per_node || world % tp) continue;
    for (int etp : std::set<int>{1, tp})
      for (int ep : eps) {
        if (world % (ep * etp)) continue;
        for (int zero : {0, 1, 2}) {
          if (options.stage != PlanStage::Distill && zero != 1) continue;  // no student optimizer
          PlanLayout L;
          L.tp = tp;
          L.etp = etp;
          L.ep = ep;
          L.zero = zero;
          try {
            all.push_back(make_plan(teacher, student, cluster, hw, L, options));
          } catch (const InputError&) {  // e.g. TP not dividing some layer's heads
          }
        }
      }
  }
  return all;
}

std::vector<Plan> fitting_layouts(const ArchSpec& teacher, const ArchSpec* student, const Cluster& cluster,
                                  const HardwareProfile& hw, const PlanOptions& options, size_t max_results) {
  std::vector<Plan> fit;
  for (auto& p : candidate_layouts(teacher, student, cluster, hw, options))
    if (p.fits) fit.push_back(std::move(p));
  std::sort(fit.begin(), fit.end(), [](const Plan& a, const Plan& b) {
    auto key = [](const Plan& p) {
      return std::make_tuple(p.layout.tp * p.layout.ep * p.layout.etp, p.layout.zero, p.total_bytes);
    };
    return key(a) < key(b);
  });
  if (fit.size() > max_results) fit.resize(max_results);
  return fit;
}

std::vector<Plan> smallest_fitting_cluster(const ArchSpec& teacher, const ArchSpec* student, const Cluster& cluster,
                                           const HardwareProfile& hw, const PlanOptions& options, int max_nodes) {
  for (Cluster c = cluster; c.nodes <= max_nodes; c.nodes *= 2) {
    std::vector<Plan> fit = fitting_layouts(teacher, student, c, hw, options, 1);
    if (!fit.empty()) return fit;
  }
  return {};
}

std::string Plan::table() const {
  std::ostringstream o;
  char line[512];
  o << "plan: " << to_string(options.stage) << " on " << cluster.to_string() << " (" << hardware_name << ", "
    << cluster.world() << " GPUs)\n";
  o << "layout: " << layout.to_string() << "; EDP " << edp;
  if (teacher_edp != edp) o << " (teacher EDP " << teacher_edp << ")";
  o << "; seq " << options.seq_len << ", micro-batch " << options.micro_batch << ", global batch "
    << int64_t(tokens_per_step / options.seq_len) << " (grad accum " << grad_accum << "), recompute "
    << to_string(options.recompute) << (options.flash_attention ? ", flash attention" : ", eager attention")
    << (options.sequence_parallel && layout.tp > 1 ? ", SP" : "") << "\n";
  std::snprintf(line, sizeof line, "params: teacher %.3fB (%.3fB on one GPU)", teacher_params / 1e9, teacher_params_gpu / 1e9);
  o << line;
  if (student_params > 0) {
    std::snprintf(line, sizeof line, ", student %.3fB (dense %.3fB + experts %.3fB on one GPU)", student_params / 1e9,
                  student_dense_gpu / 1e9, student_expert_gpu / 1e9);
    o << line;
  }
  o << "\n\nper-GPU memory                         GiB  live  how\n";
  for (const auto& m : memory) {
    std::snprintf(line, sizeof line, "  %-32s %7.2f  %s; %s\n", m.name.c_str(), m.bytes / kGiB, phase_names(m.phases).c_str(),
                  m.note.c_str());
    o << line;
  }
  std::snprintf(line, sizeof line, "  %-32s %7.2f  always %.2f + %s %.2f (phases: forward %.2f, KD backward %.2f, "
                "backward %.2f, step %.2f)\n", "peak", total_bytes / kGiB, always_bytes / kGiB, phase_names(peak_phase).c_str(),
                (total_bytes - always_bytes) / kGiB, phase_bytes[0] / kGiB, phase_bytes[1] / kGiB, phase_bytes[2] / kGiB,
                phase_bytes[3] / kGiB);
  o << line;
  std::snprintf(line, sizeof line, "  %-32s %7.2f  %.1f GB device x %.2f - %.2f GiB reserve: %s %.2f GiB\n", "usable",
                usable_bytes / kGiB, device_bytes / 1e9, device_bytes > 0 ? (usable_bytes + options.reserve_bytes) / device_bytes : 0.0,
                options.reserve_bytes / kGiB, fits ? "fits, free" : "DOES NOT FIT, over by",
                std::fabs(usable_bytes - total_bytes) / kGiB);
  o << line;
  o << "\nactivations per layer kind            layers  saved GiB/layer  working GiB/layer\n";
  for (const auto& r : activations) {
    std::snprintf(line, sizeof line, "  %-16s %-4s %19d %16.4f %18.4f\n", r.model.c_str(), r.kind.c_str(), r.layers,
                  r.saved_per_layer / kGiB, r.working_per_layer / kGiB);
    o << line;
  }
  o << "\ncommunication per step (per GPU)\n";
  for (const auto& c : comm) {
    std::snprintf(line, sizeof line, "  %-4s %4d %-10s %9.3f GiB %9.2f ms  %s: %s\n", c.group.c_str(), c.group_size,
                  c.inter_node ? "inter-node" : "intra-node", c.bytes_per_step / kGiB, c.seconds * 1e3,
                  c.collective.c_str(), c.what.c_str());
    o << line;
  }
  if (comm.empty()) o << "  none\n";
  std::snprintf(line, sizeof line, "\nstep estimate: compute %.3f s (%.1f TFLOP per GPU at the profile's efficiencies)",
                compute_s, flops_per_gpu / 1e12);
  o << line;
  if (has_interconnect) {
    std::snprintf(line, sizeof line, " + TP/ETP %.3f s + EP %.3f s + DP/EDP %.3f s (hidden behind the backward where it can be)\n",
                  tp_comm_s, ep_comm_s, dp_comm_s);
    o << line;
    std::snprintf(line, sizeof line, "  step %.3f s, %.0f tokens per step, %.0f tokens/s, %.1f GPU-hours per billion tokens\n",
                  step_s, tokens_per_step, tokens_per_s, tokens_per_s > 0 ? cluster.world() * 1e9 / tokens_per_s / 3600 : 0.0);
    o << line;
  } else {
    o << "\n  (hardware profile " << hardware_id << " has no interconnect block: communication times not estimated)\n";
  }
  return o.str();
}

json Plan::to_json() const {
  json mem = json::array(), act = json::array(), cm = json::array();
  for (const auto& m : memory)
    mem.push_back({{"name", m.name}, {"bytes", m.bytes}, {"gib", m.bytes / kGiB}, {"live", phase_names(m.phases)}, {"note", m.note}});
  for (const auto& r : activations)
    act.push_back({{"model", r.model}, {"kind", r.kind}, {"layers", r.layers}, {"saved_bytes_per_layer", r.saved_per_layer},
                   {"working_bytes_per_layer", r.working_per_layer}});
  for (const auto& c : comm)
    cm.push_back({{"collective", c.collective}, {"group", c.group}, {"what", c.what}, {"group_size", c.group_size},
                  {"inter_node", c.inter_node}, {"bytes_per_step", c.bytes_per_step}, {"seconds", c.seconds}});
  return {{"format", "autocompress.plan"},
          {"version", 1},
          {"stage", to_string(options.stage)},
          {"cluster", cluster.to_string()},
          {"hardware", hardware_id},
          {"gpus", cluster.world()},
          {"layout",
           {{"tp", layout.tp}, {"dp", layout.dp}, {"ep", layout.ep}, {"etp", layout.etp}, {"edp", edp},
            {"teacher_ep", layout.teacher_ep}, {"teacher_edp", teacher_edp}, {"zero", layout.zero}}},
          {"options",
           {{"seq_len", options.seq_len}, {"micro_batch", options.micro_batch}, {"grad_accum", grad_accum},
            {"recompute", to_string(options.recompute)}, {"flash_attention", options.flash_attention},
            {"sequence_parallel", options.sequence_parallel}, {"grad_bytes", options.grad_bytes},
            {"reserve_bytes", options.reserve_bytes}}},
          {"params",
           {{"teacher", teacher_params}, {"teacher_per_gpu", teacher_params_gpu}, {"student", student_params},
            {"student_dense_per_gpu", student_dense_gpu}, {"student_expert_per_gpu", student_expert_gpu}}},
          {"memory", mem},
          {"total_bytes", total_bytes},
          {"always_bytes", always_bytes},
          {"phase_bytes",
           {{"forward", phase_bytes[0]}, {"kd_backward", phase_bytes[1]}, {"backward", phase_bytes[2]}, {"step", phase_bytes[3]}}},
          {"peak_phase", phase_names(peak_phase)},
          {"device_bytes", device_bytes},
          {"usable_bytes", usable_bytes},
          {"fits", fits},
          {"activations", act},
          {"communication", cm},
          {"step",
           {{"flops_per_gpu", flops_per_gpu}, {"compute_s", compute_s}, {"tp_comm_s", tp_comm_s}, {"ep_comm_s", ep_comm_s},
            {"dp_comm_s", dp_comm_s}, {"step_s", has_interconnect ? json(step_s) : json(nullptr)},
            {"tokens_per_step", tokens_per_step}, {"tokens_per_s", has_interconnect ? json(tokens_per_s) : json(nullptr)}}}};
}

}  // namespace ac::search

// The serving cost formulas, written once over a per-layer vector type T: `Vec` (double per
// layer) for the exact model, a [num_layers] float64 torch::Tensor for the differentiable one.
// Every per-layer quantity is elementwise; sums and maxima over layers go through Ops<T>.
// Private to search/costmodel (formulas documented in docs/costmodel.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"

namespace ac::search::detail {

// ---- an elementwise vector of doubles (one entry per layer) ---------------------------------
struct Vec {
  std::vector<double> v;
  Vec() = default;
  Vec(size_t n, double x) : v(n, x) {}
  size_t size() const { return v.size(); }
  double& operator[](size_t i) { return v[i]; }
  double operator[](size_t i) const { return v[i]; }
};
template <typename F>
inline Vec zip(const Vec& a, const Vec& b, F f) {
  Vec r(a.size(), 0.0);
  for (size_t i = 0; i < a.size(); ++i) r.v[i] = f(a.v[i], b.v[i]);
  return r;
}
template <typename F>
inline Vec map(const Vec& a, F f) {
  Vec r(a.size(), 0.0);
  for (size_t i = 0; i < a.size(); ++i) r.v[i] = f(a.v[i]);
  return r;
}
inline Vec operator+(const Vec& a, const Vec& b) { return zip(a, b, [](double x, double y) { return x + y; }); }
inline Vec operator-(const Vec& a, const Vec& b) { return zip(a, b, [](double x, double y) { return x - y; }); }
inline Vec operator*(const Vec& a, const Vec& b) { return zip(a, b, [](double x, double y) { return x * y; }); }
inline Vec operator/(const Vec& a, const Vec& b) { return zip(a, b, [](double x, double y) { return x / y; }); }
inline Vec operator+(const Vec& a, double s) { return map(a, [s](double x) { return x + s; }); }
inline Vec operator-(const Vec& a, double s) { return map(a, [s](double x) { return x - s; }); }
inline Vec operator*(const Vec& a, double s) { return map(a, [s](double x) { return x * s; }); }
inline Vec operator/(const Vec& a, double s) { return map(a, [s](double x) { return x / s; }); }
inline Vec operator+(double s, const Vec& a) { return a + s; }
inline Vec operator-(double s, const Vec& a) { return map(a, [s](double x) { return s - x; }); }
inline Vec operator*(double s, const Vec& a) { return a * s; }
inline Vec operator/(double s, const Vec& a) { return map(a, [s](double x) { return s / x; }); }

template <typename T>
struct Ops;

template <>
struct Ops<Vec> {
  using S = double;   // a model-level scalar
  using Hd = double;  // the hidden width
  static double make_hidden(double h) { return h; }
  static Vec full(const Vec& like, double x) { return Vec(like.size(), x); }
  static Vec maximum(const Vec& a, const Vec& b) { return zip(a, b, [](double x, double y) { return std::max(x, y); }); }
  static Vec maximum(const Vec& a, double b) { return map(a, [b](double x) { return std::max(x, b); }); }
  static double maximum(double a, double b) { return std::max(a, b); }
  static double minimum(double a, double b) { return std::min(a, b); }
  static Vec minimum(const Vec& a, double b) { return map(a, [b](double x) { return std::min(x, b); }); }
  static Vec pow(const Vec& a, double b) { return map(a, [b](double x) { return std::pow(x, b); }); }
  static Vec pow(const Vec& a, const Vec& b) { return zip(a, b, [](double x, double y) { return std::pow(x, y); }); }
  static double sum(const Vec& a) {
    double s = 0;
    for (double x : a.v) s += x;
    return s;
  }
  static double max_all(const Vec& a) { return a.v.empty() ? 0.0 : *std::max_element(a.v.begin(), a.v.end()); }
  static double floor_st(double a) { return std::floor(a); }
  static double ceil_st(double a) { return std::ceil(a); }
  static Vec ceil_st(const Vec& a) { return map(a, [](double x) { return std::ceil(x); }); }
  static Vec at_least(const Vec& a, double b) { return map(a, [b](double x) { return x >= b ? 1.0 : 0.0; }); }
  static double scalar(double x, const Vec&) { return x; }
};

// The decode GEMM line (HardwareProfile::DecodeStepCost's gemv_* terms), written once: the
// formulas charge it whole, the calibration fits its terms (gemv_features: each term alone).
// A GEMM of a [out, in] weight over `rows` rows, weights of `wbytes` and activations of
// `abytes` per element: the one-row GEMM streams the weight at its own rate; each further row
// (a batched decode, an expert's tokens) adds its own cost per output and per multiply-add, not
// another one-row GEMM's; a call of 2-16 rows (small_linear where the one-row call is LibTorch's
// matrix-vector product) its own fixed cost and one more pass over the weight per 8 rows.
inline constexpr double HardwareProfile::DecodeStepCost::*kGemvLineTerms[] = {
    &HardwareProfile::DecodeStepCost::gemv_fixed,          &HardwareProfile::DecodeStepCost::gemv_per_byte,
    &HardwareProfile::DecodeStepCost::gemv_per_out,        &HardwareProfile::DecodeStepCost::gemv_per_row_out,
    &HardwareProfile::DecodeStepCost::gemv_per_row_mac,    &HardwareProfile::DecodeStepCost::gemv_multirow_fixed,
    &HardwareProfile::DecodeStepCost::gemv_multirow_per_mac};
template <typename O, typename A, typename B, typename R>
auto gemv_line(const HardwareProfile::DecodeStepCost& c, const A& out, const B& in, const R& rows, double wbytes,
               double abytes) {
  const R extra = O::maximum(rows - 1.0, 0.0), multirow = O::minimum(extra, 1.0);
  const R passes = multirow * (1.0 + O::maximum(rows - 8.0, 0.0) / 8.0);  // the 2-16-row kernel's, per 8 rows
  return out * in * (wbytes * c.gemv_per_byte) + (in + out) * (rows * abytes * c.gemv_per_byte) +
         out * c.gemv_per_out + out * (extra * c.gemv_per_row_out) +
         out * in * (extra * c.gemv_per_row_mac + passes * c.gemv_multirow_per_mac) +
         multirow * c.gemv_multirow_fixed + c.gemv_fixed;
}

// Per-layer dimensions. An absent sublayer has keep 0 and harmless dimensions (no division
// by zero); a soft architecture has keep and dims between the choices.
template <typename T>
struct LayerDims {
  T attn_keep, heads, kv_heads, head_dim, qkv_bias, o_bias, qk_norm;
  T mamba_keep, m_heads, m_head_dim, m_state, m_groups, m_conv, m_chunk, m_conv_bias, m_proj_bias, m_state_bytes;
  T mlp_keep, ffn, mlp_mats, mlp_bias;
  T moe_keep, experts, top_k, expert_ffn, shared_ffn, moe_width, latent, moe_mats, router_buffer;
};

// Model-level constants.
struct Globals {
  double hidden = 0, vocab = 0;
  bool tie = false;
  double wbytes = 2, abytes = 2, kvbytes = 2;
  bool has_attention = false, has_mamba = false;  // any layer (decides the hybrid page rule)
  bool rope = false;                              // attention applies rotary embeddings
};

template <typename T>
struct CostResult {
  using S = typename Ops<T>::S;
  S params, active_params, weight_bytes, kv_bytes_per_token, state_bytes_per_seq, activation_bytes, reserved_bytes,
      budget_bytes, kv_budget_bytes, bytes_per_seq, concurrency_limit, max_concurrency, concurrency, ttft_s, tpot_s,
      decode_tok_s, throughput_tok_s;
  T layer_params, layer_active_params, layer_weight_bytes, layer_kv_per_token, layer_state_per_seq, layer_prefill_s,
      layer_decode_s;
};

// Mamba derived widths.
template <typename T>
struct MambaWidths {
  T d_inner, conv_dim, in_proj;
};
template <typename T>
MambaWidths<T> mamba_widths(const LayerDims<T>& d) {
  T di = d.m_heads * d.m_head_dim;
  T conv = di + 2.0 * d.m_groups * d.m_state;
  return {di, conv, di + conv + d.m_heads};
}

// Bytes of fresh pages (kFreshPagesBytes) that eager attention allocates for `elems` score
// elements ([B x H x T x S]): the scores and the probabilities in the activation dtype, the fp32
// copy softmax makes of its input and its fp32 output; each is one tensor.
template <typename T>
T eager_score_fresh_bytes(const T& elems, double abytes) {
  return 2.0 * abytes * elems * Ops<T>::at_least(elems * abytes, kFreshPagesBytes) +
         8.0 * elems * Ops<T>::at_least(elems * 4.0, kFreshPagesBytes);
}

// Distinct experts that n tokens touch when each picks k of E uniformly: E (1 - (1 - k/E)^n).
template <typename T, typename N>
T experts_touched(const T& E, const T& k, const N& n) {
  return E * (1.0 - Ops<T>::pow(1.0 - k / E, n));
}

template <typename T>
class Evaluator {
 public:
  using O = Ops<T>;
  using S = typename O::S;
  using Hd = typename O::Hd;
  // `h`: the hidden width. The differentiable model passes one per row ([H, 1]) to evaluate
  // several hidden widths at once over [H, num_layers] dims (sums and maxima over the last dim).
  Evaluator(const Globals& g, const LayerDims<T>& d, const HardwareProfile& hw, const EngineProfile& e,
            const Workload& w, Hd h)
      : g_(g), d_(d), hw_(hw), e_(e), w_(w), h_(std::move(h)) {}
  Evaluator(const Globals& g, const LayerDims<T>& d, const HardwareProfile& hw, const EngineProfile& e,
            const Workload& w)
      : Evaluator(g, d, hw, e, w, O::make_hidden(g.hidden)) {}

  // Roofline of one operator: max(compute, memory) with the efficiency curves folded in,
  // (work + half) / (peak * max), plus the fixed per-operator overhead. `groups` > 1 is a
  // grouped GEMM (MoE experts): each group pays its own small-size penalty.
  template <typename X>
  X op_time(const X& flops, const X& bytes, const EfficiencyCurve& c, const X& groups) const {
    X tc = (flops + groups * c.half) / (hw_.peak_flops * c.max);
    X tm = (bytes + hw_.memory.half) / (hw_.memory_bandwidth * hw_.memory.max);
    return O::maximum(tc, tm) + hw_.kernel_overhead_s;
  }
  // A GEMM of `rows` rows (tokens). With a measured GEMM line (CPU profiles): its fixed cost,
  // the weight's bytes and the FLOPs, each at its measured rate (HardwareProfile::GemmLine).
  // Else the roofline: below gemm_rows_half rows the compute rate falls as rows / (rows +
  // gemm_rows_half) (matrix-vector products reuse each loaded weight for fewer rows; 0 on the
  // GPU profiles).
  T gemm(const T& tokens_in_out_flops, const T& weight_elems, const T& act_elems, const T& rows) const {
    if (hw_.gemm_line.measured) return gemm_line<T>(tokens_in_out_flops, weight_elems, one());
    return op_time<T>(tokens_in_out_flops * (1.0 + hw_.gemm_rows_half / rows),
                      weight_elems * g_.wbytes + act_elems * g_.abytes, hw_.gemm, one());
  }
  // `calls` GEMMs of `weight_elems` weights in all on the measured GEMM line.
  template <typename X>
  X gemm_line(const X& flops, const X& weight_elems, const X& calls) const {
    return hw_.gemm_line.seconds<X>(flops, weight_elems * g_.wbytes, calls);
  }
  // Fixed cost of one more GEMM call (an engine that runs q/k/v, gate/up, experts' matrices
  // as separate GEMMs pays it per extra call).
  double gemm_call_s() const {
    if (hw_.gemm_line.measured) return hw_.gemm_line.fixed;
    return hw_.gemm.half / (hw_.peak_flops * hw_.gemm.max) + hw_.kernel_overhead_s;
  }
  // The routed experts of a MoE layer over N tokens: a GEMM per expert touched, each on its
  // tokens (with a GEMM line: each pays the fixed cost and its weight's pass; on the roofline
  // a grouped GEMM whose groups each pay the small-size penalty).
  T routed_experts(const T& N, const T& touched, const T& expert_w) const {
    const auto& d = d_;
    const T flops = 2.0 * N * d.top_k * expert_w;
    if (hw_.gemm_line.measured) return gemm_line<T>(flops, touched * expert_w, touched);
    const T groups = O::maximum(touched, 1.0);
    const T bytes = touched * expert_w * g_.wbytes +
                    N * d.top_k * (2.0 * d.moe_width + d.expert_ffn * d.moe_mats) * g_.abytes;
    return op_time<T>(flops * (1.0 + hw_.gemm_rows_half * groups / O::maximum(N * d.top_k, 1.0)), bytes, hw_.gemm,
                      groups);
  }
  // Elementwise operators (norms, gating): memory time only.
  template <typename X>
  X mem_time(const X& bytes) const {
    return (bytes + hw_.elementwise.half) / (hw_.memory_bandwidth * hw_.elementwise.max) + hw_.kernel_overhead_s;
  }
  // Elementwise work around a sublayer (norm, residual add, gating): `act_elems` elements
  // read and written once by a fused kernel; an unfused engine moves elementwise_traffic
  // times as many bytes (fp32 intermediates, one pass per framework op).
  T mem_op(const T& act_elems) const { return mem_time<T>(act_elems * g_.abytes * e_.elementwise_traffic); }
  T one() const { return O::full(d_.attn_keep, 1.0); }

  T layer_params(bool active) const {
    const Hd& h = h_;
    const auto& d = d_;
    T qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim;
    T attn = h + h * qd + 2.0 * h * kvd + qd * h + d.qkv_bias * (qd + 2.0 * kvd) + d.o_bias * h + d.qk_norm * 2.0 * d.head_dim;
    MambaWidths<T> m = mamba_widths(d);
    T mamba = h + h * m.in_proj + m.conv_dim * d.m_conv + d.m_conv_bias * m.conv_dim + 3.0 * d.m_heads + m.d_inner +
              m.d_inner * h + d.m_proj_bias * (m.in_proj + h);
    T mlp = h + d.mlp_mats * h * d.ffn + d.mlp_bias * ((d.mlp_mats - 1.0) * d.ffn + h);
    T expert = d.moe_mats * d.moe_width * d.expert_ffn;
    T routed = (active ? d.top_k : d.experts) * expert;
    T moe = h + d.experts * h + routed + d.moe_mats * h * d.shared_ffn + 2.0 * h * d.latent;
    return d.attn_keep * attn + d.mamba_keep * mamba + d.mlp_keep * mlp + d.moe_keep * moe;
  }

  // Time of every layer for `n` tokens that belong to `b` sequences, `s` new tokens each,
  // after `past` cached tokens. Decode is s = 1.
  T layers_time(const S& n, const S& b, double s, double past, bool decode) const {
    if (decode && hw_.decode.measured) return measured_decode_time(n, b, past);
    const Hd& h = h_;
    const auto& d = d_;
    const T N = one() * n;
    // attention
    T qkv = (d.heads + 2.0 * d.kv_heads) * d.head_dim, qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim;
    T core_flops = 4.0 * qd * (b * s * (past + (s + 1.0) / 2.0));
    T core_bytes = (N * (qkv + qd)) * g_.abytes + kvd * (2.0 * b * past * g_.kvbytes);
    // Eager attention materialises every head's [s x (past + s)] scores; past 32 MiB a tensor
    // comes in fresh pages (HardwareProfile::fresh_bytes_s; 0 for fused kernels).
    T scores = eager_score_fresh_bytes<T>(d.heads * (b * s * (past + s)), g_.abytes) * hw_.fresh_bytes_s;
    T attn = gemm(2.0 * N * h * qkv, h * qkv, N * (h + qkv), N) +
             op_time<T>(core_flops, core_bytes, hw_.attention, one()) + scores +
             gemm(2.0 * N * qd * h, qd * h, N * (qd + h), N) + mem_op(2.0 * N * h);
    // Mamba-2: in_proj, conv + scan, gated norm, out_proj
    MambaWidths<T> m = mamba_widths(d);
    T hpn = d.m_heads * d.m_head_dim * d.m_state;
    T conv_flops = 2.0 * d.m_conv * m.conv_dim;
    T scan_flops, scan_bytes;
    if (decode) {
      scan_flops = N * (conv_flops + 6.0 * hpn);
      scan_bytes = N * (2.0 * hpn * d.m_state_bytes + 2.0 * (d.m_conv - 1.0) * m.conv_dim * g_.wbytes) +
                   N * (2.0 * m.conv_dim + m.d_inner + d.m_heads) * g_.abytes;
    } else {
      scan_flops = N * (conv_flops + d.m_chunk * (d.m_groups * d.m_state + d.m_heads * d.m_head_dim) + 4.0 * hpn);
      scan_bytes = N * (2.0 * m.conv_dim + 2.0 * m.d_inner + d.m_heads) * g_.abytes + b * hpn * d.m_state_bytes;
    }
    T mamba_base = gemm(2.0 * N * h * m.in_proj, h * m.in_proj, N * (h + m.in_proj), N) +
                   gemm(2.0 * N * m.d_inner * h, m.d_inner * h, N * (m.d_inner + h), N) + mem_op(2.0 * N * h);
    T mamba;
    if (hw_.mamba.measured) {
      // The mixer's measured cost outside its projections (HardwareProfile::MambaMixerCost;
      // features as in calibrate.h: conv, scan, gated norm, casts and dispatch included).
      const auto& c = hw_.mamba;
      if (decode) {  // the recurrent step expands B and C to the heads: H (P + N) per token
        mamba = mamba_base + N * (c.step_per_state * hpn + c.step_per_lin * (d.m_heads * (d.m_head_dim + d.m_state))) +
                c.step_fixed;
      } else {
        T lp = O::ceil_st(s / d.m_chunk) * d.m_chunk * b;  // tokens padded to whole chunks
        mamba = mamba_base +
                c.per_flop * 2.0 * lp *
                    (d.m_chunk * (d.m_groups * d.m_state + d.m_heads * d.m_head_dim) + 2.0 * hpn) +
                c.per_quad * lp * d.m_chunk * d.m_heads +
                c.per_lin * lp * (d.m_heads * d.m_head_dim + d.m_groups * d.m_state) + c.fixed;
      }
    } else {
      mamba = mamba_base + op_time<T>(scan_flops, scan_bytes, hw_.scan, one()) + mem_op(3.0 * N * m.d_inner);
    }
    // dense MLP
    T mlp = gemm(2.0 * N * h * d.ffn * d.mlp_mats, h * d.ffn * d.mlp_mats, N * (2.0 * h + d.ffn * d.mlp_mats), N) +
            activation(N * d.ffn, d.mlp_mats) + mem_op(2.0 * N * h);
    // MoE: router, latent projections, shared expert, routed experts as a grouped GEMM over
    // the experts this many tokens touch: E (1 - (1 - k/E)^n) under uniform routing.
    T touched = experts_touched(d.experts, d.top_k, n);
    T moe = gemm(2.0 * N * h * d.experts, h * d.experts, N * (h + d.experts), N) +
            (d.latent / O::maximum(d.latent, 1.0)) * gemm(4.0 * N * h * d.latent, 2.0 * h * d.latent, 2.0 * N * (h + d.latent), N) +
            (d.shared_ffn / O::maximum(d.shared_ffn, 1.0)) *
                gemm(2.0 * N * h * d.shared_ffn * d.moe_mats, h * d.shared_ffn * d.moe_mats,
                     N * (2.0 * h + d.shared_ffn * d.moe_mats), N) +
            routed_experts(N, touched, d.moe_mats * d.moe_width * d.expert_ffn) +
            activation(N * (d.shared_ffn + d.top_k * d.expert_ffn), d.moe_mats) + mem_op(2.0 * N * h);
    T total = d.attn_keep * attn + d.mamba_keep * mamba + d.mlp_keep * mlp + d.moe_keep * moe;
    // Framework operators an eager engine dispatches besides the modelled ones (engine
    // extra_ops, each at the hardware's per-operator overhead).
    const auto& x = e_.extra_ops;
    T shared = d.shared_ffn / O::maximum(d.shared_ffn, 1.0), latent = d.latent / O::maximum(d.latent, 1.0);
    T ops = d.attn_keep * ((decode ? x.attention_decode : x.attention_prefill) + (g_.rope ? x.rope : 0.0) + x.norm) +
            d.mamba_keep * ((hw_.mamba.measured ? 0.0 : decode ? x.mamba_decode : x.mamba_prefill) + x.norm) +
            d.mlp_keep * (x.mlp + x.norm) + d.moe_keep * (x.moe + x.norm + shared * x.moe_shared + touched * x.moe_expert);
    // Separate GEMM calls of an engine that does not fuse projections: q/k/v (3 for 1),
    // gate/up/down (mats for 1), shared expert, latent pair, every touched expert's matrices.
    T calls = e_.split_projections ? d.attn_keep * 2.0 + d.mlp_keep * (d.mlp_mats - 1.0) +
                                         d.moe_keep * (shared * (d.moe_mats - 1.0) + latent + touched * (d.moe_mats - 1.0))
                                   : one() * 0.0;
    return total + ops * hw_.kernel_overhead_s + calls * gemm_call_s();
  }

  // The MLP / expert activation over `elems` elements of a block of `mats` matrices (3: gated,
  // SwiGLU; 2: plain, squared ReLU) as measured (HardwareProfile::ActivationCost; 0 where it
  // was not, and where a GEMM epilogue fuses it).
  template <typename E, typename M>
  T activation(const E& elems, const M& mats) const {
    const auto& a = hw_.activation;
    T gated = O::minimum(O::maximum(mats - 2.0, 0.0), 1.0);
    return elems * (gated * a.gated_element_s + (1.0 - gated) * a.plain_element_s);
  }

  // A GEMM of a [out, in] weight over `rows` rows on a profile with a measured decode step: the
  // decode GEMM line (gemv_line), plus the whole cold step's model_per_weight_byte on its weight
  // bytes beyond the pooled GEMMs' rate (fitted on one-row model steps, charged at any rows:
  // docs/costmodel.md "Each further row of a batched step").
  template <typename A, typename B, typename R>
  auto gemv(const A& out, const B& in, const R& rows) const {
    return gemv_line<O>(hw_.decode, out, in, rows, g_.wbytes, g_.abytes) +
           out * in * (g_.wbytes * hw_.decode.model_per_weight_byte);
  }
  // The GEMMs of a gated / plain MLP of width `ffn` at width `w` (gate and up, down), run as
  // separate calls by an engine that splits projections, else gate+up fused.
  template <typename R>
  T mlp_gemvs(const T& mats, const T& ffn, const T& w, const R& rows) const {
    if (e_.split_projections) return (mats - 1.0) * gemv(ffn, w, rows) + gemv(w, ffn, rows);
    return gemv((mats - 1.0) * ffn, w, rows) + gemv(w, ffn, rows);
  }
  // One decode step of every layer with the measured decode-step cost: each sublayer's GEMMs on
  // the one-row GEMM line plus the sublayer's measured rest (norm and residual included), the
  // first row's and each further row's (a batched step: one row per sequence).
  T measured_decode_time(const S& n, const S& b, double past) const {
    const Hd& h = h_;
    const auto& d = d_;
    const auto& c = hw_.decode;
    const T H = one() * h;
    // The further rows of a batched step: one per sequence for attention (each reads its own
    // cache), one per token for the MLP (the same in decode: one token per sequence).
    const S further_seqs = O::maximum(b - 1.0, 0.0), further_tokens = O::maximum(n - 1.0, 0.0);
    T qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim;
    T proj = e_.split_projections ? gemv(qd, H, n) + 2.0 * gemv(kvd, H, n) : gemv(qd + 2.0 * kvd, H, n);
    T attn = proj + gemv(H, qd, n) + kvd * (past * (c.attn_per_kv + further_seqs * c.row_per_kv())) +
             qd * (past * (c.attn_per_q + further_seqs * c.row_per_q())) +
             (c.attn_fixed + further_seqs * c.attn_per_row);
    MambaWidths<T> m = mamba_widths(d);
    T lin = d.m_heads * (d.m_head_dim + d.m_state);
    T mamba = gemv(m.in_proj, H, n) + gemv(H, m.d_inner, n) +
              d.m_heads * d.m_head_dim * d.m_state * (n * hw_.mamba.step_per_state) + lin * (n * hw_.mamba.step_per_lin) +
              (hw_.mamba.step_fixed + c.mamba_fixed);
    T mlp = mlp_gemvs(d.mlp_mats, d.ffn, H, n) + d.ffn * (c.mlp_per_ffn + further_tokens * c.row_per_ffn()) +
            (c.mlp_fixed + further_tokens * c.mlp_per_row);
    T touched = experts_touched(d.experts, d.top_k, n);
    T shared = d.shared_ffn / O::maximum(d.shared_ffn, 1.0), latent = d.latent / O::maximum(d.latent, 1.0);
    T moe = gemv(d.experts, H, n) + latent * (gemv(d.latent, H, n) + gemv(H, d.latent, n)) +
            shared * mlp_gemvs(d.moe_mats, d.shared_ffn, H, n) +
            touched * mlp_gemvs(d.moe_mats, d.expert_ffn, d.moe_width, d.top_k * n / O::maximum(touched, 1.0)) +
            touched * c.moe_per_expert + c.moe_fixed;
    return d.attn_keep * (attn + c.model_per_layer) + d.mamba_keep * (mamba + c.model_per_mamba_layer) +
           d.mlp_keep * (mlp + c.model_per_layer) + d.moe_keep * (moe + c.model_per_moe_layer);
  }

  // Peak bytes of the tensors an eager implementation (model/layers/*) holds at once in each
  // layer while prefilling `t` tokens of one sequence from an empty cache: the sublayer's
  // normed input plus its live intermediates (attention: q, GQA-expanded K/V, the
  // materialised scores in the activation dtype, their fp32 softmax and its cast; Mamba:
  // in_proj output, conv input/output, x/B/C copies, the SSD's fp32 per-chunk [l x l] decay
  // and score matrices and its fp32 per-head tensors; MLP: up, gate, activation, product;
  // MoE: fp32 accumulator, router scores, shared expert, one expert's tokens). The KV cache
  // and Mamba state are counted in bytes_per_seq, not here.
  T eager_layer_activation(double t) const {
    const Hd& h = h_;
    const double a = g_.abytes;
    const auto& d = d_;
    T qd = d.heads * d.head_dim;
    T gqa = 1.0 - O::maximum(1.0 - (d.heads - d.kv_heads), 0.0);  // 1 when K/V are expanded to the query heads
    T attn = t * qd * a * (1.0 + 2.0 * gqa) + d.heads * (t * t) * (2.0 * a + 4.0);
    MambaWidths<T> m = mamba_widths(d);
    T tp = O::ceil_st(t / d.m_chunk) * d.m_chunk;  // padded to whole chunks
    T hp = d.m_heads * d.m_head_dim;
    // Mamba (model/layers/mamba2.cpp since 73d889c): in_proj output and the conv input in the
    // activation dtype; the fp32 SiLU(conv) output, dt x, contiguous B/C, the per-chunk states
    // (before and after the recurrence: H P N per chunk); then the larger of the within-chunk step
    // (exp-segsum's three [Q x Q] per-head temporaries or the decay-weighted scores with the
    // per-group C.B^T, x and Y_diag) and the output step (Y_diag, Y_off and its product, sum, copy).
    T gq = d.m_groups * d.m_chunk;
    T mamba = t * (m.in_proj + m.conv_dim) * a +
              tp * 4.0 * (m.conv_dim + hp + 2.0 * d.m_groups * d.m_state + 2.0 * hp * d.m_state / d.m_chunk +
                          O::maximum(O::maximum(3.0 * d.m_chunk * d.m_heads + gq, 2.0 * d.m_chunk * d.m_heads + gq + 2.0 * hp),
                                     5.0 * hp));
    T mlp = t * (d.mlp_mats + 1.0) * d.ffn * a;
    T shared = d.shared_ffn / O::maximum(d.shared_ffn, 1.0);
    T moe = t * (d.moe_width * (4.0 + a) + 12.0 * d.experts) + t * (d.moe_mats + 1.0) * d.shared_ffn * a +
            shared * t * 2.0 * h * a +
            t * d.top_k / d.experts * ((d.moe_mats + 1.0) * d.expert_ffn * a + d.moe_width * (2.0 * a + 4.0));
    T live = O::maximum(O::maximum(d.attn_keep * attn, d.mamba_keep * mamba), O::maximum(d.mlp_keep * mlp, d.moe_keep * moe));
    return live + t * h * a;
  }

  // Embedding gather and final norm over n tokens, and the LM head for `rows` logits.
  S head_time(const S& n, const S& rows, bool with_head, bool decode = false) const {
    const Hd& h = h_;
    const double V = g_.vocab;
    auto t = [&](const S& flops, const S& bytes, const EfficiencyCurve& c) {
      return O::maximum((flops + c.half) / (hw_.peak_flops * c.max),
                        (bytes + hw_.memory.half) / (hw_.memory_bandwidth * hw_.memory.max)) +
             hw_.kernel_overhead_s;
    };
    S r = mem_time<S>(2.0 * n * h * g_.abytes) + mem_time<S>(2.0 * n * h * g_.abytes * e_.elementwise_traffic);
    if (with_head && decode && hw_.decode.measured)  // the decode GEMM line, as measured
      r = r + gemv(V, h, rows);
    else if (with_head && hw_.gemm_line.measured)
      r = r + gemm_line<S>(2.0 * rows * h * V, h * V, O::scalar(1.0, d_.attn_keep));
    else if (with_head) r = r + t(2.0 * rows * h * V * (1.0 + hw_.gemm_rows_half / rows), rows * (h * g_.abytes + V * 4.0) + h * V * g_.wbytes, hw_.gemm);
    return r + e_.extra_ops.model * hw_.kernel_overhead_s;
  }

  CostResult<T> run() const {
    CostResult<T> r;
    const auto& d = d_;
    const Hd& h = h_;
    const double V = g_.vocab;
    // ---- memory
    r.layer_params = layer_params(false);
    r.layer_active_params = layer_params(true);
    const Hd embed = V * h * (g_.tie ? 1.0 : 2.0) + h;
    r.params = O::sum(r.layer_params) + embed;
    r.active_params = O::sum(r.layer_active_params) + embed;
    r.layer_weight_bytes = r.layer_params * g_.wbytes + d.moe_keep * d.router_buffer * d.experts * 4.0;
    r.weight_bytes = O::sum(r.layer_weight_bytes) + embed * g_.wbytes;
    r.layer_kv_per_token = d.attn_keep * 2.0 * d.kv_heads * d.head_dim * g_.kvbytes;
    MambaWidths<T> m = mamba_widths(d);
    r.layer_state_per_seq = d.mamba_keep * ((d.m_conv - 1.0) * m.conv_dim * g_.wbytes +
                                            d.m_heads * d.m_head_dim * d.m_state * d.m_state_bytes);
    r.kv_bytes_per_token = O::sum(r.layer_kv_per_token);
    r.state_bytes_per_seq = O::sum(r.layer_state_per_seq);
    // Activation peak of a profile run at max_num_batched_tokens: residual + the widest
    // intermediate of any layer, plus fp32 logits for max_num_seqs rows.
    const double tm = double(e_.max_num_batched_tokens);
    T widest = O::maximum(O::maximum(d.attn_keep * ((d.heads + 2.0 * d.kv_heads) * d.head_dim + d.heads * d.head_dim),
                                     d.mamba_keep * (m.in_proj + m.conv_dim)),
                          O::maximum(d.mlp_keep * d.ffn * d.mlp_mats,
                                     d.moe_keep * (d.top_k * (d.expert_ffn * d.moe_mats + d.moe_width) +
                                                   d.shared_ffn * d.moe_mats + d.experts * 2.0)));
    if (e_.activations == "eager")  // residual stream + the largest layer's live tensors + one row of logits
      r.activation_bytes = O::max_all(eager_layer_activation(tm)) + tm * h * g_.abytes + V * g_.abytes;
    else
      r.activation_bytes = (O::max_all(widest) + 2.0 * h) * tm * g_.abytes + double(e_.max_num_seqs) * V * 4.0;
    r.reserved_bytes = O::scalar(e_.cuda_graph_bytes + e_.non_torch_bytes, d.attn_keep);
    const double usable = hw_.memory_bytes * hw_.usable_fraction;
    if (e_.memory_policy == "fraction_of_free") {
      r.budget_bytes = O::scalar(usable, d.attn_keep);
      r.kv_budget_bytes = (usable - r.weight_bytes - r.activation_bytes - r.reserved_bytes) * e_.memory_fraction;
    } else {
      r.budget_bytes = O::scalar(usable * e_.memory_fraction, d.attn_keep);
      r.kv_budget_bytes = r.budget_bytes - r.weight_bytes - r.activation_bytes - r.reserved_bytes;
    }
    // Bytes one sequence of context_tokens holds.
    const double ctx = double(w_.context_tokens), bt = double(e_.kv_block_tokens);
    if (e_.hybrid_page_rule && g_.has_attention && g_.has_mamba) {
      // vLLM hybrid: one page size for all layers; the attention block grows (in steps of
      // the block size) until its page holds one Mamba state; each Mamba layer takes a page.
      S attn_tok = O::max_all(r.layer_kv_per_token);
      S mamba_state = O::max_all(r.layer_state_per_seq);
      S block = O::ceil_st(mamba_state / attn_tok / bt) * bt;
      block = O::maximum(block, bt);
      S page = block * attn_tok;
      r.bytes_per_seq = O::sum(d.mamba_keep) * page + O::sum(d.attn_keep) * O::ceil_st(ctx / block) * page;
    } else {
      r.bytes_per_seq = std::ceil(ctx / bt) * bt * r.kv_bytes_per_token + r.state_bytes_per_seq;
    }
    r.concurrency_limit = r.kv_budget_bytes / r.bytes_per_seq;
    r.max_concurrency = O::minimum(O::floor_st(O::maximum(r.concurrency_limit, 0.0)), double(e_.max_num_seqs));
    r.concurrency = w_.concurrency == 0 ? r.max_concurrency : O::minimum(r.max_concurrency, double(w_.concurrency));
    // Timing runs at >= 1 sequence even when none fits (the caller reports that it does not fit).
    const S B = O::maximum(r.concurrency, 1.0);
    // ---- TTFT: one prompt, prefilled in chunks of max_num_batched_tokens.
    const double P = double(w_.prompt_tokens);
    r.layer_prefill_s = one() * 0.0;
    S head = O::scalar(0.0, d.attn_keep);
    for (double done = 0; done < P; done += tm) {
      const double s = std::min(tm, P - done);
      const S n = O::scalar(s, d.attn_keep);
      r.layer_prefill_s = r.layer_prefill_s + layers_time(n, O::scalar(1.0, d.attn_keep), s, done, false);
      // + the measured rest of an eager prefill chunk (HardwareProfile::PrefillStepCost)
      head = head + head_time(n, O::scalar(1.0, d.attn_keep), done + s >= P) + e_.step_overhead_s +
             (hw_.prefill.model_fixed + n * h * hw_.prefill.model_per_element);
    }
    r.ttft_s = O::sum(r.layer_prefill_s) + head;
    // ---- TPOT: one decode step of B sequences at the mean context (prompt + half the output).
    const double L = P + double(w_.output_tokens) / 2.0;
    r.layer_decode_s = layers_time(B, B, 1, L, true);
    r.tpot_s = O::sum(r.layer_decode_s) + head_time(B, B, true, true) + e_.step_overhead_s +
               (hw_.decode.measured ? hw_.decode.model_fixed : 0.0);
    r.decode_tok_s = B / r.tpot_s;
    const double out = double(w_.output_tokens);
    r.throughput_tok_s = B * out / (B * r.ttft_s + out * r.tpot_s);
    return r;
  }

 private:
  const Globals& g_;
  const LayerDims<T>& d_;
  const HardwareProfile& hw_;
  const EngineProfile& e_;
  const Workload& w_;
  Hd h_;
};

}  // namespace ac::search::detail

namespace ac::search::detail {

Globals globals_from_spec(const model::ArchSpec& spec);

// Per-layer constants of a spec as plain vectors (one entry per layer), in LayerDims order;
// `make` turns a std::vector<double> into T.
template <typename T, typename Make>
LayerDims<T> dims_from_spec(const model::ArchSpec& spec, Make make) {
  const size_t L = spec.layers.size();
  const double wb = globals_from_spec(spec).wbytes, h = double(spec.hidden_size);
  std::vector<std::vector<double>> f(37, std::vector<double>(L, 0.0));
  enum { AK, HE, KV, HD, QB, OB, QN, MK, MH, MP, MN, MG, MC, MQ, MCB, MPB, MSB, FK, FF, FM, FB,
         EK, EE, ET, EF, ES, EW, EL, EM, ER };
  for (size_t i = 0; i < L; ++i) {
    const auto& l = spec.layers[i];
    f[HD][i] = f[MP][i] = f[MN][i] = f[MG][i] = f[MC][i] = f[MQ][i] = f[EE][i] = 1.0;
    f[FM][i] = f[EM][i] = 2.0;
    f[MSB][i] = wb;
    f[EW][i] = h;
    if (const auto& a = l.attention) {
      f[AK][i] = 1, f[HE][i] = a->num_heads, f[KV][i] = a->num_kv_heads, f[HD][i] = a->head_dim;
      f[QB][i] = a->qkv_bias, f[OB][i] = a->o_bias, f[QN][i] = a->qk_norm;
    }
    if (const auto& m = l.mamba) {
      f[MK][i] = 1, f[MH][i] = m->num_heads, f[MP][i] = m->head_dim, f[MN][i] = m->state_size, f[MG][i] = m->n_groups;
      f[MC][i] = m->conv_kernel, f[MQ][i] = m->chunk_size, f[MCB][i] = m->conv_bias, f[MPB][i] = m->proj_bias;
      f[MSB][i] = m->ssm_state_fp32 ? 4.0 : wb;
    }
    if (const auto& m = l.mlp) {
      f[FK][i] = 1, f[FF][i] = double(m->ffn_size), f[FB][i] = m->bias;
      f[FM][i] = m->activation == model::MlpActivation::SwiGLU ? 3.0 : 2.0;
    }
    if (const auto& m = l.moe) {
      f[EK][i] = 1, f[EE][i] = m->num_experts, f[ET][i] = m->top_k, f[EF][i] = double(m->expert_ffn);
      f[ES][i] = double(m->shared_ffn), f[EL][i] = double(m->latent_size);
      f[EW][i] = m->latent_size > 0 ? double(m->latent_size) : h;
      f[EM][i] = m->activation == model::MlpActivation::SwiGLU ? 3.0 : 2.0;
      f[ER][i] = m->router == model::RouterKind::SigmoidBias ? 1.0 : 0.0;
    }
  }
  LayerDims<T> d{make(f[AK]), make(f[HE]), make(f[KV]), make(f[HD]), make(f[QB]), make(f[OB]), make(f[QN]),
                 make(f[MK]), make(f[MH]), make(f[MP]), make(f[MN]), make(f[MG]), make(f[MC]), make(f[MQ]),
                 make(f[MCB]), make(f[MPB]), make(f[MSB]), make(f[FK]), make(f[FF]), make(f[FM]), make(f[FB]),
                 make(f[EK]), make(f[EE]), make(f[ET]), make(f[EF]), make(f[ES]), make(f[EW]), make(f[EL]),
                 make(f[EM]), make(f[ER])};
  return d;
}

}  // namespace ac::search::detail

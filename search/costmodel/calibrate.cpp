// Micro-benchmarks and curve fits behind `autocompress cost calibrate`.
#include "search/costmodel/calibrate.h"

#include <torch/torch.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "checkpoint/convert.h"
#include "dist/error.h"
#include "dist/communicator.h"
#include "dist/cpu_features.h"
#include "dist/omp_env.h"
#include "model/layers/attention.h"
#include "model/layers/mamba2.h"
#include "model/layers/selective_recompute.h"
#include "model/kernels_version.h"
#include "model/model.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/formulas.h"

namespace ac::search {

using nlohmann::json;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double roofline_seconds(const HardwareProfile& hw, const std::string& kind, double flops, double bytes, double rows) {
  if (kind == "dispatch") return hw.kernel_overhead_s;
  if (kind == "memory") return (bytes + hw.memory.half) / (hw.memory_bandwidth * hw.memory.max) + hw.kernel_overhead_s;
  if (kind == "elementwise")
    return (bytes + hw.elementwise.half) / (hw.memory_bandwidth * hw.elementwise.max) + hw.kernel_overhead_s;
  const EfficiencyCurve& c = kind == "attention" ? hw.attention : kind == "scan" ? hw.scan : hw.gemm;
  if (kind == "gemm" && rows > 0) flops *= 1.0 + hw.gemm_rows_half / rows;
  const double tc = (flops + c.half) / (hw.peak_flops * c.max);
  const double tm = (bytes + hw.memory.half) / (hw.memory_bandwidth * hw.memory.max);
  return std::max(tc, tm) + hw.kernel_overhead_s;
}

std::vector<double> mamba_prefill_features(double b, double s, double H, double P, double N, double G, double Q) {
  const double lp = b * std::ceil(s / Q) * Q;  // tokens padded to whole chunks
  return {2.0 * lp * (Q * (G * N + H * P) + 2.0 * H * P * N), lp * Q * H, lp * (H * P + G * N), 1.0};
}
std::vector<double> mamba_step_features(double b, double H, double P, double N) {
  return {b * H * P * N, b * H * (P + N), 1.0};
}
double mamba_mixer_seconds(const HardwareProfile& hw, bool step, const std::vector<double>& f) {
  const auto& c = hw.mamba;
  if (step) return c.step_per_state * f[0] + c.step_per_lin * f[1] + c.step_fixed * f[2];
  return c.per_flop * f[0] + c.per_quad * f[1] + c.per_lin * f[2] + c.fixed * f[3];
}

std::vector<double> gemv_features(double out, double in, double rows, double eb) {
  std::vector<double> f;
  for (const auto term : detail::kGemvLineTerms) {
    HardwareProfile::DecodeStepCost unit;
    unit.*term = 1.0;
    f.push_back(detail::gemv_line<detail::Ops<detail::Vec>>(unit, out, in, rows, eb, eb));
  }
  return f;
}

namespace {
// How many features a sublayer step's rest has for its first row: attention {1, past kv_dim,
// past q_dim}, MLP {1, ffn}; a batched step's features repeat them x (rows - 1) for the further
// rows. 0: a kind whose further rows are not fitted apart.
size_t first_row_features(const std::string& kind) {
  return kind == "attention_decode" ? 3 : kind == "mlp_decode" ? 2 : 0;
}
}  // namespace

double decode_step_seconds(const HardwareProfile& hw, const std::string& kind, const std::vector<double>& f,
                           const std::vector<std::array<double, 3>>& gemms, double eb) {
  const auto& c = hw.decode;
  auto gemv = [&](double out, double in, double rows) {
    return detail::gemv_line<detail::Ops<detail::Vec>>(c, out, in, rows, eb, eb);
  };
  double t = 0;
  for (const auto& g : gemms) t += gemv(g[0], g[1], g[2]);
  if (kind == "gemv" || f.empty()) return t;
  const bool rows = f.size() > first_row_features(kind);  // with the further rows' features
  if (kind == "attention_decode")
    t += c.attn_fixed * f[0] + c.attn_per_kv * f[1] + c.attn_per_q * f[2] +
         (rows ? c.attn_per_row * f[3] + c.row_per_kv() * f[4] + c.row_per_q() * f[5] : 0.0);
  if (kind == "mlp_decode")
    t += c.mlp_fixed * f[0] + c.mlp_per_ffn * f[1] + (rows ? c.mlp_per_row * f[2] + c.row_per_ffn() * f[3] : 0.0);
  if (kind == "moe_decode") t += c.moe_fixed * f[0] + c.moe_per_expert * f[1];
  if (kind == "mamba_decode") t += mamba_mixer_seconds(hw, true, f) + c.mamba_fixed;
  return t;
}

Stopwatch Stopwatch::for_device(const std::string& device) {
  Stopwatch w;
  w.cpu_time = device == "cpu" && torch::get_num_threads() == 1;
  return w;
}

double Stopwatch::now() const {
  if (cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

// Median time of f() over repetitions lasting at least min_seconds in total (after a
// warm-up). The median, not the minimum: `cost validate` (and a server) sees typical operator
// times, and the CPU-time clock already leaves out time spent preempted; the fastest run is
// systematically faster than the typical one on a machine whose caches other jobs share.
template <typename F>
double time_it(F f, const torch::Device& dev, double min_seconds, const Stopwatch& clock) {
  f();
  sync(dev);
  std::vector<double> t;
  double total = 0;
  while (total < min_seconds || t.size() < 3) {
    const double a = clock.now();
    f();
    sync(dev);
    const double s = clock.now() - a;
    t.push_back(s);
    total += s;
    if (t.size() >= 200) break;
  }
  return median(std::move(t));
}

// Median time of f() over n calls, each after evict_cpu_caches() (not timed), after `warmup`
// untimed calls that warm the code path up.
template <typename F>
double time_cold(F f, int n, const Stopwatch& clock, int warmup = 1) {
  std::vector<double> t;
  for (int i = 0; i < warmup + n; ++i) {
    evict_cpu_caches();
    const double a = clock.now();
    f();
    if (i >= warmup) t.push_back(clock.now() - a);
  }
  return median(std::move(t));
}

// A GEMM point as a model runs it: y = x W^T with W in the nn.Linear layout [out, in], each
// call on the next weight of a pool larger than the CPU's caches, so weights stream from
// memory as in a forward pass instead of staying hot across repetitions.
std::vector<torch::Tensor> weight_pool(int64_t out, int64_t in, const torch::TensorOptions& opt, double pool_bytes) {
  const double bytes = double(out * in) * double(torch::elementSize(torch::typeMetaToScalarType(opt.dtype())));
  std::vector<torch::Tensor> pool;
  for (int64_t i = 0, copies = std::max<int64_t>(1, int64_t(std::ceil(pool_bytes / bytes))); i < copies; ++i)
    pool.push_back(torch::randn({out, in}, opt));
  return pool;
}
// Median time of linear(a, W) going round the pool.
double time_linear(const torch::Tensor& a, const std::vector<torch::Tensor>& pool, double min_seconds,
                   const Stopwatch& clock) {
  size_t next = 0;
  return time_it(
      [&] {
        (void)model::apply_linear(a, pool[next]);
        next = (next + 1) % pool.size();
      },
      a.device(), min_seconds, clock);
}
constexpr double kGemmPoolBytes = 64.0 * 1048576, kQuickGemmPoolBytes = 16.0 * 1048576;

// Fits t = a * w + c (a, c >= 0) minimising the relative error sum(((a w + c) - t) / t)^2.
std::pair<double, double> fit_linear(const std::vector<double>& w, const std::vector<double>& t) {
  double sww = 0, sw = 0, s1 = 0, swt = 0, st = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double q = 1.0 / (t[i] * t[i]);
    sww += q * w[i] * w[i], sw += q * w[i], s1 += q, swt += q * w[i] * t[i], st += q * t[i];
  }
  const double det = sww * s1 - sw * sw;
  double a = det != 0 ? (swt * s1 - sw * st) / det : 0, c = det != 0 ? (sww * st - sw * swt) / det : 0;
  if (c < 0 || a <= 0) {  // fall back to a pure rate through the origin
    c = 0;
    a = swt / sww;
  }
  return {a, c};
}

// Non-negative least squares on the relative error, min sum(((X c) - t) / t)^2 with c >= 0,
// by trying every subset of the (few) features and keeping the best non-negative solution.
// With `off`: fits off + X c to t (a known part of each time, predicted by another fit).
std::vector<double> fit_nonneg(const std::vector<std::vector<double>>& X, const std::vector<double>& t,
                               const std::vector<double>& off = {}) {
  const size_t k = X.empty() ? 0 : X[0].size();
  std::vector<double> best(k, 0.0);
  double best_err = INFINITY;
  for (unsigned mask = 1; mask < (1u << k); ++mask) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < k; ++j)
      if (mask & (1u << j)) cols.push_back(j);
    const size_t m = cols.size();
    std::vector<std::vector<double>> A(m, std::vector<double>(m + 1, 0.0));  // normal equations
    for (size_t i = 0; i < X.size(); ++i) {
      const double q = 1.0 / (t[i] * t[i]);
      for (size_t a = 0; a < m; ++a) {
        for (size_t b = 0; b < m; ++b) A[a][b] += q * X[i][cols[a]] * X[i][cols[b]];
        A[a][m] += q * X[i][cols[a]] * (t[i] - (off.empty() ? 0.0 : off[i]));
      }
    }
    bool ok = true;
    for (size_t p = 0; p < m && ok; ++p) {  // Gauss-Jordan with partial pivoting
      size_t piv = p;
      for (size_t r = p + 1; r < m; ++r)
        if (std::fabs(A[r][p]) > std::fabs(A[piv][p])) piv = r;
      std::swap(A[p], A[piv]);
      if (!(std::fabs(A[p][p]) > 1e-300)) ok = false;
      for (size_t r = 0; r < m && ok; ++r)
        if (r != p) {
          const double f = A[r][p] / A[p][p];
          for (size_t c = p; c <= m; ++c) A[r][c] -= f * A[p][c];
        }
    }
    if (!ok) continue;
    std::vector<double> c(k, 0.0);
    for (size_t a = 0; a < m; ++a) c[cols[a]] = A[a][m] / A[a][a];
    if (std::any_of(c.begin(), c.end(), [](double v) { return !(v >= 0); })) continue;
    double err = 0;
    for (size_t i = 0; i < X.size(); ++i) {
      double y = off.empty() ? 0.0 : off[i];
      for (size_t j = 0; j < k; ++j) y += c[j] * X[i][j];
      err += (y - t[i]) * (y - t[i]) / (t[i] * t[i]);
    }
    if (err < best_err) best_err = err, best = c;
  }
  return best;
}

void add_point(std::vector<CalibrationPoint>& points, const std::string& kind, const std::string& shape,
               double flops, double bytes, double seconds) {
  CalibrationPoint p;
  p.kind = kind, p.shape = shape, p.flops = flops, p.bytes = bytes, p.seconds = seconds;
  points.push_back(std::move(p));
}

// A step cache in memory of its own, with the same values and layout.
model::LayerCache copy_cache(const model::LayerCache& c) {
  auto copy = [](const torch::Tensor& t) { return t.defined() ? t.clone() : t; };
  model::LayerCache r = c;
  if (c.kv.buffered()) {
    r.kv.k_buf = copy(c.kv.k_buf), r.kv.v_buf = copy(c.kv.v_buf);
    r.kv.k = r.kv.k_buf.narrow(2, 0, c.kv.k.size(2)), r.kv.v = r.kv.v_buf.narrow(2, 0, c.kv.v.size(2));
  } else {
    r.kv.k = copy(c.kv.k), r.kv.v = copy(c.kv.v);
  }
  r.mamba.conv_state = copy(c.mamba.conv_state), r.mamba.ssm_state = copy(c.mamba.ssm_state);
  return r;
}

// Decode steps (CPU): the one-row GEMM line (measure_gemvs), then the model's own DecoderLayer
// at chosen sizes (one layer with one sublayer, no architecture), a decode step timed whole
// (layer_steps, time_layer_steps). Its GEMMs are charged by the GEMM line fitted here, the rest
// (norm, residual, casts, RoPE, cache append, GQA expansion, scores, routing, dispatch) is
// fitted per sublayer kind, first row and further rows (HardwareProfile::DecodeStepCost).
void measure_gemvs(const CalibrationOptions& o, const torch::TensorOptions& opt, double eb, double pool_bytes,
                   const Stopwatch& clock, std::vector<CalibrationPoint>& points) {
  // One-row GEMMs [1, in] x [out, in]^T, cold: each call on another weight of a 64 MiB pool.
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      o.quick ? std::vector<std::pair<int64_t, int64_t>>{{160, 224}, {1408, 320}, {320, 1408}, {2560, 576}, {96, 480}}
              : std::vector<std::pair<int64_t, int64_t>>{{160, 224},  {1408, 320}, {320, 1408}, {2560, 576},
                                                         {96, 480},   {704, 704},  {576, 2560}, {4000, 288},
                                                         {288, 288},  {1200, 448}, {48, 640},   {3200, 160}};
  // The same line over 2-16 rows on half of the shapes: what a batched decode step (one row per
  // sequence) and an expert's few tokens run (small_linear in fp32 where it has a kernel, the
  // BLAS / oneDNN GEMM in bf16); each extra row's cost is fitted apart from the one-row GEMM's.
  const std::vector<int64_t> more_rows = o.quick ? std::vector<int64_t>{4, 16} : std::vector<int64_t>{2, 4, 8, 16};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& [out, in] = shapes[i];
    const std::vector<torch::Tensor> pool = weight_pool(out, in, opt, pool_bytes);
    std::vector<int64_t> rows{1};
    if (i % 2 == 0) rows.insert(rows.end(), more_rows.begin(), more_rows.end());
    for (int64_t m : rows) {
      const double s = time_linear(torch::randn({m, 1, in}, opt), pool, o.min_seconds, clock);
      add_point(points, "gemv", std::to_string(m) + " x " + std::to_string(in) + " -> " + std::to_string(out),
                2.0 * double(m * out * in), eb * double(out * in + m * (out + in)), s);
      points.back().rows = double(m);
      points.back().features = gemv_features(double(out), double(in), double(m), eb);
      points.back().gemms = {{double(out), double(in), double(m)}};
    }
  }
}

// One sublayer's decode step to time: kind, hidden, the layer, the cached tokens before the
// step, features, the GEMMs it runs, and the sequences it steps (one row each).
struct LayerStep {
  const char* kind;
  int64_t h;
  model::LayerSpec layer;
  int64_t past;
  std::vector<double> features;
  std::vector<std::array<double, 3>> gemms;
  int64_t rows = 1;
  bool same_layer = false;  // the previous step's layer over other rows: its pool is kept
};

std::vector<LayerStep> layer_steps(const CalibrationOptions& o) {
  std::vector<LayerStep> steps;
  auto mlp_gemms = [](double mats, double ffn, double w, double rows = 1.0) {
    std::vector<std::array<double, 3>> g(size_t(mats - 1), {ffn, w, rows});
    g.push_back({w, ffn, rows});
    return g;
  };
  // Attention and MLP sublayers are also stepped over 4 or 8 sequences at once (a batched decode,
  // every other size in turn): each further row's rest is fitted apart from the first row's.
  auto batch_of = [&](size_t i) -> int64_t { return o.quick ? 8 : i % 2 == 0 ? 4 : 8; };
  // attention: h, heads, kv heads, head dim, cached tokens (RoPE on; GQA 1:1 to 1:7)
  const std::vector<std::array<int64_t, 5>> attention_sizes{
      {192, 3, 1, 64, 100}, {320, 5, 5, 64, 300}, {448, 7, 1, 64, 200}, {384, 6, 2, 64, 480},
      {256, 8, 4, 32, 160}, {640, 10, 2, 64, 360}, {512, 16, 4, 32, 250}, {288, 9, 3, 32, 420}};
  for (size_t i = 0; i < attention_sizes.size() && !(o.quick && i >= 4); ++i) {
    const auto& [h, H, K, D, past] = attention_sizes[i];
    model::LayerSpec l;
    l.attention = model::AttentionSpec{int(H), int(K), int(D)};
    const double qd = double(H * D), kvd = double(K * D), hd = double(h);
    for (int64_t b : {int64_t(1), batch_of(i)}) {
      const double r = double(b), x = r - 1.0;
      steps.push_back({"attention_decode", h, l, past,
                       {1.0, double(past) * kvd, double(past) * qd, x, x * double(past) * kvd, x * double(past) * qd},
                       {{qd, hd, r}, {kvd, hd, r}, {kvd, hd, r}, {hd, qd, r}}, b, b > 1});
    }
  }
  // MLP: h, ffn, gated (SwiGLU) or not (ReLU2)
  const std::vector<std::array<int64_t, 3>> mlp_sizes{{192, 640, 1},  {320, 1000, 1}, {448, 1536, 0},
                                                      {384, 2304, 1}, {576, 1200, 0}, {256, 2816, 1}};
  for (size_t i = 0; i < mlp_sizes.size() && !(o.quick && i >= 3); ++i) {
    const auto& [h, ffn, gated] = mlp_sizes[i];
    model::LayerSpec l;
    l.mlp = model::MlpSpec{ffn, gated ? model::MlpActivation::SwiGLU : model::MlpActivation::ReLU2};
    for (int64_t b : {int64_t(1), batch_of(i)}) {
      const double r = double(b), x = r - 1.0;
      steps.push_back({"mlp_decode", h, l, 0, {1.0, double(ffn), x, x * double(ffn)},
                       mlp_gemms(gated ? 3 : 2, double(ffn), double(h), r), b, b > 1});
    }
  }
  // MoE: h, experts, top-k, expert FFN, shared FFN, latent
  const size_t before_moe = steps.size();
  for (const auto& [h, E, k, eff, sh, lat] : std::vector<std::array<int64_t, 6>>{
           {256, 6, 2, 256, 0, 0},   {320, 12, 3, 192, 320, 0}, {384, 10, 1, 512, 0, 0}, {448, 20, 4, 128, 0, 0},
           {288, 16, 2, 160, 576, 0}, {512, 12, 2, 256, 0, 192}, {256, 24, 6, 96, 0, 0}}) {
    model::LayerSpec l;
    model::MoeSpec m;
    m.num_experts = int(E), m.top_k = int(k), m.expert_ffn = eff, m.shared_ffn = sh, m.latent_size = lat;
    l.moe = m;
    const double w = double(lat > 0 ? lat : h), hd = double(h);
    std::vector<std::array<double, 3>> g{{double(E), hd, 1}};
    if (lat > 0) g.push_back({double(lat), hd, 1}), g.push_back({hd, double(lat), 1});
    if (sh > 0)
      for (const auto& x : mlp_gemms(3, double(sh), hd)) g.push_back(x);
    for (int64_t e = 0; e < k; ++e)
      for (const auto& x : mlp_gemms(3, double(eff), w)) g.push_back(x);
    steps.push_back({"moe_decode", h, l, 0, {1.0, double(k)}, g});
    if (o.quick && steps.size() - before_moe >= 3) break;
  }
  // Mamba (the mixer's own step is the `mamba` term): the layer's norm and residual around it
  for (const auto& [h, H, P, N, G] : std::vector<std::array<int64_t, 5>>{
           {256, 4, 32, 16, 1}, {384, 8, 32, 128, 4}, {640, 24, 32, 16, 6}, {320, 10, 32, 64, 5}}) {
    model::LayerSpec l;
    model::MambaSpec ms;
    ms.num_heads = int(H), ms.head_dim = int(P), ms.state_size = int(N), ms.n_groups = int(G), ms.chunk_size = 64;
    l.mamba = ms;
    const double di = double(H * P), hd = double(h);
    steps.push_back({"mamba_decode", h, l, 64, mamba_step_features(1, double(H), double(P), double(N)),
                     {{2.0 * di + 2.0 * double(G * N) + double(H), hd, 1}, {hd, di, 1}}});
    if (o.quick) break;
  }
  return steps;
}

// Each step's time: weights cold, as in a model's decode step (the other layers' weights pass
// through the caches in between) while the code and the allocator stay warm. Each size is a pool
// of copies of the layer whose weights one step reads (its GEMMs': a MoE step reads its router,
// shared expert and top-k experts, not the other experts) total > 40 MiB (16 quick), more than the
// last-level cache; the steps go round the pool, and the median of `rounds` rounds' medians is
// kept. (Counting every weight instead, a MoE pool held 40 MiB of which its steps read 2-7 MiB,
// the same experts each round: they ran from the cache, faster than their GEMMs on the decode
// line, the MoE rest fitted to 0 and the whole-model fit put every expert's rest on
// model_per_moe_layer. docs/costmodel.md "fp32 profiles".)
std::vector<double> time_layer_steps(const std::vector<LayerStep>& steps, const CalibrationOptions& o,
                                     const torch::TensorOptions& opt, torch::Dtype dt, const Stopwatch& clock) {
  model::TpGroup tp{dist::make_self_communicator()};
  const int rounds = o.quick || o.passes > 1 ? 1 : 3;  // passes repeat it too
  std::vector<double> out;
  std::vector<model::DecoderLayer> pool;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& st = steps[i];
    if (!st.same_layer) {
      model::ArchSpec spec;
      spec.hidden_size = st.h, spec.vocab_size = 256, spec.layers = {st.layer};
      pool.clear();
      double read = 0;  // weight bytes one step of one copy reads
      for (const auto& g : st.gemms) read += g[0] * g[1] * double(torch::elementSize(dt));
      while (double(pool.size()) * read < (o.quick ? 16.0 : 40.0) * 1048576 || pool.size() < 3) {
        pool.emplace_back(spec, 0, tp, dt);
        pool.back()->eval();
      }
    }
    // Each member's own cache of `past` tokens per sequence: the first one's, prefilled, copied.
    std::vector<model::LayerCache> caches(pool.size());
    if (st.past > 0) (void)pool[0]->forward(torch::randn({st.rows, st.past, st.h}, opt), 0, &caches[0]);
    for (size_t k = 1; k < pool.size(); ++k) caches[k] = copy_cache(caches[0]);
    auto x1 = torch::randn({st.rows, 1, st.h}, opt);
    const size_t reps = std::max<size_t>(o.quick ? 9 : 21, pool.size());
    std::vector<double> rounds_s;
    for (int round = 0; round < rounds; ++round) {
      std::vector<double> t;
      for (size_t rep = 0; rep <= reps; ++rep) {
        const size_t k = rep % pool.size();
        model::LayerCache c = caches[k];  // the same cached length every time (the step appends)
        const double a = clock.now();
        (void)pool[k]->forward(x1, st.past, &c);
        if (rep > 0) t.push_back(clock.now() - a);
      }
      rounds_s.push_back(median(t));
    }
    out.push_back(median(rounds_s));
  }
  return out;
}

void measure_decode_steps(const CalibrationOptions& o, const torch::TensorOptions& opt, torch::Dtype dt, double eb,
                          double pool_bytes, const Stopwatch& clock, std::vector<CalibrationPoint>& points) {
  measure_gemvs(o, opt, eb, pool_bytes, clock, points);
  const std::vector<LayerStep> steps = layer_steps(o);
  const std::vector<double> seconds = time_layer_steps(steps, o, opt, dt, clock);
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& st = steps[i];
    std::string shape = "layer h" + std::to_string(st.h) + " step after " + std::to_string(st.past) + " tokens";
    if (st.rows > 1) shape += " x" + std::to_string(st.rows) + " sequences";
    if (st.layer.attention)
      shape += " heads " + std::to_string(st.layer.attention->num_heads) + "/" + std::to_string(st.layer.attention->num_kv_heads);
    if (st.layer.mlp) shape += " ffn " + std::to_string(st.layer.mlp->ffn_size);
    if (st.layer.moe) shape += " experts " + std::to_string(st.layer.moe->top_k) + "/" + std::to_string(st.layer.moe->num_experts);
    if (st.layer.mamba) shape += " mamba heads " + std::to_string(st.layer.mamba->num_heads);
    add_point(points, st.kind, shape, 0, 0, std::max(1e-7, seconds[i]));
    points.back().features = st.features;
    points.back().gemms = st.gemms;
  }
}

// `blocks` blocks of one family at hidden size h, FFN width ffn and vocabulary V: the models of
// the whole-model calibration points. Dense: attention (GQA 2:1, RoPE, head dim 64) and a SwiGLU
// MLP (Llama's layer); MoE: that attention and a Nemotron MoE (16 experts, top 4, sigmoid router
// with bias, ReLU2 experts of width ffn / 4, a shared expert of ffn / 2); Mamba: a Mamba-2 mixer
// (expand 2, head dim 64, state 64, 2 groups) and a ReLU2 MLP (Nemotron-H's).
constexpr int64_t kBlockHeadDim = 64;
enum class BlockFamily { Dense, Moe, Mamba };
model::ArchSpec block_spec(int64_t h, int64_t ffn, int64_t V, int blocks, const std::string& dtype,
                           BlockFamily family = BlockFamily::Dense) {
  const int64_t heads = h / kBlockHeadDim;
  int64_t kv = std::max<int64_t>(1, heads / 2);  // GQA: the largest KV count <= heads / 2 dividing heads
  while (heads % kv != 0) --kv;
  model::ArchSpec spec;
  spec.hidden_size = h, spec.vocab_size = V, spec.max_position_embeddings = 4096;
  spec.dtype = dtype;  // what the model runs in and the fits price it in
  model::LayerSpec l;
  if (family == BlockFamily::Mamba) {
    model::MambaSpec m;
    m.num_heads = int(2 * h / kBlockHeadDim), m.head_dim = int(kBlockHeadDim), m.state_size = 64, m.n_groups = 2;
    m.chunk_size = 64;
    l.mamba = m;
    l.mlp = model::MlpSpec{ffn, model::MlpActivation::ReLU2};
  } else {
    l.attention = model::AttentionSpec{int(heads), int(kv), int(kBlockHeadDim)};
  }
  if (family == BlockFamily::Dense) l.mlp = model::MlpSpec{ffn, model::MlpActivation::SwiGLU};
  if (family == BlockFamily::Moe) {
    model::MoeSpec e;
    e.num_experts = 16, e.top_k = 4, e.expert_ffn = ffn / 4, e.shared_ffn = ffn / 2;
    e.router = model::RouterKind::SigmoidBias, e.activation = model::MlpActivation::ReLU2, e.routed_scaling = 2.5;
    l.moe = e;
  }
  spec.layers.assign(size_t(blocks), l);
  return spec;
}
// block_spec's model in its dtype, weights initialised (seed 1), in eval mode.
model::CausalLM block_model(const model::ArchSpec& spec) {
  model::ModelOptions mo;
  mo.dtype = checkpoint::parse_dtype(spec.dtype, "block model dtype");
  model::CausalLM m(spec, model::TpGroup{}, mo);
  m->init_weights(1);
  m->eval();
  return m;
}

// The model sizes of the whole-model points: hidden, ffn, vocabulary.
std::vector<std::array<int64_t, 3>> model_sizes(bool quick) {
  return quick ? std::vector<std::array<int64_t, 3>>{{256, 768, 4096}, {512, 1536, 16384}}
               : std::vector<std::array<int64_t, 3>>{{256, 768, 4096}, {512, 1536, 4096}, {384, 1024, 16384}, {576, 1536, 49152}};
}

// The cold decode step of `m` (one sequence, kModelDecodePast tokens cached): the median of n calls, each
// from evicted caches (time_cold), each on the same cached length (the step appends).
struct ColdStep {
  model::CausalLM m;
  model::InferenceCache filled;
  torch::Tensor tok;
  ColdStep(model::CausalLM model, int64_t V) : m(std::move(model)), tok(torch::randint(0, V, {1, 1}, torch::kLong)) {
    (void)m->forward(torch::randint(0, V, {1, kModelDecodePast}, torch::kLong), &filled);
  }
  void step() {
    model::InferenceCache c = filled;
    (void)m->forward(tok, &c);
  }
  double time(int n, const Stopwatch& clock) {
    return time_cold([&] { step(); }, n, clock);
  }
};
// The cold prefill of `p` tokens into an empty cache, then the last token's logits (as `cost
// validate` times a prefill): the median of n calls after `warmup` untimed ones.
double time_cold_prefill(model::CausalLM& m, const torch::Tensor& ids, int n, const Stopwatch& clock, int warmup) {
  const int64_t p = ids.size(1);
  return time_cold(
      [&] {
        model::InferenceCache c = m->new_cache();
        const auto hidden = m->hidden_states(ids, &c);
        (void)m->logits_local(hidden.slice(1, p - 1, p));
      },
      n, clock, warmup);
}
const char* family_tag(BlockFamily f) { return f == BlockFamily::Moe ? "moe " : f == BlockFamily::Mamba ? "mamba " : ""; }
std::string model_decode_shape(int64_t h, int64_t ffn, int64_t V, int blocks = 1, BlockFamily family = BlockFamily::Dense) {
  const std::string layer = family_tag(family) + ("h" + std::to_string(h) + " ffn " + std::to_string(ffn));
  return (blocks == 1 ? layer : std::to_string(blocks) + "x(" + layer + ")") + " vocab " + std::to_string(V);
}
std::string model_prefill_shape(int blocks, int64_t h, int64_t ffn, int64_t V, int64_t p) {
  return std::to_string(blocks) + "x(h" + std::to_string(h) + " ffn " + std::to_string(ffn) + ") vocab " +
         std::to_string(V) + " prompt " + std::to_string(p);
}
constexpr int kDecodeCalls = 9, kQuickDecodeCalls = 5, kPrefillCalls = 5, kQuickPrefillCalls = 3, kPrefillWarmup = 6;

// Whole decode steps of one- and two-block models at chosen hidden and vocabulary sizes, 8
// tokens cached, each step started from evicted caches as a step of a model larger than the
// last-level cache starts: what a step costs beyond its sublayers' pooled steps and the LM
// head's GEMM is the `model_decode` terms (HardwareProfile::DecodeStepCost): model_fixed once
// per step (the embedding lookup, final norm, logits, the cold code and page tables of its
// first kernels), a rest per sublayer of each kind (a pooled sublayer step keeps its code warm;
// in a cold model step each sublayer's norm, cache and activations come from memory too) and
// a rest per weight byte. One block alone cannot tell the step's term from the layers' (a
// one-block fit charged 0.3 ms per step and nothing per layer, over-predicting one-block models
// by ~15% and under-predicting deep ones by ~10%); dense blocks alone charged a MoE or Mamba
// sublayer a dense one's rest (the 24 validation models' MoE rows 10-20% under their
// measurement, docs/costmodel.md "The cold step per layer kind"). So every size has dense
// one- and two-block models, and the two smallest sizes MoE and Mamba ones as well.
//
// The cold step of a small model is bimodal on a VM (docs/costmodel.md, "The cold decode step
// is bimodal"): its latency-bound loads run in a fast or a slow state that holds for seconds.
// With one window per pass, one calibration in six timed the slow state in all three passes
// (model_fixed 0.59 ms against 0.21-0.30). So the models are built once and timed in short
// windows spread over each pass, a point keeps its fastest window's median (as validation
// keeps its fastest sweep's), and the profile lists every window's (`window_s`). Over six
// calibrations the points moved 1.05-1.25x (three-pass ones 1.03-1.37x; docs/costmodel.md,
// "Windows over each pass"). Six windows a pass (after each group of measurements), not three:
// replayed on 16 stored AVX2 pairs, the fastest of a point's first three, six and nine windows
// gave decode B=1 17.7%, 15.2% and 14.6% MAPE, leaning high less with each (docs/costmodel.md,
// "More windows").
// In a window each model's steps run back to back (ColdStep::time, as the speed reference
// probes them), the one-block model's, then the two-block one's, a fraction of a second apart,
// so both see the same speed state. Call by call in turn with the other model, an fp32 step
// ran 4-9% slower than alone or in validation's sequence (bench_cold_step: 38-41 of 48 rounds;
// bf16 0.98-1.01), and the fitted rest carried that into every fp32 prediction
// (docs/costmodel.md, "Timed in turn").
// Features: {hidden, ffn, vocabulary, blocks, family} (model_decode_spec).
class ModelStepWindows {
 public:
  explicit ModelStepWindows(const CalibrationOptions& o) : calls_(o.quick ? kQuickDecodeCalls : kDecodeCalls) {
    const auto sizes = model_sizes(o.quick);
    for (size_t i = 0; i < sizes.size(); ++i)
      for (BlockFamily f : {BlockFamily::Dense, BlockFamily::Moe, BlockFamily::Mamba}) {
        if (f != BlockFamily::Dense && i >= (o.quick ? 1u : 2u)) continue;
        const auto [h, ffn, V] = sizes[i];
        models_.push_back({h, ffn, V, f});
        for (int blocks : {1, 2}) steps_.emplace_back(block_model(block_spec(h, ffn, V, blocks, o.dtype, f)), V);
      }
    windows_.assign(steps_.size(), {});
  }
  // One window: each model's one-block steps, then its two-block steps, each median kept.
  void window(const Stopwatch& clock) {
    for (size_t k = 0; k < steps_.size(); ++k) windows_[k].push_back(steps_[k].time(calls_, clock));
  }
  // The points of the windows since the last call, in model_sizes order.
  void add_points(std::vector<CalibrationPoint>& points) {
    for (size_t i = 0; i < models_.size(); ++i) {
      const Model& m = models_[i];
      for (int blocks : {1, 2}) {
        const std::vector<double>& w = windows_[2 * i + size_t(blocks - 1)];
        add_point(points, "model_decode", model_decode_shape(m.h, m.ffn, m.V, blocks, m.family), 0, 0,
                  *std::min_element(w.begin(), w.end()));
        points.back().window_s = w;
        points.back().features = {double(m.h), double(m.ffn), double(m.V), double(blocks), double(int(m.family))};
      }
    }
    windows_.assign(steps_.size(), {});
  }

 private:
  struct Model {
    int64_t h, ffn, V;
    BlockFamily family;
  };
  int calls_;
  std::vector<Model> models_;
  std::vector<ColdStep> steps_;  // per model: the one-block one, then the two-block one
  std::vector<std::vector<double>> windows_;  // per step: each window's median since add_points
};

// Whole prefills of one- and two-block models (block_model) from an empty cache and evicted
// caches, timed as `cost validate` times a prefill (the layers, then the last token's logits):
// the `model_prefill` points, whose time beyond the engine's prediction is the profile's
// PrefillStepCost. Features: {prompt tokens, hidden, blocks, ffn, vocabulary}.
void measure_model_prefills(const CalibrationOptions& o, const Stopwatch& clock,
                            std::vector<CalibrationPoint>& points) {
  const std::vector<int64_t> prompts = o.quick ? std::vector<int64_t>{128} : std::vector<int64_t>{128, 512};
  for (const auto& [h, ffn, V] : model_sizes(o.quick))
    for (int blocks : {1, 2}) {
      model::CausalLM m = block_model(block_spec(h, ffn, V, blocks, o.dtype));
      for (const int64_t p : prompts) {
        const double s = time_cold_prefill(m, torch::randint(0, V, {1, p}, torch::kLong),
                                           o.quick ? kQuickPrefillCalls : kPrefillCalls, clock, kPrefillWarmup);
        add_point(points, "model_prefill", model_prefill_shape(blocks, h, ffn, V, p), 0, 0, s);
        points.back().features = {double(p), double(h), double(blocks), double(ffn), double(V)};
      }
    }
}

// A model_prefill point's prediction by `engine` (one chunk, one sequence) on profile `hw`, its
// weights, activations and cache in `dtype` (the calibration's: what the point's model ran in).
double model_prefill_seconds(const HardwareProfile& hw, const EngineProfile& engine, const std::vector<double>& f,
                             const std::string& dtype) {
  const model::ArchSpec spec = block_spec(int64_t(f.at(1)), int64_t(f.at(3)), int64_t(f.at(4)), int(f.at(2)), dtype);
  return predict_prompt(spec, hw, engine, int64_t(f.at(0)), 1).ttft_s;
}

// The prefill rest: each model_prefill point's time = the engine's prediction (the rest
// excluded) + model_fixed + model_per_element x p h. Per model, not per sublayer: a term per
// sublayer (fitted here on 1-2 blocks of attention + MLP) over-predicted the 24 validation
// models' prefills by ~10% (their Mamba, MoE and deeper stacks do not miss as much per
// sublayer; docs/costmodel.md "Cold prefills").
void fit_model_prefills(HardwareProfile& h, const std::vector<CalibrationPoint>& points, const EngineProfile& engine,
                        const std::string& dtype) {
  std::vector<std::vector<double>> X;
  std::vector<double> t, off;
  HardwareProfile bare = h;
  bare.prefill = HardwareProfile::PrefillStepCost{};
  for (const auto& p : points)
    if (p.kind == "model_prefill") {
      const double elems = p.features[0] * p.features[1];
      X.push_back({1.0, elems});
      t.push_back(p.seconds);
      off.push_back(model_prefill_seconds(bare, engine, p.features, dtype));
    }
  if (X.empty()) return;
  const std::vector<double> c = fit_nonneg(X, t, off);
  h.prefill.model_fixed = c[0], h.prefill.model_per_element = c[1];
  h.prefill.measured = true;
}

// Whether a sublayer step point stepped more than one sequence (its rows - 1 feature > 0).
bool batched_step(const CalibrationPoint& p) {
  const size_t at = first_row_features(p.kind);
  return at > 0 && p.features.size() > at && p.features[at] > 0;
}

// Decode steps: the one-row GEMM line, then each sublayer kind's rest with its GEMMs (and the
// Mamba mixer's fitted step) as a known offset: first on one-row steps, then (attention and MLP)
// each further row's rest on the batched steps, with the first row's as a known offset too.
void fit_decode_steps(HardwareProfile& h, const std::vector<CalibrationPoint>& points, double eb) {
  std::vector<std::vector<double>> X;
  std::vector<double> t;
  for (const auto& p : points)
    if (p.kind == "gemv") X.push_back(p.features), t.push_back(p.seconds);
  if (X.empty()) return;
  const std::vector<double> c = fit_nonneg(X, t);
  auto& d = h.decode;
  for (size_t k = 0; k < c.size(); ++k) d.*detail::kGemvLineTerms[k] = c[k];
  d.measured = d.batched = d.has_multirow = true;
  // The rest of `kind`'s one-row or batched steps, fitted on the features [first, first + count)
  // of each point; the other terms (the GEMMs, the Mamba mixer, the first row's rest of a batched
  // step) are a known offset.
  auto fit_rest = [&](const std::string& kind, bool batched, size_t first, size_t count) {
    const bool mamba = kind == "mamba_decode";
    std::vector<std::vector<double>> x;
    std::vector<double> y, off;
    for (const auto& p : points) {
      if (p.kind != kind || batched_step(p) != batched) continue;
      const auto at = p.features.begin() + long(first);
      x.push_back(mamba ? std::vector<double>{1.0} : std::vector<double>(at, at + long(count)));
      y.push_back(p.seconds);
      std::vector<double> known = mamba ? std::vector<double>{} : p.features;
      for (size_t i = first; i < first + count && i < known.size(); ++i) known[i] = 0;
      off.push_back(decode_step_seconds(h, p.kind, known, p.gemms, eb) +
                    (mamba ? mamba_mixer_seconds(h, true, p.features) : 0.0));
    }
    return x.empty() ? std::vector<double>{} : fit_nonneg(x, y, off);
  };
  const size_t na = first_row_features("attention_decode"), nm = first_row_features("mlp_decode");
  if (auto f = fit_rest("attention_decode", false, 0, na); !f.empty())
    d.attn_fixed = f[0], d.attn_per_kv = f[1], d.attn_per_q = f[2];
  if (auto f = fit_rest("mlp_decode", false, 0, nm); !f.empty()) d.mlp_fixed = f[0], d.mlp_per_ffn = f[1];
  if (auto f = fit_rest("moe_decode", false, 0, 2); !f.empty()) d.moe_fixed = f[0], d.moe_per_expert = f[1];
  if (auto f = fit_rest("mamba_decode", false, 0, 1); !f.empty()) d.mamba_fixed = f[0];
  const std::vector<double> a = fit_rest("attention_decode", true, na, na), m = fit_rest("mlp_decode", true, nm, nm);
  if (!a.empty() && !m.empty()) {
    d.attn_per_row = a[0], d.attn_per_row_kv = a[1], d.attn_per_row_q = a[2];
    d.mlp_per_row = m[0], d.mlp_per_row_ffn = m[1];
    d.has_row_rests = true;
  }
}

// A model_decode point's prediction: the engine's decode step of one sequence after
// kModelDecodePast cached tokens.
double model_decode_seconds(const HardwareProfile& hw, const EngineProfile& engine, const std::vector<double>& f,
                            const std::string& dtype) {
  return predict_prompt(model_decode_spec(f, dtype), hw, engine, kModelDecodePast, 1).tpot_s;
}

}  // namespace

// The cold model step's rest: each model_decode point's time = the engine's prediction without
// it + model_fixed + each sublayer's rest by kind + model_per_weight_byte x the weight bytes
// its GEMMs read (non-negative). A term's feature is what the formulas charge per unit of it,
// read off the prediction (linear in each term), so the fit and the formulas count alike.
void fit_model_decodes(HardwareProfile& h, const std::vector<CalibrationPoint>& points, const EngineProfile& engine,
                       const std::string& dtype) {
  if (!h.decode.measured) return;
  using D = HardwareProfile::DecodeStepCost;
  const std::vector<double D::*> terms = {&D::model_fixed, &D::model_per_layer, &D::model_per_moe_layer,
                                          &D::model_per_mamba_layer, &D::model_per_weight_byte};
  const std::vector<double> unit = {1e-3, 1e-4, 1e-4, 1e-4, 1e-10};  // seconds per step, per sublayer, per byte
  HardwareProfile bare = h;
  for (auto term : terms) bare.decode.*term = 0;
  std::vector<std::vector<double>> X;
  std::vector<double> t, off;
  for (const auto& p : points)
    if (p.kind == "model_decode") {
      off.push_back(model_decode_seconds(bare, engine, p.features, dtype));
      std::vector<double> row;
      for (size_t j = 0; j < terms.size(); ++j) {
        HardwareProfile one = bare;
        one.decode.*terms[j] = unit[j];
        row.push_back((model_decode_seconds(one, engine, p.features, dtype) - off.back()) / unit[j]);
      }
      X.push_back(row), t.push_back(p.seconds);
    }
  if (X.empty()) return;
  const std::vector<double> c = fit_nonneg(X, t, off);
  for (size_t j = 0; j < terms.size(); ++j) h.decode.*terms[j] = c[j];
  h.decode.has_model_fixed = h.decode.has_model_per_layer = h.decode.has_model_kinds = true;
}

namespace {

// ---- calibrate's steps: the measurements in order, then the fits ---------------------------

// What every measurement takes: the options, the device and dtypes, the clock.
struct Bench {
  const CalibrationOptions& o;
  torch::Device dev;
  torch::Dtype dt;
  double eb;  // bytes per element of dt
  torch::TensorOptions opt, opt32;
  Stopwatch clock;
  double pool_bytes;  // cold weights: each GEMM on another weight of a pool this large
};

void check_options(const CalibrationOptions& o) {
  if (o.device != "cpu" && o.device != "cuda") throw InputError("--device", o.device, "expected cpu or cuda");
  if (o.device == "cuda" && !torch::cuda::is_available())
    throw InputError("--device", "cuda", "no CUDA device is available to this LibTorch");
  if (o.dtype != "bfloat16" && o.dtype != "float32" && o.dtype != "float16")
    throw InputError("--dtype", o.dtype, "expected bfloat16, float16 or float32");
  if (!(o.memory_bytes > 0)) throw InputError("--memory-bytes", std::to_string(o.memory_bytes), "must be positive");
  if (o.threads < 0) throw InputError("--threads", std::to_string(o.threads), "must not be negative");
}

// GEMMs: decode-like (few rows, memory bound) to prefill-like (many rows, compute bound), as a
// model runs them (weight_pool / time_linear: cold `x W^T`): square weights, and the narrow and
// rectangular ones of small models' experts, Mamba projections and MLPs (32-512 rows: a prefill's
// tokens, an expert's share of them). Shape "rows x in x out"; features: the GEMM line's
// {1, weight bytes, FLOPs} (HardwareProfile::GemmLine).
void measure_gemms(const Bench& b, std::vector<CalibrationPoint>& points) {
  const CalibrationOptions& o = b.o;
  const std::vector<int64_t> rows = o.quick ? std::vector<int64_t>{1, 16, 64, 512} : std::vector<int64_t>{1, 16, 128, 512, 2048};
  const std::vector<int64_t> widths = o.quick ? std::vector<int64_t>{512, 1024} : std::vector<int64_t>{512, 1024, 2048};
  // {in, out} of the rectangular weights, each at these rows
  using Shapes = std::vector<std::array<int64_t, 2>>;
  const Shapes rect =
      o.quick ? Shapes{{256, 128}, {256, 768}} : Shapes{{256, 128}, {128, 512}, {256, 768}, {384, 1536}};
  const std::vector<int64_t> rect_rows = o.quick ? std::vector<int64_t>{32, 128} : std::vector<int64_t>{32, 128, 512};
  auto measure = [&](int64_t in, int64_t out, const std::vector<int64_t>& at) {
    const std::vector<torch::Tensor> pool = weight_pool(out, in, b.opt, b.pool_bytes);
    for (int64_t m : at) {
      const double s = time_linear(torch::randn({m, in}, b.opt), pool, o.min_seconds, b.clock);
      const double flops = 2.0 * double(m * in * out);
      add_point(points, "gemm", std::to_string(m) + "x" + std::to_string(in) + "x" + std::to_string(out), flops,
                b.eb * double(m * in + in * out + m * out), s);
      points.back().rows = double(m);
      points.back().features = {1.0, b.eb * double(in * out), flops};
    }
  };
  for (int64_t n : widths) measure(n, n, rows);
  for (const auto& [in, out] : rect) measure(in, out, rect_rows);
}

// Causal attention by the model's own core (model::attention_core: the fused SDPA kernel on
// LibTorch >= 2.1, eager math before): the useful work is counted causally, so the fitted
// efficiency absorbs the masked half.
void measure_attention(const Bench& b, std::vector<CalibrationPoint>& points) {
  // {heads, head dim, tokens}: 128-2048 tokens, head dim 32-128 (FLOPs and score elements apart)
  const std::vector<std::array<int64_t, 3>> shapes =
      b.o.quick ? std::vector<std::array<int64_t, 3>>{{8, 64, 256}, {8, 64, 1024}, {16, 32, 512}, {4, 128, 1024}}
                : std::vector<std::array<int64_t, 3>>{{8, 64, 128},  {8, 64, 512},   {8, 64, 1024}, {8, 64, 2048},
                                                      {16, 32, 512}, {4, 128, 1024}, {2, 128, 2048}, {16, 32, 1536}};
  for (const auto& [H, D, S] : shapes) {
    auto q = torch::randn({1, H, S, D}, b.opt), k = torch::randn({1, H, S, D}, b.opt), v = torch::randn({1, H, S, D}, b.opt);
    const double s = time_it([&] { (void)model::attention_core(q, k, v); }, b.dev, b.o.min_seconds, b.clock);
    add_point(points, "attention", "H" + std::to_string(H) + " D" + std::to_string(D) + " S" + std::to_string(S),
              4.0 * H * D * S * (S + 1) / 2.0, b.eb * 4.0 * S * H * D, s);
    // the scores' fresh-page bytes (eager core; none for SDPA)
    points.back().features = {model::eager_attention() ? detail::eager_score_fresh_bytes(detail::Vec(1, double(H * S * S)), b.eb)[0] : 0.0};
  }
}

// Mamba-2 chunked scan (SSD) over one chunk length, float32, G = 1 group.
void measure_scan(const Bench& b, std::vector<CalibrationPoint>& points) {
  const auto& opt32 = b.opt32;
  for (int64_t Lq : b.o.quick ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{256, 1024, 4096}) {
    const int64_t H = 8, P = 64, N = 64, Q = 128, C = Lq / Q;
    auto x = torch::randn({C, Q, H, P}, opt32), B = torch::randn({C, Q, N}, opt32), Cm = torch::randn({C, Q, N}, opt32);
    auto dA = -torch::rand({C, Q, H}, opt32) * 0.1;
    auto causal = torch::ones({Q, Q}, opt32).tril().unsqueeze(-1);
    const double s = time_it(
        [&] {
          auto cum = dA.cumsum(1);                                              // [C,Q,H]
          auto decay = (cum.unsqueeze(2) - cum.unsqueeze(1)).exp() * causal;  // [C,Q,K,H]
          auto cb = torch::matmul(Cm, B.transpose(1, 2));                      // [C,Q,K]
          auto y = torch::einsum("cqk,cqkh,ckhp->cqhp", {cb, decay, x});
          auto st = torch::einsum("ckn,ckh,ckhp->chpn", {B, (cum.select(1, Q - 1).unsqueeze(1) - cum).exp(), x});
          auto states = st.cumsum(0);  // inter-chunk recurrence (decay folded)
          (void)(y + torch::einsum("cqn,chpn->cqhp", {Cm, states}));
        },
        b.dev, b.o.min_seconds, b.clock);
    const double per_tok = Q * (N + H * P) + 4.0 * H * P * N;
    add_point(points, "scan", "H8 P64 N64 Q128 L" + std::to_string(Lq), per_tok * Lq, 4.0 * Lq * (2 * N + 2 * H * P), s);
  }
}

// The model's own eager Mamba-2 mixer (model::Mamba2) as an operator microbenchmark at chosen
// sizes (one layer, no architecture): a prefill of L tokens into a fresh cache and a decode
// step from a filled cache, each minus its two projections timed alone on the same weights
// and inputs (those are GEMMs, predicted by the gemm fit). What is left is everything else the
// mixer runs (conv, SiLU, dt/A, the chunked SSD scan or its recurrent step on the layouts the
// mixer hands it, the gated norm, casts, copies, dispatch), fitted by HardwareProfile::
// MambaMixerCost. Sizes vary heads, head dim, state, groups (fewer than heads, as in
// Nemotron-H), chunk and length independently; one length is not a whole number of chunks.
void measure_mamba_mixers(const Bench& b, std::vector<CalibrationPoint>& points) {
  const CalibrationOptions& o = b.o;
  const auto& opt = b.opt;
  const auto& dev = b.dev;
  const auto& clock = b.clock;
  struct Size { int64_t h, H, P, N, G, Q, L; };
  const std::vector<Size> sizes =
      o.quick ? std::vector<Size>{{256, 4, 32, 16, 1, 64, 128}, {512, 8, 64, 64, 2, 128, 512},
                                  {256, 16, 32, 32, 4, 32, 200}, {384, 8, 32, 128, 4, 64, 128},
                                  {448, 12, 64, 16, 3, 64, 384}}
              : std::vector<Size>{{256, 4, 32, 16, 1, 64, 128},   {512, 8, 64, 64, 2, 128, 512},
                                  {256, 16, 32, 32, 4, 32, 200},  {384, 8, 32, 128, 4, 64, 128},
                                  {448, 12, 64, 16, 3, 64, 384},  {320, 6, 48, 48, 2, 128, 128},
                                  {640, 24, 32, 16, 6, 64, 512},  {256, 4, 96, 32, 2, 32, 512},
                                  {768, 16, 64, 64, 8, 64, 200},  {192, 2, 64, 128, 1, 128, 384},
                                  {384, 32, 16, 16, 8, 32, 128},  {320, 10, 32, 64, 5, 64, 640}};
  const int rounds = o.quick || o.passes > 1 ? 1 : 3;  // passes repeat it too
  std::vector<std::vector<double>> pre(sizes.size()), step(sizes.size());
  model::TpGroup tp{dist::make_self_communicator()};
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto& z = sizes[i];
      model::MambaSpec ms;
      ms.num_heads = int(z.H), ms.head_dim = int(z.P), ms.state_size = int(z.N), ms.n_groups = int(z.G);
      ms.chunk_size = int(z.Q);
      model::Mamba2 mixer(ms, z.h, 1e-5, tp, b.dt, "calibration");
      auto x = torch::randn({1, z.L, z.h}, opt), y = torch::randn({1, z.L, z.H * z.P}, opt);
      const auto& wi = mixer->in_proj->weight;
      const auto& wo = mixer->out_proj->weight;
      const double full = time_it(
          [&] {
            model::MambaCache c;
            (void)mixer->forward(x, &c);
          },
          dev, o.min_seconds, clock);
      const double proj = time_it([&] { (void)model::apply_linear(x, wi); }, dev, o.min_seconds, clock) +
                          time_it([&] { (void)model::apply_linear(y, wo); }, dev, o.min_seconds, clock);
      pre[i].push_back(full - proj);
      model::MambaCache c;
      (void)mixer->forward(x.narrow(1, 0, std::min<int64_t>(z.L, 32)), &c);
      auto x1 = torch::randn({1, 1, z.h}, opt), y1 = torch::randn({1, 1, z.H * z.P}, opt);
      const double full1 = time_it([&] { (void)mixer->forward(x1, &c); }, dev, o.min_seconds, clock);
      const double proj1 = time_it([&] { (void)model::apply_linear(x1, wi); }, dev, o.min_seconds, clock) +
                           time_it([&] { (void)model::apply_linear(y1, wo); }, dev, o.min_seconds, clock);
      step[i].push_back(full1 - proj1);
    }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto& z = sizes[i];
    char shape[112];
    std::snprintf(shape, sizeof shape, "mixer h%lld H%lld P%lld N%lld G%lld Q%lld", (long long)z.h, (long long)z.H,
                  (long long)z.P, (long long)z.N, (long long)z.G, (long long)z.Q);
    add_point(points, "mamba_prefill", std::string(shape) + " L" + std::to_string(z.L) + " minus projections", 0, 0,
              std::max(1e-7, median(pre[i])));
    points.back().features =
        mamba_prefill_features(1, double(z.L), double(z.H), double(z.P), double(z.N), double(z.G), double(z.Q));
    add_point(points, "mamba_step", std::string(shape) + " step minus projections", 0, 0, std::max(1e-7, median(step[i])));
    points.back().features = mamba_step_features(1, double(z.H), double(z.P), double(z.N));
  }
}

void measure_copies(const Bench& b, std::vector<CalibrationPoint>& points) {
  for (int64_t mb : b.o.quick ? std::vector<int64_t>{1, 16, 64} : std::vector<int64_t>{1, 4, 16, 64, 256}) {
    auto src = torch::empty({int64_t(mb * 1048576 / b.eb)}, b.opt).uniform_();
    auto dst = torch::empty_like(src);
    const double s = time_it([&] { dst.copy_(src); }, b.dev, b.o.min_seconds, b.clock);
    add_point(points, "memory", std::to_string(mb) + " MiB copy", 0, 2.0 * mb * 1048576, s);
  }
}

// Elementwise arithmetic in the model dtype (what norms, gates and activations run): an
// out-of-place product of two tensors, 3 x elements x bytes of traffic.
void measure_elementwise(const Bench& b, std::vector<CalibrationPoint>& points) {
  for (int64_t n : b.o.quick ? std::vector<int64_t>{65536, 1048576} : std::vector<int64_t>{65536, 262144, 1048576, 4194304}) {
    auto x = torch::randn({n}, b.opt), z = torch::randn({n}, b.opt);
    const double s = time_it([&] { (void)(x * z); }, b.dev, b.o.min_seconds, b.clock);
    add_point(points, "elementwise", std::to_string(n) + " x*y", 0, 3.0 * b.eb * double(n), s);
  }
}

// The MLP / expert activation as the model runs it between its GEMMs (model::mlp_activation on
// [tokens, ffn]): gated SwiGLU (its SiLU in fp32, cast back, times up) and plain squared ReLU,
// at 128-2048 tokens of 768-3072 features (L2-resident to several MiB). Features {elements, gated}.
void measure_activations(const Bench& b, std::vector<CalibrationPoint>& points) {
  const std::vector<std::pair<int64_t, int64_t>> sizes =
      b.o.quick ? std::vector<std::pair<int64_t, int64_t>>{{128, 768}, {1024, 2048}}
                : std::vector<std::pair<int64_t, int64_t>>{{128, 768}, {512, 1536}, {1024, 2048}, {2048, 3072}};
  for (const bool gated : {true, false})
    for (const auto& [n, f] : sizes) {
      auto up = torch::randn({n, f}, b.opt), gate = gated ? torch::randn({n, f}, b.opt) : torch::Tensor();
      const auto act = gated ? model::MlpActivation::SwiGLU : model::MlpActivation::ReLU2;
      const double s = time_it([&] { (void)model::mlp_activation(gate, up, act); }, b.dev, b.o.min_seconds, b.clock);
      add_point(points, "activation", std::string(gated ? "swiglu " : "relu2 ") + std::to_string(n) + "x" + std::to_string(f),
                0, (gated ? 3.0 : 2.0) * b.eb * double(n * f), s);
      points.back().features = {double(n * f), gated ? 1.0 : 0.0};
    }
}

// Dispatch: the fixed cost of one framework operator on small tensors (the per-operator
// overhead of eager execution: dispatch, stride handling, allocation), measured on a mix
// shaped like one token through an eager norm + attention step (4-D views, casts, a cache
// append, batched products, softmax, a copying reshape): its time / the 16 operators that
// compute or copy (views are not counted, as in an engine's extra_ops).
void measure_dispatch(const Bench& b, std::vector<CalibrationPoint>& points) {
  const auto& opt = b.opt;
  auto x = torch::randn({1, 1, 256}, opt), w = torch::randn({256}, opt), kc = torch::randn({1, 4, 16, 64}, opt);
  constexpr int kOps = 16;
  const double s = time_it(
      [&] {
        auto h = x.to(torch::kFloat32);
        h = h * torch::rsqrt(h.pow(2).mean(-1, true) + 1e-5);
        auto y = w * h.to(x.scalar_type());
        auto q = y.view({1, 1, 4, 64}).transpose(1, 2);
        auto c = torch::cat({kc, q}, 2);
        auto sc = torch::matmul(q, c.transpose(2, 3)) * 0.125;
        auto pr = torch::softmax(sc, -1, torch::kFloat32).to(x.scalar_type());
        auto o = torch::matmul(pr, c).transpose(1, 2).reshape({1, 1, 256});
        (void)(x + o);
      },
      b.dev, b.o.min_seconds, b.clock);
  add_point(points, "dispatch", std::to_string(kOps) + " small ops (norm + 1-token attention step, eager)", 0, 0, s / kOps);
}

// The profile's description: id, name, where it was calibrated, memory.
void describe_profile(HardwareProfile& h, const CalibrationOptions& o) {
  h.id = o.id;
  h.name = o.name.empty() ? std::string(o.device == "cuda" ? "local CUDA device" : "local CPU") + " (" + o.dtype +
                                ", " + std::to_string(torch::get_num_threads()) + " threads)"
                          : o.name;
  h.source = "autocompress cost calibrate";
  if (o.device != "cuda") {
    h.threads = torch::get_num_threads();
    const dist::CpuFeatures& cpu = dist::detect_cpu();
    h.calibrated_on.cpu_model = cpu.model;
    h.calibrated_on.isa = cpu.isa();
    h.calibrated_on.dtype = o.dtype;
    h.calibrated_on.kernels = model::kernels_version();
  }
  h.memory_bytes = o.memory_bytes;
  h.usable_fraction = o.usable_fraction;
}

// GEMM: peak and fixed cost from compute-bound points with many rows (the memory curve
// explains memory-bound ones); then the rows penalty from GEMMs with few rows.
void fit_gemm(HardwareProfile& h, const std::vector<CalibrationPoint>& points, double overhead) {
  constexpr double kManyRows = 128;
  std::vector<double> w, t;
  for (const auto& p : points)
    if (p.kind == "gemm" && p.rows >= kManyRows && p.seconds > 1.5 * (p.bytes + h.memory.half) / h.memory_bandwidth)
      w.push_back(p.flops), t.push_back(p.seconds);
  if (w.size() < 2)
    for (const auto& p : points)
      if (p.kind == "gemm") w.push_back(p.flops), t.push_back(p.seconds);
  const auto [a, c] = fit_linear(w, t);
  h.peak_flops = 1.0 / a;
  h.gemm = {1.0, std::max(0.0, c - overhead) / a};
  // t = (flops (1 + r / rows) + half) / peak + overhead for a compute-bound GEMM with few
  // rows: r from each such point, the median kept (0 when few-row GEMMs are not slower).
  std::vector<double> rs;
  for (const auto& p : points)
    if (p.kind == "gemm" && p.rows > 0 && p.rows < kManyRows &&
        p.seconds > 1.5 * (p.bytes + h.memory.half) / h.memory_bandwidth)
      rs.push_back(std::max(0.0, p.rows * (((p.seconds - overhead) * h.peak_flops - h.gemm.half) / p.flops - 1.0)));
  if (!rs.empty()) {
    std::sort(rs.begin(), rs.end());
    h.gemm_rows_half = rs[rs.size() / 2];
  }
}

// Attention: t = flops / (peak x max) + fresh_bytes_s x fresh-page bytes of the scores + c
// (non-negative, relative least squares); shapes below and above the fresh-page size. Without
// a fresh-page term (a fused kernel: no scores) this is the line on FLOPs alone.
void fit_attention(HardwareProfile& h, const std::vector<CalibrationPoint>& points, double overhead) {
  std::vector<std::vector<double>> X;
  std::vector<double> t;
  for (const auto& p : points)
    if (p.kind == "attention") X.push_back({p.flops, p.features.empty() ? 0.0 : p.features[0], 1.0}), t.push_back(p.seconds);
  const std::vector<double> c = fit_nonneg(X, t);
  if (c[0] > 0) {
    h.attention = {std::min(1.0, 1.0 / (c[0] * h.peak_flops)), std::max(0.0, c[2] - overhead) / c[0]};
    h.fresh_bytes_s = c[1];
    return;
  }
  std::vector<double> w;
  for (const auto& x : X) w.push_back(x[0]);
  const auto [a, b] = fit_linear(w, t);
  h.attention = {std::min(1.0, 1.0 / (a * h.peak_flops)), std::max(0.0, b - overhead) / a};
  h.fresh_bytes_s = 0;
}

// The straight lines of the roofline: memory, GEMM, elementwise, attention and scan. Each
// curve's intercept keeps what is left of its fitted fixed cost after the per-operator
// overhead (half = (c - overhead) / a, never negative).
void fit_roofline(HardwareProfile& h, const std::vector<CalibrationPoint>& points, double overhead) {
  auto fit = [&](const std::string& kind, bool by_bytes) {
    std::vector<double> w, t;
    for (const auto& p : points)
      if (p.kind == kind) w.push_back(by_bytes ? p.bytes : p.flops), t.push_back(p.seconds);
    return fit_linear(w, t);
  };
  const auto [am, cm] = fit("memory", true);
  h.memory_bandwidth = 1.0 / am;
  h.memory = {1.0, std::max(0.0, cm - overhead) / am};
  fit_gemm(h, points, overhead);
  {
    const auto [a, c] = fit("elementwise", true);
    h.elementwise = {std::min(1.0, 1.0 / (a * h.memory_bandwidth)), std::max(0.0, c - overhead) / a};
  }
  {
    const auto [a, c] = fit("scan", false);
    h.scan = {std::min(1.0, 1.0 / (a * h.peak_flops)), std::max(0.0, c - overhead) / a};
  }
  fit_attention(h, points, overhead);
}

// The GEMM line (HardwareProfile::GemmLine), CPU profiles: fixed + per weight byte + per FLOP
// on the GEMMs of more than 16 rows (the BLAS path of apply_linear in every dtype; fp32 runs
// 2-16 rows through small_linear and one row through a matrix-vector product).
void fit_gemm_line(HardwareProfile& h, const std::vector<CalibrationPoint>& points) {
  std::vector<std::vector<double>> X;
  std::vector<double> t;
  for (const auto& p : points)
    if (p.kind == "gemm" && p.rows > 16 && p.features.size() == 3) X.push_back(p.features), t.push_back(p.seconds);
  if (X.size() < 3) return;
  const std::vector<double> c = fit_nonneg(X, t);
  if (!(c[1] + c[2] > 0)) return;
  h.gemm_line = {true, c[0], c[1], c[2]};
}

void fit_mamba_mixers(HardwareProfile& h, const std::vector<CalibrationPoint>& points) {
  for (const char* kind : {"mamba_prefill", "mamba_step"}) {
    std::vector<std::vector<double>> X;
    std::vector<double> t;
    for (const auto& p : points)
      if (p.kind == kind) X.push_back(p.features), t.push_back(p.seconds);
    if (X.empty()) continue;
    const std::vector<double> c = fit_nonneg(X, t);
    if (std::string(kind) == "mamba_prefill")
      h.mamba.per_flop = c[0], h.mamba.per_quad = c[1], h.mamba.per_lin = c[2], h.mamba.fixed = c[3];
    else
      h.mamba.step_per_state = c[0], h.mamba.step_per_lin = c[1], h.mamba.step_fixed = c[2];
    h.mamba.measured = true;
  }
}

// An activation point's operators (gated: cast, SiLU, cast, product; plain: ReLU, square), each
// at the per-operator overhead.
double activation_dispatch(const HardwareProfile& h, bool gated) { return (gated ? 4.0 : 2.0) * h.kernel_overhead_s; }

// The activation costs (HardwareProfile::ActivationCost): per kind, the slope of the line
// through its points' times over their elements (fit_linear: relative least squares); its
// intercept is the operators' dispatch, which the engine's extra_ops charge.
void fit_activations(HardwareProfile& h, const std::vector<CalibrationPoint>& points) {
  for (const bool gated : {true, false}) {
    std::vector<double> x, t;
    for (const auto& p : points)
      if (p.kind == "activation" && (p.features.at(1) > 0) == gated) x.push_back(p.features[0]), t.push_back(p.seconds);
    if (x.size() >= 2) (gated ? h.activation.gated_element_s : h.activation.plain_element_s) = fit_linear(x, t).first;
  }
}

// An activation point's time by the profile: its elements at the fitted rate and its dispatch.
double activation_seconds(const HardwareProfile& h, const std::vector<double>& f) {
  const bool gated = f.at(1) > 0;
  return f.at(0) * (gated ? h.activation.gated_element_s : h.activation.plain_element_s) + activation_dispatch(h, gated);
}

// Each point's time by the fitted profile; the mean absolute percentage error.
double score_points(const HardwareProfile& h, const EngineProfile& engine, std::vector<CalibrationPoint>& points,
                    const std::string& dtype, double eb) {
  double err = 0;
  for (auto& p : points) {
    p.predicted_s = p.kind == "model_prefill"   ? model_prefill_seconds(h, engine, p.features, dtype)
                    : p.kind == "model_decode" ? model_decode_seconds(h, engine, p.features, dtype)
                    : p.kind == "gemm" && h.gemm_line.measured && p.features.size() == 3
                        ? h.gemm_line.seconds(p.features[2], p.features[1], p.features[0])
                    : p.kind == "activation" ? activation_seconds(h, p.features)
                    : p.kind == "mamba_prefill" || p.kind == "mamba_step"
                        ? mamba_mixer_seconds(h, p.kind == "mamba_step", p.features)
                    : p.kind == "gemv" || (p.kind.size() > 7 && p.kind.compare(p.kind.size() - 7, 7, "_decode") == 0)
                        ? decode_step_seconds(h, p.kind, p.features, p.gemms, eb)
                        : roofline_seconds(h, p.kind, p.flops, p.bytes, p.rows) +
                              (p.kind == "attention" ? h.fresh_bytes_s * p.features.at(0) : 0.0);
    err += std::fabs(p.predicted_s - p.seconds) / p.seconds;
  }
  return err / double(points.size());
}

}  // namespace

model::ArchSpec model_decode_spec(const std::vector<double>& f, const std::string& dtype) {
  return block_spec(int64_t(f.at(0)), int64_t(f.at(1)), int64_t(f.at(2)), int(f.at(3)), dtype,
                    BlockFamily(int(f.at(4))));
}

void evict_cpu_caches() {
  static torch::Tensor buffer = [] {
    int64_t llc = 0;
    for (int index = 3; index >= 2 && llc == 0; --index) {
      std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
      std::string v;
      if (f >> v && !v.empty()) llc = std::atoll(v.c_str()) * (v.back() == 'M' ? 1 << 20 : v.back() == 'K' ? 1 << 10 : 1);
    }
    const int64_t bytes = std::max<int64_t>(int64_t(64) << 20, 2 * llc);
    return torch::zeros({bytes / 4}, torch::kFloat32);
  }();
  torch::NoGradGuard no_grad;
  buffer.add_(1.0f);
}

std::vector<CalibrationPoint> fastest_pass(const std::vector<std::vector<CalibrationPoint>>& passes) {
  if (passes.empty()) return {};
  std::vector<CalibrationPoint> out = passes[0];
  for (size_t k = 1; k < passes.size(); ++k) {
    if (passes[k].size() != out.size()) throw std::invalid_argument("calibration passes measured different points");
    for (size_t i = 0; i < out.size(); ++i) {
      if (passes[k][i].kind != out[i].kind || passes[k][i].shape != out[i].shape)
        throw std::invalid_argument("calibration pass " + std::to_string(k) + " point " + std::to_string(i) + " is " +
                                    passes[k][i].kind + " " + passes[k][i].shape + ", not " + out[i].kind + " " + out[i].shape);
      out[i].seconds = std::min(out[i].seconds, passes[k][i].seconds);
      out[i].window_s.insert(out[i].window_s.end(), passes[k][i].window_s.begin(), passes[k][i].window_s.end());
    }
  }
  return out;
}

namespace {
void add_phase_seconds(std::vector<std::pair<std::string, double>>& phases, const std::string& group, double seconds) {
  for (auto& [name, total] : phases)
    if (name == group) {
      total += seconds;
      return;
    }
  phases.emplace_back(group, seconds);
}
}  // namespace

CalibrationResult calibrate(const CalibrationOptions& o) {
  check_options(o);
  const dist::ScopedComputeThreads threads(o.threads);  // the caller's count back afterwards
  const Stopwatch clock = Stopwatch::for_device(o.device);
  torch::NoGradGuard no_grad;
  const torch::Device dev(o.device == "cuda" ? torch::kCUDA : torch::kCPU);
  const torch::Dtype dt = checkpoint::parse_dtype(o.dtype);
  const int passes = o.quick ? 1 : std::max(1, o.passes);
  CalibrationOptions po = o;
  po.min_seconds = o.min_seconds / passes;
  const Bench b{po, dev, dt, o.dtype == "float32" ? 4.0 : 2.0, torch::TensorOptions().dtype(dt).device(dev),
                torch::TensorOptions().dtype(torch::kFloat32).device(dev), clock,
                o.quick ? kQuickGemmPoolBytes : kGemmPoolBytes};
  torch::manual_seed(0);
  CalibrationResult r;
  r.clock = clock.name();
  // ---- measurements: whole passes, so the passes of one point are tens of seconds apart
  // The whole-model decode points are timed in windows between the groups of measurements
  // (six a pass; three, at its start, middle and end, in a quick calibration).
  std::vector<std::vector<CalibrationPoint>> runs(static_cast<size_t>(passes));
  auto timed = [&r](const char* group, const auto& measure) {
    const auto t0 = std::chrono::steady_clock::now();
    measure();
    add_phase_seconds(r.phase_s, group, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  std::optional<ModelStepWindows> model_steps;
  if (o.device == "cpu") timed("model windows", [&] { model_steps.emplace(po); });
  auto model_step_window = [&] {
    if (model_steps) timed("model windows", [&] { model_steps->window(clock); });
  };
  for (auto& pts : runs) {
    model_step_window();
    timed("gemms", [&] { measure_gemms(b, pts); });
    if (!o.quick) model_step_window();
    timed("attention + scan", [&] {
      measure_attention(b, pts);
      measure_scan(b, pts);
    });
    if (!o.quick) model_step_window();
    if (o.device == "cpu") timed("mamba mixers", [&] { measure_mamba_mixers(b, pts); });
    model_step_window();
    if (o.device == "cpu")
      timed("decode sublayer steps", [&] { measure_decode_steps(po, b.opt, dt, b.eb, b.pool_bytes, clock, pts); });
    if (!o.quick) model_step_window();
    if (o.device == "cpu") timed("model prefills", [&] { measure_model_prefills(po, clock, pts); });
    model_step_window();
    if (model_steps) model_steps->add_points(pts);
    timed("copies + elementwise + dispatch", [&] {
      measure_copies(b, pts);
      measure_elementwise(b, pts);
      if (o.device == "cpu") measure_activations(b, pts);
      measure_dispatch(b, pts);
    });
  }
  r.points = fastest_pass(runs);
  // ---- fits
  // Per-operator overhead: the fastest tiny op mix, taken out of every curve's intercept.
  double overhead = 0;
  for (const auto& p : r.points)
    if (p.kind == "dispatch") overhead = p.seconds;
  HardwareProfile& h = r.profile;
  describe_profile(h, o);
  h.kernel_overhead_s = overhead;
  fit_roofline(h, r.points, overhead);
  if (o.device == "cpu") fit_gemm_line(h, r.points);
  fit_mamba_mixers(h, r.points);
  fit_activations(h, r.points);
  fit_decode_steps(h, r.points, b.eb);
  // Last: the whole-model steps' and prefills' rests are what the fitted profile above leaves over.
  const EngineProfile engine = load_engine(kPrefillEngine, o.configs_dir.empty() ? default_configs_dir() : o.configs_dir);
  fit_model_decodes(h, r.points, engine, o.dtype);
  fit_model_prefills(h, r.points, engine, o.dtype);
  r.mape = score_points(h, engine, r.points, o.dtype, b.eb);
  return r;
}

json CalibrationResult::to_json() const {
  json j = hardware_to_json(profile);
  json m = json::array();
  for (const auto& p : points) {
    json q = {{"kind", p.kind}, {"shape", p.shape}, {"flops", p.flops}, {"bytes", p.bytes}, {"seconds", p.seconds},
              {"predicted_s", p.predicted_s}};
    if (!p.features.empty()) q["features"] = p.features;
    if (!p.window_s.empty()) q["window_s"] = p.window_s;
    m.push_back(q);
  }
  json phases = json::object();
  for (const auto& [group, seconds] : phase_s) phases[group] = seconds;
  j["measurements"] = {{"mape", mape}, {"clock", clock}, {"points", m}, {"phase_s", phases}};
  return j;
}

struct SpeedReference::State {
  std::map<std::string, double> calibrated_s;  // the profile's points
  torch::TensorOptions opt;
  std::vector<torch::Tensor> pool;  // the GEMM probes' weights
  std::string decode_point, prefill_point;  // the reference's model_decode / model_prefill points
  std::optional<ColdStep> step;     // the reference model, its decode step and its prompt
  torch::Tensor prompt;
  double calibrated(const std::string& point) const {
    const auto it = calibrated_s.find(point);
    return it == calibrated_s.end() || !(it->second > 0) ? 0.0 : it->second;
  }
};

SpeedReference::SpeedReference(const HardwareProfile& hw, const std::string& dtype) : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.calibrated_s = hw.calibration_seconds;
  s.opt = torch::TensorOptions().dtype(checkpoint::parse_dtype(dtype));
  torch::NoGradGuard no_grad;
  // The smallest model of the whole-model points, in the quick calibration and the full one.
  const auto [h, ffn, V] = model_sizes(true).front();
  constexpr int64_t kPrompt = 128;
  s.decode_point = "model_decode " + model_decode_shape(h, ffn, V);
  s.prefill_point = "model_prefill " + model_prefill_shape(1, h, ffn, V, kPrompt);
  if (s.calibrated(s.decode_point) > 0 || s.calibrated(s.prefill_point) > 0) {
    s.step.emplace(block_model(block_spec(h, ffn, V, 1, dtype)), V);
    s.prompt = torch::randint(0, V, {1, kPrompt}, torch::kLong);
  }
}

std::vector<SpeedProbe> SpeedReference::probe(double gemm_seconds) {
  State& s = *state_;
  std::vector<SpeedProbe> out;
  const int64_t n = 1024;
  const Stopwatch clock = Stopwatch::for_device("cpu");
  torch::NoGradGuard no_grad;
  for (int64_t m : {512, 16, 1}) {
    const std::string point = "gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(n);
    if (s.calibrated(point) == 0) continue;
    if (s.pool.empty()) s.pool = weight_pool(n, n, s.opt, kGemmPoolBytes);
    out.push_back({point, s.calibrated(point), time_linear(torch::randn({m, n}, s.opt), s.pool, gemm_seconds, clock)});
  }
  if (s.calibrated(s.decode_point) > 0)
    out.push_back({s.decode_point, s.calibrated(s.decode_point), s.step->time(kDecodeCalls, clock)});
  if (s.calibrated(s.prefill_point) > 0)
    out.push_back({s.prefill_point, s.calibrated(s.prefill_point),
                   time_cold_prefill(s.step->m, s.prompt, kPrefillCalls, clock, kPrefillWarmup)});
  return out;
}

std::vector<SpeedProbe> probe_speed(const HardwareProfile& hw, const std::string& dtype, double gemm_seconds) {
  return SpeedReference(hw, dtype).probe(gemm_seconds);
}

}  // namespace ac::search

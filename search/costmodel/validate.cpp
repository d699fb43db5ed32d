// `autocompress cost validate`: predicted vs measured on this machine (docs/costmodel.md).
#include "search/costmodel/validate.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "checkpoint/convert.h"
#include "dist/device.h"
#include "dist/omp_env.h"
#include "dist/tensor_memory.h"
#include "model/model.h"
#include "search/costmodel/calibrate.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/local_profile.h"

namespace ac::search {


namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

model::ArchSpec base_spec(int64_t hidden) {
  model::ArchSpec s;
  s.hidden_size = hidden;
  s.vocab_size = 4096;
  s.max_position_embeddings = 4096;
  s.dtype = "bfloat16";
  return s;
}
model::AttentionSpec attn(int h, int kv, int d) {
  model::AttentionSpec a;
  a.num_heads = h, a.num_kv_heads = kv, a.head_dim = d;
  return a;
}
model::MambaSpec mamba(int h, int p, int n, int g, int chunk = 64) {
  model::MambaSpec m;
  m.num_heads = h, m.head_dim = p, m.state_size = n, m.n_groups = g, m.chunk_size = chunk;
  return m;
}
model::MlpSpec mlp(int64_t f, model::MlpActivation a) {
  model::MlpSpec m;
  m.ffn_size = f, m.activation = a;
  return m;
}
model::MoeSpec moe(int e, int k, int64_t f, int64_t shared, int64_t latent) {
  model::MoeSpec m;
  m.num_experts = e, m.top_k = k, m.expert_ffn = f, m.shared_ffn = shared, m.latent_size = latent;
  m.router = model::RouterKind::SigmoidBias, m.activation = model::MlpActivation::ReLU2, m.routed_scaling = 2.0;
  return m;
}
}  // namespace

std::vector<ValidationCase> validation_architectures() {
  using model::LayerSpec;
  using model::MlpActivation;
  std::vector<ValidationCase> out;
  auto dense = [&](const std::string& name, int64_t h, int layers, int heads, int kv, int64_t ffn) {
    model::ArchSpec s = base_spec(h);
    s.family = model::ModelFamily::Llama;
    for (int i = 0; i < layers; ++i) {
      LayerSpec l;
      l.attention = attn(heads, kv, int(h / heads));
      l.mlp = mlp(ffn, MlpActivation::SwiGLU);
      s.layers.push_back(l);
    }
    s.name = name;
    out.push_back({name, s});
  };
  dense("dense-256-4L", 256, 4, 4, 2, 768);
  dense("dense-384-4L", 384, 4, 6, 2, 1024);
  dense("dense-512-3L", 512, 3, 8, 8, 1536);
  dense("dense-512-6L-mqa", 512, 6, 8, 1, 1024);
  dense("dense-256-8L", 256, 8, 4, 4, 512);
  dense("dense-512-2L-wide", 512, 2, 8, 4, 3072);
  auto hybrid = [&](const std::string& name, int64_t h, const std::string& pattern, model::MambaSpec m,
                    model::AttentionSpec a, int64_t ffn, model::MoeSpec e) {
    model::ArchSpec s = base_spec(h);
    s.family = model::ModelFamily::NemotronH;
    for (char c : pattern) {
      LayerSpec l;
      if (c == 'M') l.mamba = m;
      if (c == '*') l.attention = a;
      if (c == '-') l.mlp = mlp(ffn, MlpActivation::ReLU2);
      if (c == 'E') l.moe = e;
      s.layers.push_back(l);
    }
    s.name = name;
    out.push_back({name, s});
  };
  const auto e0 = moe(8, 2, 128, 256, 0);
  hybrid("hybrid-M*M-", 256, "M*M-", mamba(8, 32, 16, 2), attn(4, 2, 64), 1024, e0);
  hybrid("hybrid-M-M-M*-", 256, "M-M-M*-", mamba(8, 32, 32, 1), attn(4, 1, 64), 768, e0);
  hybrid("hybrid-384-MM*-", 384, "MM*-", mamba(12, 32, 64, 4), attn(6, 2, 64), 1536, e0);
  hybrid("hybrid-512-M*-", 512, "M*--", mamba(16, 64, 16, 8, 128), attn(8, 2, 64), 2048, e0);
  hybrid("hybrid-N128", 256, "M-*-", mamba(4, 64, 128, 1), attn(4, 4, 64), 512, e0);
  hybrid("mamba-only", 384, "M-M-", mamba(12, 64, 32, 2), attn(4, 4, 64), 1024, e0);
  hybrid("moe-ME*E", 256, "ME*E", mamba(8, 32, 16, 2), attn(4, 2, 64), 512, moe(8, 2, 256, 256, 0));
  hybrid("moe-16x1", 256, "E*E*", mamba(8, 32, 16, 2), attn(4, 2, 64), 512, moe(16, 1, 512, 0, 0));
  hybrid("moe-latent", 384, "MEM*E", mamba(12, 32, 32, 4), attn(6, 2, 64), 512, moe(16, 4, 256, 384, 128));
  hybrid("moe-32x4", 256, "M*EE", mamba(8, 32, 16, 2), attn(4, 2, 64), 512, moe(32, 4, 128, 256, 0));
  hybrid("moe-8x8-dense", 512, "*E*E", mamba(8, 32, 16, 2), attn(8, 4, 64), 512, moe(8, 8, 256, 512, 0));
  hybrid("moe-latent-wide", 512, "ME*EME", mamba(16, 32, 64, 8), attn(8, 2, 64), 512, moe(32, 6, 192, 1024, 256));
  // Heterogeneous students: per-layer dimensions differ, some layers removed.
  auto hetero = [&](const std::string& name, int64_t h, const std::vector<LayerSpec>& layers) {
    model::ArchSpec s = base_spec(h);
    s.layers = layers;
    s.name = name;
    out.push_back({name, s});
  };
  auto L = [](std::optional<model::AttentionSpec> a, std::optional<model::MambaSpec> m, std::optional<model::MlpSpec> f,
              std::optional<model::MoeSpec> e) {
    LayerSpec l;
    l.attention = a, l.mamba = m, l.mlp = f, l.moe = e;
    return l;
  };
  const auto sw = MlpActivation::SwiGLU, r2 = MlpActivation::ReLU2;
  hetero("hetero-dense-ffn", 384, {L(attn(6, 2, 64), {}, mlp(1536, sw), {}), L(attn(6, 2, 64), {}, mlp(512, sw), {}),
                                   L(attn(3, 1, 64), {}, mlp(1024, sw), {}), L(attn(6, 6, 64), {}, mlp(256, sw), {})});
  hetero("hetero-dense-skip", 256, {L(attn(4, 2, 64), {}, mlp(1024, sw), {}), L({}, {}, mlp(768, sw), {}),
                                    L(attn(4, 2, 64), {}, {}, {}), LayerSpec{}, L(attn(2, 1, 64), {}, mlp(256, sw), {})});
  hetero("hetero-hybrid-heads", 256, {L({}, mamba(8, 32, 16, 2), {}, {}), L({}, {}, mlp(1024, r2), {}),
                                      L({}, mamba(4, 32, 16, 2), {}, {}), L(attn(4, 1, 64), {}, {}, {}),
                                      L({}, mamba(6, 32, 16, 2), {}, {}), L({}, {}, mlp(384, r2), {})});
  hetero("hetero-moe-experts", 256, {L({}, mamba(8, 32, 16, 2), {}, {}), L({}, {}, {}, moe(16, 2, 128, 256, 0)),
                                     L(attn(4, 2, 64), {}, {}, {}), L({}, {}, {}, moe(4, 2, 128, 256, 0)),
                                     L({}, {}, {}, moe(8, 1, 256, 0, 0))});
  hetero("hetero-mixed", 384, {L({}, mamba(12, 32, 32, 4), {}, {}), L({}, {}, {}, moe(16, 4, 256, 384, 128)),
                               L({}, mamba(8, 32, 32, 4), {}, {}), L(attn(6, 2, 64), {}, {}, {}), LayerSpec{},
                               L({}, {}, mlp(768, r2), {})});
  hetero("hetero-deep-thin", 256, {L({}, mamba(4, 32, 16, 1), {}, {}), L({}, {}, mlp(256, r2), {}),
                                   L({}, mamba(4, 32, 16, 1), {}, {}), L({}, {}, mlp(256, r2), {}),
                                   L(attn(2, 1, 64), {}, {}, {}), L({}, {}, mlp(256, r2), {}),
                                   L({}, mamba(4, 32, 16, 1), {}, {}), L({}, {}, mlp(256, r2), {})});
  for (auto& c : out) model::validate(c.spec, c.name);
  return out;
}

ValidationCase validation_case_from_file(const std::string& path) {
  model::ArchSpec spec = model::load_arch(path);
  // Named by the file: a run's search/arch.json is "search", a model's .../NAME/config.json
  // "NAME" (a config.json's own name is its class, e.g. LlamaForCausalLM).
  const std::filesystem::path f(path);
  std::string name = f.stem().string();
  if ((name == "config" || name == "arch") && !f.parent_path().filename().empty()) name = f.parent_path().filename().string();
  spec.name = name;
  return {name, spec};
}

namespace {

std::string ttft_regime(int64_t prompt) { return "ttft p=" + std::to_string(prompt); }
std::string tpot_regime(int64_t batch) { return "tpot B=" + std::to_string(batch); }

// One quantity's timings, each with the sweep it was taken in. The measurement is the fastest
// window: the median of each sweep's samples (a typical time, not a lucky one), then the
// smallest of those. Sweeps are seconds to minutes apart; a VM whose co-tenants slow it down
// for seconds at a time (docs/costmodel.md, "Machine speed states": small-op decode steps 1.8x,
// streaming GEMVs 1.3x) slows whole sweeps, not single samples, and a median over all samples
// lands wherever the share of slow sweeps puts it. The calibration keeps its points the same way
// (calibrate.cpp, passes), so both describe the machine in its uninterfered state. (Most of
// what looked like slow spells was oneDNN's primitive cache thrashing after the first sweep:
// docs/costmodel.md, "The oneDNN primitive cache"; the launcher sizes it since.)
struct Series {
  std::vector<double> t;
  std::vector<int> sweep;
  void add(double v, int s) { t.push_back(v), sweep.push_back(s); }
  double fastest_window() const { return fastest().first; }
  // The fastest window's time and its sweep.
  std::pair<double, int> fastest() const {
    std::pair<double, int> best{0, -1};
    for (const auto& [k, m] : medians())
      if (best.second < 0 || m < best.first) best = {m, k};
    return best;
  }
  // Each sweep's median.
  std::map<int, double> medians() const {
    std::map<int, std::vector<double>> by;
    for (size_t i = 0; i < t.size(); ++i) by[sweep[i]].push_back(t[i]);
    std::map<int, double> out;
    for (const auto& [k, v] : by) out[k] = median(v);
    return out;
  }
};

// Per architecture, the base row's samples and each regime's over all sweeps.
struct Samples {
  Series prefill, prefill_wall, steps, steps_wall;
  std::map<std::string, Series> regime;
  double peak = 0;
};

// Times the forward passes of one model on one device: by the calibration's clock, the wall
// clock beside it; on CUDA every span starts and ends synchronized.
class Timer {
 public:
  Timer(const torch::Device& dev, const Stopwatch& clock) : dev_(dev), clock_(clock) {}
  void sync() const {
    if (dev_.is_cuda()) dist::cuda_synchronize(dev_.index());
  }
  // Every timed call starts with cold caches on a CPU (evict_cpu_caches).
  void cold() const {
    if (dev_.is_cpu()) evict_cpu_caches();
  }
  // A prefill of `ids` ([B, T]) into `cache` (fresh) and the last token's logits.
  std::pair<double, double> prefill(model::CausalLM& m, const torch::Tensor& ids, model::InferenceCache& cache) const {
    cache = model::InferenceCache{};
    cache = m->new_cache();
    sync();
    cold();
    const auto t0 = Clock::now();
    const double c0 = clock_.now();
    auto h = m->hidden_states(ids, &cache);
    const int64_t t = ids.size(1);
    (void)m->logits_local(h.slice(1, t - 1, t));
    sync();
    return {clock_.now() - c0, since(t0)};
  }
  // One decode step of `tokens` ([B, 1]) with `cache`.
  std::pair<double, double> step(model::CausalLM& m, const torch::Tensor& tokens, model::InferenceCache& cache) const {
    cold();
    const auto t0 = Clock::now();
    const double c0 = clock_.now();
    (void)m->forward(tokens, &cache);
    sync();
    return {clock_.now() - c0, since(t0)};
  }

 private:
  torch::Device dev_;
  const Stopwatch& clock_;
};

// The regimes beyond the base row, measured on a loaded model: prefills of other prompt
// lengths, and decode steps of B sequences after a batched prefill.
void measure_regimes(model::CausalLM& m, const model::ArchSpec& spec, const ValidationOptions& o, const Timer& timer,
                     const torch::Device& dev, int sweep, Samples& sm) {
  model::InferenceCache cache;
  for (int64_t p : o.prompts) {
    if (p == o.prompt_tokens) continue;
    const auto ids = torch::randint(0, spec.vocab_size, {1, p}, torch::kLong).to(dev);
    for (int rep = 0; rep <= o.repeats; ++rep) {  // rep 0 is a warm-up
      const double t = timer.prefill(m, ids, cache).first;
      if (rep > 0) sm.regime[ttft_regime(p)].add(t, sweep);
    }
  }
  for (int64_t b : o.concurrency) {
    if (b == 1) continue;
    const auto ids = torch::randint(0, spec.vocab_size, {b, o.prompt_tokens}, torch::kLong).to(dev);
    const auto tokens = torch::randint(0, spec.vocab_size, {o.decode_steps, b, 1}, torch::kLong).to(dev);
    (void)timer.prefill(m, ids, cache);
    for (int64_t s = 0; s < o.decode_steps; ++s) sm.regime[tpot_regime(b)].add(timer.step(m, tokens[s], cache).first, sweep);
  }
  cache = model::InferenceCache{};
}

// One architecture over one sweep: the base row (prefill repeats, decode steps, the memory
// peak in the first sweep), then the other regimes. The model is built in the first sweep and
// kept for the others (`holder`), as a server keeps its weights loaded.
void measure_case(const ValidationCase& c, const ValidationOptions& o, const Timer& timer, const torch::Device& dev,
                  int sweep, std::optional<model::CausalLM>& holder, Samples& sm) {
  const bool cuda = dev.is_cuda();
  auto live_bytes = [&] { return cuda ? dist::cuda_allocated_bytes(dev.index()) : tensor_memory::current(); };
  auto peak_bytes = [&] { return cuda ? dist::cuda_peak_allocated_bytes(dev.index()) : tensor_memory::peak(); };
  model::ArchSpec spec = c.spec;
  spec.dtype = o.dtype;
  timer.sync();
  const int64_t base = live_bytes();
  if (!holder) {
    model::ModelOptions mo;
    mo.dtype = checkpoint::parse_dtype(o.dtype);
    holder.emplace(spec, model::TpGroup{}, mo);
    (*holder)->init_weights(1234);  // on the host (the same values on any device), then moved
    (*holder)->to(dev);
    (*holder)->eval();
  }
  model::CausalLM& m = *holder;
  const auto ids = torch::randint(0, spec.vocab_size, {1, o.prompt_tokens}, torch::kLong).to(dev);
  const auto tokens = torch::randint(0, spec.vocab_size, {o.decode_steps, 1, 1}, torch::kLong).to(dev);
  // Serving starts here: the peak counts from the loaded model (weights) on, as a serving
  // engine's does; what initialisation needed temporarily is not part of it.
  timer.sync();
  if (cuda) dist::reset_cuda_peak(dev.index());
  else tensor_memory::reset_peak();
  {  // Untimed steps first: a server's model decodes without pause; this one sat idle while the
     // other architectures ran, and on a VM its first steps after that ran up to 1.7x slower
     // even from evicted caches (docs/costmodel.md, "Cold steps"). Its cache is gone before
     // the timed one exists (one cache at a time, as the memory peak assumes).
    model::InferenceCache scratch;
    (void)timer.prefill(m, ids, scratch);
    for (int64_t s = 0; s < o.decode_steps; ++s) (void)timer.step(m, tokens[s], scratch);
  }
  model::InferenceCache cache;
  for (int rep = 0; rep <= o.repeats; ++rep) {  // rep 0 is a warm-up
    const auto [cpu, wall] = timer.prefill(m, ids, cache);
    if (rep > 0) sm.prefill.add(cpu, sweep), sm.prefill_wall.add(wall, sweep);
  }
  for (int64_t s = 0; s < o.decode_steps; ++s) {
    const auto [cpu, wall] = timer.step(m, tokens[s], cache);
    sm.steps.add(cpu, sweep), sm.steps_wall.add(wall, sweep);
  }
  if (sweep == 0) sm.peak = double(peak_bytes() - base);
  cache = model::InferenceCache{};
  measure_regimes(m, spec, o, timer, dev, sweep, sm);
}

double ape(double predicted, double measured) { return std::fabs(predicted - measured) / measured; }

ErrorSummary summarize(const std::string& key, const std::vector<const RegimeRow*>& rows) {
  ErrorSummary e;
  e.key = key;
  for (const RegimeRow* r : rows) {
    const double rel = (r->predicted_s - r->measured_s) / r->measured_s;
    e.mape += std::fabs(rel), e.mean_signed += rel, ++e.rows;
  }
  if (e.rows > 0) e.mape /= e.rows, e.mean_signed /= e.rows;
  return e;
}

// Errors per regime (in the order first seen) and per layer kind.
void summarize_regimes(ValidationResult& r) {
  std::vector<std::string> regimes;
  for (const auto& x : r.regime_rows)
    if (std::find(regimes.begin(), regimes.end(), x.regime) == regimes.end()) regimes.push_back(x.regime);
  for (const auto& key : regimes) {
    std::vector<const RegimeRow*> rows;
    for (const auto& x : r.regime_rows)
      if (x.regime == key) rows.push_back(&x);
    r.by_regime.push_back(summarize(key, rows));
  }
  const std::pair<char, const char*> kinds[] = {{'*', "attention"}, {'-', "mlp"}, {'M', "mamba"}, {'E', "moe"}};
  for (const auto& [k, label] : kinds)
    for (const char* phase : {"ttft", "tpot"}) {
      std::vector<const RegimeRow*> rows;
      for (const auto& x : r.regime_rows)
        if (x.kinds.find(k) != std::string::npos && x.regime.rfind(phase, 0) == 0) rows.push_back(&x);
      if (!rows.empty()) r.by_kind.push_back(summarize(std::string(label) + " " + phase, rows));
    }
}

}  // namespace

std::vector<double> sweep_speed(const std::vector<std::vector<SpeedProbe>>& speed_by_sweep, const std::string& kind) {
  auto ratio_of = [&](const std::vector<SpeedProbe>& probes) {
    for (const SpeedProbe& q : probes)
      if (q.point.rfind(kind, 0) == 0 && q.calibrated_s > 0 && q.now_s > 0) return q.ratio();
    return 0.0;
  };
  std::vector<double> out;
  for (size_t k = 0; k + 1 < speed_by_sweep.size(); ++k) {
    const double before = ratio_of(speed_by_sweep[k]), after = ratio_of(speed_by_sweep[k + 1]);
    if (before <= 0 || after <= 0) return {};
    out.push_back(std::sqrt(before * after));
  }
  return out;
}

double speed_tracking(const std::vector<std::pair<std::vector<double>, std::vector<double>>>& phases) {
  auto variance = [](const std::vector<double>& x) {
    double mean = 0, sum = 0;
    for (double v : x) mean += v / double(x.size());
    for (double v : x) sum += (v - mean) * (v - mean);
    return sum / double(x.size());
  };
  double raw = 0, normalized = 0;
  for (const auto& [ratio, speed] : phases) {
    if (ratio.size() < 3 || speed.size() != ratio.size()) return -1;
    std::vector<double> a, b;
    for (size_t k = 0; k < ratio.size(); ++k) {
      if (ratio[k] <= 0 || speed[k] <= 0) return -1;
      a.push_back(std::log(ratio[k])), b.push_back(std::log(ratio[k] / speed[k]));
    }
    raw += variance(a), normalized += variance(b);
  }
  return phases.empty() || raw <= 0 ? -1 : std::sqrt(normalized / raw);
}

double speed_normalized_time(const std::map<int, double>& sweep_medians, const std::vector<double>& speed) {
  std::vector<double> at_speed;
  for (const auto& [k, m] : sweep_medians)
    if (k >= 0 && size_t(k) < speed.size()) at_speed.push_back(m / speed[size_t(k)]);
  return at_speed.empty() ? 0.0 : median(at_speed);
}

ValidationResult validate_cost_model(const HardwareProfile& hw, const EngineProfile& engine_in,
                                     const ValidationOptions& o, const std::vector<ValidationCase>& cases) {
  tensor_memory::install();
  torch::NoGradGuard no_grad;
  ValidationResult r;
  r.hardware = hw.id;
  r.engine = engine_in.id;
  r.options = o;
  const dist::ScopedComputeThreads threads(o.threads);
  r.threads = torch::get_num_threads();
  const torch::Device dev(o.device);
  const bool cuda = dev.is_cuda();
  const Stopwatch clock = Stopwatch::for_device(cuda ? "cuda" : "cpu");
  r.clock = clock.name();
  const Timer timer(dev, clock);
  torch::manual_seed(0);
  // Sweeps: every architecture is measured once per sweep, so a slow spell of the machine
  // falls on one sweep of every architecture instead of on all samples of one; each time is
  // the fastest sweep's median (Series). Memory is deterministic and taken in the first sweep.
  std::vector<Samples> samples(cases.size());
  std::vector<std::optional<model::CausalLM>> models(cases.size());
  if (!cuda) evict_cpu_caches();  // its buffer allocated now, not inside the first memory peak
  // The machine-speed reference (a CPU's speed on a shared machine; not on a GPU), probed
  // before every sweep and after the last, kept as the models are.
  std::optional<SpeedReference> reference;
  if (!cuda) reference.emplace(hw, o.dtype);
  const int sweeps = std::max(1, o.sweeps);
  for (int sweep = 0; sweep <= sweeps; ++sweep) {
    if (reference) r.speed_by_sweep.push_back(reference->probe());
    if (sweep < sweeps)
      for (size_t ci = 0; ci < cases.size(); ++ci) measure_case(cases[ci], o, timer, dev, sweep, models[ci], samples[ci]);
  }
  models.clear();
  reference.reset();
  if (!r.speed_by_sweep.empty()) r.speed_start = r.speed_by_sweep.front(), r.speed_end = r.speed_by_sweep.back();
  // Per regime and sweep: the sum of log(sweep median / predicted) over architectures, and their count.
  std::map<std::string, std::vector<std::pair<double, int>>> log_ratio;
  const std::vector<double> prefill_speed = sweep_speed(r.speed_by_sweep, "model_prefill");
  const std::vector<double> decode_speed = sweep_speed(r.speed_by_sweep, "model_decode");
  const bool at_speed = !prefill_speed.empty() && !decode_speed.empty();
  if (at_speed) r.mape_prefill_at_speed = r.mape_decode_at_speed = r.mape_latency_at_speed = 0;
  for (const auto& probes : r.speed_by_sweep)
    for (const SpeedProbe& q : probes)
      if (q.calibrated_s > 0 && q.now_s > 0) r.speed_moved = std::max(r.speed_moved, std::fabs(q.ratio() - 1));
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Samples& sm = samples[ci];
    model::ArchSpec spec = cases[ci].spec;
    spec.dtype = o.dtype;
    const Prediction p = predict_prompt(spec, hw, engine_in, o.prompt_tokens, o.decode_steps);
    ValidationRow row;
    row.name = cases[ci].name;
    for (const auto& l : spec.layers) row.kinds += model::layer_kind(l);
    row.params = p.params;
    row.predicted_prefill_s = p.ttft_s;
    std::tie(row.measured_prefill_s, row.prefill_sweep) = sm.prefill.fastest();
    row.predicted_decode_s = p.tpot_s;
    std::tie(row.measured_decode_s, row.decode_sweep) = sm.steps.fastest();
    row.predicted_memory_bytes = p.weight_bytes + p.bytes_per_seq + p.activation_bytes;
    row.measured_memory_bytes = sm.peak;
    row.weight_bytes = p.weight_bytes;
    row.wall_prefill_s = sm.prefill_wall.fastest_window();
    row.wall_decode_s = sm.steps_wall.fastest_window();
    row.prefill_samples_s = sm.prefill.t, row.decode_samples_s = sm.steps.t;
    if (at_speed) {
      const double n = double(cases.size());
      r.mape_prefill_at_speed += ape(p.ttft_s, speed_normalized_time(sm.prefill.medians(), prefill_speed)) / n;
      r.mape_decode_at_speed += ape(p.tpot_s, speed_normalized_time(sm.steps.medians(), decode_speed)) / n;
    }
    r.rows.push_back(row);
    // The regime rows: the base row's two, then the others measured.
    auto add = [&](int64_t prompt, int64_t batch, bool decode, const Series& measured) {
      const Prediction q = prompt == o.prompt_tokens && batch == 1 ? p : predict_prompt(spec, hw, engine_in, prompt, o.decode_steps, batch);
      RegimeRow x;
      x.name = row.name, x.kinds = row.kinds, x.prompt_tokens = prompt, x.concurrency = batch, x.decode = decode;
      x.regime = decode ? tpot_regime(batch) : ttft_regime(prompt);
      x.predicted_s = decode ? q.tpot_s : q.ttft_s;
      std::tie(x.measured_s, x.sweep) = measured.fastest();
      if (decode) x.predicted_tok_s = double(batch) / q.tpot_s, x.measured_tok_s = double(batch) / x.measured_s;
      auto& by_sweep = log_ratio[x.regime];
      by_sweep.resize(size_t(sweeps));
      for (const auto& [k, m] : measured.medians())
        by_sweep[size_t(k)].first += std::log(m / x.predicted_s), ++by_sweep[size_t(k)].second;
      r.regime_rows.push_back(x);
    };
    add(o.prompt_tokens, 1, false, sm.prefill);
    for (int64_t prompt : o.prompts)
      if (prompt != o.prompt_tokens) add(prompt, 1, false, sm.regime.at(ttft_regime(prompt)));
    add(o.prompt_tokens, 1, true, sm.steps);
    for (int64_t batch : o.concurrency)
      if (batch != 1) add(o.prompt_tokens, batch, true, sm.regime.at(tpot_regime(batch)));
  }
  const double n = double(std::max<size_t>(r.rows.size(), 1));
  for (const auto& row : r.rows) {
    r.mape_prefill += ape(row.predicted_prefill_s, row.measured_prefill_s) / n;
    r.mape_decode += ape(row.predicted_decode_s, row.measured_decode_s) / n;
    r.mape_memory += ape(row.predicted_memory_bytes, row.measured_memory_bytes) / n;
  }
  r.mape_latency = (r.mape_prefill + r.mape_decode) / 2;
  if (at_speed) r.mape_latency_at_speed = (r.mape_prefill_at_speed + r.mape_decode_at_speed) / 2;
  summarize_regimes(r);
  for (const auto& e : r.by_regime) {
    SweepRatios row{e.key, {}};
    for (const auto& [sum, count] : log_ratio.at(e.key)) row.ratio.push_back(count > 0 ? std::exp(sum / count) : 0.0);
    r.by_sweep.push_back(row);
  }
  if (at_speed) {
    auto ratios = [&](const std::string& regime) {
      for (const auto& x : r.by_sweep)
        if (x.regime == regime) return x.ratio;
      return std::vector<double>{};
    };
    r.speed_tracking = speed_tracking({{ratios(ttft_regime(o.prompt_tokens)), prefill_speed},
                                       {ratios(tpot_regime(1)), decode_speed}});
    auto kept = [&](const std::vector<double>& speed, int ValidationRow::*sweep) {
      double sum = 0;
      for (const auto& row : r.rows) {
        const int k = row.*sweep;
        if (k < 0 || size_t(k) >= speed.size()) return 0.0;
        sum += std::log(speed[size_t(k)]) / n;
      }
      return std::exp(sum);
    };
    r.kept_speed_prefill = kept(prefill_speed, &ValidationRow::prefill_sweep);
    r.kept_speed_decode = kept(decode_speed, &ValidationRow::decode_sweep);
  }
  return r;
}

nlohmann::json ValidationResult::to_json() const {
  nlohmann::json rows_j = nlohmann::json::array();
  for (const auto& x : rows)
    rows_j.push_back({{"name", x.name},
                      {"kinds", x.kinds},
                      {"params", x.params},
                      {"prefill_s", {{"predicted", x.predicted_prefill_s}, {"measured", x.measured_prefill_s}}},
                      {"decode_s", {{"predicted", x.predicted_decode_s}, {"measured", x.measured_decode_s}}},
                      {"memory_bytes", {{"predicted", x.predicted_memory_bytes}, {"measured", x.measured_memory_bytes}}},
                      {"weight_bytes", x.weight_bytes},
                      {"wall_clock_s", {{"prefill", x.wall_prefill_s}, {"decode", x.wall_decode_s}}},
                      {"sweep", {{"prefill", x.prefill_sweep}, {"decode", x.decode_sweep}}},
                      {"samples_s", {{"prefill", x.prefill_samples_s}, {"decode", x.decode_samples_s}}}});
  nlohmann::json speed = nlohmann::json::array();
  for (size_t i = 0; i < speed_start.size() && i < speed_end.size(); ++i)
    speed.push_back({{"point", speed_start[i].point},
                     {"calibrated_s", speed_start[i].calibrated_s},
                     {"start_s", speed_start[i].now_s},
                     {"end_s", speed_end[i].now_s}});
  nlohmann::json by_sweep = nlohmann::json::array();
  for (size_t i = 0; i < speed_start.size(); ++i) {
    nlohmann::json now = nlohmann::json::array();
    for (const auto& probe : speed_by_sweep)
      if (i < probe.size()) now.push_back(probe[i].now_s);
    by_sweep.push_back({{"point", speed_start[i].point}, {"calibrated_s", speed_start[i].calibrated_s}, {"now_s", now}});
  }
  const nlohmann::json tracking = speed_tracking < 0 ? nlohmann::json(nullptr) : nlohmann::json(speed_tracking);
  nlohmann::json ratios_by_sweep = nlohmann::json::object();
  for (const auto& x : this->by_sweep) ratios_by_sweep[x.regime] = x.ratio;
  nlohmann::json regimes_j = nlohmann::json::array();
  for (const auto& x : regime_rows) {
    nlohmann::json q = {{"name", x.name},       {"kinds", x.kinds},         {"regime", x.regime},
                        {"prompt_tokens", x.prompt_tokens}, {"concurrency", x.concurrency},
                        {"seconds", {{"predicted", x.predicted_s}, {"measured", x.measured_s}}},
                        {"sweep", x.sweep}};
    if (x.decode) q["tokens_per_s"] = {{"predicted", x.predicted_tok_s}, {"measured", x.measured_tok_s}};
    regimes_j.push_back(q);
  }
  auto summaries = [](const std::vector<ErrorSummary>& v) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& e : v) {
      j[e.key] = {{"rows", e.rows}, {"mape", e.mape}, {"mean_signed_error", e.mean_signed}};
    }
    return j;
  };
  return {{"format", "autocompress.cost_validation"},
          {"version", 1},
          {"hardware", hardware},
          {"engine", engine},
          {"prompt_tokens", options.prompt_tokens},
          {"decode_steps", options.decode_steps},
          {"repeats", options.repeats},
          {"sweeps", options.sweeps},
          {"dtype", options.dtype},
          {"device", options.device},
          {"threads", threads},
          {"clock", clock},
          {"timing", "per sweep over all architectures: `repeats` prefills after one warm-up and the decode steps; "
                     "per quantity the median of each sweep's samples, the fastest sweep kept"},
          {"memory", std::string(options.device == "cpu" ? "peak bytes of live CPU tensors (counting allocator)"
                                                         : "peak bytes allocated on " + options.device +
                                                               " (CUDA caching allocator statistics)") +
                         " from the loaded model through prefill and decode, minus the bytes live before the model "
                         "was built"},
          {"calibration", "the hardware profile is fitted on operator microbenchmarks only; no architecture here was "
                          "used to fit it"},
          {"rows", rows_j},
          {"machine_speed", speed},
          {"mape", {{"prefill", mape_prefill}, {"decode", mape_decode}, {"latency", mape_latency}, {"memory", mape_memory}}},
          {"mape_at_calibration_speed",
           mape_latency_at_speed < 0
               ? nlohmann::json(nullptr)
               : nlohmann::json{{"prefill", mape_prefill_at_speed},
                                {"decode", mape_decode_at_speed},
                                {"latency", mape_latency_at_speed},
                                {"speed_moved", speed_moved},
                                {"speed_tracking", tracking},
                                {"speed_at_kept_sweeps",
                                 {{"prefill", kept_speed_prefill}, {"decode", kept_speed_decode}}},
                                {"how", "each sweep's median divided by the speed reference's ratio around that sweep "
                                        "(model_prefill / model_decode probe, geometric mean of the probes before "
                                        "and after it), the median over sweeps against the prediction; speed_tracking: "
                                        "the base rows' sweep-to-sweep spread of log(measured / predicted) left after "
                                        "that division, over the spread before it (below 0.5: the rows moved with the "
                                        "probes); speed_at_kept_sweeps: the probes' ratio (time now / at calibration) "
                                        "in the sweeps the base rows kept, geometric mean over the rows"}}},
          {"prompts", options.prompts},
          {"concurrency", options.concurrency},
          {"regime_rows", regimes_j},
          {"mape_by_regime", summaries(by_regime)},
          {"mape_by_layer_kind", summaries(by_kind)},
          {"machine_speed_by_sweep", by_sweep},
          {"measured_over_predicted_by_sweep", ratios_by_sweep},
          {"speed_reference", "the profile's own points re-timed before every sweep and after the last "
                              "(machine_speed_by_sweep: now_s per probe); each measured time's `sweep` is the sweep "
                              "whose median was kept"}};
}

std::string ValidationResult::table() const {
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "cost validate on %s, engine %s, device %s: prompt %lld, %lld decode steps, %s, %d threads; latency "
                "by %s, the fastest of %d sweeps' medians of %d prefills and of the decode steps; memory: peak live tensor bytes\n",
                hardware.c_str(), engine.c_str(), options.device.c_str(), (long long)options.prompt_tokens,
                (long long)options.decode_steps, options.dtype.c_str(), threads, clock.c_str(), options.sweeps,
                options.repeats);
  out += buf;
  std::snprintf(buf, sizeof buf, "%-20s %-8s %7s | %21s %6s | %21s %6s | %19s %6s\n", "architecture", "kinds",
                "params", "prefill ms pred/meas", "err", "decode ms pred/meas", "err", "memory MB pred/meas", "err");
  out += buf;
  auto err = [](double p, double m) { return 100.0 * (p - m) / m; };
  for (const auto& x : rows) {
    std::snprintf(buf, sizeof buf,
                  "%-20s %-8s %6.2fM | %10.3f %10.3f %+5.0f%% | %10.3f %10.3f %+5.0f%% | %9.2f %9.2f %+5.1f%%\n",
                  x.name.c_str(), x.kinds.substr(0, 8).c_str(), x.params / 1e6, x.predicted_prefill_s * 1e3,
                  x.measured_prefill_s * 1e3, err(x.predicted_prefill_s, x.measured_prefill_s),
                  x.predicted_decode_s * 1e3, x.measured_decode_s * 1e3,
                  err(x.predicted_decode_s, x.measured_decode_s), x.predicted_memory_bytes / 1e6,
                  x.measured_memory_bytes / 1e6, err(x.predicted_memory_bytes, x.measured_memory_bytes));
    out += buf;
  }
  std::snprintf(buf, sizeof buf,
                "MAPE over %zu architectures: prefill %.1f%%, decode %.1f%% (latency %.1f%%), memory %.1f%%\n",
                rows.size(), 100 * mape_prefill, 100 * mape_decode, 100 * mape_latency, 100 * mape_memory);
  out += buf;
  if (mape_latency_at_speed >= 0) {
    std::snprintf(buf, sizeof buf,
                  "at the calibration's speed (each sweep divided by the speed probe around it): prefill %.1f%%, "
                  "decode %.1f%% (latency %.1f%%); the speed probes moved up to %.0f%% during the run%s\n",
                  100 * mape_prefill_at_speed, 100 * mape_decode_at_speed, 100 * mape_latency_at_speed,
                  100 * speed_moved, speed_advice().c_str());
    out += buf;
  }
  out += speed_table();
  out += regimes_table();
  out += sweeps_table();
  return out;
}

// Which latency figure to read. The raw one keeps each row's fastest sweep: right when those
// sweeps ran at the calibration's speed. The one at the calibration's speed divides by the
// probes: right when the rows moved with them (speed_tracking at most 0.5: the division removed
// three quarters of the rows' sweep-to-sweep variance). On steady machines the division mostly
// grew that spread, and a probe reads its point slower than the calibration's fastest window
// did (docs/costmodel.md, "When the rows follow the probes"). So the second figure is advised
// only where both hold: the kept sweeps ran off the calibration's speed by more than the spot
// check's tolerance, and the rows followed the probes.
std::string ValidationResult::speed_advice() const {
  constexpr double kTracks = 0.5;
  if (speed_tracking < 0 || kept_speed_prefill <= 0 || kept_speed_decode <= 0) return "";
  const double off = std::max(std::fabs(std::log(kept_speed_prefill)), std::fabs(std::log(kept_speed_decode)));
  const bool kept_off = off > std::log1p(LocalProfileOptions{}.spot_tolerance);
  const bool tracks = speed_tracking <= kTracks;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "; the sweeps the rows kept ran at %.2fx / %.2fx the calibration's time (prefill / decode), "
                "the rows %s with the probes (%.0f%% of their sweep-to-sweep spread left): %s",
                kept_speed_prefill, kept_speed_decode, tracks ? "moved" : "did not move", 100 * speed_tracking,
                kept_off && tracks ? "read this figure" : "the raw figure stands");
  return buf;
}

std::string ValidationResult::sweeps_table() const {
  if (options.sweeps < 2 || by_sweep.empty()) return "";
  std::string out = "measured / predicted by sweep (geometric mean over architectures; each row keeps its fastest sweep):\n";
  char buf[64];
  for (const auto& x : by_sweep) {
    std::snprintf(buf, sizeof buf, "  %-14s", x.regime.c_str());
    out += buf;
    for (double v : x.ratio) std::snprintf(buf, sizeof buf, " %.2f", v), out += buf;
    out += "\n";
  }
  return out;
}

// The speed reference's ratios per probe, and a note when the machine as a whole ran far from
// its calibrated speed.
std::string ValidationResult::speed_table() const {
  if (speed_by_sweep.empty() || speed_start.empty()) return "";
  std::string out = "machine speed vs the profile's calibration (time now / then, before each sweep and after the last):\n";
  char buf[256];
  std::vector<double> ratios;
  for (size_t i = 0; i < speed_start.size(); ++i) {
    std::snprintf(buf, sizeof buf, "  %-52s", speed_start[i].point.c_str());
    std::string line = buf;
    for (const auto& probe : speed_by_sweep)
      if (i < probe.size()) {
        std::snprintf(buf, sizeof buf, " %.2f", probe[i].ratio());
        line += buf, ratios.push_back(probe[i].ratio());
      }
    out += line + "\n";
  }
  const double med = median(ratios);
  if (med > 1.15 || med < 1 / 1.15) {
    std::snprintf(buf, sizeof buf,
                  "note: this machine runs %.0f%% %s than when the profile was calibrated; that shifts every "
                  "row's error. Recalibrate (cost calibrate) right before validating.\n",
                  100 * std::fabs(med - 1), med > 1 ? "slower" : "faster");
    out += buf;
  }
  return out;
}

std::string ValidationResult::regimes_table() const {
  if (by_regime.empty()) return "";
  std::string out = "per regime (TTFT of one prompt; TPOT and tokens/s of B sequences decoding together):\n";
  char buf[256];
  for (const auto& e : by_regime) {
    double pred_tok = 0, meas_tok = 0;
    for (const auto& x : regime_rows)
      if (x.regime == e.key && x.decode) pred_tok += x.predicted_tok_s / e.rows, meas_tok += x.measured_tok_s / e.rows;
    std::snprintf(buf, sizeof buf, "  %-12s %3d rows: MAPE %5.1f%%, mean signed %+6.1f%%", e.key.c_str(), e.rows,
                  100 * e.mape, 100 * e.mean_signed);
    out += buf;
    if (meas_tok > 0) {
      std::snprintf(buf, sizeof buf, "; mean tokens/s predicted %.0f, measured %.0f", pred_tok, meas_tok);
      out += buf;
    }
    out += "\n";
  }
  out += "per layer kind (rows of architectures that have it):\n";
  for (const auto& e : by_kind) {
    std::snprintf(buf, sizeof buf, "  %-14s %3d rows: MAPE %5.1f%%, mean signed %+6.1f%%\n", e.key.c_str(), e.rows,
                  100 * e.mape, 100 * e.mean_signed);
    out += buf;
  }
  return out;
}

}  // namespace ac::search

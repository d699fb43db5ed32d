// `autocompress cost validate`: predicted vs measured on this machine.
#include "search/costmodel/validate.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "model/model.h"
#include "search/costmodel/cost_model.h"

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

EngineProfile local_eager_engine(int64_t prompt_tokens) {
  EngineProfile e;
  e.id = "local-eager";
  e.name = "this project's model code, eager, one sequence";
  e.memory_policy = "fraction_of_total";
  e.memory_fraction = 1.0;
  e.kv_block_tokens = 1;
  e.hybrid_page_rule = false;
  e.max_num_batched_tokens = prompt_tokens;
  e.max_num_seqs = 1;
  return e;
}

ValidationResult validate_cost_model(const HardwareProfile& hw, const ValidationOptions& o,
                                     const std::vector<ValidationCase>& cases) {
  torch::NoGradGuard no_grad;
  const auto dtype = o.dtype == "float32" ? torch::kFloat32 : torch::kBFloat16;
  Workload w;
  w.id = "validate";
  w.prompt_tokens = o.prompt_tokens;
  w.output_tokens = o.decode_steps;
  w.context_tokens = o.prompt_tokens + o.decode_steps;
  w.concurrency = 1;
  const EngineProfile engine = local_eager_engine(o.prompt_tokens);
  ValidationResult r;
  for (const auto& c : cases) {
    model::ArchSpec spec = c.spec;
    spec.dtype = o.dtype;
    model::ModelOptions mo;
    mo.dtype = dtype;
    model::CausalLM m(spec, {}, mo);
    m->init_weights(1234);
    m->eval();
    const auto ids = torch::randint(0, spec.vocab_size, {1, o.prompt_tokens}, torch::kLong);
    double prefill = 1e30;
    model::InferenceCache cache;
    for (int rep = 0; rep < o.repeats; ++rep) {
      cache = m->new_cache();
      const auto t0 = Clock::now();
      auto h = m->hidden_states(ids, &cache);
      (void)m->logits_local(h.slice(1, o.prompt_tokens - 1, o.prompt_tokens));
      prefill = std::min(prefill, since(t0));
    }
    std::vector<double> steps;
    for (int64_t s = 0; s < o.decode_steps; ++s) {
      const auto tok = torch::randint(0, spec.vocab_size, {1, 1}, torch::kLong);
      const auto t0 = Clock::now();
      (void)m->forward(tok, &cache);
      steps.push_back(since(t0));
    }
    std::sort(steps.begin(), steps.end());
    double bytes = 0;
    for (const auto& p : m->parameters()) bytes += double(p.numel() * p.element_size());
    auto add = [&](const torch::Tensor& t) {
      if (t.defined()) bytes += double(t.numel() * t.element_size());
    };
    for (const auto& l : cache.layers) add(l.kv.k), add(l.kv.v), add(l.mamba.conv_state), add(l.mamba.ssm_state);
    const Prediction p = predict(spec, hw, engine, w);
    ValidationRow row;
    row.name = c.name;
    for (const auto& l : spec.layers) row.kinds += model::layer_kind(l);
    row.params = p.params;
    row.predicted_prefill_s = p.ttft_s;
    row.measured_prefill_s = prefill;
    row.predicted_decode_s = p.tpot_s;
    row.measured_decode_s = steps[steps.size() / 2];
    row.predicted_memory_bytes = p.weight_bytes + p.bytes_per_seq;
    row.measured_memory_bytes = bytes;
    r.rows.push_back(row);
  }
  auto ape = [](double pred, double meas) { return std::fabs(pred - meas) / meas; };
  for (const auto& row : r.rows) {
    r.mape_prefill += ape(row.predicted_prefill_s, row.measured_prefill_s) / double(r.rows.size());
    r.mape_decode += ape(row.predicted_decode_s, row.measured_decode_s) / double(r.rows.size());
    r.mape_memory += ape(row.predicted_memory_bytes, row.measured_memory_bytes) / double(r.rows.size());
  }
  r.mape_latency = (r.mape_prefill + r.mape_decode) / 2;
  return r;
}

}  // namespace ac::search

// The exact cost model: the shared formulas (formulas.h) over one double per layer, plus the
// fit verdict and the report.
#include "search/costmodel/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/error.h"
#include "search/costmodel/formulas.h"

namespace ac::search {

using nlohmann::json;

namespace detail {
Globals globals_from_spec(const model::ArchSpec& spec) {
  Globals g;
  g.hidden = double(spec.hidden_size);
  g.vocab = double(spec.vocab_size);
  g.tie = spec.tie_embeddings;
  // Rotary embeddings (model/layers/attention.cpp): everything but Nemotron-H attention.
  g.rope = spec.family != model::ModelFamily::NemotronH && spec.rope_theta > 0;
  g.wbytes = g.abytes = g.kvbytes = spec.dtype == "float32" ? 4.0 : 2.0;
  for (const auto& l : spec.layers) {
    g.has_attention = g.has_attention || bool(l.attention);
    g.has_mamba = g.has_mamba || bool(l.mamba);
  }
  return g;
}
}  // namespace detail

namespace {
std::string gb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GB", bytes / 1e9);
  return b;
}
std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / double(1ull << 30));
  return b;
}
}  // namespace

Prediction predict_prompt(const model::ArchSpec& spec, const HardwareProfile& hw, const EngineProfile& engine,
                          int64_t prompt_tokens, int64_t output_tokens, int64_t batch) {
  Workload w;
  w.id = "one-prompt";
  w.prompt_tokens = prompt_tokens;
  w.output_tokens = output_tokens;
  w.context_tokens = prompt_tokens + output_tokens;
  w.concurrency = batch;
  EngineProfile e = engine;
  e.max_num_batched_tokens = std::min(e.max_num_batched_tokens, prompt_tokens);
  e.max_num_seqs = batch;
  return predict(spec, hw, e, w);
}

Prediction predict(const model::ArchSpec& spec, const HardwareProfile& hw, const EngineProfile& engine,
                   const Workload& w) {
  model::validate(spec, spec.name.empty() ? "<arch>" : spec.name);
  if (w.prompt_tokens <= 0 || w.output_tokens <= 0)
    throw InputError(w.id, "prompt_tokens", "prompt and output tokens must be positive");
  using detail::Vec;
  const detail::Globals g = detail::globals_from_spec(spec);
  const auto dims = detail::dims_from_spec<Vec>(spec, [](const std::vector<double>& v) {
    Vec r;
    r.v = v;
    return r;
  });
  const detail::CostResult<Vec> c = detail::Evaluator<Vec>(g, dims, hw, engine, w).run();

  Prediction p;
  p.arch = spec.name;
  p.hardware = hw.id;
  p.engine = engine.id;
  p.workload = w.id;
  p.params = c.params;
  p.active_params = c.active_params;
  p.weight_bytes = c.weight_bytes;
  p.kv_bytes_per_token = c.kv_bytes_per_token;
  p.state_bytes_per_seq = c.state_bytes_per_seq;
  p.activation_bytes = c.activation_bytes;
  p.reserved_bytes = c.reserved_bytes;
  p.budget_bytes = c.budget_bytes;
  p.kv_budget_bytes = c.kv_budget_bytes;
  p.bytes_per_seq = c.bytes_per_seq;
  p.max_concurrency = int64_t(c.max_concurrency);
  p.concurrency = int64_t(std::max(0.0, c.concurrency));
  p.ttft_s = c.ttft_s;
  p.tpot_s = c.tpot_s;
  p.decode_tok_s = c.decode_tok_s;
  p.throughput_tok_s = c.throughput_tok_s;
  const double fixed = c.weight_bytes + c.activation_bytes + c.reserved_bytes;
  const double usable = hw.memory_bytes * hw.usable_fraction;
  const double limit = engine.memory_policy == "fraction_of_free" ? usable : c.budget_bytes;
  if (fixed > limit) {
    p.problem = "weights " + gb(c.weight_bytes) + " + activations " + gb(c.activation_bytes) + " + reserve " +
                gb(c.reserved_bytes) + " exceed the " + gb(limit) + " that " + engine.id + " may use on " + hw.id;
  } else if (p.max_concurrency < 1) {
    p.problem = "one sequence of " + std::to_string(w.context_tokens) + " tokens needs " + gib(c.bytes_per_seq) +
                " of KV cache and Mamba state, only " + gib(std::max(0.0, c.kv_budget_bytes)) + " is left";
  } else if (w.concurrency > p.max_concurrency) {
    p.problem = "concurrency limited to " + std::to_string(p.max_concurrency) + " (workload asks " +
                std::to_string(w.concurrency) + ")";
  }
  p.fits = fixed <= limit && p.max_concurrency >= 1;
  if (!p.fits) p.concurrency = 0;
  p.meets_ttft = w.ttft_limit_s <= 0 || c.ttft_s <= w.ttft_limit_s;
  p.meets_tpot = w.tpot_limit_s <= 0 || c.tpot_s <= w.tpot_limit_s;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    LayerCost l;
    l.index = int(i);
    l.kind = model::layer_kind(spec.layers[i]);
    l.params = c.layer_params[i];
    l.weight_bytes = c.layer_weight_bytes[i];
    l.kv_bytes_per_token = c.layer_kv_per_token[i];
    l.state_bytes_per_seq = c.layer_state_per_seq[i];
    l.prefill_s = c.layer_prefill_s[i];
    l.decode_s = c.layer_decode_s[i];
    p.layers.push_back(l);
  }
  return p;
}

json Prediction::to_json(bool per_layer) const {
  json j = {{"arch", arch},
            {"hardware", hardware},
            {"engine", engine},
            {"workload", workload},
            {"params", params},
            {"active_params", active_params},
            {"weight_bytes", weight_bytes},
            {"kv_bytes_per_token", kv_bytes_per_token},
            {"state_bytes_per_seq", state_bytes_per_seq},
            {"activation_bytes", activation_bytes},
            {"reserved_bytes", reserved_bytes},
            {"budget_bytes", budget_bytes},
            {"kv_budget_bytes", kv_budget_bytes},
            {"bytes_per_seq", bytes_per_seq},
            {"fits", fits},
            {"problem", problem},
            {"max_concurrency", max_concurrency},
            {"concurrency", concurrency},
            {"ttft_s", ttft_s},
            {"tpot_s", tpot_s},
            {"decode_tok_s", decode_tok_s},
            {"throughput_tok_s", throughput_tok_s},
            {"meets_ttft", meets_ttft},
            {"meets_tpot", meets_tpot}};
  if (per_layer) {
    json arr = json::array();
    for (const auto& l : layers)
      arr.push_back({{"index", l.index},
                     {"kind", l.kind},
                     {"params", l.params},
                     {"weight_bytes", l.weight_bytes},
                     {"kv_bytes_per_token", l.kv_bytes_per_token},
                     {"state_bytes_per_seq", l.state_bytes_per_seq},
                     {"prefill_s", l.prefill_s},
                     {"decode_s", l.decode_s}});
    j["layers"] = arr;
  }
  return j;
}

std::string Prediction::table(bool per_layer) const {
  std::ostringstream o;
  char b[256];
  o << "cost model: " << (arch.empty() ? "(unnamed)" : arch) << " on " << hardware << ", engine " << engine
    << ", workload " << workload << "\n";
  auto row = [&](const char* k, const std::string& v) {
    std::snprintf(b, sizeof b, "  %-26s %s\n", k, v.c_str());
    o << b;
  };
  auto num = [&](const char* fmt, double v) {
    std::snprintf(b, sizeof b, fmt, v);
    return std::string(b);
  };
  row("parameters (total/active)", num("%.3fB", params / 1e9) + " / " + num("%.3fB", active_params / 1e9));
  row("weights", gb(weight_bytes));
  row("KV cache per token", num("%.0f B", kv_bytes_per_token) + " (" + num("%.2f KiB", kv_bytes_per_token / 1024) + ")");
  row("Mamba state per sequence", num("%.1f MiB", state_bytes_per_seq / 1048576.0));
  row("activation workspace", gb(activation_bytes));
  row("reserved (graphs, other)", gb(reserved_bytes));
  row("engine budget", gb(budget_bytes));
  row("left for KV + state", gb(kv_budget_bytes));
  row("bytes per sequence", gib(bytes_per_seq));
  row("fits", fits ? "yes" : "NO");
  if (!problem.empty()) row("note", problem);
  row("max concurrency", std::to_string(max_concurrency));
  row("concurrency used", std::to_string(concurrency));
  row("TTFT", num("%.4f s", ttft_s) + (meets_ttft ? "" : "  (over the workload limit)"));
  row("TPOT", num("%.3f ms", tpot_s * 1e3) + (meets_tpot ? "" : "  (over the workload limit)"));
  row("decode tokens/s", num("%.1f", decode_tok_s));
  row("throughput tokens/s", num("%.1f", throughput_tok_s));
  if (per_layer) {
    o << "  layer kind      params   weights(MB)  KV B/tok  state MiB  prefill ms  decode ms\n";
    for (const auto& l : layers) {
      std::snprintf(b, sizeof b, "  %5d %-4s %10.1fM %12.1f %9.0f %10.2f %11.3f %10.4f\n", l.index, l.kind.c_str(),
                    l.params / 1e6, l.weight_bytes / 1e6, l.kv_bytes_per_token, l.state_bytes_per_seq / 1048576.0,
                    l.prefill_s * 1e3, l.decode_s * 1e3);
      o << b;
    }
  }
  return o.str();
}

}  // namespace ac::search

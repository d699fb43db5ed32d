// Hugging Face config.json readers and writers. Field names follow transformers'
// configuration_llama / qwen2 / qwen3 / mistral / nemotron_h and NVIDIA's DeciLM
// (Nemotron-NAS) and Nemotron-H Puzzle configs; per-layer overrides follow transformers'
// heterogeneity support (`per_layer_config` = {"<layer>": {attribute: value, "skip": [...]}}).
#include "model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "dist/error.h"
#include "dist/file_io.h"

namespace ac::model {

using nlohmann::json;

int64_t decilm_ffn_size(double ffn_mult, int64_t hidden) {
  const int64_t n = int64_t(2.0 * ffn_mult * double(hidden) / 3.0);
  return n % 256 == 0 ? n : n + 256 - n % 256;
}

namespace {

std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// The global config with one layer's overrides on top; error messages name the field where
// the value was found ("per_layer_config.3.num_key_value_heads" or "num_key_value_heads").
struct View {
  const json& global;
  const json* over;
  const std::string& path;
  std::string over_prefix;

  const json* find(const std::string& k) const {
    if (over && over->contains(k)) return &(*over)[k];
    if (global.contains(k)) return &global[k];
    return nullptr;
  }
  std::string field(const std::string& k) const {
    return over && over->contains(k) ? over_prefix + "." + k : k;
  }
  [[noreturn]] void fail(const std::string& k, const std::string& what) const { throw InputError(path, field(k), what); }
  bool present(const std::string& k) const {
    const json* v = find(k);
    return v && !v->is_null();
  }
  int64_t integer(const std::string& k) const {
    const json* v = find(k);
    if (!v || v->is_null()) fail(k, "missing");
    return json_integer(*v, path, field(k));
  }
  int64_t integer(const std::string& k, int64_t def) const { return present(k) ? integer(k) : def; }
  double number(const std::string& k, double def) const {
    const json* v = find(k);
    if (!v || v->is_null()) return def;
    if (v->is_number()) return v->get<double>();
    fail(k, "expected a number, got " + shown(*v));
  }
  bool boolean(const std::string& k, bool def) const {
    const json* v = find(k);
    if (!v || v->is_null()) return def;
    if (v->is_boolean()) return v->get<bool>();
    fail(k, "expected true or false, got " + shown(*v));
  }
  std::string string(const std::string& k, const std::string& def) const {
    const json* v = find(k);
    if (!v || v->is_null()) return def;
    if (v->is_string()) return v->get<std::string>();
    fail(k, "expected a string, got " + shown(*v));
  }
};

std::string read_dtype(const json& c, const std::string& path) {
  for (const char* k : {"dtype", "torch_dtype"}) {
    if (!c.contains(k) || c[k].is_null()) continue;
    if (!c[k].is_string()) throw InputError(path, k, "expected a string, got " + shown(c[k]));
    std::string d = c[k].get<std::string>();
    if (d == "float32" || d == "bfloat16" || d == "float16") return d;
    throw InputError(path, k, "\"" + d + "\" is not one of float32, bfloat16, float16");
  }
  return "bfloat16";
}

double read_rope_theta(const View& v) {
  if (v.present("rope_theta")) return v.number("rope_theta", 10000.0);
  if (const json* rp = v.find("rope_parameters"); rp && rp->is_object() && rp->contains("rope_theta"))
    return (*rp)["rope_theta"].get<double>();
  return 10000.0;
}

void read_globals(ArchSpec& s, const View& v, const char* eps_key) {
  s.hidden_size = v.integer("hidden_size");
  s.vocab_size = v.integer("vocab_size");
  s.norm_eps = v.number(eps_key, 1e-5);
  s.rope_theta = read_rope_theta(v);
  s.tie_embeddings = v.boolean("tie_word_embeddings", false);
  s.max_position_embeddings = v.integer("max_position_embeddings", 4096);
  s.dtype = read_dtype(v.global, v.path);
}

// The per-layer override object of layer i from per_layer_config ({"3": {...}} or {"03": ...}).
std::map<int, const json*> per_layer_overrides(const json& c, const std::string& path, int num_layers) {
  std::map<int, const json*> out;
  if (!c.contains("per_layer_config") || c["per_layer_config"].is_null()) return out;
  const json& p = c["per_layer_config"];
  if (!p.is_object()) throw InputError(path, "per_layer_config", "expected an object {\"<layer index>\": {...}}");
  for (auto it = p.begin(); it != p.end(); ++it) {
    const std::string f = "per_layer_config." + it.key();
    int idx = -1;
    try {
      size_t used = 0;
      idx = std::stoi(it.key(), &used);
      if (used != it.key().size()) idx = -1;
    } catch (...) {
    }
    if (idx < 0 || idx >= num_layers)
      throw InputError(path, f, "key is not a layer index in [0, " + std::to_string(num_layers) + ")");
    if (!it.value().is_object()) throw InputError(path, f, "expected an object of attribute overrides");
    out[idx] = &it.value();
  }
  return out;
}

std::vector<std::string> read_skip(const json* over, const std::string& f, const std::string& path) {
  std::vector<std::string> skip;
  if (!over || !over->contains("skip")) return skip;
  const json& s = (*over)["skip"];
  if (!s.is_array()) throw InputError(path, f + ".skip", "expected a list such as [\"attention\", \"mlp\"]");
  for (const auto& e : s) {
    if (!e.is_string() || (e != "attention" && e != "mlp"))
      throw InputError(path, f + ".skip", shown(e) + " is not \"attention\" or \"mlp\"");
    skip.push_back(e.get<std::string>());
  }
  return skip;
}

// ---- Llama / Mistral / Qwen2 / Qwen3 --------------------------------------------------------
LayerSpec llama_layer(const View& v, ModelFamily fam, int64_t hidden, const std::vector<std::string>& skip) {
  LayerSpec l;
  auto skipped = [&](const char* s) { return std::find(skip.begin(), skip.end(), s) != skip.end(); };
  if (!skipped("attention")) {
    AttentionSpec a;
    a.num_heads = int(v.integer("num_attention_heads"));
    a.num_kv_heads = int(v.integer("num_key_value_heads", a.num_heads));
    if (v.present("head_dim")) {
      a.head_dim = int(v.integer("head_dim"));
    } else {
      if (a.num_heads <= 0 || hidden % a.num_heads != 0)
        v.fail("num_attention_heads", std::to_string(a.num_heads) + " does not divide hidden_size " +
                                          std::to_string(hidden) + " and no head_dim is given");
      a.head_dim = int(hidden / a.num_heads);
    }
    const bool bias = v.boolean("attention_bias", false);
    if (fam == ModelFamily::Qwen2) {
      a.qkv_bias = true;  // Qwen2Attention: q/k/v biased, o not, regardless of the config
      a.o_bias = false;
    } else {
      a.qkv_bias = a.o_bias = bias;
    }
    a.qk_norm = fam == ModelFamily::Qwen3;
    l.attention = a;
  }
  if (!skipped("mlp")) {
    MlpSpec m;
    m.ffn_size = v.integer("intermediate_size");
    const std::string act = v.string("hidden_act", "silu");
    if (act != "silu" && act != "swish")
      v.fail("hidden_act", "\"" + act + "\" is not supported for gated MLPs (silu only)");
    m.activation = MlpActivation::SwiGLU;
    m.bias = v.boolean("mlp_bias", false);
    l.mlp = m;
  }
  return l;
}

// Qwen3MoeForCausalLM: Qwen3 attention (q/k norm); layer i is a softmax-routed SwiGLU MoE
// (no shared expert) unless it is in mlp_only_layers or (i + 1) % decoder_sparse_step != 0,
// then a dense SwiGLU MLP of intermediate_size.
ArchSpec read_qwen3_moe(const json& c, const std::string& path) {
  ArchSpec s;
  s.family = ModelFamily::Qwen3;
  View g{c, nullptr, path, ""};
  read_globals(s, g, "rms_norm_eps");
  const int n = int(g.integer("num_hidden_layers"));
  if (n <= 0) g.fail("num_hidden_layers", std::to_string(n) + " must be positive");
  if (n > kMaxLayers) g.fail("num_hidden_layers", std::to_string(n) + " is more than the " + std::to_string(kMaxLayers) + " layers accepted");
  if (c.contains("per_layer_config") && !c["per_layer_config"].is_null())
    g.fail("per_layer_config", "heterogeneous Qwen3MoeForCausalLM configs are not supported");
  const int64_t experts = g.present("num_experts") ? g.integer("num_experts") : g.integer("num_local_experts");
  const int64_t step = g.integer("decoder_sparse_step", 1);
  std::vector<int64_t> mlp_only;
  if (const json* m = g.find("mlp_only_layers"); m && !m->is_null()) {
    if (!m->is_array()) g.fail("mlp_only_layers", "expected a list of layer indices");
    for (const json& e : *m) {
      if (!e.is_number_integer()) g.fail("mlp_only_layers", "expected integers, got " + shown(e));
      mlp_only.push_back(e.get<int64_t>());
    }
  }
  const std::string act = g.string("hidden_act", "silu");
  if (act != "silu" && act != "swish") g.fail("hidden_act", "\"" + act + "\" is not supported (silu only)");
  for (int i = 0; i < n; ++i) {
    const bool moe = experts > 0 && step > 0 && (i + 1) % step == 0 &&
                     std::find(mlp_only.begin(), mlp_only.end(), i) == mlp_only.end();
    LayerSpec l = llama_layer(g, ModelFamily::Qwen3, s.hidden_size,
                              moe ? std::vector<std::string>{"mlp"} : std::vector<std::string>{});
    if (moe) {
      MoeSpec m;
      m.num_experts = int(experts);
      m.top_k = int(g.integer("num_experts_per_tok"));
      m.expert_ffn = g.integer("moe_intermediate_size");
      m.router = RouterKind::Softmax;
      m.norm_topk_prob = g.boolean("norm_topk_prob", false);
      m.activation = MlpActivation::SwiGLU;
      l.moe = m;
    }
    s.layers.push_back(l);
  }
  return s;
}

ArchSpec read_llama(const json& c, const std::string& path, ModelFamily fam) {
  ArchSpec s;
  s.family = fam;
  View g{c, nullptr, path, ""};
  read_globals(s, g, "rms_norm_eps");
  const int n = int(g.integer("num_hidden_layers"));
  if (n <= 0) g.fail("num_hidden_layers", std::to_string(n) + " must be positive");
  if (n > kMaxLayers) g.fail("num_hidden_layers", std::to_string(n) + " is more than the " + std::to_string(kMaxLayers) + " layers accepted");
  auto overrides = per_layer_overrides(c, path, n);
  for (int i = 0; i < n; ++i) {
    const json* over = overrides.count(i) ? overrides[i] : nullptr;
    const std::string prefix = "per_layer_config." + std::to_string(i);
    View v{c, over, path, prefix};
    s.layers.push_back(llama_layer(v, fam, s.hidden_size, read_skip(over, prefix, path)));
  }
  return s;
}

// ---- DeciLM / Nemotron-NAS (block_configs with attention/ffn sub-objects) -------------------
ArchSpec read_decilm(const json& c, const std::string& path) {
  ArchSpec s;
  s.family = ModelFamily::DeciLM;
  View g{c, nullptr, path, ""};
  read_globals(s, g, "rms_norm_eps");
  if (!c.contains("block_configs") || !c["block_configs"].is_array())
    throw InputError(path, "block_configs", "missing (DeciLM configs list one block config per layer)");
  const json& blocks = c["block_configs"];
  const int heads = int(g.integer("num_attention_heads"));
  // head_dim: given (vLLM's DeciLM attention reads config.head_dim), else hidden / heads.
  if (heads <= 0 || (!g.present("head_dim") && s.hidden_size % heads != 0))
    g.fail("num_attention_heads", std::to_string(heads) + " does not divide hidden_size " + std::to_string(s.hidden_size) +
                                      " and no head_dim is given");
  const int head_dim = g.present("head_dim") ? int(g.integer("head_dim")) : int(s.hidden_size / heads);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string f = "block_configs[" + std::to_string(i) + "]";
    const json& b = blocks[i];
    if (!b.is_object()) throw InputError(path, f, "expected an object with attention and ffn");
    LayerSpec l;
    const json at = b.value("attention", json::object()), ff = b.value("ffn", json::object());
    if (at.value("replace_with_linear", false) || ff.value("replace_with_linear", false))
      throw InputError(path, f, "replace_with_linear blocks are not supported by ArchSpec");
    if (!at.value("no_op", false)) {
      View v{at, nullptr, path, f + ".attention"};
      const int64_t group = v.integer("n_heads_in_group");
      if (group <= 0 || heads % group != 0)
        throw InputError(path, f + ".attention.n_heads_in_group",
                         std::to_string(group) + " does not divide num_attention_heads " + std::to_string(heads));
      AttentionSpec a;
      a.num_heads = heads;
      a.num_kv_heads = int(heads / group);
      a.head_dim = head_dim;
      a.qkv_bias = a.o_bias = g.boolean("attention_bias", false);
      l.attention = a;
    }
    if (!ff.value("no_op", false)) {
      if (!ff.contains("ffn_mult") || !ff["ffn_mult"].is_number())
        throw InputError(path, f + ".ffn.ffn_mult", "missing or not a number");
      MlpSpec m;
      m.ffn_size = decilm_ffn_size(ff["ffn_mult"].get<double>(), s.hidden_size);
      m.bias = g.boolean("mlp_bias", false);
      l.mlp = m;
    }
    s.layers.push_back(l);
  }
  return s;
}

// ---- Nemotron-H -------------------------------------------------------------------------------
char nemotron_letter(const std::string& t, const std::string& path, const std::string& f) {
  if (t == "mamba" || t == "linear_attention" || t == "M") return 'M';
  if (t == "attention" || t == "full_attention" || t == "*") return '*';
  if (t == "mlp" || t == "-") return '-';
  if (t == "moe" || t == "E") return 'E';
  throw InputError(path, f, "unknown layer type \"" + t + "\" (expected mamba, attention, mlp or moe)");
}

MlpActivation nemotron_act(const View& v) {
  const std::string act = v.string("mlp_hidden_act", "relu2");
  if (act == "relu2") return MlpActivation::ReLU2;
  v.fail("mlp_hidden_act", "\"" + act + "\" is not supported (NemotronH MLPs are ungated; relu2 only)");
}

LayerSpec nemotron_layer(const View& v, char kind) {
  LayerSpec l;
  if (kind == 'M') {
    MambaSpec m;
    m.num_heads = int(v.integer("mamba_num_heads"));
    m.head_dim = int(v.integer("mamba_head_dim"));
    m.state_size = int(v.integer("ssm_state_size", 128));
    m.n_groups = int(v.present("n_groups") ? v.integer("n_groups") : v.integer("mamba_n_groups", 8));
    m.conv_kernel = int(v.present("conv_kernel") ? v.integer("conv_kernel") : v.integer("mamba_d_conv", 4));
    m.chunk_size = int(v.present("chunk_size") ? v.integer("chunk_size") : v.integer("mamba_chunk_size", 128));
    m.conv_bias = v.present("use_conv_bias") ? v.boolean("use_conv_bias", true) : v.boolean("mamba_conv_bias", true);
    // transformers' NemotronHMamba2Mixer biases in_proj/out_proj with config.use_bias.
    m.proj_bias = v.boolean("use_bias", false);
    m.time_step_min = v.number("time_step_min", 0.001);
    m.time_step_max = v.number("time_step_max", 0.1);
    if (const json* lim = v.find("time_step_limit"); lim && lim->is_array() && lim->size() == 2) {
      m.time_step_limit_min = (*lim)[0].is_number() ? (*lim)[0].get<double>() : 0.0;
      m.time_step_limit_max = (*lim)[1].is_number() ? (*lim)[1].get<double>() : 1e30;
    }
    m.ssm_state_fp32 = v.string("mamba_ssm_cache_dtype", "float32") == "float32";
    l.mamba = m;
  } else if (kind == '*') {
    AttentionSpec a;
    a.num_heads = int(v.integer("num_attention_heads"));
    a.num_kv_heads = int(v.integer("num_key_value_heads", a.num_heads));
    a.head_dim = int(v.present("head_dim") ? v.integer("head_dim")
                                           : v.integer("attention_head_dim", v.integer("hidden_size") / std::max(1, a.num_heads)));
    a.qkv_bias = a.o_bias = v.boolean("attention_bias", false);
    l.attention = a;
  } else if (kind == '-') {
    MlpSpec m;
    m.ffn_size = v.integer("intermediate_size");
    m.activation = nemotron_act(v);
    m.bias = v.boolean("mlp_bias", false);
    l.mlp = m;
  } else if (kind == 'E') {
    MoeSpec m;
    m.num_experts = int(v.present("n_routed_experts") ? v.integer("n_routed_experts") : v.integer("num_local_experts"));
    m.top_k = int(v.integer("num_experts_per_tok"));
    m.expert_ffn = v.integer("moe_intermediate_size");
    m.shared_ffn = v.integer("n_shared_experts", 1) > 0 ? v.integer("moe_shared_expert_intermediate_size") : 0;
    m.latent_size = v.integer("moe_latent_size", 0);
    m.router = RouterKind::SigmoidBias;  // DeepseekV3TopkRouter: sigmoid + e_score_correction_bias
    m.routed_scaling = v.number("routed_scaling_factor", 1.0);
    m.norm_topk_prob = v.boolean("norm_topk_prob", true);
    m.activation = nemotron_act(v);
    m.n_group = int(v.integer("n_group", 1));
    m.topk_group = int(v.integer("topk_group", 1));
    l.moe = m;
  }
  return l;
}

std::string nemotron_pattern(const json& c, const std::string& path, const char* pattern_key, const char* list_key) {
  if (c.contains(pattern_key) && c[pattern_key].is_string()) {
    std::string p = c[pattern_key].get<std::string>();
    for (size_t i = 0; i < p.size(); ++i) nemotron_letter(std::string(1, p[i]), path, pattern_key);
    return p;
  }
  if (c.contains(list_key) && c[list_key].is_array()) {
    std::string p;
    for (size_t i = 0; i < c[list_key].size(); ++i) {
      const json& t = c[list_key][i];
      const std::string f = std::string(list_key) + "[" + std::to_string(i) + "]";
      if (!t.is_string()) throw InputError(path, f, "expected a string");
      p += nemotron_letter(t.get<std::string>(), path, f);
    }
    return p;
  }
  return "";
}

ArchSpec read_nemotron_h(const json& c, const std::string& path) {
  ArchSpec s;
  s.family = ModelFamily::NemotronH;
  View g{c, nullptr, path, ""};
  read_globals(s, g, "layer_norm_epsilon");
  const bool has_blocks = c.contains("block_configs") && c["block_configs"].is_array();
  std::string pattern = nemotron_pattern(c, path, "hybrid_override_pattern", "layers_block_type");
  if (has_blocks) {  // Nemotron-H Puzzle: [{"block_type": "moe", <overrides>}, ...]
    const json& blocks = c["block_configs"];
    std::string from_blocks;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const std::string f = "block_configs[" + std::to_string(i) + "]";
      if (!blocks[i].is_object() || !blocks[i].contains("block_type") || !blocks[i]["block_type"].is_string())
        throw InputError(path, f + ".block_type", "missing");
      from_blocks += nemotron_letter(blocks[i]["block_type"].get<std::string>(), path, f + ".block_type");
    }
    if (!pattern.empty() && pattern != from_blocks)
      throw InputError(path, "block_configs", "block types " + from_blocks + " disagree with the layer pattern " + pattern);
    pattern = from_blocks;
  }
  if (pattern.empty())
    throw InputError(path, "hybrid_override_pattern", "missing (also no layers_block_type or block_configs)");
  auto overrides = per_layer_overrides(c, path, int(pattern.size()));
  for (size_t i = 0; i < pattern.size(); ++i) {
    const json* over = nullptr;
    std::string prefix;
    if (has_blocks) {
      over = &c["block_configs"][i];
      prefix = "block_configs[" + std::to_string(i) + "]";
    } else if (overrides.count(int(i))) {
      over = overrides[int(i)];
      prefix = "per_layer_config." + std::to_string(i);
    }
    s.layers.push_back(nemotron_layer(View{c, over, path, prefix}, pattern[i]));
  }
  const int mtp = int(g.integer("num_nextn_predict_layers", 0));
  if (mtp > 0) {
    s.mtp.num_predict_layers = mtp;
    std::string mp = nemotron_pattern(c, path, "mtp_hybrid_override_pattern", "mtp_layers_block_type");
    if (mp.empty()) mp = "*E";  // transformers' default mtp_layers_block_type
    const bool mtp_blocks = c.contains("mtp_block_configs") && c["mtp_block_configs"].is_array() &&
                            c["mtp_block_configs"].size() == mp.size();
    for (size_t i = 0; i < mp.size(); ++i) {
      const json* over = mtp_blocks ? &c["mtp_block_configs"][i] : nullptr;
      s.mtp.layers.push_back(nemotron_layer(View{c, over, path, "mtp_block_configs[" + std::to_string(i) + "]"}, mp[i]));
    }
  }
  return s;
}

std::string first_string(const json& c, const char* key) {
  if (!c.contains(key)) return "";
  const json& v = c[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array() && !v.empty() && v[0].is_string()) return v[0].get<std::string>();
  return "";
}

// ---- writers ----------------------------------------------------------------------------------
[[noreturn]] void unwritable(size_t i, const std::string& what) {
  throw InputError("config.json", "layers[" + std::to_string(i) + "]", what);
}

// Adds {key: value} to layer i's overrides when it differs from the global value.
void override_if_differs(json& global, json& per_layer, size_t i, const std::string& key, const json& value) {
  if (global.contains(key) && global[key] == value) return;
  per_layer[std::to_string(i)][key] = value;
}

json finish_per_layer(const json& per_layer, size_t num_layers) {
  // Zero-padded keys sort numerically, as transformers writes them.
  const size_t width = std::to_string(num_layers > 0 ? num_layers - 1 : 0).size();
  json out = json::object();
  for (auto it = per_layer.begin(); it != per_layer.end(); ++it) {
    std::string k = it.key();
    while (k.size() < width) k = "0" + k;
    out[k] = it.value();
  }
  return out;
}

// Global value of each attribute: the most common one among the layers that have it (the
// first on ties), so per-layer overrides list only the real differences.
json mode_attrs(const std::vector<json>& attrs) {
  std::map<std::string, std::vector<std::pair<json, int>>> counts;
  std::vector<std::string> order;
  for (const json& a : attrs)
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto& v = counts[it.key()];
      if (v.empty()) order.push_back(it.key());
      bool found = false;
      for (auto& [val, n] : v)
        if (val == it.value()) ++n, found = true;
      if (!found) v.push_back({it.value(), 1});
    }
  json out = json::object();
  for (const auto& k : order) {
    const auto& v = counts[k];
    size_t best = 0;
    for (size_t i = 1; i < v.size(); ++i)
      if (v[i].second > v[best].second) best = i;
    out[k] = v[best].first;
  }
  return out;
}

void write_globals(json& c, const ArchSpec& s, const char* eps_key) {
  c["hidden_size"] = s.hidden_size;
  c["vocab_size"] = s.vocab_size;
  c[eps_key] = s.norm_eps;
  c["rope_theta"] = s.rope_theta;
  c["tie_word_embeddings"] = s.tie_embeddings;
  c["max_position_embeddings"] = s.max_position_embeddings;
  c["torch_dtype"] = s.dtype;
}

json write_llama(const ArchSpec& s) {
  json c;
  const char* arch = "LlamaForCausalLM";
  const char* type = "llama";
  if (s.family == ModelFamily::Mistral) arch = "MistralForCausalLM", type = "mistral";
  if (s.family == ModelFamily::Qwen2) arch = "Qwen2ForCausalLM", type = "qwen2";
  if (s.family == ModelFamily::Qwen3) arch = "Qwen3ForCausalLM", type = "qwen3";
  c["architectures"] = {arch};
  c["model_type"] = type;
  write_globals(c, s, "rms_norm_eps");
  c["num_hidden_layers"] = s.layers.size();
  c["hidden_act"] = "silu";
  const AttentionSpec* a0 = nullptr;
  const MlpSpec* m0 = nullptr;
  std::vector<json> attrs;
  for (const auto& l : s.layers) {
    if (l.attention && !a0) a0 = &*l.attention;
    if (l.mlp && !m0) m0 = &*l.mlp;
    json a = json::object();
    if (l.attention)
      a = {{"num_attention_heads", l.attention->num_heads}, {"num_key_value_heads", l.attention->num_kv_heads},
           {"head_dim", l.attention->head_dim}};
    if (l.mlp) a["intermediate_size"] = l.mlp->ffn_size;
    attrs.push_back(a);
  }
  if (!a0 || !m0) throw InputError("config.json", "layers", "a Llama-family model needs at least one attention and one MLP");
  const json g = mode_attrs(attrs);
  for (auto it = g.begin(); it != g.end(); ++it) c[it.key()] = it.value();
  c["attention_bias"] = s.family == ModelFamily::Qwen2 ? false : a0->qkv_bias;
  c["mlp_bias"] = m0->bias;
  json per_layer = json::object();
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const LayerSpec& l = s.layers[i];
    if (l.mamba || l.moe) unwritable(i, "a " + layer_kind(l) + " layer cannot be written as " + std::string(arch));
    json skip = json::array();
    if (const auto& a = l.attention) {
      const bool qwen2 = s.family == ModelFamily::Qwen2;
      if (qwen2 ? (!a->qkv_bias || a->o_bias) : (a->qkv_bias != a0->qkv_bias || a->o_bias != a0->qkv_bias))
        unwritable(i, "attention biases differ from what " + std::string(arch) + " builds");
      if (a->qk_norm != (s.family == ModelFamily::Qwen3)) unwritable(i, "qk_norm does not match the family");
    } else {
      skip.push_back("attention");
    }
    if (const auto& m = l.mlp) {
      if (m->activation != MlpActivation::SwiGLU) unwritable(i, "Llama-family MLPs are SwiGLU");
      if (m->bias != m0->bias) unwritable(i, "mlp bias differs between layers");
    } else {
      skip.push_back("mlp");
    }
    for (auto it = attrs[i].begin(); it != attrs[i].end(); ++it)
      override_if_differs(c, per_layer, i, it.key(), it.value());
    if (!skip.empty()) per_layer[std::to_string(i)]["skip"] = skip;
  }
  if (!per_layer.empty()) c["per_layer_config"] = finish_per_layer(per_layer, s.layers.size());
  return c;
}

// Qwen3MoeForCausalLM: every attention and every MoE layer alike (no per-layer overrides
// in this family), dense layers listed in mlp_only_layers.
json write_qwen3_moe(const ArchSpec& s) {
  json c;
  c["architectures"] = {"Qwen3MoeForCausalLM"};
  c["model_type"] = "qwen3_moe";
  write_globals(c, s, "rms_norm_eps");
  c["num_hidden_layers"] = s.layers.size();
  c["hidden_act"] = "silu";
  const AttentionSpec* a0 = nullptr;
  const MoeSpec* e0 = nullptr;
  const MlpSpec* m0 = nullptr;
  for (const auto& l : s.layers) {
    if (l.attention && !a0) a0 = &*l.attention;
    if (l.moe && !e0) e0 = &*l.moe;
    if (l.mlp && !m0) m0 = &*l.mlp;
  }
  if (!a0 || !e0) throw InputError("config.json", "layers", "a Qwen3MoeForCausalLM needs attention and MoE layers");
  json mlp_only = json::array();
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const LayerSpec& l = s.layers[i];
    if (l.mamba) unwritable(i, "a Mamba layer cannot be written as Qwen3MoeForCausalLM");
    if (!l.attention || (!l.mlp && !l.moe)) unwritable(i, "Qwen3MoeForCausalLM cannot skip sublayers");
    const auto& a = *l.attention;
    if (a.num_heads != a0->num_heads || a.num_kv_heads != a0->num_kv_heads || a.head_dim != a0->head_dim ||
        a.qkv_bias != a0->qkv_bias || a.o_bias != a0->qkv_bias || !a.qk_norm)
      unwritable(i, "Qwen3MoeForCausalLM layers share one attention shape (with q/k norm)");
    if (const auto& m = l.moe) {
      if (m->num_experts != e0->num_experts || m->top_k != e0->top_k || m->expert_ffn != e0->expert_ffn ||
          m->norm_topk_prob != e0->norm_topk_prob)
        unwritable(i, "Qwen3MoeForCausalLM layers share one MoE shape");
      if (m->router != RouterKind::Softmax || m->activation != MlpActivation::SwiGLU || m->shared_ffn != 0 ||
          m->latent_size != 0 || m->routed_scaling != 1.0 || m->n_group != 1)
        unwritable(i, "a Qwen3-MoE expert layer is softmax-routed SwiGLU without shared expert, latent or scaling");
    } else {
      if (l.mlp->ffn_size != m0->ffn_size || l.mlp->activation != MlpActivation::SwiGLU || l.mlp->bias)
        unwritable(i, "Qwen3MoeForCausalLM dense layers share one SwiGLU MLP without bias");
      mlp_only.push_back(i);
    }
  }
  c["num_attention_heads"] = a0->num_heads;
  c["num_key_value_heads"] = a0->num_kv_heads;
  c["head_dim"] = a0->head_dim;
  c["attention_bias"] = a0->qkv_bias;
  c["num_local_experts"] = e0->num_experts;
  c["num_experts_per_tok"] = e0->top_k;
  c["moe_intermediate_size"] = e0->expert_ffn;
  c["norm_topk_prob"] = e0->norm_topk_prob;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = mlp_only;
  c["intermediate_size"] = m0 ? m0->ffn_size : e0->expert_ffn;
  return c;
}

// A student the chosen block_configs layout cannot express: names the layer and field and
// points at the layout that can (transformers' per_layer_config).
[[noreturn]] void inexpressible(size_t i, const std::string& field, const std::string& what) {
  throw InputError("config.json", "layers[" + std::to_string(i) + "]." + field,
                   what + "; export it with --hf-layout per-layer-config");
}

// The ffn_mult DeciLM's rounding maps back to exactly `ffn`: the 6-decimal value nearest to
// 1.5 * ffn / hidden, or a neighbour of it. Only multiples of 256 are reachable.
double decilm_ffn_mult(int64_t ffn, int64_t hidden, size_t i) {
  if (ffn % 256 == 0) {
    const double base = std::round(1.5 * double(ffn) / double(hidden) * 1e6) / 1e6;
    for (int step : {0, 1, -1, 2, -2, 3, 4}) {
      const double m = base + step * 1e-6;
      if (decilm_ffn_size(m, hidden) == ffn) return m;
    }
  }
  inexpressible(i, "mlp.ffn_size",
                std::to_string(ffn) + " is not a DeciLM FFN width: DeciLM derives it from ffn.ffn_mult as "
                "round_up(int(2 * ffn_mult * hidden / 3), 256), so it must be a multiple of 256");
}

json write_decilm(const ArchSpec& s) {
  json c;
  c["architectures"] = {"DeciLMForCausalLM"};
  c["model_type"] = "nemotron-nas";
  // DeciLM's configuration and modeling code are not in transformers: they ship with the
  // checkpoint (configuration_decilm.py, modeling_decilm.py of NVIDIA's Nemotron-NAS models).
  c["auto_map"] = {{"AutoConfig", "configuration_decilm.DeciLMConfig"},
                   {"AutoModelForCausalLM", "modeling_decilm.DeciLMForCausalLM"}};
  write_globals(c, s, "rms_norm_eps");
  c["num_hidden_layers"] = s.layers.size();
  c["hidden_act"] = "silu";
  // Global fields: num_attention_heads and head_dim (vLLM's DeciLM attention reads
  // config.head_dim, hidden / heads without it; written always, since a hidden-pruned
  // student keeps the teacher's head_dim), one attention_bias for q, k, v and o, one
  // mlp_bias; they come from the first layer that has the sublayer.
  size_t a_at = 0, m_at = 0;
  const AttentionSpec* a0 = nullptr;
  const MlpSpec* m0 = nullptr;
  for (size_t i = 0; i < s.layers.size(); ++i) {
    if (s.layers[i].attention && !a0) a0 = &*s.layers[i].attention, a_at = i;
    if (s.layers[i].mlp && !m0) m0 = &*s.layers[i].mlp, m_at = i;
  }
  if (!a0)
    throw InputError("config.json", "layers", "every attention is removed, DeciLM needs one for num_attention_heads; "
                                              "export it with --hf-layout per-layer-config");
  const int heads = a0->num_heads;
  c["num_attention_heads"] = heads;
  c["head_dim"] = a0->head_dim;
  c["attention_bias"] = a0->qkv_bias;
  c["mlp_bias"] = m0 ? m0->bias : false;
  const std::string first_a = "layer " + std::to_string(a_at), first_m = "layer " + std::to_string(m_at);
  json blocks = json::array();
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const LayerSpec& l = s.layers[i];
    if (l.mamba) inexpressible(i, "mamba", "a DeciLM block holds attention and a dense MLP, no Mamba mixer");
    if (l.moe) inexpressible(i, "moe", "a DeciLM block holds attention and a dense MLP, no MoE");
    json at = {{"no_op", !l.attention}, {"replace_with_linear", false}};
    if (const auto& a = l.attention) {
      if (a->num_heads != heads)
        inexpressible(i, "attention.num_heads",
                      std::to_string(a->num_heads) + " query heads where " + first_a + " has " + std::to_string(heads) +
                          ": DeciLM has one global num_attention_heads, per layer only n_heads_in_group (the KV groups)");
      if (a->head_dim != a0->head_dim)
        inexpressible(i, "attention.head_dim",
                      std::to_string(a->head_dim) + " where " + first_a + " has " + std::to_string(a0->head_dim) +
                          ": DeciLM has one global head_dim");
      if (a->num_kv_heads <= 0 || heads % a->num_kv_heads != 0)
        inexpressible(i, "attention.num_kv_heads", std::to_string(a->num_kv_heads) + " does not divide " + std::to_string(heads));
      if (a->qkv_bias != a0->qkv_bias || a->o_bias != a0->qkv_bias)
        inexpressible(i, "attention.qkv_bias", "DeciLM has one attention_bias for q, k, v and o in every layer (" +
                                                   first_a + ": " + (a0->qkv_bias ? "true" : "false") + ")");
      if (a->qk_norm) inexpressible(i, "attention.qk_norm", "DeciLM attention has no q/k norm");
      at["n_heads_in_group"] = heads / a->num_kv_heads;
    }
    json ff = {{"no_op", !l.mlp}, {"replace_with_linear", false}};
    if (const auto& m = l.mlp) {
      if (m->activation != MlpActivation::SwiGLU) inexpressible(i, "mlp.activation", "DeciLM MLPs are SwiGLU");
      if (m->bias != m0->bias)
        inexpressible(i, "mlp.bias", "DeciLM has one mlp_bias for every layer (" + first_m + ": " +
                                         (m0->bias ? "true" : "false") + ")");
      ff["ffn_mult"] = decilm_ffn_mult(m->ffn_size, s.hidden_size, i);
    }
    blocks.push_back({{"attention", at}, {"ffn", ff}});
  }
  c["block_configs"] = blocks;
  return c;
}

// The NemotronH attributes of one sublayer, as the config names them.
json nemotron_attrs(const LayerSpec& l, size_t i) {
  json a = json::object();
  if (const auto& m = l.mamba) {
    a = {{"mamba_num_heads", m->num_heads}, {"mamba_head_dim", m->head_dim}, {"ssm_state_size", m->state_size},
         {"n_groups", m->n_groups},         {"conv_kernel", m->conv_kernel}, {"chunk_size", m->chunk_size},
         {"use_conv_bias", m->conv_bias},   {"use_bias", m->proj_bias},      {"time_step_min", m->time_step_min},
         {"time_step_max", m->time_step_max},
         // The dt clamp; an infinite upper limit is written as 1e30 (plain JSON, read back as such).
         {"time_step_limit", {m->time_step_limit_min, std::min(m->time_step_limit_max, 1e30)}},
         {"mamba_ssm_cache_dtype", m->ssm_state_fp32 ? "float32" : "bfloat16"}};
  } else if (const auto& at = l.attention) {
    if (at->qkv_bias != at->o_bias || at->qk_norm) unwritable(i, "NemotronH attention has one attention_bias and no qk_norm");
    a = {{"num_attention_heads", at->num_heads}, {"num_key_value_heads", at->num_kv_heads},
         {"head_dim", at->head_dim}, {"attention_bias", at->qkv_bias}};
  } else if (const auto& m = l.mlp) {
    if (m->activation != MlpActivation::ReLU2) unwritable(i, "NemotronH MLPs are squared-ReLU (ungated)");
    a = {{"intermediate_size", m->ffn_size}, {"mlp_bias", m->bias}};
  } else if (const auto& m = l.moe) {
    if (m->activation != MlpActivation::ReLU2) unwritable(i, "NemotronH experts are squared-ReLU (ungated)");
    if (m->router != RouterKind::SigmoidBias) unwritable(i, "NemotronH routers are sigmoid with bias");
    a = {{"n_routed_experts", m->num_experts},
         {"num_experts_per_tok", m->top_k},
         {"moe_intermediate_size", m->expert_ffn},
         {"n_shared_experts", m->shared_ffn > 0 ? 1 : 0},
         {"moe_latent_size", m->latent_size > 0 ? json(m->latent_size) : json(nullptr)},
         {"routed_scaling_factor", m->routed_scaling},
         {"norm_topk_prob", m->norm_topk_prob},
         {"n_group", m->n_group},
         {"topk_group", m->topk_group}};
    if (m->shared_ffn > 0) a["moe_shared_expert_intermediate_size"] = m->shared_ffn;
  }
  return a;
}

// The per-block overrides a nemotron_h_puzzle block_configs entry may carry (the published
// MlpConfig and MoeConfig fields, ../shared/SEARCH.md): MLP and MoE sizes. Mamba and attention
// dimensions stay global (the schema has no per-layer Mamba heads or KV heads).
bool puzzle_block_key(char kind, const std::string& key) {
  static const char* const mlp[] = {"intermediate_size"};
  static const char* const moe[] = {"n_routed_experts",   "num_experts_per_tok",   "moe_intermediate_size",
                                    "moe_shared_expert_intermediate_size", "moe_latent_size",
                                    "routed_scaling_factor", "norm_topk_prob", "n_group", "topk_group"};
  if (kind == '-') return std::find(std::begin(mlp), std::end(mlp), key) != std::end(mlp);
  if (kind == 'E') return std::find(std::begin(moe), std::end(moe), key) != std::end(moe);
  return false;
}

// The ArchSpec field a NemotronH config attribute comes from (for error messages).
std::string nemotron_field(const std::string& key) {
  static const std::map<std::string, std::string> f = {
      {"mamba_num_heads", "mamba.num_heads"},       {"mamba_head_dim", "mamba.head_dim"},
      {"ssm_state_size", "mamba.state_size"},       {"n_groups", "mamba.n_groups"},
      {"conv_kernel", "mamba.conv_kernel"},         {"chunk_size", "mamba.chunk_size"},
      {"use_conv_bias", "mamba.conv_bias"},         {"use_bias", "mamba.proj_bias"},
      {"num_attention_heads", "attention.num_heads"}, {"num_key_value_heads", "attention.num_kv_heads"},
      {"head_dim", "attention.head_dim"},           {"attention_bias", "attention.qkv_bias"},
      {"intermediate_size", "mlp.ffn_size"},        {"mlp_bias", "mlp.bias"},
      {"n_routed_experts", "moe.num_experts"},      {"num_experts_per_tok", "moe.top_k"},
      {"moe_intermediate_size", "moe.expert_ffn"},  {"n_shared_experts", "moe.shared_ffn"},
      {"moe_shared_expert_intermediate_size", "moe.shared_ffn"}, {"moe_latent_size", "moe.latent_size"}};
  auto it = f.find(key);
  return it != f.end() ? it->second : key;
}

json write_nemotron_h(const ArchSpec& s, HfHeterogeneity how) {
  json c;
  const bool blocks = how == HfHeterogeneity::BlockConfigs;
  c["architectures"] = {blocks ? "NemotronHPuzzleForCausalLM" : "NemotronHForCausalLM"};
  c["model_type"] = blocks ? "nemotron_h_puzzle" : "nemotron_h";
  write_globals(c, s, "layer_norm_epsilon");
  c["mlp_hidden_act"] = "relu2";
  c["mamba_hidden_act"] = "silu";
  // Skipped layers are identities: they are left out, and later layers renumbered.
  std::vector<size_t> kept;
  std::string pattern;
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const std::string k = layer_kind(s.layers[i]);
    if (k == ".") continue;
    if (k.size() != 1) unwritable(i, "a NemotronH block has exactly one of M * - E, this layer is " + k);
    kept.push_back(i);
    pattern += k;
  }
  c["hybrid_override_pattern"] = pattern;
  c["num_hidden_layers"] = pattern.size();
  // Globals: the most common value of each attribute (MTP blocks included, they read them).
  std::vector<json> attrs;
  for (const auto* list : {&s.layers, &s.mtp.layers})
    for (size_t i = 0; i < list->size(); ++i) attrs.push_back(nemotron_attrs((*list)[i], i));
  const json g = mode_attrs(attrs);
  for (auto it = g.begin(); it != g.end(); ++it) c[it.key()] = it.value();
  if (c.contains("use_bias")) c["mamba_proj_bias"] = c["use_bias"];
  json per_layer = json::object(), block_list = json::array();
  for (size_t j = 0; j < kept.size(); ++j) {
    json a = nemotron_attrs(s.layers[kept[j]], kept[j]);
    json b = {{"block_type", std::string(1, pattern[j]) == "M"   ? "mamba"
                             : std::string(1, pattern[j]) == "*" ? "attention"
                             : std::string(1, pattern[j]) == "-" ? "mlp"
                                                                 : "moe"}};
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (c[it.key()] == it.value()) continue;
      if (blocks) {
        if (!puzzle_block_key(pattern[j], it.key()))
          inexpressible(kept[j], nemotron_field(it.key()),
                        it.value().dump() + " where the other layers have " + c[it.key()].dump() + " (" + it.key() +
                            "): nemotron_h_puzzle block_configs carry per-layer MLP and MoE sizes only, not " +
                            (pattern[j] == 'M' ? "Mamba" : pattern[j] == '*' ? "attention" : "this") + " fields");
        b[it.key()] = it.value();
      } else {
        per_layer[std::to_string(j)][it.key()] = it.value();
      }
    }
    block_list.push_back(b);
  }
  if (blocks) c["block_configs"] = block_list;
  else if (!per_layer.empty()) c["per_layer_config"] = finish_per_layer(per_layer, kept.size());
  if (s.mtp.num_predict_layers > 0) {
    c["num_nextn_predict_layers"] = s.mtp.num_predict_layers;
    std::string mp;
    for (size_t i = 0; i < s.mtp.layers.size(); ++i) {
      const std::string k = layer_kind(s.mtp.layers[i]);
      if (k.size() != 1 || k == ".") throw InputError("config.json", "mtp.layers[" + std::to_string(i) + "]", "not one of M * - E");
      json a = nemotron_attrs(s.mtp.layers[i], i);
      for (auto it = a.begin(); it != a.end(); ++it)
        if (c[it.key()] != it.value())
          throw InputError("config.json", "mtp.layers[" + std::to_string(i) + "]." + it.key(),
                           "MTP blocks must use the global NemotronH dimensions");
      mp += k;
    }
    c["mtp_hybrid_override_pattern"] = mp;
  }
  return c;
}

}  // namespace

ArchSpec arch_from_hf_config(const json& c, const std::string& path) {
  if (!c.is_object()) throw InputError(path, "(top level)", "expected a JSON object");
  const std::string arch = first_string(c, "architectures");
  const std::string type = first_string(c, "model_type");
  ArchSpec s;
  if (arch == "LlamaForCausalLM" || type == "llama") s = read_llama(c, path, ModelFamily::Llama);
  else if (arch == "MistralForCausalLM" || type == "mistral") s = read_llama(c, path, ModelFamily::Mistral);
  else if (arch == "Qwen2ForCausalLM" || type == "qwen2") s = read_llama(c, path, ModelFamily::Qwen2);
  else if (arch == "Qwen3ForCausalLM" || type == "qwen3") s = read_llama(c, path, ModelFamily::Qwen3);
  else if (arch == "Qwen3MoeForCausalLM" || type == "qwen3_moe") s = read_qwen3_moe(c, path);
  else if (arch == "NemotronHForCausalLM" || arch == "NemotronHPuzzleForCausalLM" || type == "nemotron_h" ||
           type == "nemotron_h_puzzle")
    s = read_nemotron_h(c, path);
  else if (arch == "DeciLMForCausalLM" || type == "nemotron-nas" || type == "deci")
    s = read_decilm(c, path);
  else
    throw InputError(path, arch.empty() ? "model_type" : "architectures",
                     "unsupported architecture \"" + (arch.empty() ? type : arch) +
                         "\" (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                         "NemotronHForCausalLM, NemotronHPuzzleForCausalLM, DeciLMForCausalLM)");
  s.name = c.contains("_name_or_path") && c["_name_or_path"].is_string() ? c["_name_or_path"].get<std::string>()
                                                                         : (arch.empty() ? type : arch);
  validate(s, path);
  return s;
}

json arch_to_hf_config(const ArchSpec& s, HfHeterogeneity how) {
  validate(s, "config.json");
  bool has_hybrid = false, has_mamba = false;
  for (const auto& l : s.layers) {
    has_hybrid = has_hybrid || l.mamba || l.moe;
    has_mamba = has_mamba || l.mamba;
  }
  using H = HfHeterogeneity;
  if (s.family == ModelFamily::Qwen3 && has_hybrid && !has_mamba) return write_qwen3_moe(s);
  if (s.family == ModelFamily::NemotronH || has_hybrid) {
    if (how != H::Auto) return write_nemotron_h(s, how);
    json plain = write_nemotron_h(s, H::PerLayerConfig);  // uniform: no per-layer overrides
    return plain.contains("per_layer_config") ? write_nemotron_h(s, H::BlockConfigs) : plain;
  }
  if (how == H::PerLayerConfig) return write_llama(s);
  if (how == H::BlockConfigs || s.family == ModelFamily::DeciLM) return write_decilm(s);
  json plain = write_llama(s);
  return plain.contains("per_layer_config") ? write_decilm(s) : plain;
}

HfHeterogeneity parse_hf_layout(const std::string& name, const std::string& what) {
  if (name == "auto") return HfHeterogeneity::Auto;
  if (name == "per-layer-config") return HfHeterogeneity::PerLayerConfig;
  if (name == "block-configs") return HfHeterogeneity::BlockConfigs;
  throw InputError("command line", what, "'" + name + "' is not auto, per-layer-config or block-configs");
}

std::string hf_layout_of(const json& config) {
  if (config.contains("block_configs")) return "block-configs";
  if (config.contains("per_layer_config")) return "per-layer-config";
  return "plain";
}

void save_hf_config(const ArchSpec& spec, const std::string& path, HfHeterogeneity how) {
  const json c = arch_to_hf_config(spec, how);
  write_file_atomic(path, c.dump(2) + "\n", "config.json");
}

}  // namespace ac::model

// ArchSpec: a heterogeneous model architecture, global dimensions plus one entry per layer.
// It is the value that flows between search/, model/, checkpoint/ and the cost model, so it
// is plain data with no torch dependency. JSON in/out, validation and parameter/FLOP counts
// are declared at the end of this file and live in arch_spec.cpp (format: docs/archspec.md).
#pragma once

#include <climits>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ac::model {

enum class MlpActivation { SwiGLU, ReLU2 };        // gated SiLU (Llama) / squared ReLU (Nemotron)
enum class RouterKind { Softmax, SigmoidBias };    // Mixtral/Qwen-MoE style / DeepSeek-V3 & Nemotron style

// Grouped-query attention with RoPE.
struct AttentionSpec {
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // key/value heads (GQA); num_heads % num_kv_heads == 0
  int head_dim = 0;
  bool qkv_bias = false;  // Qwen2 has q/k/v biases
  bool o_bias = false;
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on q and k before RoPE
};

// Mamba-2 mixer. d_inner = num_heads * head_dim (not expand * hidden).
struct MambaSpec {
  int num_heads = 0;
  int head_dim = 0;
  int state_size = 0;   // N
  int n_groups = 1;     // G; num_heads % n_groups == 0
  int conv_kernel = 4;  // K
  int chunk_size = 128;
  bool conv_bias = true;
  bool proj_bias = false;
  double time_step_min = 0.001, time_step_max = 0.1;
  double time_step_limit_min = 0.0;                 // clamp of dt after softplus
  double time_step_limit_max = 1e30;                // (inf in the reference)
  bool ssm_state_fp32 = true;  // the serving cache keeps the SSM state in fp32
  int64_t d_inner() const { return int64_t(num_heads) * head_dim; }
};

// Dense MLP. SwiGLU: gate+up [ffn, hidden], down [hidden, ffn]; ReLU2: up, down.
struct MlpSpec {
  int64_t ffn_size = 0;
  MlpActivation activation = MlpActivation::SwiGLU;
  bool bias = false;
};

// Mixture of experts, optionally latent (Nemotron 3 Super): routed experts run in a
// latent_size-wide space between fc1_latent_proj (hidden->latent) and fc2_latent_proj.
struct MoeSpec {
  int num_experts = 0;
  int top_k = 0;
  int64_t expert_ffn = 0;      // per routed expert
  int64_t shared_ffn = 0;      // shared expert(s) FFN width; 0 = none
  int64_t latent_size = 0;     // 0 = experts work at the hidden size
  RouterKind router = RouterKind::Softmax;
  double routed_scaling = 1.0;
  bool norm_topk_prob = true;
  MlpActivation activation = MlpActivation::SwiGLU;
  int n_group = 1, topk_group = 1;  // grouped routing (DeepSeek-V3 style); 1 = none
};

// One layer: an optional token mixer (attention or Mamba-2) followed by an optional
// channel mixer (dense MLP or MoE), each pre-normed with its own RMSNorm and residual.
// A Nemotron-H pattern letter is a layer with exactly one of the four; a Llama layer has
// attention + mlp; a pruned layer may have neither (skipped entirely).
struct LayerSpec {
  std::optional<AttentionSpec> attention;
  std::optional<MambaSpec> mamba;
  std::optional<MlpSpec> mlp;
  std::optional<MoeSpec> moe;
};

// Where the spec came from, so exports can write the same Hugging Face family back.
enum class ModelFamily { Llama, Qwen2, Qwen3, Mistral, NemotronH, DeciLM, Generic };

// Multi-token prediction head (Nemotron 3 Super, DeepSeek-V3): per predicted depth an
// eh_proj [hidden, 2*hidden], enorm/hnorm/final norm, and its own blocks. It shares the
// embedding and LM head. Serving normally drops it; counts report it separately.
struct MtpSpec {
  int num_predict_layers = 0;      // num_nextn_predict_layers
  std::vector<LayerSpec> layers;   // blocks of one depth (e.g. attention then MoE)
};

struct ArchSpec {
  std::string name;               // free text
  ModelFamily family = ModelFamily::Generic;
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  int64_t max_position_embeddings = 4096;
  std::string dtype = "bfloat16";  // float32 | bfloat16 | float16: the weights' storage dtype
  std::vector<LayerSpec> layers;
  MtpSpec mtp;                     // empty unless the model has MTP layers
};

// ---- JSON (docs/archspec.md) -----------------------------------------------------------
inline constexpr int kArchSpecVersion = 1;
inline constexpr const char* kArchSpecFormat = "autocompress.archspec";

// `path` only names the source in error messages. Throws ac::InputError naming the field.
ArchSpec arch_from_json(const nlohmann::json& j, const std::string& path = "<json>");
nlohmann::json arch_to_json(const ArchSpec& spec);
// Reads an ArchSpec JSON or a Hugging Face config.json (told apart by "format"/"architectures").
ArchSpec load_arch(const std::string& path);
// Writes an ArchSpec JSON atomically (temp file + rename).
void save_arch(const ArchSpec& spec, const std::string& path);

// Throws ac::InputError("<path>: layers[3].attention.num_kv_heads: ...") on the first problem,
// including sizes beyond these bounds (a hostile file must not make us allocate or overflow).
inline constexpr int64_t kMaxLayers = 4096;          // num_hidden_layers, pattern length
inline constexpr int64_t kMaxDim = int64_t(1) << 24;  // any width, count or head size
inline constexpr double kMaxParams = 1e15;            // keeps every count far from int64 overflow
void validate(const ArchSpec& spec, const std::string& path = "<arch>");

// A JSON integer as int64 in [lo, hi], or InputError(path, field, ...): no narrowing, no
// wrap-around (2^64-1 is not -1), a float only when integral and in range; out-of-range
// values are quoted as written, never as an overflowed integer.
int64_t json_integer(const nlohmann::json& v, const std::string& path, const std::string& field,
                     int64_t lo = INT32_MIN, int64_t hi = INT32_MAX);

// Names for enums as they appear in JSON.
std::string to_string(MlpActivation a);
std::string to_string(RouterKind r);
std::string to_string(ModelFamily f);
// Nemotron-H pattern letter(s) of a layer: "M", "*", "-", "E"; combinations like "*-" for a
// Llama layer; "." for a skipped layer.
std::string layer_kind(const LayerSpec& layer);

// ---- parameter counts (what transformers' num_parameters() reports; buffers such as the
// sigmoid router's e_score_correction_bias are counted apart) ------------------------------
struct LayerParams {
  int64_t norms = 0;          // one RMSNorm per present sublayer (+ q/k norms)
  int64_t attention = 0;      // q, k, v, o (+ biases)
  int64_t mamba = 0;          // in_proj, conv1d, dt_bias, A_log, D, gated norm, out_proj
  int64_t mlp = 0;
  int64_t moe_router = 0;     // gate weight
  int64_t moe_routed = 0;     // all routed experts
  int64_t moe_routed_active = 0;  // top_k of them
  int64_t moe_shared = 0;
  int64_t moe_latent = 0;     // fc1_latent_proj + fc2_latent_proj
  int64_t buffers = 0;        // e_score_correction_bias (not a parameter)
  int64_t total() const;
  int64_t active() const;     // per token: routed experts counted top_k times
};

struct ParamCounts {
  int64_t embedding = 0;
  int64_t head = 0;           // 0 when tied
  int64_t final_norm = 0;
  std::vector<LayerParams> layers;
  int64_t mtp = 0;            // all MTP depths (shares embedding and head)
  int64_t mtp_active = 0;
  int64_t total() const;      // without MTP
  int64_t active() const;     // without MTP
  int64_t total_with_mtp() const { return total() + mtp; }
};

LayerParams count_layer_params(const LayerSpec& layer, int64_t hidden);
ParamCounts count_params(const ArchSpec& spec);

// ---- FLOPs per token (multiply-add = 2 FLOPs) --------------------------------------------
// Prefill: average per token over one causal sequence of seq_len tokens (attention's score
// and value products grow with position: 2 * 2 * heads * head_dim * (seq_len + 1) / 2), LM
// head included for every token. Decode: one new token at context_len cached tokens.
struct LayerFlops {
  double dense = 0;      // projections, MLP, shared expert, router, latent projections
  double experts = 0;    // top_k routed experts
  double attention = 0;  // context-dependent score/value products
  double ssm = 0;        // Mamba conv + scan
  double total() const { return dense + experts + attention + ssm; }
};
LayerFlops layer_flops_prefill(const LayerSpec& layer, int64_t hidden, int64_t seq_len);
LayerFlops layer_flops_decode(const LayerSpec& layer, int64_t hidden, int64_t context_len);
double prefill_flops_per_token(const ArchSpec& spec, int64_t seq_len);
double decode_flops_per_token(const ArchSpec& spec, int64_t context_len);

}  // namespace ac::model

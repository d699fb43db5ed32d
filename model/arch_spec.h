// ArchSpec: a heterogeneous model architecture, global dimensions plus one entry per layer.
// It is the value that flows between search/, model/, checkpoint/ and the cost model, so it
// is plain data with no torch dependency. JSON in/out and validation live in arch_spec.cpp.
#pragma once

#include <cstdint>
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
};

}  // namespace ac::model

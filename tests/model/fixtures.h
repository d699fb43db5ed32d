// The golden fixtures made by scripts/make_model_fixtures.py, and their ArchSpecs written
// out by hand (the same dimensions as each fixture's config.json).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "model/safetensors.h"

namespace ac::model::testing {

inline std::string fixture_dir(const std::string& name) { return std::string(AC_MODEL_FIXTURES) + "/" + name; }

inline const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> n = {"llama", "qwen3", "qwen3_moe", "nemotron_h", "nemotron_h_latent"};
  return n;
}
// The fixtures whose config.json the ArchSpec readers take (all of them).
inline const std::vector<std::string>& config_fixture_names() { return fixture_names(); }

inline ArchSpec fixture_spec(const std::string& name) {
  ArchSpec s;
  s.name = name;
  s.vocab_size = 96;
  s.hidden_size = 64;
  s.dtype = "float32";
  s.max_position_embeddings = 128;
  if (name == "llama" || name == "qwen3" || name == "qwen3_moe") {
    const bool qwen = name != "llama";
    s.family = qwen ? ModelFamily::Qwen3 : ModelFamily::Llama;
    s.norm_eps = qwen ? 1e-6 : 1e-5;
    s.rope_theta = qwen ? 1e6 : 1e4;
    s.tie_embeddings = name == "qwen3";
    for (int i = 0; i < 2; ++i) {
      LayerSpec l;
      l.attention = AttentionSpec{4, 2, 16, false, false, qwen};
      if (name == "qwen3_moe") {  // softmax router, SwiGLU experts, no shared expert
        MoeSpec e;
        e.num_experts = 8;
        e.top_k = 2;
        e.expert_ffn = 32;
        e.router = RouterKind::Softmax;
        e.norm_topk_prob = false;
        e.activation = MlpActivation::SwiGLU;
        l.moe = e;
      } else {
        l.mlp = MlpSpec{96, MlpActivation::SwiGLU, false};
      }
      s.layers.push_back(l);
    }
    return s;
  }
  s.family = ModelFamily::NemotronH;
  s.norm_eps = 1e-5;
  const bool latent = name == "nemotron_h_latent";
  const std::string pattern = latent ? "ME*E" : "M*-EM-E";
  for (char c : pattern) {
    LayerSpec l;
    if (c == 'M') {
      MambaSpec m;
      m.num_heads = 8;
      m.head_dim = 8;
      m.state_size = 16;
      m.n_groups = 2;
      m.conv_kernel = 4;
      m.chunk_size = 4;
      m.time_step_limit_min = 0.001;  // transformers clamps dt below at time_step_min
      l.mamba = m;
    } else if (c == '*') {
      l.attention = AttentionSpec{4, 2, 16, false, false, false};
    } else if (c == '-') {
      l.mlp = MlpSpec{96, MlpActivation::ReLU2, false};
    } else {
      MoeSpec e;
      e.num_experts = 8;
      e.top_k = 2;
      e.expert_ffn = 32;
      e.shared_ffn = 48;
      e.latent_size = latent ? 32 : 0;
      e.router = RouterKind::SigmoidBias;
      e.routed_scaling = 2.5;
      e.norm_topk_prob = true;
      e.activation = MlpActivation::ReLU2;
      l.moe = e;
    }
    s.layers.push_back(l);
  }
  return s;
}

struct Golden {
  torch::Tensor input_ids, logits;
};
inline Golden load_golden(const std::string& name) {
  SafetensorsReader r(fixture_dir(name) + "/golden.safetensors");
  return {r.read("input_ids"), r.read("logits")};
}

}  // namespace ac::model::testing

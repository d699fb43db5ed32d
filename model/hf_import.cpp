// Hugging Face tensor naming, sliced checkpoint loading and export.
#include "model/hf_import.h"

#include <map>
#include <regex>

#include "dist/error.h"

namespace ac::model {
namespace {

bool starts(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

}  // namespace

std::string hf_tensor_name(const ArchSpec& spec, const std::string& logical) {
  static const std::regex layer_re(R"(^layers\.(\d+)\.([a-z_]+)\.(.*)$)");
  const bool nem = spec.family == ModelFamily::NemotronH;
  if (logical == "embed.weight") return nem ? "backbone.embeddings.weight" : "model.embed_tokens.weight";
  if (logical == "final_norm.weight") return nem ? "backbone.norm_f.weight" : "model.norm.weight";
  if (logical == "lm_head.weight") return "lm_head.weight";
  std::smatch m;
  if (!std::regex_match(logical, m, layer_re)) throw std::runtime_error("no Hugging Face name for " + logical);
  const std::string i = m[1], part = m[2], rest = m[3];
  if (nem) {
    const std::string p = "backbone.layers." + i + ".";
    if (part == "mixer_norm" || part == "ffn_norm") return p + "norm." + rest;
    return p + "mixer." + rest;
  }
  const std::string p = "model.layers." + i + ".";
  if (part == "mixer_norm") return p + "input_layernorm." + rest;
  if (part == "ffn_norm") return p + "post_attention_layernorm." + rest;
  if (part == "attention") return p + "self_attn." + rest;
  if (part == "mlp") return p + "mlp." + rest;
  if (part == "moe") {  // Qwen-MoE / Mixtral-style names under mlp.
    if (starts(rest, "shared_experts.")) return p + "mlp.shared_expert." + rest.substr(15);
    return p + "mlp." + rest;
  }
  return p + part + "." + rest;  // mamba layers in a Llama-named model
}

void load_hf_weights(CausalLM& model, const SafetensorsReader& reader) {
  const auto& spec = model->spec();
  auto dtype = model->embed->weight.scalar_type();
  std::map<std::string, bool> checked;
  model->load([&](const ShardPiece& p) {
    const std::string name = hf_tensor_name(spec, p.logical);
    if (!checked[name]) {
      reader.expect_shape(name, p.logical_shape);  // InputError: missing / wrong shape
      checked[name] = true;
    }
    auto want = p.logical.find("gate.weight") != std::string::npos ||
                        p.logical.find("e_score_correction_bias") != std::string::npos
                    ? torch::kFloat32  // routers stay fp32
                    : dtype;
    if (p.logical_shape.empty()) return reader.read(name, want);
    return reader.read_slice(name, p.dim, p.start, p.size, want);
  });
}

std::vector<std::pair<std::string, torch::Tensor>> hf_state_dict(CausalLM& model, torch::Dtype dtype) {
  const auto& spec = model->spec();
  if (spec.family == ModelFamily::NemotronH)
    for (size_t i = 0; i < spec.layers.size(); ++i) {
      const auto& l = spec.layers[i];
      const int n = int(bool(l.attention)) + int(bool(l.mamba)) + int(bool(l.mlp)) + int(bool(l.moe));
      if (n != 1)
        throw InputError("ArchSpec", "layers[" + std::to_string(i) + "]",
                         "a Nemotron-H checkpoint layer holds exactly one of mamba/attention/mlp/moe, this one has " +
                             std::to_string(n));
    }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [logical, t] : model->logical_tensors()) {
    const bool router = logical.find("gate.weight") != std::string::npos ||
                        logical.find("e_score_correction_bias") != std::string::npos;
    out.emplace_back(hf_tensor_name(spec, logical), t.to(router ? torch::kFloat32 : dtype).contiguous());
  }
  return out;
}

std::vector<std::string> save_hf_weights(CausalLM& model, const std::string& dir, torch::Dtype dtype,
                                         const SafetensorsWriteOptions& options) {
  return save_safetensors(dir, hf_state_dict(model, dtype), options);
}

}  // namespace ac::model

// Hugging Face config.json <-> ArchSpec. Reads LlamaForCausalLM and the Qwen2/Qwen3/Mistral
// variants, NemotronHForCausalLM (hybrid_override_pattern or layers_block_type, Mamba-2, MoE
// and latent MoE, MTP), heterogeneous students written with transformers' per_layer_config
// or block_configs (DeciLM / Nemotron-NAS, and Nemotron-H Puzzle), and writes them back.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/arch_spec.h"

namespace ac::model {

// How per-layer differences are written. Auto: DeciLM family -> DeciLM block_configs,
// everything else -> transformers' per_layer_config (only when layers differ).
enum class HfHeterogeneity { Auto, PerLayerConfig, BlockConfigs };

// `path` names the file in error messages. Unknown architectures throw ac::InputError
// naming the file and the "architectures" / "model_type" field.
ArchSpec arch_from_hf_config(const nlohmann::json& config, const std::string& path = "config.json");
nlohmann::json arch_to_hf_config(const ArchSpec& spec, HfHeterogeneity how = HfHeterogeneity::Auto);
void save_hf_config(const ArchSpec& spec, const std::string& path, HfHeterogeneity how = HfHeterogeneity::Auto);

// DeciLM's FFN width rule: round_up(int(2 * ffn_mult * hidden / 3), 256).
int64_t decilm_ffn_size(double ffn_mult, int64_t hidden);

}  // namespace ac::model

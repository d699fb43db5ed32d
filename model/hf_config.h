// Hugging Face config.json <-> ArchSpec. Reads LlamaForCausalLM and the Qwen2/Qwen3/Mistral
// variants, NemotronHForCausalLM (hybrid_override_pattern or layers_block_type, Mamba-2, MoE
// and latent MoE, MTP), heterogeneous students written with transformers' per_layer_config
// or block_configs (DeciLM / Nemotron-NAS, and Nemotron-H Puzzle), and writes them back.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/arch_spec.h"

namespace ac::model {

// How per-layer differences are written (`autocompress export --hf-layout`):
//   Auto: a uniform student -> the plain family config (LlamaForCausalLM, NemotronHForCausalLM,
//         ...); a heterogeneous Llama-family student -> DeciLM block_configs (DeciLMForCausalLM,
//         model_type nemotron-nas, what vLLM's nemotron_nas.py serves); a heterogeneous
//         Nemotron-H -> nemotron_h_puzzle block_configs (NemotronHPuzzleForCausalLM). A spec of
//         the DeciLM family is always written as DeciLM.
//   PerLayerConfig: the plain family config with transformers' per_layer_config (only when
//         layers differ).
//   BlockConfigs: DeciLM / nemotron_h_puzzle block_configs, also for uniform students.
// Qwen3-MoE is written as Qwen3MoeForCausalLM whatever the choice. A student the chosen layout
// cannot express exactly throws ac::InputError naming the layer and field
// ("config.json: layers[3].mlp.ffn_size: ...") and suggesting --hf-layout per-layer-config.
enum class HfHeterogeneity { Auto, PerLayerConfig, BlockConfigs };

// "auto" | "per-layer-config" | "block-configs"; anything else throws ac::InputError naming `what`.
HfHeterogeneity parse_hf_layout(const std::string& name, const std::string& what = "--hf-layout");
// The layout of a config.json arch_to_hf_config wrote: "block-configs" (it has block_configs),
// "per-layer-config" (it has per_layer_config) or "plain".
std::string hf_layout_of(const nlohmann::json& config);

// `path` names the file in error messages. Unknown architectures throw ac::InputError
// naming the file and the "architectures" / "model_type" field.
ArchSpec arch_from_hf_config(const nlohmann::json& config, const std::string& path = "config.json");
nlohmann::json arch_to_hf_config(const ArchSpec& spec, HfHeterogeneity how = HfHeterogeneity::Auto);
void save_hf_config(const ArchSpec& spec, const std::string& path, HfHeterogeneity how = HfHeterogeneity::Auto);

// DeciLM's FFN width rule: round_up(int(2 * ffn_mult * hidden / 3), 256).
int64_t decilm_ffn_size(double ffn_mult, int64_t hidden);

}  // namespace ac::model

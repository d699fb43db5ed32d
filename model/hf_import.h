// Hugging Face checkpoints <-> CausalLM: tensor names of LlamaForCausalLM (and the
// Qwen2/Qwen3/Mistral/DeciLM layouts that share them) and NemotronHForCausalLM
// (`backbone.*`, per-expert tensors as on the Hub), sliced loading so each TP rank reads
// only its shards, and export to safetensors.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "model/safetensors.h"

namespace ac::model {

// The checkpoint tensor name of a logical tensor ("layers.3.attention.q_proj.weight" ->
// "model.layers.3.self_attn.q_proj.weight" for Llama-style families).
std::string hf_tensor_name(const ArchSpec& spec, const std::string& logical);

// Fills `model` from a checkpoint: every local parameter is read as slices of the named
// tensors (only those bytes are touched). A missing tensor or a shape that disagrees with the
// ArchSpec throws ac::InputError naming the file and tensor. Tensors are converted to the
// model's dtype.
void load_hf_weights(CausalLM& model, const SafetensorsReader& reader);

// The model's tensors under their Hugging Face names at their full shapes (TP = 1 only),
// converted to `dtype`, in checkpoint order.
std::vector<std::pair<std::string, torch::Tensor>> hf_state_dict(CausalLM& model, torch::Dtype dtype);

// Writes hf_state_dict(model) into `dir` as safetensors (sharded with an index above
// options.max_shard_bytes). config.json is written by the ArchSpec side (hf_config).
std::vector<std::string> save_hf_weights(CausalLM& model, const std::string& dir, torch::Dtype dtype,
                                         const SafetensorsWriteOptions& options = {});

}  // namespace ac::model

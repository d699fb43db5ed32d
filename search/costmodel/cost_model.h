// Serving cost model: memory, TTFT, TPOT and throughput of an ArchSpec on a hardware profile,
// a serving engine and a workload, with a per-layer breakdown. Formulas: docs/costmodel.md;
// the same formulas over soft per-layer dimensions are in differentiable.h.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"

namespace ac::search {

struct LayerCost {
  int index = 0;
  std::string kind;  // M * - E, combinations, "." for skipped
  double params = 0, weight_bytes = 0, kv_bytes_per_token = 0, state_bytes_per_seq = 0;
  double prefill_s = 0;  // this layer's share of TTFT
  double decode_s = 0;   // this layer's share of TPOT
};

struct Prediction {
  std::string arch, hardware, engine, workload;
  double params = 0, active_params = 0;
  double weight_bytes = 0;         // all weights at the spec's dtype (+ fp32 router biases); MTP excluded
  double kv_bytes_per_token = 0;   // attention layers only, GQA-aware, at the spec's dtype
  double state_bytes_per_seq = 0;  // Mamba conv state + SSM state (fp32 where the model uses it)
  double activation_bytes = 0;     // engine profile run at max_num_batched_tokens + logits
  double reserved_bytes = 0;       // CUDA graphs + non-torch memory
  double budget_bytes = 0;         // what the engine may use on this device
  double kv_budget_bytes = 0;      // left for KV cache and Mamba state
  double bytes_per_seq = 0;        // one sequence of context_tokens (engine paging included)
  bool fits = false;
  std::string problem;             // why it does not fit / what limits it
  int64_t max_concurrency = 0;     // sequences of context_tokens that fit
  int64_t concurrency = 0;         // used for TPOT and throughput
  double ttft_s = 0, tpot_s = 0;
  double decode_tok_s = 0;         // concurrency / TPOT
  double throughput_tok_s = 0;     // output tokens/s with prefills serialized before decoding
  bool meets_ttft = true, meets_tpot = true;
  std::vector<LayerCost> layers;

  nlohmann::json to_json(bool per_layer = false) const;
  std::string table(bool per_layer = false) const;
};

Prediction predict(const model::ArchSpec& spec, const HardwareProfile& hw, const EngineProfile& engine,
                   const Workload& workload);

// One prompt of `prompt_tokens` prefilled in one chunk (the engine's chunk capped at the prompt:
// an eager engine has no fixed profile run, its activations peak at the prompt it runs), then
// `batch` sequences decoding `output_tokens` together at the mean context: the engine as
// `cost validate` measures it and as calibration's whole-model prefill points time it.
Prediction predict_prompt(const model::ArchSpec& spec, const HardwareProfile& hw, const EngineProfile& engine,
                          int64_t prompt_tokens, int64_t output_tokens, int64_t batch = 1);

}  // namespace ac::search

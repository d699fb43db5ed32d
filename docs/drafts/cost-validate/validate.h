// Validation of the cost model on this machine: builds small architectures of every kind
// with this project's own model code (model/model.h), measures prefill latency, per-token
// decode latency and the memory of weights + caches, and compares with the predictions for
// the same architectures under a calibrated profile and an eager single-sequence engine.
#pragma once

#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"

namespace ac::search {

struct ValidationCase {
  std::string name;
  model::ArchSpec spec;
};
// 24 architectures: dense, hybrid (Mamba + attention + MLP), MoE (incl. latent, shared
// expert), heterogeneous (per-layer dims, skipped layers).
std::vector<ValidationCase> validation_architectures();

struct ValidationOptions {
  int64_t prompt_tokens = 256;
  int64_t decode_steps = 8;
  std::string dtype = "bfloat16";
  int repeats = 3;  // prefill repetitions (the fastest counts)
};

struct ValidationRow {
  std::string name, kinds;
  double params = 0;
  double predicted_prefill_s = 0, measured_prefill_s = 0;
  double predicted_decode_s = 0, measured_decode_s = 0;
  double predicted_memory_bytes = 0, measured_memory_bytes = 0;
};

struct ValidationResult {
  std::vector<ValidationRow> rows;
  double mape_prefill = 0, mape_decode = 0, mape_latency = 0, mape_memory = 0;
};

// The engine the measurements correspond to: eager, one sequence, no paging, no reserves.
EngineProfile local_eager_engine(int64_t prompt_tokens);

ValidationResult validate_cost_model(const HardwareProfile& hw, const ValidationOptions& options,
                                     const std::vector<ValidationCase>& cases);

}  // namespace ac::search

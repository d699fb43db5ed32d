// The deployment scorecard (`autocompress scorecard`): candidates (checkpoints, or bare
// architectures with random weights) driven by one request set through this project's own
// serving loop (eval/generate.h generate_static_batch: batch-1 prefills, batched decode with
// the KV cache / Mamba state), measured here (TTFT, TPOT, output tokens/s, peak tensor memory)
// next to the cost model's prediction of each (cost_model.h predict) and its error.
// docs/scorecard.md.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/profiles.h"

namespace ac::eval {

struct ServingRequest {
  int64_t prompt_tokens = 0, output_tokens = 0;
};

// `count` requests of the workload's prompt and output lengths.
std::vector<ServingRequest> workload_requests(const search::Workload& w, int64_t count);
// A request file: one request per line, "PROMPT_TOKENS OUTPUT_TOKENS" (space, tab or comma
// between them; blank lines and lines starting with # skipped). An empty file, a malformed
// line or a non-positive length throws ac::InputError naming the file and line.
std::vector<ServingRequest> read_requests(const std::string& path);
// Caps every prompt / output length (0: no cap); returns how many requests were shortened.
int64_t cap_requests(std::vector<ServingRequest>& requests, int64_t max_prompt, int64_t max_output);
// The prompt token ids of each request: uniform over [0, vocab) from `seed` (the same ids for
// every candidate of one vocabulary).
std::vector<std::vector<int64_t>> request_prompts(const std::vector<ServingRequest>& requests, int64_t vocab,
                                                  uint64_t seed);

struct ArchSummary {
  int64_t params = 0, active_params = 0;  // model::count_params (MTP excluded)
  int layers = 0, attention = 0, mamba = 0, mlp = 0, moe = 0, skipped = 0;
  bool heterogeneous = false;  // sublayers of one kind with different dimensions, or skipped layers
  std::string kinds;           // the Nemotron-H pattern letters, one group per layer
};
ArchSummary summarize_arch(const model::ArchSpec& spec);

struct Candidate {
  std::string label;  // as given on the command line
  std::string path;   // the resolved checkpoint file, or the ArchSpec / config.json
  bool has_weights = false;  // false: an architecture only (random weights; timing, no quality)
  model::ArchSpec spec;
};
// A checkpoint (directory with `latest`, or .h5) or an architecture (.json: ArchSpec or
// Hugging Face config.json). Throws ac::InputError naming the argument when it is neither.
Candidate load_candidate(const std::string& arg);

struct ScorecardOptions {
  int64_t concurrency = 1;     // sequences per static batch (wave)
  int64_t context_tokens = 0;  // one sequence's context for the memory fit (0: the workload's)
  std::string dtype = "float32";  // compute dtype: "float32" | "bfloat16" | "float16" (CUDA only)
  int threads = 1;             // LibTorch intra-op threads while measuring
  uint64_t seed = 1234;        // prompt ids, random weights of architecture-only candidates
  double memory_bytes = 0;     // > 0: the device's memory as stated (replaces the profile's)
  bool warmup = true;          // one short untimed prefill + decode before the measurement
  // "cpu": process CPU time (only at 1 thread: other jobs on a shared machine do not count);
  // "wall": the wall clock; "auto": cpu at 1 thread, else wall (as `cost validate` times).
  std::string clock = "auto";
  // >= 0: measure on CUDA device `cuda_index` (the model moved there; each timestamp after a
  // device synchronize, by the wall clock; peak memory from the caching allocator's
  // allocated-bytes statistics). -1: this machine's CPU.
  int cuda_index = -1;
};
// The clock `o.clock` names at o.threads: {"process CPU time (1 thread)" | "wall clock", cpu?}.
bool scorecard_cpu_clock(const ScorecardOptions& o);

struct Percentiles {
  double p50 = 0, p90 = 0;
};

struct ScorecardRow {
  Candidate candidate;
  ArchSummary arch;
  std::string dtype, device, hardware, engine, workload;
  int64_t context_tokens = 0, concurrency = 0;
  // "ok", "does not fit" (predicted; not run), "failed" (the run threw, e.g. out of memory)
  std::string status = "ok";
  std::string note;  // why it does not fit / failed, or what limited it
  // measured (status "ok")
  int64_t requests = 0, waves = 0, output_tokens = 0;
  double seconds = 0;       // by the clock below
  double wall_seconds = 0;  // the same run by the wall clock
  std::string clock;
  Percentiles ttft_s, tpot_s, queue_s;
  double output_tok_s = 0;
  double peak_bytes = 0;  // peak live CPU tensor bytes from the loaded model on (weights included)
  // predicted
  search::Prediction prediction;
  double predicted_peak_bytes = 0;  // weights + activations + concurrency x the run's KV/state
  nlohmann::json quality;           // `eval` of the candidate (null when not asked or no weights)
  nlohmann::json to_json() const;
};

struct ScorecardInfo {
  std::vector<ServingRequest> requests;
  int64_t capped = 0;          // requests shortened by the caps
  std::string request_source;  // "workload <id>" or the request file
  int64_t max_prompt_cap = 0, max_output_cap = 0;
  int64_t workload_prompt_tokens = 0, workload_output_tokens = 0;
};

// Measures and predicts one candidate. The engine profile is used as given except that an
// engine with one sequence and chunked prefill (local-eager) is set to what the loop runs:
// max_num_seqs = concurrency, max_num_batched_tokens = the longest prompt. Every candidate is
// run with the same requests and prompt ids. Bad input throws ac::InputError; a failure of
// the run itself (out of memory) becomes a "failed" row.
ScorecardRow score_candidate(const Candidate& c, const std::vector<ServingRequest>& requests,
                             const std::vector<std::vector<int64_t>>& prompts, const search::HardwareProfile& hw,
                             const search::EngineProfile& engine, const search::Workload& workload, const ScorecardOptions& o,
                             const std::function<void(const std::string&)>& progress = nullptr);

// The workload the cost model is asked about: the request set's mean prompt and output lengths,
// the context (option or workload's, at least the longest request) and the concurrency.
search::Workload scorecard_workload(const search::Workload& w, const std::vector<ServingRequest>& requests, const ScorecardOptions& o);
search::EngineProfile scorecard_engine(search::EngineProfile e, const std::vector<ServingRequest>& requests, int64_t concurrency);

std::string scorecard_markdown(const std::vector<ScorecardRow>& rows, const ScorecardInfo& info,
                               const ScorecardOptions& o);
std::string scorecard_csv(const std::vector<ScorecardRow>& rows);
nlohmann::json scorecard_json(const std::vector<ScorecardRow>& rows, const ScorecardInfo& info,
                              const ScorecardOptions& o);

}  // namespace ac::eval

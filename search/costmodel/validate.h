// Validation of the cost model on this machine (`autocompress cost validate`): builds small
// architectures of every kind with this project's own model code (model/model.h), measures
// prefill latency, per-token decode latency and peak tensor memory, and compares them with
// the predictions for the same architectures under a calibrated hardware profile and an
// eager single-sequence engine (configs/engines/local-eager.json). docs/costmodel.md.
//
// Disjointness: `cost calibrate` fits the hardware profile on operator microbenchmarks
// (GEMMs, attention, the Mamba scan, copies, dispatch of a tiny op) and on no architecture,
// so none of these architectures was used to fit anything.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <map>
#include <string>
#include <vector>

#include "dist/tensor_memory.h"
#include "model/arch_spec.h"
#include "search/costmodel/calibrate.h"
#include "search/costmodel/profiles.h"

namespace ac::search {

struct ValidationCase {
  std::string name;
  model::ArchSpec spec;
};
// 24 architectures: dense, hybrid (Mamba + attention + MLP), MoE (incl. latent, shared
// expert), heterogeneous (per-layer dims, skipped layers). Small enough for a 2-core CPU.
std::vector<ValidationCase> validation_architectures();
// An architecture from an ArchSpec JSON or a Hugging Face config.json (a student the search or
// Minitron cut from a real teacher, or the teacher), named by the file (its stem; for
// config.json or arch.json, its folder).
ValidationCase validation_case_from_file(const std::string& path);

struct ValidationOptions {
  int64_t prompt_tokens = 256;
  int64_t decode_steps = 16;
  std::string dtype = "bfloat16";
  int repeats = 2;  // timed prefills per architecture and sweep (after one warm-up)
  int sweeps = 5;   // passes over all architectures; each time is the fastest sweep's median
  int threads = 1;  // LibTorch intra-op threads (0: leave LibTorch's setting); 1 times by CPU time
  // "cpu" or "cuda:<index>": where the models run. On CUDA, latency is the wall clock around
  // synchronized kernels and memory the caching allocator's peak of allocated bytes.
  std::string device = "cpu";
  // The serving regimes the search prices (docs/costmodel.md "Regimes"): TTFT of one prompt of
  // each length in `prompts`, and TPOT of a decode step of B sequences at once for each B in
  // `concurrency` (after a prefill of `prompt_tokens` each). The base row (one prompt of
  // `prompt_tokens`, one sequence) is always measured; values equal to it add nothing.
  std::vector<int64_t> prompts, concurrency;
};

// One architecture in one regime: "ttft p=N" (one prompt of N tokens) or "tpot B=N" (a decode
// step of N sequences; tokens/s = N / TPOT).
struct RegimeRow {
  std::string name, kinds, regime;
  int64_t prompt_tokens = 0, concurrency = 1;
  bool decode = false;
  double predicted_s = 0, measured_s = 0;
  double predicted_tok_s = 0, measured_tok_s = 0;  // decode rows: concurrency / TPOT
  int sweep = -1;  // the sweep whose median was kept
};

// Errors of a group of rows: mean absolute and mean signed relative error (predicted vs
// measured time).
struct ErrorSummary {
  std::string key;
  int rows = 0;
  double mape = 0, mean_signed = 0;
};

// One regime over the sweeps: per sweep, the geometric mean over architectures of that
// sweep's median / the prediction. A drift along a row is the machine (or the process)
// changing during the validation; each architecture's row keeps its own fastest sweep.
struct SweepRatios {
  std::string regime;
  std::vector<double> ratio;  // one per sweep
};

struct ValidationRow {
  std::string name, kinds;
  double params = 0;
  double predicted_prefill_s = 0, measured_prefill_s = 0;
  double predicted_decode_s = 0, measured_decode_s = 0;
  double predicted_memory_bytes = 0, measured_memory_bytes = 0;
  double weight_bytes = 0;  // predicted weights (part of predicted memory), for the report
  double wall_prefill_s = 0, wall_decode_s = 0;  // the same medians by the wall clock (waits for a core included)
  int prefill_sweep = -1, decode_sweep = -1;     // the sweeps whose medians were kept
  std::vector<double> prefill_samples_s, decode_samples_s;  // every timed prefill / step, in the order measured
};

struct ValidationResult {
  std::string hardware, engine;
  ValidationOptions options;
  int threads = 0;
  std::string clock;
  std::vector<ValidationRow> rows;
  double mape_prefill = 0, mape_decode = 0, mape_latency = 0, mape_memory = 0;
  // The profile's own points re-timed (SpeedReference) before every sweep and after the last:
  // time now / time at calibration near 1 means the machine runs as it did when it was
  // calibrated. speed_start / speed_end: the first and last probe.
  std::vector<std::vector<SpeedProbe>> speed_by_sweep;
  std::vector<SpeedProbe> speed_start, speed_end;
  // Every architecture in every regime (the base row's two included), and their errors per
  // regime and per layer kind (a row counts for every kind its architecture has).
  std::vector<RegimeRow> regime_rows;
  std::vector<ErrorSummary> by_regime, by_kind;
  std::vector<SweepRatios> by_sweep;  // per regime, in the order of by_regime
  // The same MAPE at the calibration's speed (speed_normalized_time; the base rows, B=1): on a
  // machine whose speed drifts during the run (a co-tenant on the host) it separates the drift
  // from the model's error; on a steady one the probes' own noise makes it the noisier figure
  // (docs/costmodel.md "The AVX2-only class, measured"). -1 without a speed reference.
  double mape_prefill_at_speed = -1, mape_decode_at_speed = -1, mape_latency_at_speed = -1;
  double speed_moved = 0;  // the largest |probe ratio - 1| of any speed probe over the run
  // Whether the rows moved with the probes: speed_tracking over the base regimes (TTFT at the
  // prompt, TPOT at B=1); -1 without a speed reference or with fewer than three sweeps. And the
  // probes' speed ratio in the sweeps the base rows kept (the geometric mean over the rows of
  // their kept sweep's ratio), per phase: near 1, the raw figure was measured at the
  // calibration's speed; 0 without a speed reference.
  double speed_tracking = -1;
  double kept_speed_prefill = 0, kept_speed_decode = 0;
  nlohmann::json to_json() const;
  std::string table() const;
  std::string regimes_table() const;  // MAPE per regime and per layer kind ("" without regimes)
  std::string speed_table() const;    // the speed reference's ratios, probe by probe
  std::string sweeps_table() const;   // by_sweep ("" with one sweep)
  std::string speed_advice() const;   // which latency figure to read ("" under three sweeps or no probes)
};

// Each sweep's speed ratio (time now / at calibration) by the reference's probes whose point
// starts with `kind` ("model_decode", "model_prefill"): the geometric mean of that sweep's probe
// before it and the one after. Empty when no probe has that kind.
std::vector<double> sweep_speed(const std::vector<std::vector<SpeedProbe>>& speed_by_sweep, const std::string& kind);

// How much of the rows' sweep-to-sweep spread is left once each sweep is divided by its speed
// ratio: the root mean square over the phases of the standard deviation over sweeps of
// log(measured / predicted / speed), over the same without the division. Near 0 the rows moved
// with the probes (the machine's drift, which the figure at the calibration's speed removes);
// near or above 1 they did not, and the division adds the probes' own noise. Each phase is a
// pair (measured / predicted per sweep, speed ratio per sweep); -1 with fewer than three sweeps
// or no spread.
double speed_tracking(const std::vector<std::pair<std::vector<double>, std::vector<double>>>& phases);

// A measured time at the calibration's speed: the median over sweeps of each sweep's median
// divided by that sweep's speed ratio (sweep index -> median; sweeps without a ratio skipped);
// 0 when none is left.
double speed_normalized_time(const std::map<int, double>& sweep_medians, const std::vector<double>& speed);

ValidationResult validate_cost_model(const HardwareProfile& hw, const EngineProfile& engine,
                                     const ValidationOptions& options, const std::vector<ValidationCase>& cases);

// The counting CPU allocator the validation measures memory with.
namespace tensor_memory = dist::tensor_memory;

}  // namespace ac::search

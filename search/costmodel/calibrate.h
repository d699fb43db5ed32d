// Calibration of a hardware profile on the local device: times GEMMs, causal attention, a
// Mamba-2 chunked scan and memory copies through LibTorch (GPU when present) and fits the
// profile's peak rates and efficiency curves to them (docs/costmodel.md).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"

namespace ac::search {

struct CalibrationOptions {
  std::string id = "cpu-local";
  std::string name;           // free text; defaults to a description of the device
  std::string device = "cpu"; // "cpu" or "cuda"
  std::string dtype = "bfloat16";  // GEMM/attention/copy dtype (the scan runs in float32)
  double memory_bytes = 0;    // device memory; the caller supplies it (the library reads no system state)
  double usable_fraction = 0.9;
  bool quick = false;         // fewer sizes (tests)
  double min_seconds = 0.05;  // time each point for at least this long (over all passes)
  // Passes over every measurement (not with `quick`), each timing each point for min_seconds /
  // passes; a point keeps its fastest pass. A shared machine (a VM's co-tenants) runs 1.3-2x
  // slower for seconds at a time; one pass per point lets such a spell decide the profile.
  int passes = 3;
  int threads = 0;            // LibTorch intra-op threads (0: leave LibTorch's setting)
  // Where the engine of the whole-model prefill points (kPrefillEngine) is read; empty: the
  // installed configs (default_configs_dir()).
  std::string configs_dir;
};

// The engine whose prediction the `model_prefill` points complete (HardwareProfile::
// PrefillStepCost): this project's eager model code, the engine that runs on a CPU.
inline constexpr const char* kPrefillEngine = "local-eager";

// The clock calibration and validation time with. On a CPU with one intra-op thread it is the
// process's CPU time (CLOCK_PROCESS_CPUTIME_ID): on a machine shared with other jobs the wall
// clock also counts the time spent waiting for a core, which says nothing about the
// hardware; with one thread, CPU time is what the wall time would be on an idle machine.
// Otherwise (GPU, several threads) it is the wall clock.
struct Stopwatch {
  bool cpu_time = false;
  static Stopwatch for_device(const std::string& device);  // reads torch::get_num_threads()
  double now() const;
  const char* name() const { return cpu_time ? "process CPU time (1 thread)" : "wall clock"; }
};

struct CalibrationPoint {
  std::string kind;   // gemm | attention | scan | memory | ... | model_decode | model_prefill
  std::string shape;  // human-readable sizes
  double flops = 0, bytes = 0, seconds = 0;
  double predicted_s = 0;  // by the fitted profile
  double rows = 0;         // GEMM rows (0: not a GEMM)
  std::vector<double> features;  // mamba_prefill / mamba_step / gemv / *_decode: the fit's features
  // gemv, *_decode (a DecoderLayer's decode step): the GEMMs it runs, {out, in, rows} each, charged
  // by the fitted one-row GEMM line; the rest of the step is fitted (HardwareProfile::DecodeStepCost).
  std::vector<std::array<double, 3>> gemms;
  // model_decode: every window's median, in the order timed (all passes); `seconds` is the least.
  std::vector<double> window_s;
};

struct CalibrationResult {
  HardwareProfile profile;
  std::vector<CalibrationPoint> points;
  double mape = 0;  // mean absolute percentage error of the fitted profile on its own points
  std::string clock;  // Stopwatch::name()
  // Wall seconds of each group of measurements over all passes, in the order they first ran
  // ("model windows" counts building the whole models and timing their windows).
  std::vector<std::pair<std::string, double>> phase_s;
  nlohmann::json to_json() const;  // the profile plus the measurements
};

CalibrationResult calibrate(const CalibrationOptions& options);

// The points of several passes over the same measurements (the same kinds and shapes in the same
// order) as one: each point with its fastest pass's time. Throws std::invalid_argument when the
// passes do not line up.
std::vector<CalibrationPoint> fastest_pass(const std::vector<std::vector<CalibrationPoint>>& passes);

// The median of `v` (the mean of the middle two for an even count; 0 when empty): the typical
// time calibration and validation keep of repeated timings.
double median(std::vector<double> v);

// The whole-model decode rest of `h` (DecodeStepCost's model_fixed, per layer, per MoE and
// Mamba layer, per weight byte; non-negative) refitted to the `model_decode` points (their
// `seconds` and `features`) as the last step of calibrate() does: what the fitted profile
// predicts for those models without it, subtracted. No-op unless `h.decode.measured`.
// bench/bench_cost_replay refits stored profiles with it.
void fit_model_decodes(HardwareProfile& h, const std::vector<CalibrationPoint>& points, const EngineProfile& engine,
                       const std::string& dtype);

// Time of one operator under a profile (the roofline of formulas.h, for reporting and tests).
// `rows`: a GEMM's rows (0: many, no matrix-vector penalty).
double roofline_seconds(const HardwareProfile& hw, const std::string& kind, double flops, double bytes, double rows = 0);

// Features of one eager Mamba-2 mixer without its projections (HardwareProfile::MambaMixerCost):
// prefill {SSD matmul FLOPs, [Q x Q] elements, per-token H P + G N elements, 1} for b
// sequences of s tokens (the chunked scan keeps B and C per group); decode step {H P N,
// H (P + N), 1} per sequence times b (the 1 once; the recurrent step expands B and C to heads).
std::vector<double> mamba_prefill_features(double b, double s, double H, double P, double N, double G, double Q);
std::vector<double> mamba_step_features(double b, double H, double P, double N);
// Features of a GEMM of a [out, in] weight over `rows` rows on the decode GEMM line
// (HardwareProfile::DecodeStepCost; formulas.h gemv_line): each gemv_* term's share alone,
// {1, bytes, out, (rows - 1) out, (rows - 1) out in, m, m out in (1 + max(rows - 8, 0) / 8)}
// with m = min(rows - 1, 1) (a call of 2 or more rows' own terms).
std::vector<double> gemv_features(double out, double in, double rows, double elem_bytes);
// A decode-step point's time by the profile's DecodeStepCost: "gemv" its GEMMs on the line; a "<kind>_decode" layer step as its GEMMs on the one-row line plus, when
// `features` are given, the sublayer's fitted rest; `elem_bytes` per weight and activation
// element (the calibration's dtype).
double decode_step_seconds(const HardwareProfile& hw, const std::string& kind, const std::vector<double>& features,
                           const std::vector<std::array<double, 3>>& gemms, double elem_bytes);
double mamba_mixer_seconds(const HardwareProfile& hw, bool step, const std::vector<double>& features);

// The model of a model_decode point (features {hidden, ffn, vocabulary, blocks, family}): one or
// two blocks of a dense, MoE or Mamba family, its weights, activations and cache in `dtype` (the
// calibration's, which the fits price it in), its step timed after kModelDecodePast cached tokens.
constexpr int64_t kModelDecodePast = 8;
model::ArchSpec model_decode_spec(const std::vector<double>& features, const std::string& dtype);

// Evicts the CPU's caches (and with them its TLBs) by streaming a buffer of max(64 MiB, 2 x the
// last-level cache) through them; nothing on a GPU. Decode of a model larger than the
// last-level cache leaves every step's weights, code and page tables cold: calibration (decode
// points) and validation (every timed forward) start each timed call from here, so they measure
// the same regime and the tiny validation models are not timed from the L3 (docs/costmodel.md,
// "Cold steps"). Not thread-safe; untimed by its callers.
void evict_cpu_caches();

// How fast this CPU runs now against a profile's own calibration: points of the profile's
// `measurements` re-timed by the code that timed them: the GEMMs at width 1024 with 512, 16
// and 1 rows (cold weights), and the speed reference proper, the smallest one-block model's
// cold decode step and cold 128-token prefill (its `model_decode` and `model_prefill` points):
// whole model steps, which on a VM slow down with its co-tenants where a GEMM may not
// (docs/costmodel.md, "Machine speed"). Points the profile does not hold are left out (none
// for GPU profiles). The spot check takes the median ratio; `cost validate` probes one
// reference before every sweep and after the last, so each measurement can be read against the
// machine's speed while it was taken. The models and weights are built once: a reference kept
// across sweeps ages in memory as the validated models do. Times by the clock of the current
// thread setting.
struct SpeedProbe {
  std::string point;  // "<kind> <shape>" as in the profile's measurements
  double calibrated_s = 0, now_s = 0;
  double ratio() const { return now_s / calibrated_s; }  // > 1: slower now
};
class SpeedReference {
 public:
  SpeedReference(const HardwareProfile& hw, const std::string& dtype);
  std::vector<SpeedProbe> probe(double gemm_seconds = 0.05);  // each GEMM timed for at least gemm_seconds
 private:
  struct State;
  std::shared_ptr<State> state_;
};
std::vector<SpeedProbe> probe_speed(const HardwareProfile& hw, const std::string& dtype, double gemm_seconds = 0.05);

}  // namespace ac::search

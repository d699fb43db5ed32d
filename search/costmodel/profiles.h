// Inputs of the serving cost model, kept as data files: hardware (configs/hardware/*.json),
// serving engine (configs/engines/*.json) and workload (configs/workloads/*.json). Formats
// are documented in docs/costmodel.md; every loader names the file and field on bad input.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <map>
#include <string>

namespace ac::search {

// Achieved fraction of peak as a function of the work in one operator (FLOPs for compute
// curves, bytes for the memory curve): eff(w) = max * w / (w + half). Small kernels are
// latency bound, large ones approach `max`.
struct EfficiencyCurve {
  double max = 1.0;
  double half = 0.0;
  double at(double work) const { return max * work / (work + half); }
};

// glibc's malloc serves requests this large (or larger) by a fresh mmap every time
// (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): no reuse of freed memory, a page fault per page.
// The CLI's CPU allocator keeps such blocks for reuse (dist/tensor_memory.h), so a profile
// calibrated by it fits fresh_bytes_s near 0; with AC_CPU_CACHE_MB=0 the term comes back.
constexpr double kFreshPagesBytes = 32.0 * 1048576;

struct HardwareProfile {
  std::string id, name, source;
  double peak_flops = 0;        // dense BF16 FLOP/s (GeForce: the FP32-accumulate rate)
  double memory_bandwidth = 0;  // bytes/s
  double memory_bytes = 0;      // device memory
  double usable_fraction = 1;   // what the serving process can have (desktop cards lose some to the display)
  double kernel_overhead_s = 0; // fixed cost per operator (launch, sync)
  double gemm_rows_half = 0;    // GEMM compute rate x rows / (rows + this): slow matrix-vector paths
  // Seconds per byte of a tensor so large (>= kFreshPagesBytes, glibc's largest mmap
  // threshold) that the allocator maps fresh pages for it at every allocation, which the kernel
  // faults in and zeroes on first touch: eager attention's [H x T x S] score tensors beyond ~1K
  // tokens. Fitted by `cost calibrate` on the attention points; 0 on GPU profiles.
  double fresh_bytes_s = 0;
  int threads = 0;              // CPU profiles: intra-op threads the rates were measured with (0: whole device)
  EfficiencyCurve gemm, attention, scan, memory;
  // Elementwise arithmetic (norms, gates, residual adds) as a fraction of memory_bandwidth;
  // profiles without it use the memory curve.
  EfficiencyCurve elementwise;
  // Measured line of the BLAS GEMM (y = x W^T, W [out, in]) an eager CPU model runs for
  // projections and experts, CPU profiles only (absent on fused-kernel devices: they use the
  // `gemm` curve and gemm_rows_half). Fitted by `cost calibrate` on GEMMs of 32-2048 rows with
  // weights of 128 x 256 to 2048 x 2048 (docs/costmodel.md "The GEMM line"):
  //   fixed + per_weight_byte x weight bytes (the weight's pass: packing, streaming)
  //         + per_flop x 2 rows in out
  // Each GEMM call pays `fixed` (an engine that splits projections pays it per matrix, a MoE per
  // matrix of every expert its tokens touch). The one-row GEMMs of a decode step have their own
  // line (DecodeStepCost).
  struct GemmLine {
    bool measured = false;
    double fixed = 0, per_weight_byte = 0, per_flop = 0;
    // `calls` GEMMs of `flops` FLOPs and `weight_bytes` weight bytes in all (X: a double, or a
    // per-layer vector of the cost formulas).
    template <typename X>
    X seconds(const X& flops, const X& weight_bytes, const X& calls) const {
      return flops * per_flop + weight_bytes * per_weight_byte + calls * fixed;
    }
  } gemm_line;
  // Measured cost of an eager Mamba-2 mixer (model::Mamba2) without its two projections (those
  // are GEMMs: the GEMM line on CPU profiles): conv, SiLU, dt/A, the SSD scan, the gated norm, the casts and
  // copies, dispatch included. Fitted by `cost calibrate` on the mixer itself at chosen sizes;
  // absent (measured = false) on profiles of fused-kernel devices, which use the `scan` curve.
  // Per layer over b sequences of s tokens, heads H, head dim P, state N, groups G, chunk Q, Lp = s
  // rounded up to whole chunks:
  //   prefill: per_flop x 2 b Lp (Q (G N + H P) + 2 H P N)   (the SSD matmuls: C.B^T per group)
  //          + per_quad x b Lp Q H                            (segsum / decay / score [Q x Q] elements)
  //          + per_lin x b Lp (H P + G N)                     (per-token tensors: conv, casts, x, y,
  //                                                            the norm, B/C per group)
  //          + fixed
  //   (profiles before the twenty-sixth session fitted H (Q (N + P) + 2 P N) and H (P + N):
  //   B and C as if repeated over heads, which the per-group SSD has not done since 73d889c)
  //   decode step: step_per_state x b H P N + step_per_lin x b H (P + N) + step_fixed
  struct MambaMixerCost {
    bool measured = false;
    double per_flop = 0, per_quad = 0, per_lin = 0, fixed = 0;
    double step_per_state = 0, step_per_lin = 0, step_fixed = 0;
  } mamba;
  // Measured cost of an eager decode step (one new token per sequence, b sequences), CPU
  // profiles only (absent on fused-kernel devices: they use the curves above). Fitted by
  // `cost calibrate` on one-row GEMMs and on the model's own DecoderLayer at chosen sizes
  // (docs/costmodel.md):
  //   GEMM of a [out, in] weight over b rows: gemv_fixed + gemv_per_byte x (weight + b (in + out)
  //     activation bytes) + gemv_per_out x out + (b - 1) (gemv_per_row_out x out +
  //     gemv_per_row_mac x out in)   (the extra rows fitted on 2-16-row GEMMs: `batched`; a
  //     profile without them charges each row gemv_per_out x out, as one-row GEMMs)
  //     + min(b - 1, 1) (gemv_multirow_fixed + gemv_multirow_per_mac x out in (1 + max(b - 8, 0) / 8)):
  //     what a call of 2 or more rows pays beyond the one-row call's path, another kernel in fp32
  //     (small_linear, one pass over the weight per 8 rows, against the one-row matrix-vector
  //     product); ~0 where one kernel serves every row count (`has_multirow`: fitted; a profile
  //     without them charges 0 and is recalibrated when cached)
  //   a sublayer's step minus its GEMMs (norm, residual, casts, RoPE, cache append, scores, routing,
  //   dispatch): attention attn_fixed + attn_per_kv x past kv_dim + attn_per_q x past q_dim;
  //   MLP mlp_fixed + mlp_per_ffn x ffn; MoE moe_fixed + moe_per_expert x touched;
  //   Mamba (on top of the `mamba` step term) mamba_fixed. Each further row of a batched step
  //   (b - 1 of them) adds attn_per_row + attn_per_row_kv x past kv_dim + attn_per_row_q x past
  //   q_dim, and mlp_per_row + mlp_per_row_ffn x ffn (fitted on 4- and 8-row sublayer steps:
  //   `has_row_rests`; a profile without them charges each row the one-row rest's per-kv, per-q
  //   and per-ffn terms again, as profiles before them did).
  //   The model's step beyond its layers and the LM head's GEMM (fitted on one- and two-block
  //   models), started from cold caches as a step of a model larger than the last-level cache
  //   is (embedding, final norm, logits, the first touches of cold code and page tables):
  //   model_fixed once per step, and model_per_layer once per sublayer: what a sublayer costs in
  //   a whole cold step beyond its price from a pool of warm-code copies (its norm weights, its
  //   cache and activations from memory). That rest per sublayer is model_per_layer for
  //   attention and MLP sublayers, model_per_moe_layer for MoE and model_per_mamba_layer for
  //   Mamba ones (fitted on one- and two-block models of each family), plus
  //   model_per_weight_byte on every weight byte a GEMM reads (a whole cold step reads its
  //   weights slower than the pooled GEMMs: ~25% on the Zen 4 VM; fitted on one-row steps,
  //   charged at any rows: docs/costmodel.md "Each further row of a batched step").
  //   `has_model_fixed` / `has_model_per_layer` / `has_model_kinds`: measured; profiles from
  //   before charge 0 and are recalibrated when cached.
  struct DecodeStepCost {
    bool measured = false;
    double gemv_fixed = 0, gemv_per_byte = 0, gemv_per_out = 0;
    double attn_fixed = 0, attn_per_kv = 0, attn_per_q = 0;
    double mlp_fixed = 0, mlp_per_ffn = 0;
    double moe_fixed = 0, moe_per_expert = 0;
    double mamba_fixed = 0;
    double gemv_per_row_out = 0, gemv_per_row_mac = 0;
    bool batched = false;  // the per-row terms were measured (2-16-row GEMMs)
    double model_fixed = 0;
    bool has_model_fixed = false;
    double model_per_layer = 0;
    bool has_model_per_layer = false;
    double model_per_moe_layer = 0, model_per_mamba_layer = 0, model_per_weight_byte = 0;
    bool has_model_kinds = false;
    double attn_per_row = 0, attn_per_row_kv = 0, attn_per_row_q = 0, mlp_per_row = 0, mlp_per_row_ffn = 0;
    bool has_row_rests = false;
    double gemv_multirow_fixed = 0, gemv_multirow_per_mac = 0;
    bool has_multirow = false;
    // Each further row's rest as charged: measured, or the one-row rest's variable terms again.
    double row_per_kv() const { return has_row_rests ? attn_per_row_kv : attn_per_kv; }
    double row_per_q() const { return has_row_rests ? attn_per_row_q : attn_per_q; }
    double row_per_ffn() const { return has_row_rests ? mlp_per_row_ffn : mlp_per_ffn; }
  } decode;
  // Measured rest of an eager prefill, CPU profiles only: what a whole model's prefill from
  // cold caches takes beyond the operators the formulas price (fitted by `cost calibrate` on
  // one- and two-block models against the local-eager engine's prediction; docs/costmodel.md
  // "Cold prefills"): per prefill chunk of s tokens at hidden size h, model_fixed +
  // model_per_element x s h. `measured` false (GPU and literature profiles, CPU profiles from
  // before it): nothing charged.
  struct PrefillStepCost {
    bool measured = false;
    double model_fixed = 0, model_per_element = 0;
  } prefill;
  // Measured MLP / expert activation, CPU profiles only: seconds per element of the [tokens x
  // ffn] intermediate that model::mlp_activation computes between the GEMMs (gated: SwiGLU,
  // SiLU in fp32 and cast back, times up; plain: squared ReLU). Fitted by `cost calibrate` on
  // the activation points (docs/costmodel.md "The MLP activation"); charged on prefill chunks
  // (a measured decode step's rest holds it already). 0 (GPU and literature profiles, CPU
  // profiles from before it): nothing charged, as a GEMM epilogue that fuses it costs nothing.
  struct ActivationCost {
    double gated_element_s = 0, plain_element_s = 0;
    bool measured() const { return gated_element_s > 0 || plain_element_s > 0; }
  } activation;
  // The profile's own calibration measurements ("kind shape" -> median seconds, from the
  // `measurements` block `cost calibrate` writes; empty for the literature GPU profiles):
  // `cost validate` re-times a few of them to say how fast this machine runs now.
  std::map<std::string, double> calibration_seconds;
  // Optional `interconnect` block (training plans, search/plan/plan.h): per-GPU bandwidth in one
  // direction within a node (NVLink) and across nodes (the GPU's NIC), the achieved fraction of
  // it for large NCCL collectives, and GPUs per node of the reference system. Absent (0) on
  // profiles without one: `plan` then gives memory but no communication times.
  struct Interconnect {
    double intra_node_bandwidth = 0;  // bytes/s per GPU per direction
    double inter_node_bandwidth = 0;  // bytes/s per GPU per direction
    double efficiency = 0.8;          // achieved fraction for large collectives
    int gpus_per_node = 0;            // 0: not stated
    std::string source;
    bool present() const { return intra_node_bandwidth > 0 && inter_node_bandwidth > 0; }
  } interconnect;
  // The machine `cost calibrate` measured (CPU model, ISA features as dist::CpuFeatures::isa(),
  // dtype): a profile belongs to the CPU that measured it. Empty in the literature GPU
  // profiles and in CPU profiles written before it was recorded (`calibrated_on` in JSON).
  // `kernels`: the build's kernel version (model::kernels_version()) the times are of; `when`:
  // UTC time of the calibration; `other_cores`: cores' worth of CPU time other processes used
  // while it ran (-1: not recorded), of `cores` (docs/costmodel.md "A busy machine").
  struct CalibratedOn {
    std::string cpu_model, isa, dtype;
    std::string kernels, when;
    double other_cores = -1;
    int cores = 0;
    bool empty() const { return cpu_model.empty() && isa.empty() && dtype.empty(); }
  } calibrated_on;
};

// How a serving engine sizes memory and batches work.
// Per-layer axes an engine profile may list: a dense MLP's width, attention heads per KV
// group, Mamba heads, routed experts, expert and shared-expert widths, routed experts per token
// (top_k), the latent width of a latent MoE, and "skip" (a no-op sublayer: attention, Mamba, MLP or MoE removed from one layer).
inline const std::vector<std::string>& engine_per_layer_axes() {
  static const std::vector<std::string> axes = {"ffn", "attn_heads", "mamba_heads", "experts", "expert_ffn", "shared_ffn", "top_k", "latent", "skip"};
  return axes;
}

struct EngineProfile {
  std::string id, name;
  // "fraction_of_total" (vLLM gpu_memory_utilization: budget = total * f, then weights,
  // activations and reserves come out of it) or "fraction_of_free" (TensorRT-LLM
  // free_gpu_memory_fraction: KV pool = f * what is free after weights and activations).
  std::string memory_policy = "fraction_of_total";
  double memory_fraction = 0.9;
  int kv_block_tokens = 16;
  bool hybrid_page_rule = false;       // vLLM: attention page enlarged to hold one Mamba state
  int64_t max_num_batched_tokens = 8192;  // prefill chunk and activation profile size
  int64_t max_num_seqs = 256;
  double cuda_graph_bytes = 0;         // reserve for captured graphs
  double non_torch_bytes = 0;          // NCCL/cuBLAS workspaces, allocator slack
  double step_overhead_s = 0;          // scheduler / sampler per engine step
  // Framework operators an eager engine dispatches besides the ones the roofline models
  // (casts, views that copy, RoPE, masks, routing bookkeeping), each costing the hardware's
  // kernel_overhead_s. Counted from the implementation (configs/engines/local-eager.json);
  // 0 for engines with fused kernels / CUDA graphs (their launch cost is step_overhead_s).
  struct ExtraOps {
    double norm = 0;                                  // per sublayer: RMSNorm + residual add
    double attention_prefill = 0, attention_decode = 0;
    double rope = 0;                                  // per attention layer with rotary embeddings
    double mamba_prefill = 0, mamba_decode = 0;       // not charged when the hardware has a
                                                      // measured `mamba` mixer cost (it includes them)
    double mlp = 0;                                   // activation ops
    double moe = 0;                                   // router + dispatch
    double moe_shared = 0;                            // with a shared expert
    double moe_expert = 0;                            // per expert touched
    double model = 0;                                 // embedding, final norm, head, per step
  } extra_ops;
  // Activation memory: "profile" = vLLM's profile run (residual + widest intermediate at
  // max_num_batched_tokens + fp32 logits); "eager" = the tensors an eager implementation
  // holds at once while prefilling max_num_batched_tokens (materialised attention scores,
  // the SSD chunk matrices in fp32, ...). docs/costmodel.md.
  std::string activations = "profile";
  // GEMMs run one per weight matrix (q, k, v; gate, up, down; each expert's) instead of fused;
  // each extra call pays the GEMM's fixed cost.
  bool split_projections = false;
  // Bytes an elementwise step (norm + residual, gating) moves relative to one fused read +
  // write: 1 for fused kernels; ~10 for the eager RMSNorm (fp32 casts, pow, mean, mul, cast back).
  double elementwise_traffic = 1;
  // Heterogeneous students this engine serves (../shared/SEARCH.md): the checkpoint format and
  // the axes it lets differ from layer to layer (kEnginePerLayerAxes). The architecture search
  // varies only these per layer; with none, the engine serves uniform models only.
  std::string heterogeneous_format;
  std::vector<std::string> per_layer_axes;
  // heterogeneous.ffn_multiple: per-layer dense FFN widths of a heterogeneous Llama-family
  // student must be multiples of this (DeciLM block_configs give a width only through
  // ffn_mult, rounded up to a multiple of 256: vLLM 256). 1 = any width. Nemotron-H Puzzle
  // MLP widths (intermediate_size) are written as they are.
  int64_t per_layer_ffn_multiple = 1;
  bool serves_per_layer(const std::string& axis) const;
};

struct Workload {
  std::string id, name;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t context_tokens = 0;  // tokens one sequence must be able to hold (>= prompt + output)
  int64_t concurrency = 1;     // concurrent sequences; 0 = as many as fit (up to max_num_seqs)
  double ttft_limit_s = 0;     // 0 = no limit
  double tpot_limit_s = 0;
};

HardwareProfile hardware_from_json(const nlohmann::json& j, const std::string& path);
nlohmann::json hardware_to_json(const HardwareProfile& h);
EngineProfile engine_from_json(const nlohmann::json& j, const std::string& path);
Workload workload_from_json(const nlohmann::json& j, const std::string& path);

// `id_or_path`: an id looked up as <configs_dir>/<kind>/<id>.json, or a path to a .json file.
// Unknown ids list the ones available.
HardwareProfile load_hardware(const std::string& id_or_path, const std::string& configs_dir);
EngineProfile load_engine(const std::string& id_or_path, const std::string& configs_dir);
Workload load_workload(const std::string& id_or_path, const std::string& configs_dir);
void save_hardware(const HardwareProfile& h, const std::string& path);  // atomic
// The source tree's configs/ when it exists (compiled in), else "configs" relative to the
// working directory.
std::string default_configs_dir();

}  // namespace ac::search

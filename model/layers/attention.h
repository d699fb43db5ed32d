// Grouped-query attention with optional RoPE, Qwen3 q/k norm, causal mask and a KV cache.
// Tensor parallel by heads: each rank owns num_heads/TP query heads and either its share of
// the KV heads or, when there are fewer KV heads than ranks, a replica of the one it needs.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "model/arch_spec.h"
#include "model/layers/common.h"
#include "model/layers/norm.h"
#include "model/layers/observer.h"

namespace ac::model {

struct KvCache {
  torch::Tensor k, v;  // [batch, local kv heads, positions so far, head_dim]
  // With capacity > 0, k and v are views of the first positions of preallocated buffers
  // [batch, local kv heads, capacity, head_dim]: a step writes its keys and values into the
  // next slots instead of concatenating (which copies the whole cache of every layer every
  // step). The buffers grow (doubling) if a sequence outlives the capacity. capacity 0: grow
  // by concatenation. Whoever replaces k / v by other tensors (stacking, selecting rows) may
  // leave the buffers stale: a buffer counts only while k is a view of it.
  torch::Tensor k_buf, v_buf;
  int64_t capacity = 0;
  bool buffered() const { return k.defined() && k_buf.defined() && k.data_ptr() == k_buf.data_ptr(); }
};

// Which attention kernel forward() uses. With LibTorch >= 2.1 the fused
// at::scaled_dot_product_attention (flash attention, no [T, S] score matrix in memory) unless
// eager math is asked for: AC_ATTENTION=eager in the environment (read once) or
// set_eager_attention(true) (tests compare the two). LibTorch 1.x has only the eager path.
bool sdpa_available();
bool eager_attention();
void set_eager_attention(bool eager);

// softmax(q k^T / sqrt(d) + causal mask) v, the attention core without projections, RoPE or
// cache: q [B, H, T, d], k and v [B, Hkv, S, d] (H a multiple of Hkv; the last T of the S
// key positions are the queries' own, the S - T before them cached). Returns [B, H, T, d].
// The kernel is the one eager_attention() selects (the cost calibration times this too).
torch::Tensor attention_core(const torch::Tensor& q, torch::Tensor k, torch::Tensor v);

class AttentionImpl : public torch::nn::Module {
 public:
  // rope_theta <= 0: no positional rotation (Nemotron-H attention layers).
  AttentionImpl(const AttentionSpec& spec, int64_t hidden, double rope_theta, double norm_eps,
                const TpGroup& tp, torch::Dtype dtype, const std::string& where);
  // x [batch, T, hidden] at absolute positions [pos0, pos0 + T). With a cache, keys and
  // values are appended to it and attention covers everything cached.
  torch::Tensor forward(const torch::Tensor& x, int64_t pos0, KvCache* cache = nullptr);
  void shard_map(const std::string& prefix, std::vector<ParamShard>& out) const;
  // Parameters whose gradients are partial sums over a subset of ranks (replicated KV).
  bool kv_replicated() const { return kv_replicated_; }
  // With replicated KV heads (KV < TP), each rank's k_proj/v_proj gradient holds only the
  // part its own query heads contributed: sums it over the ranks that hold the same KV head
  // (collective over the TP group; no-op otherwise). After it every replica has the TP = 1
  // gradient of its head.
  void reduce_replicated_kv_grads();

  // Why `spec` cannot be split over `tp` ranks ("" if it can).
  static std::string split_problem(const AttentionSpec& spec, int tp);

  Weights q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};
  ObserverSlot observe;  // sees the o_proj input (CausalLMImpl::set_observer)

 private:
  AttentionSpec spec_;
  int64_t hidden_;
  double rope_theta_;
  TpGroup tp_;
  int64_t heads_local_, kv_local_, kv_start_;
  bool kv_replicated_ = false;
  torch::Tensor inv_freq_;
};
TORCH_MODULE(Attention);

}  // namespace ac::model

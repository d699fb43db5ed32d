// An optional observer of a model's internal activations (Minitron-style importance hooks,
// search/importance). Layers call it at fixed points of their forward when one is set; with
// none set (the default) a forward does exactly what it did before, at the cost of a null
// check. No torch dependency here: tensors are passed by reference.
#pragma once

#include <cstdint>

namespace at { class Tensor; }

namespace ac::model {

// Where an activation was seen. Tensors are this rank's TP shard where the layer is sharded
// (heads, FFN neurons, Mamba heads); `[rows, C]` tensors have one row per token of the
// flattened [batch, T] input, in order.
enum class ObservePoint {
  MixerNormOut,     // [B, T, hidden]: output of the pre-mixer RMSNorm (replicated over TP)
  FfnNormOut,       // [B, T, hidden]: output of the pre-FFN RMSNorm (replicated over TP)
  AttnOProjInput,   // [B, T, local_heads * head_dim]: input of o_proj
  MlpDownInput,     // [B, T, local_ffn]: input of a dense MLP's down_proj
  MambaX,           // [B, T, local_heads * head_dim]: the x part of in_proj's output (before the conv)
  SharedDownInput,  // [rows, local_shared_ffn]: input of the shared expert's down_proj
  MoeLatent,        // [rows, latent]: output of fc1_latent_proj (replicated over TP)
  // Points only modify() sees (the masks of the architecture search, search/das/das.h):
  EmbedOut,         // [B, T, hidden]: the embedding lookup (layer -1), before the first layer
  MixerOut,         // [B, T, hidden]: the mixer's output before the residual add (replicated over TP)
  FfnOut,           // [B, T, hidden]: the MLP / MoE output before the residual add (replicated over TP)
  MambaY,           // [B, T, local_heads * head_dim]: the SSM output (with the D skip) before the gated norm
  MoeLatentOut,     // [rows, latent]: the routed experts' weighted sum before fc2_latent_proj (this rank's part)
};

class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  virtual void activation(int layer, ObservePoint point, const at::Tensor& act) = 0;
  // One routed expert (global id `expert`, held by this rank) in one forward: the rows of
  // the tokens routed to it ([n] int64), the input of its down projection [n, expert_ffn]
  // and its output times the routing weight [n, in] (what it adds to the layer's output).
  virtual void expert(int layer, int64_t expert, const at::Tensor& rows, const at::Tensor& down_input,
                      const at::Tensor& weighted_output) = 0;
  // May replace `act` (e.g. by act * mask) at AttnOProjInput, MlpDownInput, SharedDownInput,
  // MambaY, MoeLatent, MoeLatentOut, EmbedOut, MixerOut and FfnOut; the forward then continues
  // with the replacement (autograd sees it). Called after activation() where both apply. The default leaves it alone.
  virtual void modify(int /*layer*/, ObservePoint /*point*/, at::Tensor& /*act*/) {}
  // The routing of one MoE forward (EP 1). The four tensors arrive undefined; the observer may
  // set `expert_sets` [C, num_experts] (0/1 rows: sets of experts kept) with `expert_weights`
  // [C], and `slot_sets` [C', top_k] (0/1 prefixes: the first j routing slots in order of
  // preference) with `slot_weights` [C']. The layer then computes the weighted sum over (set,
  // prefix) pairs of its output with only that set's experts (the router choosing among them
  // exactly as a router without the others' rows would) and that many routed experts per token:
  // the expected output when the weights are probabilities, linear and differentiable in them
  // (search masks, search/das/das.h).
  virtual void modify_routing(int /*layer*/, at::Tensor& /*expert_sets*/, at::Tensor& /*expert_weights*/,
                              at::Tensor& /*slot_sets*/, at::Tensor& /*slot_weights*/) {}
  // May replace the input of routed expert `expert`'s down projection ([n, expert_ffn]) as
  // modify() does; called before expert().
  virtual void modify_expert(int /*layer*/, int64_t /*expert*/, at::Tensor& /*down_input*/) {}
};

// What a layer holds: the observer (null: none) and the layer index it reports.
struct ObserverSlot {
  ActivationObserver* observer = nullptr;
  int layer = -1;
};

}  // namespace ac::model

// The masked teacher (search/das/masks.h): each decision's mask is the expected prefix mask
// over its importance-ranked units; experts and top-k give the router their choices' sets.
#include "search/das/masks.h"

#include <memory>
#include <stdexcept>

#include "search/das/das.h"

namespace ac::search {

torch::Tensor prefix_matrix(const Decision& d) {
  const int64_t C = int64_t(d.choices.size()), U = int64_t(d.rank.size());
  auto r = torch::tensor(d.rank, torch::kLong).unsqueeze(0).expand({C, U});
  auto c = torch::tensor(d.choices, torch::kLong).unsqueeze(1).expand({C, U});
  return (r < c).to(torch::kFloat32);
}

void SearchMasks::modify(int layer, model::ObservePoint p, at::Tensor& x) {
  using P = model::ObservePoint;
  auto mul = [&](const torch::Tensor& m) {
    if (m.defined()) x = x * m.to(x.scalar_type());
  };
  switch (p) {
    case P::EmbedOut: mul(hidden); break;
    case P::MixerOut: mul(mixer[size_t(layer)]), mul(hidden); break;
    case P::FfnOut: mul(channel[size_t(layer)]), mul(hidden); break;
    case P::AttnOProjInput: mul(heads[size_t(layer)]); break;
    case P::MlpDownInput: mul(ffn[size_t(layer)]); break;
    case P::SharedDownInput: mul(shared[size_t(layer)]); break;
    case P::MambaY: mul(mamba_y[size_t(layer)]); break;
    case P::MoeLatent:
    case P::MoeLatentOut: mul(latent[size_t(layer)]); break;
    default: break;
  }
}

void SearchMasks::modify_routing(int layer, at::Tensor& sets, at::Tensor& weights, at::Tensor& slots, at::Tensor& slot_w) {
  sets = expert_sets[size_t(layer)], weights = expert_weights[size_t(layer)];
  slots = slot_sets[size_t(layer)], slot_w = slot_weights[size_t(layer)];
}

void SearchMasks::modify_expert(int layer, int64_t e, at::Tensor& x) {
  const auto& m = expert_ffn[size_t(layer)];
  if (m.defined()) x = x * m[e].to(x.scalar_type());
}

void SearchMasks::set(const SearchSpace& space, const std::vector<torch::Tensor>& prefix, const std::vector<torch::Tensor>& y,
                      int64_t tp_rank, int64_t tp_size, const torch::Device& dev) {
  const model::ArchSpec& t = space.teacher;
  const size_t L = t.layers.size();
  for (auto* v : {&heads, &ffn, &mixer, &channel, &expert_sets, &expert_weights, &slot_sets, &slot_weights, &expert_ffn, &shared, &mamba_y, &latent})
    v->assign(L, {});
  hidden = torch::Tensor();
  auto unit_mask = [&](int d) { return torch::matmul(y[size_t(d)].to(torch::kFloat32), prefix[size_t(d)]).to(dev); };
  // This rank's contiguous block of units split over TP (heads, FFN and shared-expert neurons).
  auto local = [&](int d) {
    const torch::Tensor m = unit_mask(d);
    const int64_t n = m.size(0) / tp_size;
    return m.narrow(0, tp_rank * n, n);
  };
  if (space.hidden >= 0) hidden = unit_mask(space.hidden);
  for (size_t l = 0; l < L; ++l) {
    if (space.attn[l] >= 0) heads[l] = local(space.attn[l]).repeat_interleave(t.layers[l].attention->head_dim);
    if (space.ffn[l] >= 0) ffn[l] = local(space.ffn[l]);
    if (space.mamba[l] >= 0) mixer[l] = y[size_t(space.mamba[l])][1].to(dev, torch::kFloat32);
    if (space.mamba_heads[l] >= 0) mamba_y[l] = local(space.mamba_heads[l]).repeat_interleave(t.layers[l].mamba->head_dim);
    if (space.moe[l] >= 0) channel[l] = y[size_t(space.moe[l])][1].to(dev, torch::kFloat32);
    // The routing takes the choices' sets with their weights (an exact expectation: a soft
    // per-expert mask would stop routing to a fading expert and so lose its gradient).
    if (space.experts[l] >= 0) {
      expert_sets[l] = prefix[size_t(space.experts[l])].to(dev);
      expert_weights[l] = y[size_t(space.experts[l])].to(dev, torch::kFloat32);
    }
    if (space.top_k[l] >= 0) {
      slot_sets[l] = prefix[size_t(space.top_k[l])].to(dev);
      slot_weights[l] = y[size_t(space.top_k[l])].to(dev, torch::kFloat32);
    }
    // Routed experts are whole on the rank that holds them: global expert ids index the masks.
    if (space.expert_ffn[l] >= 0) expert_ffn[l] = unit_mask(space.expert_ffn[l]).view({t.layers[l].moe->num_experts, -1});
    // The latent space is whole on every rank (the experts' partial sums are masked before
    // fc2_latent_proj).
    if (space.latent[l] >= 0) latent[l] = unit_mask(space.latent[l]);
    // The shared expert is split over TP like a dense MLP.
    if (space.shared_ffn[l] >= 0) shared[l] = local(space.shared_ffn[l]);
  }
}

std::unique_ptr<model::ActivationObserver> search_masks(const SearchSpace& space, const std::vector<std::vector<double>>& probs,
                                                        int tp_rank, int tp_size) {
  if (probs.size() != space.decisions.size()) throw std::invalid_argument("search_masks: one probability vector per decision");
  std::vector<torch::Tensor> prefix, y;
  for (size_t d = 0; d < probs.size(); ++d) {
    prefix.push_back(prefix_matrix(space.decisions[d]));
    y.push_back(torch::tensor(probs[d], torch::kFloat64));
  }
  auto m = std::make_unique<SearchMasks>();
  m->set(space, prefix, y, tp_rank, tp_size, torch::kCPU);
  return m;
}

}  // namespace ac::search

// The cost-only quality proxy (search/das/proxy.h; its definition: das.h quality_proxy).
#include "search/das/proxy.h"

#include <algorithm>

#include "search/costmodel/differentiable.h"
#include "search/das/das.h"

namespace ac::search {

torch::Tensor proxy_tensor(const SearchSpace& s, const std::vector<torch::Tensor>& probs, double w) {
  // The expected fraction of the teacher's value that decision d keeps (1 where held).
  auto frac = [&](int d, double teacher_value) {
    if (d < 0) return torch::ones({}, torch::kFloat64);
    return expected_value(probs[size_t(d)], torch::tensor(s.decisions[size_t(d)].choices, torch::kFloat64)) / teacher_value;
  };
  const auto& t = s.teacher;
  torch::Tensor sum = torch::zeros({}, torch::kFloat64);
  int n = 0;
  for (size_t l = 0; l < t.layers.size(); ++l) {
    const auto& L = t.layers[l];
    if (L.attention) sum = sum + frac(s.attn[l], double(L.attention->num_heads / L.attention->num_kv_heads)), ++n;
    if (L.mlp) sum = sum + frac(s.ffn[l], double(L.mlp->ffn_size)), ++n;
    if (L.mamba) sum = sum + frac(s.mamba[l], 1.0) * frac(s.mamba_heads[l], double(L.mamba->num_heads / L.mamba->n_groups)), ++n;
    if (L.moe) {
      const auto& m = *L.moe;
      const torch::Tensor routed = frac(s.expert_ffn[l], double(m.expert_ffn)) *
                                   frac(s.latent[l], double(m.latent_size)) *
                                   (w * frac(s.experts[l], double(m.num_experts)) + (1.0 - w) * frac(s.top_k[l], double(m.top_k)));
      // The shared expert's share of the layer's active FFN width in the teacher.
      const double sh = double(m.shared_ffn) / double(m.shared_ffn + int64_t(m.top_k) * m.expert_ffn);
      sum = sum + frac(s.moe[l], 1.0) * ((1.0 - sh) * routed + sh * frac(s.shared_ffn[l], double(m.shared_ffn)));
      ++n;
    }
  }
  return frac(s.hidden, double(t.hidden_size)) * sum / double(std::max(1, n));
}

double quality_proxy(const SearchSpace& space, const std::vector<std::vector<double>>& probs, double experts_weight) {
  std::vector<torch::Tensor> p;
  for (const auto& v : probs) p.push_back(torch::tensor(v, torch::kFloat64));
  return proxy_tensor(space, p, experts_weight).item<double>();
}

double pick_proxy(const SearchSpace& s, const std::vector<int>& pick, double experts_weight) {
  std::vector<std::vector<double>> onehot;
  for (size_t d = 0; d < pick.size(); ++d) {
    onehot.emplace_back(s.decisions[d].choices.size(), 0.0);
    onehot.back()[size_t(pick[d])] = 1.0;
  }
  return quality_proxy(s, onehot, experts_weight);
}

}  // namespace ac::search

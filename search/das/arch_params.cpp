// The architecture logits of the search (search/das/arch_params.h).
#include "search/das/arch_params.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

namespace ac::search {

ArchParams::ArchParams(const SearchSpace& space, size_t num_budgets) {
  const size_t D = space.decisions.size();
  offset_.assign(D + 1, 0);
  for (size_t d = 0; d < D; ++d) offset_[d + 1] = offset_[d] + int64_t(space.decisions[d].choices.size());
  const int64_t N = size();
  tp_summed_ = torch::zeros({N}, torch::kFloat64);
  for (size_t d = 0; d < D; ++d)
    if (space.decisions[d].sharded()) tp_summed_.narrow(0, offset(d), choices(d)).fill_(1.0);
  theta = torch::zeros({N}, torch::kFloat64);
  for (size_t d = 0; d < D; ++d) theta[offset_[d + 1] - 1] = 2.0;  // the teacher's choice starts at e^2 : 1
  m = torch::zeros({N}, torch::kFloat64);
  v = torch::zeros({N}, torch::kFloat64);
  lambda = torch::zeros({int64_t(num_budgets)}, torch::kFloat64);
}

ArchParams::Sample ArchParams::sample(int64_t step, uint64_t seed, double tau, double hard_prob) const {
  const int64_t N = size();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + uint64_t(step) * 7919ULL + 17ULL);
  torch::Tensor u = torch::rand({N + 1}, gen, torch::kFloat64).clamp(1e-12, 1.0 - 1e-12);
  Sample s;
  s.hard = u[N].item<double>() < hard_prob;
  torch::Tensor gumbel = -torch::log(-torch::log(u.narrow(0, 0, N)));
  s.theta = theta.clone().requires_grad_(true);
  for (size_t d = 0; d < decisions(); ++d) {
    const int64_t c = choices(d);
    torch::Tensor y = torch::softmax((s.theta.narrow(0, offset(d), c) + gumbel.narrow(0, offset(d), c)) / tau, 0);
    if (s.hard) {
      torch::Tensor h = torch::zeros_like(y);
      h[y.argmax().item<int64_t>()] = 1.0;
      y = h - y.detach() + y;
    }
    s.y.push_back(y);
  }
  return s;
}

std::vector<torch::Tensor> ArchParams::probs() const {
  std::vector<torch::Tensor> p;
  for (size_t d = 0; d < decisions(); ++d) p.push_back(torch::softmax(theta.narrow(0, offset(d), choices(d)), 0));
  return p;
}

void ArchParams::discretize(std::vector<int>& argmax, std::vector<std::vector<double>>& log_probs) const {
  argmax.assign(decisions(), 0);
  log_probs.assign(decisions(), {});
  for (size_t d = 0; d < decisions(); ++d) {
    torch::Tensor l = torch::log_softmax(theta.narrow(0, offset(d), choices(d)), 0).contiguous();
    log_probs[d].assign(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
    argmax[d] = int(l.argmax().item<int64_t>());
  }
}

double ArchParams::entropy() const {
  double entropy = 0;
  for (const auto& p : probs()) {
    const double n = double(p.numel());
    entropy += n > 1 ? -(p * (p + 1e-30).log()).sum().item<double>() / std::log(n) : 0.0;
  }
  return entropy / double(decisions());
}

void ArchParams::update(const torch::Tensor& g, double lr, double rho, const std::vector<double>& violation) {
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  ++adam_steps;
  m = beta1 * m + (1 - beta1) * g;
  v = beta2 * v + (1 - beta2) * g * g;
  const double bc1 = 1 - std::pow(beta1, double(adam_steps)), bc2 = 1 - std::pow(beta2, double(adam_steps));
  theta = theta - lr * (m / bc1) / ((v / bc2).sqrt() + eps);
  for (size_t i = 0; i < violation.size(); ++i)
    lambda[int64_t(i)] = std::max(0.0, lambda[int64_t(i)].item<double>() + rho * violation[i]);
}

std::vector<checkpoint::ShardedTensor> ArchParams::tensors(bool writer) const {
  const int64_t N = size();
  std::vector<checkpoint::ShardedTensor> t = {
      {"search/theta", {N}, {}, theta.contiguous(), writer},
      {"search/adam_m", {N}, {}, m.contiguous(), writer},
      {"search/adam_v", {N}, {}, v.contiguous(), writer},
  };
  if (lambda.numel() > 0) t.push_back({"search/lambda", {lambda.numel()}, {}, lambda.contiguous(), writer});
  return t;
}

void ArchParams::restore(checkpoint::CheckpointReader& r) {
  theta = r.read("search/theta").to(torch::kFloat64);
  m = r.read("search/adam_m").to(torch::kFloat64);
  v = r.read("search/adam_v").to(torch::kFloat64);
  if (lambda.numel() > 0) lambda = r.read("search/lambda").to(torch::kFloat64);
  step = r.step();
  adam_steps = r.attributes().at("adam_steps").get<int64_t>();
}

}  // namespace ac::search

// Evaluations per second of the exact cost model and of the differentiable one (forward +
// backward) for a 100-layer hybrid ArchSpec, against one training-step-sized GEMM timed in the
// same run: the search calls the cost model every step, so it must be a tiny fraction of that.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

#include "model/arch_spec.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/differentiable.h"

using namespace ac;
using Clock = std::chrono::steady_clock;

namespace {
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// 100 layers in the Nemotron 3 Super style: M E M E ... with an attention layer every 10.
model::ArchSpec hundred_layers() {
  model::ArchSpec s = model::load_arch(search::default_configs_dir() + "/models/nemotron-3-super.json");
  const auto mamba = *s.layers[0].mamba;
  const auto moe = *s.layers[1].moe;
  const auto attn = *s.layers[7].attention;
  s.layers.clear();
  for (int i = 0; i < 100; ++i) {
    model::LayerSpec l;
    if (i % 10 == 9) l.attention = attn;
    else if (i % 2 == 0) l.mamba = mamba;
    else l.moe = moe;
    s.layers.push_back(l);
  }
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string cfg = search::default_configs_dir();
  const model::ArchSpec spec = hundred_layers();
  const auto hw = search::load_hardware("b200", cfg);
  const auto eng = search::load_engine("vllm", cfg);
  const char* wl_id = argc > 1 ? argv[1] : "batched-serving";
  const auto wl = search::load_workload(wl_id, cfg);
  std::printf("bench_costmodel: 100-layer hybrid (%s), b200 / vllm / %s, torch threads %d\n",
              std::to_string(spec.layers.size()).c_str(), wl_id, torch::get_num_threads());

  // Baseline: one 4096-token x 4096 x 4096 fp32 GEMM (one projection of one layer of one
  // small training micro-batch).
  auto a = torch::randn({4096, 4096}), b = torch::randn({4096, 4096});
  (void)torch::matmul(a, b);
  auto t0 = Clock::now();
  const int gemm_reps = 3;
  for (int i = 0; i < gemm_reps; ++i) (void)torch::matmul(a, b);
  const double gemm_s = seconds_since(t0) / gemm_reps;

  // Exact model.
  int n = 0;
  double checksum = 0;
  t0 = Clock::now();
  while (seconds_since(t0) < 1.0) {
    checksum += search::predict(spec, hw, eng, wl).tpot_s;
    ++n;
  }
  const double exact_s = seconds_since(t0) / n;

  // Differentiable model, forward + backward through soft expert counts of every layer.
  const search::DifferentiableCostModel soft(spec, hw, eng, wl);
  auto logits = torch::zeros({100, 4}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
  const auto choices = torch::tensor({512.0, 384.0, 256.0, 128.0}, torch::kFloat64);
  int m = 0;
  t0 = Clock::now();
  while (seconds_since(t0) < 2.0) {
    search::SoftDims d;
    d.experts = search::expected_value(torch::softmax(logits, 1), choices);
    const auto c = soft(d);
    (c.tpot_s + c.ttft_s + c.weight_bytes * 1e-12).backward();
    ++m;
  }
  const double soft_s = seconds_since(t0) / m;
  std::printf("  baseline GEMM 4096^3 fp32:     %10.3f ms\n", gemm_s * 1e3);
  std::printf("  exact cost model:              %10.3f ms/eval  (%8.0f evals/s)  = %.4f x GEMM\n", exact_s * 1e3,
              1.0 / exact_s, exact_s / gemm_s);
  std::printf("  differentiable fwd+bwd:        %10.3f ms/eval  (%8.0f evals/s)  = %.4f x GEMM\n", soft_s * 1e3,
              1.0 / soft_s, soft_s / gemm_s);
  std::printf("  (checksum %.6g, grad norm %.3g)\n", checksum, logits.grad().norm().item<double>());
  return 0;
}

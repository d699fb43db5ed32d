// The differentiable cost model equals the exact one at one-hot choices, and its gradients
// reach the choice probabilities with the right signs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/arch_spec.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/differentiable.h"

using namespace ac::search;
using ac::model::ArchSpec;
using ac::model::load_arch;

namespace {
const std::string kConfigs = std::string(AC_SOURCE_DIR) + "/configs";

double rel(double a, double b) { return std::fabs(a - b) / std::max(1e-30, std::fabs(b)); }

void expect_equal(const SoftCost& s, const Prediction& p, const std::string& what) {
  EXPECT_LT(rel(s.params.item<double>(), p.params), 1e-12) << what;
  EXPECT_LT(rel(s.active_params.item<double>(), p.active_params), 1e-12) << what;
  EXPECT_LT(rel(s.weight_bytes.item<double>(), p.weight_bytes), 1e-12) << what;
  EXPECT_LT(rel(s.kv_bytes_per_token.item<double>(), p.kv_bytes_per_token + 1e-300), 1e-12) << what;
  EXPECT_LT(rel(s.state_bytes_per_seq.item<double>() + 1, p.state_bytes_per_seq + 1), 1e-12) << what;
  EXPECT_LT(rel(s.bytes_per_seq.item<double>(), p.bytes_per_seq), 1e-12) << what;
  EXPECT_LT(rel(s.kv_budget_bytes.item<double>(), p.kv_budget_bytes), 1e-12) << what;
  EXPECT_EQ(int64_t(s.max_concurrency.item<double>()), p.max_concurrency) << what;
  EXPECT_LT(rel(s.ttft_s.item<double>(), p.ttft_s), 1e-12) << what;
  EXPECT_LT(rel(s.tpot_s.item<double>(), p.tpot_s), 1e-12) << what;
  EXPECT_LT(rel(s.throughput_tok_s.item<double>(), p.throughput_tok_s), 1e-12) << what;
  ASSERT_EQ(s.layer_decode_s.numel(), int64_t(p.layers.size()));
  for (size_t i = 0; i < p.layers.size(); ++i) {
    EXPECT_LT(rel(s.layer_decode_s[i].item<double>(), p.layers[i].decode_s), 1e-12) << what << " layer " << i;
    EXPECT_LT(rel(s.layer_prefill_s[i].item<double>(), p.layers[i].prefill_s), 1e-12) << what << " layer " << i;
  }
}

// Per-layer categorical choices over {base, reduced} for every searchable dimension.
struct Choices {
  torch::Tensor logits_heads, logits_ffn, logits_experts, logits_mamba, logits_keep;
};
}  // namespace

TEST(DifferentiableCost, EqualsExactModelAtOneHotChoices) {
  const ArchSpec base = load_arch(kConfigs + "/models/nemotron-3-super.json");
  const int64_t L = int64_t(base.layers.size());
  auto hw = load_hardware("b200", kConfigs);
  auto e = load_engine("vllm", kConfigs);
  for (const char* wl : {"long-context-128k", "batched-serving", "in-game"}) {
    auto w = load_workload(wl, kConfigs);
    const DifferentiableCostModel soft(base, hw, e, w);
    // Choice 1 of each: experts 512 -> 256, Mamba heads 128 -> 96, KV heads 2 -> 1, every
    // 4th layer dropped; choice 0 keeps the base. One-hot at a random mix of both.
    torch::manual_seed(3);
    const torch::Tensor pick = torch::randint(0, 2, {L, 4}, torch::kLong);
    ArchSpec exact = base;
    auto onehot = [&](int col) { return torch::one_hot(pick.select(1, col), 2).to(torch::kFloat64); };
    SoftDims d;
    d.experts = expected_value(onehot(0), torch::tensor({512.0, 256.0}, torch::kFloat64));
    d.mamba_heads = expected_value(onehot(1), torch::tensor({128.0, 96.0}, torch::kFloat64));
    d.kv_heads = expected_value(onehot(2), torch::tensor({2.0, 1.0}, torch::kFloat64));
    d.keep = expected_value(onehot(3), torch::tensor({1.0, 0.0}, torch::kFloat64));
    for (int64_t i = 0; i < L; ++i) {
      auto& l = exact.layers[size_t(i)];
      if (l.moe && pick[i][0].item<int64_t>()) l.moe->num_experts = 256;
      if (l.mamba && pick[i][1].item<int64_t>()) l.mamba->num_heads = 96;
      if (l.attention && pick[i][2].item<int64_t>()) l.attention->num_kv_heads = 1;
      if (pick[i][3].item<int64_t>()) l = ac::model::LayerSpec{};
    }
    const Prediction p = predict(exact, hw, e, w);
    expect_equal(soft(d), p, wl);
    // Undefined soft dims give the base model itself.
    expect_equal(soft(SoftDims{}), predict(base, hw, e, w), std::string(wl) + " (base)");
  }
}

TEST(DifferentiableCost, DenseModelAndTrtllmAlsoMatch) {
  ArchSpec base = load_arch(kConfigs + "/models/llama-3-8b.json");
  const int64_t L = int64_t(base.layers.size());
  auto hw = load_hardware("rtx5090", kConfigs);
  auto e = load_engine("trtllm", kConfigs);
  auto w = load_workload("long-context-coding", kConfigs);
  const DifferentiableCostModel soft(base, hw, e, w);
  SoftDims d;
  torch::Tensor ffn = torch::full({L}, 14336.0, torch::kFloat64);
  ffn.index_put_({torch::indexing::Slice(0, 8)}, 9216.0);
  d.ffn = ffn;
  for (int i = 0; i < 8; ++i) base.layers[size_t(i)].mlp->ffn_size = 9216;
  expect_equal(soft(d), predict(base, hw, e, w), "llama");
}

// The eager engine's extra operators and live-tensor activation estimate go through the same
// template: equal at one-hot choices too (hybrid with MoE, RoPE-less; dense with RoPE).
TEST(DifferentiableCost, EagerEngineTermsAlsoMatch) {
  auto hw = load_hardware("b200", kConfigs);
  hw.kernel_overhead_s = 4e-6;
  auto e = load_engine("local-eager", kConfigs);
  ASSERT_EQ(e.activations, "eager");
  ASSERT_GT(e.extra_ops.mamba_prefill, 0);
  e.max_num_batched_tokens = 512;
  auto w = load_workload("in-game", kConfigs);
  const ArchSpec base = load_arch(kConfigs + "/models/nemotron-3-super.json");
  const int64_t L = int64_t(base.layers.size());
  const DifferentiableCostModel soft(base, hw, e, w);
  torch::manual_seed(5);
  const torch::Tensor pick = torch::randint(0, 2, {L, 3}, torch::kLong);
  auto onehot = [&](int col) { return torch::one_hot(pick.select(1, col), 2).to(torch::kFloat64); };
  SoftDims d;
  d.experts = expected_value(onehot(0), torch::tensor({512.0, 256.0}, torch::kFloat64));
  d.kv_heads = expected_value(onehot(1), torch::tensor({2.0, 1.0}, torch::kFloat64));
  d.keep = expected_value(onehot(2), torch::tensor({1.0, 0.0}, torch::kFloat64));
  ArchSpec exact = base;
  for (int64_t i = 0; i < L; ++i) {
    auto& l = exact.layers[size_t(i)];
    if (l.moe && pick[i][0].item<int64_t>()) l.moe->num_experts = 256;
    if (l.attention && pick[i][1].item<int64_t>()) l.attention->num_kv_heads = 1;
    if (pick[i][2].item<int64_t>()) l = ac::model::LayerSpec{};
  }
  const Prediction p = predict(exact, hw, e, w);
  expect_equal(soft(d), p, "super eager");
  EXPECT_NEAR(soft(d).activation_bytes.item<double>(), p.activation_bytes, 1e-9 * p.activation_bytes);
  ArchSpec llama = load_arch(kConfigs + "/models/llama-3-8b.json");
  const DifferentiableCostModel soft_llama(llama, hw, e, w);
  expect_equal(soft_llama(SoftDims{}), predict(llama, hw, e, w), "llama eager");
  // With a measured Mamba mixer cost (a calibrated CPU profile) the Mamba terms go through the
  // same template too, with soft Mamba head counts (halved where picked).
  auto hw_m = hw;
  hw_m.mamba = {true, 2e-11, 5e-9, 1.6e-8, 2e-4, 9e-10, 8e-8, 1.6e-4};
  const torch::Tensor pick_m = torch::randint(0, 2, {L}, torch::kLong);
  SoftDims dm = d;
  std::vector<double> heads_a(size_t(L), 1.0), heads_b(size_t(L), 1.0);
  ArchSpec exact_m = exact;
  for (int64_t i = 0; i < L; ++i)
    if (const auto& m = base.layers[size_t(i)].mamba) {
      heads_a[size_t(i)] = m->num_heads, heads_b[size_t(i)] = m->num_heads / 2;
      auto& em = exact_m.layers[size_t(i)].mamba;
      if (em && pick_m[i].item<int64_t>()) em->num_heads = m->num_heads / 2;
    }
  const torch::Tensor oh = torch::one_hot(pick_m, 2).to(torch::kFloat64);
  dm.mamba_heads = oh.select(1, 0) * torch::tensor(heads_a, torch::kFloat64) +
                   oh.select(1, 1) * torch::tensor(heads_b, torch::kFloat64);
  const DifferentiableCostModel soft_m(base, hw_m, e, w);
  expect_equal(soft_m(dm), predict(exact_m, hw_m, e, w), "super eager, measured Mamba mixer");
  EXPECT_NE(predict(exact_m, hw_m, e, w).ttft_s, predict(exact_m, hw, e, w).ttft_s);
  // With a measured GEMM line (a calibrated CPU profile) the prefill's GEMMs, the routed experts
  // (soft expert counts) and the LM head go through the same template: equal at one-hot choices,
  // and it changes TTFT.
  auto hw_g = hw_m;
  hw_g.gemm_line = {true, 1.6e-5, 1e-10, 4.5e-12};
  const DifferentiableCostModel soft_g(base, hw_g, e, w);
  expect_equal(soft_g(dm), predict(exact_m, hw_g, e, w), "super eager, GEMM line");
  EXPECT_NE(predict(exact_m, hw_g, e, w).ttft_s, predict(exact_m, hw_m, e, w).ttft_s);
  // With a measured decode step too (one-row GEMM line and per-sublayer rests), decode goes
  // through the same template: equal at one-hot choices, and it changes TPOT.
  auto hw_d = hw_m;
  hw_d.decode = {true, 2e-5, 9e-11, 3e-8, 1.2e-4, 1.7e-10, 7e-10, 2.7e-5, 8.8e-9, 1e-5, 2.4e-5, 2.1e-5};
  const DifferentiableCostModel soft_d(base, hw_d, e, w);
  expect_equal(soft_d(dm), predict(exact_m, hw_d, e, w), "super eager, measured decode step");
  EXPECT_NE(predict(exact_m, hw_d, e, w).tpot_s, predict(exact_m, hw_m, e, w).tpot_s);
  EXPECT_EQ(predict(exact_m, hw_d, e, w).ttft_s, predict(exact_m, hw_m, e, w).ttft_s);  // prefill unchanged
  const DifferentiableCostModel soft_llama_d(llama, hw_d, e, w);
  expect_equal(soft_llama_d(SoftDims{}), predict(llama, hw_d, e, w), "llama eager, measured decode step");
  // A batched decode (8 sequences) with the line's measured per-row terms: equal at one-hot
  // choices, and cheaper than a profile without them (every row charged gemv_per_out x out, as
  // profiles fitted on one-row GEMMs are read) when an extra row costs less per output.
  auto hw_b = hw_d;
  hw_b.decode.gemv_per_row_out = 4e-9, hw_b.decode.gemv_per_row_mac = 2e-12, hw_b.decode.batched = true;
  hw_d.decode.gemv_per_row_out = hw_d.decode.gemv_per_out;
  auto w8 = w;
  w8.concurrency = 8;
  auto e8 = e;
  e8.max_num_seqs = 8;
  const DifferentiableCostModel soft_b(base, hw_b, e8, w8);
  expect_equal(soft_b(dm), predict(exact_m, hw_b, e8, w8), "super eager, batched decode");
  EXPECT_LT(predict(llama, hw_b, e8, w8).tpot_s, predict(llama, hw_d, e8, w8).tpot_s);
  EXPECT_GT(predict(llama, hw_b, e8, w8).tpot_s, predict(llama, hw_b, e, w).tpot_s);  // 8 rows cost more than 1
  // The extra operators cost time: the same spec is slower on the eager engine than without them.
  auto plain = e;
  plain.extra_ops = {};
  EXPECT_GT(predict(llama, hw, e, w).tpot_s, predict(llama, hw, plain, w).tpot_s);
}

TEST(DifferentiableCost, GradientsReachChoiceProbabilities) {
  const ArchSpec base = load_arch(kConfigs + "/models/nemotron-3-super.json");
  const int64_t L = int64_t(base.layers.size());
  const DifferentiableCostModel soft(base, load_hardware("b200", kConfigs), load_engine("vllm", kConfigs),
                                     load_workload("batched-serving", kConfigs));
  torch::Tensor logits = torch::zeros({L, 2}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
  SoftDims d;
  d.experts = expected_value(torch::softmax(logits, 1), torch::tensor({512.0, 128.0}, torch::kFloat64));
  const SoftCost c = soft(d);
  // Weights fall as probability moves to 128 experts: dW/dlogit[:,1] < 0 on MoE layers, 0 elsewhere.
  c.weight_bytes.backward();
  const torch::Tensor g = logits.grad();
  for (int64_t i = 0; i < L; ++i) {
    if (base.layers[size_t(i)].moe) {
      EXPECT_LT(g[i][1].item<double>(), 0) << i;
    } else {
      EXPECT_EQ(g[i][1].item<double>(), 0) << i;
    }
  }
  // TPOT is differentiable too (through the experts touched and, at this workload, the
  // concurrency that fits), and finite.
  logits.grad().zero_();
  d.experts = expected_value(torch::softmax(logits, 1), torch::tensor({512.0, 128.0}, torch::kFloat64));
  const SoftCost c2 = soft(d);
  c2.tpot_s.backward();
  EXPECT_TRUE(torch::isfinite(logits.grad()).all().item<bool>());
  EXPECT_GT(logits.grad().abs().sum().item<double>(), 0);
}

// Several hidden widths at once ([widths, layers]): row i equals the one-width model of the
// spec at that width, values and gradients, on soft (not one-hot) dims; for a dense model on
// vLLM, a hybrid MoE model with the hybrid page rule, and the eager engine with measured
// decode and Mamba costs.
TEST(DifferentiableCost, BatchedHiddenWidthsEqualOneModelPerWidth) {
  auto hw_d = load_hardware("b200", kConfigs);
  hw_d.mamba = {true, 2e-11, 5e-9, 1.6e-8, 2e-4, 9e-10, 8e-8, 1.6e-4};
  hw_d.decode = {true, 2e-5, 9e-11, 3e-8, 1.2e-4, 1.7e-10, 7e-10, 2.7e-5, 8.8e-9, 1e-5, 2.4e-5, 2.1e-5};
  struct Case {
    std::string arch, engine, workload;
    HardwareProfile hw;
  };
  const std::vector<Case> cases = {
      {"llama-3-8b", "vllm", "batched-serving", load_hardware("h100", kConfigs)},
      {"nemotron-3-super", "vllm", "long-context-128k", load_hardware("b200", kConfigs)},
      {"nemotron-3-super", "local-eager", "in-game", hw_d},
  };
  for (const auto& c : cases) {
    const ArchSpec base = load_arch(kConfigs + "/models/" + c.arch + ".json");
    const auto e = load_engine(c.engine, kConfigs);
    const auto w = load_workload(c.workload, kConfigs);
    const int64_t L = int64_t(base.layers.size()), h = base.hidden_size;
    const std::vector<int64_t> widths = {h, h / 2, h / 4};
    const DifferentiableCostModel batched(base, c.hw, e, w, widths);
    ASSERT_EQ(batched.num_widths(), 3);
    torch::manual_seed(3);
    const torch::Tensor u = torch::rand({L}, torch::kFloat64);
    auto soft = [&](const torch::Tensor& x) {
      SoftDims d;
      d.keep = 0.5 + 0.5 * x;
      d.heads = d.kv_heads = torch::ones({L}, torch::kFloat64);  // overwritten below where attention
      std::vector<double> heads(size_t(L), 1.0), experts(size_t(L), 1.0);
      for (int64_t i = 0; i < L; ++i) {
        if (const auto& a = base.layers[size_t(i)].attention) heads[size_t(i)] = a->num_heads;
        if (const auto& m = base.layers[size_t(i)].moe) experts[size_t(i)] = m->num_experts;
      }
      d.heads = torch::tensor(heads, torch::kFloat64) * (0.6 + 0.4 * x);
      d.kv_heads = torch::Tensor();
      d.experts = torch::tensor(experts, torch::kFloat64) * (0.5 + 0.5 * x);
      return d;
    };
    torch::Tensor xb = u.clone().requires_grad_(true);
    const SoftCost b = batched(soft(xb));
    ASSERT_EQ(b.tpot_s.sizes(), torch::IntArrayRef({3}));
    ASSERT_EQ(b.layer_decode_s.sizes(), torch::IntArrayRef({3, L}));
    const torch::Tensor mix = torch::tensor({0.2, 0.5, 0.3}, torch::kFloat64);
    (mix * (b.tpot_s + b.ttft_s + 1e-12 * (b.weight_bytes + b.bytes_per_seq))).sum().backward();
    torch::Tensor grad_single = torch::zeros({L}, torch::kFloat64);
    for (size_t i = 0; i < widths.size(); ++i) {
      ArchSpec a = base;
      a.hidden_size = widths[i];
      const DifferentiableCostModel one(a, c.hw, e, w);
      torch::Tensor xs = u.clone().requires_grad_(true);
      const SoftCost s = one(soft(xs));
      const std::string what = c.arch + " " + c.engine + " " + c.workload + " hidden " + std::to_string(widths[i]);
      const int64_t r = int64_t(i);
      for (auto [x, y] : {std::pair{b.params, s.params}, {b.active_params, s.active_params}, {b.weight_bytes, s.weight_bytes},
                          {b.activation_bytes, s.activation_bytes}, {b.bytes_per_seq, s.bytes_per_seq},
                          {b.max_concurrency, s.max_concurrency}, {b.ttft_s, s.ttft_s}, {b.tpot_s, s.tpot_s},
                          {b.throughput_tok_s, s.throughput_tok_s}})
        EXPECT_LT(rel(x[r].item<double>(), y.item<double>()), 1e-12) << what;
      EXPECT_LT((b.layer_decode_s[r] - s.layer_decode_s).abs().max().item<double>(), 1e-12 * s.tpot_s.item<double>()) << what;
      EXPECT_LT((b.layer_prefill_s[r] - s.layer_prefill_s).abs().max().item<double>(), 1e-12 * s.ttft_s.item<double>()) << what;
      (mix[r] * (s.tpot_s + s.ttft_s + 1e-12 * (s.weight_bytes + s.bytes_per_seq))).backward();
      grad_single += xs.grad();
    }
    EXPECT_LT((xb.grad() - grad_single).abs().max().item<double>(), 1e-9 * grad_single.abs().max().item<double>() + 1e-300)
        << c.arch << " " << c.engine;
    EXPECT_GT(grad_single.abs().max().item<double>(), 0.0) << c.arch;
  }
}

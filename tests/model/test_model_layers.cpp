// Layer-level properties: the chunked SSD scan equals the step recurrence, decoding with
// caches equals the full forward, impossible TP layouts are refused with the reason.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/error.h"
#include "eval/generate.h"
#include "model/hf_import.h"
#include "model/layers/attention.h"
#include "model/layers/common.h"
#include "model/layers/small_gemm.h"
#include "tests/model/fixtures.h"

using namespace ac::model;
using namespace ac::model::testing;
using namespace ac::eval;  // generate, generate_static_batch (eval/generate.h)

// The layers' SiLU (fp32 kernels for bf16/fp16 on LibTorch 1.x): forward and gradient are the
// fp32 SiLU's, rounded once to the input dtype, in and out of grad mode; fp32 is torch::silu.
TEST(ActSilu, MatchesFp32SiluRoundedOnce) {
  torch::manual_seed(3);
  for (auto dt : {torch::kBFloat16, torch::kHalf}) {
    auto x = (torch::randn({3, 37, 129}) * 4).to(dt).requires_grad_();
    auto g = torch::randn({3, 37, 129}).to(dt);
    auto y = ac::model::act_silu(x);
    EXPECT_EQ(y.scalar_type(), dt);
    auto xf = x.detach().to(torch::kFloat32).requires_grad_();
    auto yf = torch::silu(xf);
    EXPECT_TRUE(torch::equal(y.detach(), yf.detach().to(dt)));
    y.backward(g);
    yf.backward(g.to(torch::kFloat32));
    EXPECT_TRUE(torch::equal(x.grad(), xf.grad().to(dt))) << (x.grad().to(torch::kFloat32) - xf.grad()).abs().max();
    torch::NoGradGuard ng;
    EXPECT_TRUE(torch::equal(ac::model::act_silu(x), yf.detach().to(dt)));
  }
  auto x32 = torch::randn({5, 7});
  EXPECT_TRUE(torch::equal(ac::model::act_silu(x32), torch::silu(x32)));
}

TEST(Mamba2, ChunkedScanEqualsRecurrence) {
  torch::manual_seed(7);
  const int64_t b = 2, L = 13, H = 4, P = 3, G = 2, N = 5;
  auto x = torch::randn({b, L, H, P});
  auto dt = torch::nn::functional::softplus(torch::randn({b, L, H}));
  auto A = -torch::rand({H}) - 0.1;
  auto B = torch::randn({b, L, G, N});
  auto C = torch::randn({b, L, G, N});
  auto D = torch::randn({H});
  auto h0 = torch::randn({b, H, P, N});
  for (int64_t chunk : {1, 4, 5, 16}) {
    for (bool with_init : {false, true}) {
      auto init = with_init ? h0 : torch::Tensor();
      auto [yc, sc] = ssd_chunked_scan(x, dt, A, B, C, D, chunk, init);
      auto [yr, sr] = ssd_recurrent_scan(x, dt, A, B, C, D, init);
      EXPECT_LE((yc - yr).abs().max().item<double>(), 1e-4) << "chunk " << chunk;
      EXPECT_LE((sc - sr).abs().max().item<double>(), 1e-4) << "chunk " << chunk;
    }
  }
  // The state matters: a different initial state changes the output.
  auto [y0, s0] = ssd_recurrent_scan(x, dt, A, B, C, D, torch::Tensor());
  auto [y1, s1] = ssd_recurrent_scan(x, dt, A, B, C, D, h0);
  EXPECT_GT((y0 - y1).abs().max().item<double>(), 1e-3);
}

// The chunked form's backward (what training runs) equals the recurrence's, for inputs, dt,
// A, B, C, D and the initial state, with and without padding of the last chunk.
TEST(Mamba2, ChunkedScanGradientsEqualRecurrence) {
  torch::manual_seed(11);
  const int64_t b = 2, L = 13, H = 4, P = 3, G = 2, N = 5;
  auto leaf = [](torch::Tensor t) { return t.detach().requires_grad_(); };
  auto x = leaf(torch::randn({b, L, H, P}));
  auto dt = leaf(torch::nn::functional::softplus(torch::randn({b, L, H})));
  auto A = leaf(-torch::rand({H}) - 0.1);
  auto B = leaf(torch::randn({b, L, G, N}));
  auto C = leaf(torch::randn({b, L, G, N}));
  auto D = leaf(torch::randn({H}));
  auto h0 = leaf(torch::randn({b, H, P, N}));
  auto wy = torch::randn({b, L, H, P}), ws = torch::randn({b, H, P, N});
  std::vector<torch::Tensor> inputs = {x, dt, A, B, C, D, h0};
  auto grads = [&](bool chunked, int64_t chunk) {
    auto [y, s] = chunked ? ssd_chunked_scan(x, dt, A, B, C, D, chunk, h0) : ssd_recurrent_scan(x, dt, A, B, C, D, h0);
    return torch::autograd::grad({(y * wy).sum() + (s * ws).sum()}, inputs);
  };
  auto ref = grads(false, 0);
  const char* names[] = {"x", "dt", "A", "B", "C", "D", "initial"};
  for (int64_t chunk : {4, 13, 16}) {
    auto got = grads(true, chunk);
    for (size_t i = 0; i < ref.size(); ++i) {
      const double scale = std::max(1.0, ref[i].abs().max().item<double>());
      EXPECT_LE((got[i] - ref[i]).abs().max().item<double>(), 1e-4 * scale) << names[i] << " chunk " << chunk;
    }
  }
}

// Strong decay (|sum of A dt| over a chunk in the hundreds): no inf/NaN, still the recurrence.
TEST(Mamba2, ChunkedScanStrongDecay) {
  torch::manual_seed(5);
  const int64_t b = 1, L = 40, H = 2, P = 2, G = 1, N = 3;
  auto x = torch::randn({b, L, H, P});
  auto dt = torch::nn::functional::softplus(torch::randn({b, L, H})) + 2.0;
  auto A = torch::tensor({-8.0f, -0.01f});
  auto B = torch::randn({b, L, G, N}), C = torch::randn({b, L, G, N});
  auto [yc, sc] = ssd_chunked_scan(x, dt, A, B, C, torch::Tensor(), 32, torch::Tensor());
  auto [yr, sr] = ssd_recurrent_scan(x, dt, A, B, C, torch::Tensor(), torch::Tensor());
  EXPECT_TRUE(torch::isfinite(yc).all().item<bool>());
  EXPECT_LE((yc - yr).abs().max().item<double>(), 1e-4 * std::max(1.0, yr.abs().max().item<double>()));
  EXPECT_LE((sc - sr).abs().max().item<double>(), 1e-4 * std::max(1.0, sr.abs().max().item<double>()));
}

class Decode_ : public ::testing::TestWithParam<std::string> {};

TEST_P(Decode_, CachedDecodeEqualsFullForward) {
  const auto name = GetParam();
  CausalLM model(fixture_spec(name));
  load_hf_weights(model, SafetensorsReader(fixture_dir(name)));
  auto ids = load_golden(name).input_ids;
  torch::NoGradGuard ng;
  auto full = model->forward(ids);
  const int64_t T = ids.size(1);
  // KV cache grown by concatenation (capacity 0), preallocated for every position (T), and
  // preallocated too small (6: the buffers grow during the steps).
  for (int64_t capacity : {int64_t(0), T, int64_t(6)}) {
    // Prefill 5, a 3-token continuation (chunked scan from a state), then single-token steps.
    auto cache = model->new_cache(capacity);
    std::vector<torch::Tensor> parts;
    parts.push_back(model->forward(ids.narrow(1, 0, 5), &cache));
    parts.push_back(model->forward(ids.narrow(1, 5, 3), &cache));
    for (int64_t t = 8; t < T; ++t) parts.push_back(model->forward(ids.narrow(1, t, 1), &cache));
    EXPECT_EQ(cache.position, T);
    for (const auto& l : cache.layers) {
      if (!l.kv.k.defined()) continue;  // not an attention layer
      EXPECT_EQ(l.kv.k.size(2), T) << name << " capacity " << capacity;
      EXPECT_EQ(l.kv.buffered(), capacity > 0) << name << " capacity " << capacity;
      if (capacity > 0) EXPECT_GE(l.kv.k_buf.size(2), T);
    }
    auto stepped = torch::cat(parts, 1);
    EXPECT_LE((stepped - full).abs().max().item<double>(), 1e-4) << name << " capacity " << capacity;
  }
}

// Greedy decoding through the preallocated cache (generate: capacity = prompt + new tokens)
// gives the argmax of a full recomputation of the whole sequence at every step.
TEST_P(Decode_, GreedyDecodeEqualsArgmaxOfFullRecomputation) {
  const auto name = GetParam();
  CausalLM model(fixture_spec(name));
  load_hf_weights(model, SafetensorsReader(fixture_dir(name)));
  model->eval();
  std::vector<int64_t> seq = {5, 17, 3, 42, 8, 11, 29};
  SamplingOptions o;
  o.max_new_tokens = 8;
  const auto got = generate(model, seq, o).ids;
  ASSERT_EQ(got.size(), 8u);
  torch::NoGradGuard ng;
  for (int64_t id : got) {
    auto logits = model->forward(torch::tensor(seq, torch::kInt64).view({1, -1}));
    EXPECT_EQ(logits[0][int64_t(seq.size()) - 1].argmax().item<int64_t>(), id) << name << " at " << seq.size();
    seq.push_back(id);
  }
}

// Restores the intra-op thread count when a test that sets it ends.
struct RestoreThreads {
  int n = at::get_num_threads();
  ~RestoreThreads() { at::set_num_threads(n); }
};

// apply_linear without a recorded gradient: a single fp32 row takes the matrix-vector path and
// 2-16 rows small_linear; both equal torch's linear up to fp32 summation order, with and without
// bias, for any leading shape. 17 rows, bf16 and rows that need gradients are torch's linear
// exactly.
TEST(ApplyLinear, DecodePathsEqualLinear) {
  RestoreThreads restore;
  at::set_num_threads(1);
  torch::manual_seed(11);
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{576, 576}, {192, 576}, {576, 1536}, {1000, 64}}) {
    auto w = torch::randn({N, K}) / std::sqrt(double(K)), b = torch::randn({N});
    for (auto shape : std::vector<std::vector<int64_t>>{{K}, {1, K}, {1, 1, K}}) {
      auto x = torch::randn(shape);
      torch::NoGradGuard ng;
      for (const auto& bias : {torch::Tensor(), b}) {
        auto want = torch::nn::functional::linear(x, w, bias);
        auto got = apply_linear(x, w, bias);
        ASSERT_EQ(got.sizes(), want.sizes());
        const double scale = std::max(1.0, want.abs().max().item<double>());
        EXPECT_LE((got - want).abs().max().item<double>(), 1e-6 * scale) << N << "x" << K;
      }
    }
    {
      torch::NoGradGuard ng;
      // 2-16 rows: the small-M kernel where the CPU has one, else linear itself; 17: linear.
      for (int64_t M : {2, 8, 16}) {
        auto xm = torch::randn({M, 1, K});
        auto want = torch::nn::functional::linear(xm, w, b);
        EXPECT_LE((apply_linear(xm, w, b) - want).abs().max().item<double>(), 1e-5 * std::max(1.0, want.abs().max().item<double>()))
            << N << "x" << K << " M " << M;
      }
      auto x17 = torch::randn({17, K});
      EXPECT_TRUE(torch::equal(apply_linear(x17, w, b), torch::nn::functional::linear(x17, w, b)));
    }
    auto x8g = torch::randn({8, 1, K});  // gradient mode, no requires_grad: no gradient recorded
    EXPECT_LE((apply_linear(x8g, w, b) - torch::nn::functional::linear(x8g, w, b)).abs().max().item<double>(), 1e-4);
    auto x8r = torch::randn({8, K}).requires_grad_();  // recorded: linear, bitwise
    EXPECT_TRUE(torch::equal(apply_linear(x8r, w, b), torch::nn::functional::linear(x8r, w, b)));
    auto xb = torch::randn({1, K}).to(torch::kBFloat16), wb = w.to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(apply_linear(xb, wb), torch::nn::functional::linear(xb, wb)));
    auto xg = torch::randn({1, K}).requires_grad_();
    auto yg = apply_linear(xg, w, b);
    EXPECT_TRUE(torch::equal(yg, torch::nn::functional::linear(xg, w, b)));
    yg.sum().backward();
    EXPECT_TRUE(xg.grad().defined());
  }
}

// Every kernel of small_linear this CPU can run (model/layers/small_gemm.h), at every row count
// it takes and at weight row counts that leave partial blocks of 8, against torch's linear. On
// an x86-64 CPU with AVX2 + FMA at least the AVX2 kernel must be there.
TEST(SmallLinear, EachKernelOfThisCpuEqualsLinear) {
  RestoreThreads restore;
  torch::NoGradGuard ng;
  torch::manual_seed(12);
  int ran = 0;
  for (const std::string isa : {"avx2", "avx512"}) {
    // 1 and 2 threads (a build without OpenMP declines at 2: `ran` counts what ran); 1003 rows
    // are 126 blocks of 8, enough to be split.
    for (auto [N, K, threads] : std::vector<std::tuple<int64_t, int64_t, int>>{
             {576, 576, 1}, {13, 40, 1}, {1003, 77, 1}, {5, 1536, 1}, {1003, 77, 2}, {576, 576, 2}}) {
      at::set_num_threads(threads);
      auto w = torch::randn({N, K}) / std::sqrt(double(K));
      for (int64_t M = 2; M <= 16; ++M) {
        auto x = torch::randn({M, K});
        auto y = ac::model::small_linear(x, w, isa);
        if (!y.defined()) break;  // this CPU has no such kernel
        ++ran;
        auto want = torch::nn::functional::linear(x, w);
        ASSERT_EQ(y.sizes(), want.sizes());
        EXPECT_LE((y - want).abs().max().item<double>(), 2e-6 * std::max(1.0, want.abs().max().item<double>()))
            << isa << " M " << M << " " << N << "x" << K << " threads " << threads;
      }
    }
    at::set_num_threads(1);
    // What it declines: one row, 17 rows, another dtype, a non-contiguous weight.
    auto w = torch::randn({24, 32});
    EXPECT_FALSE(ac::model::small_linear(torch::randn({1, 32}), w, isa).defined());
    EXPECT_FALSE(ac::model::small_linear(torch::randn({17, 32}), w, isa).defined());
    EXPECT_FALSE(ac::model::small_linear(torch::randn({4, 32}).to(torch::kBFloat16), w.to(torch::kBFloat16), isa).defined());
    EXPECT_FALSE(ac::model::small_linear(torch::randn({4, 24}), w.t(), isa).defined());
  }
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_GT(ran, 0) << "an AVX2 CPU without the AVX2 kernel";
    if (!std::getenv("AC_SMALL_GEMM")) EXPECT_FALSE(ac::model::small_linear_isa().empty());
  }
#endif
  if (ran == 0) GTEST_SKIP() << "no small_linear kernel for this CPU (" << ac::model::small_linear_isa() << ")";
}

// The scorecard's serving loop: batch-1 prefills, stacked caches, batched decode with rows
// leaving as they finish, gives every sequence the tokens that greedy generate() gives it alone.
TEST_P(Decode_, StaticBatchEqualsOneSequenceAtATime) {
  const auto name = GetParam();
  CausalLM model(fixture_spec(name));
  load_hf_weights(model, SafetensorsReader(fixture_dir(name)));
  model->eval();
  std::vector<std::vector<int64_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    std::vector<int64_t> p;
    for (int t = 0; t < 9; ++t) p.push_back((7 * i + 13 * t + 5) % 96);
    prompts.push_back(p);
  }
  const std::vector<int64_t> lengths = {6, 1, 4};  // the second leaves after its first token
  const BatchTimings b = generate_static_batch(model, prompts, lengths);
  ASSERT_EQ(b.ids.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    SamplingOptions o;
    o.max_new_tokens = lengths[i];
    EXPECT_EQ(b.ids[i], generate(model, prompts[i], o).ids) << name << " sequence " << i;
    EXPECT_GT(b.ttft_s[i], 0);
  }
  // Steps: 5 after the first tokens, with 2 rows until the third sequence is done, then 1.
  EXPECT_EQ(b.step_rows, (std::vector<int64_t>{2, 2, 2, 1, 1})) << name;
  EXPECT_THROW(generate_static_batch(model, {{1, 2}, {1, 2, 3}}, {2, 2}), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Decode_, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

// LibTorch >= 2.1: the fused scaled_dot_product_attention path gives the eager path's logits
// and gradients on every fixture (GQA, RoPE, no RoPE, q/k norm), in a full forward and in a
// cached prefill + chunk + single-token decode. Skipped on LibTorch 1.x (no SDPA there).
TEST(Attention, SdpaEqualsEager) {
  if (!ac::model::sdpa_available()) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no scaled_dot_product_attention";
  struct Restore {
    ~Restore() { ac::model::set_eager_attention(false); }
  } restore;
  for (const auto& name : fixture_names()) {
    CausalLM model(fixture_spec(name));
    load_hf_weights(model, SafetensorsReader(fixture_dir(name)));
    auto ids = load_golden(name).input_ids;
    const int64_t T = ids.size(1);
    torch::manual_seed(5);
    auto w = torch::randn({ids.size(0), T, model->spec().vocab_size});
    auto run = [&](bool eager) {
      ac::model::set_eager_attention(eager);
      model->zero_grad(true);
      auto logits = model->forward(ids);
      (logits * w).sum().backward();
      std::vector<torch::Tensor> grads;
      for (const auto& p : model->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
      return std::make_pair(logits.detach(), grads);
    };
    auto [le, ge] = run(true);
    auto [ls, gs] = run(false);
    EXPECT_LE((ls - le).abs().max().item<double>(), 1e-5) << name;
    for (size_t i = 0; i < ge.size(); ++i)
      if (ge[i].defined()) EXPECT_LE((gs[i] - ge[i]).abs().max().item<double>(), 1e-4 * std::max(1.0, ge[i].abs().max().item<double>())) << name << " grad " << i;
    torch::NoGradGuard ng;
    auto cache = model->new_cache();
    std::vector<torch::Tensor> parts;
    parts.push_back(model->forward(ids.narrow(1, 0, 5), &cache));
    parts.push_back(model->forward(ids.narrow(1, 5, 3), &cache));  // T > 1 after cached keys: the mask path
    for (int64_t t = 8; t < T; ++t) parts.push_back(model->forward(ids.narrow(1, t, 1), &cache));
    EXPECT_LE((torch::cat(parts, 1) - le).abs().max().item<double>(), 1e-4) << name;
  }
}

// A decode step (T = 1) with grouped KV heads reads the cache in place (each KV head's query
// heads as rows of one product) instead of expanding it to H heads; both must give softmax(q
// k^T / sqrt(d)) v with query head h on KV head h / group. The reference is written out here.
TEST(Attention, GroupedDecodeStepEqualsPerHeadReference) {
  struct Restore {
    ~Restore() { ac::model::set_eager_attention(false); }
  } restore;
  ac::model::set_eager_attention(true);  // the eager kernel (the only one LibTorch 1.x has)
  torch::NoGradGuard ng;
  torch::manual_seed(11);
  const int64_t B = 3, H = 6, Hkv = 2, S = 9, d = 8, group = H / Hkv;
  auto q = torch::randn({B, H, 1, d}), k = torch::randn({B, Hkv, S, d}), v = torch::randn({B, Hkv, S, d});
  // The cache as generation keeps it: a view of the first S positions of a longer buffer.
  auto kbuf = torch::randn({B, Hkv, S + 5, d}), vbuf = torch::randn({B, Hkv, S + 5, d});
  kbuf.narrow(2, 0, S).copy_(k);
  vbuf.narrow(2, 0, S).copy_(v);
  auto out = ac::model::attention_core(q, kbuf.narrow(2, 0, S), vbuf.narrow(2, 0, S));
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{B, H, 1, d}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      auto kh = k[b][h / group], vh = v[b][h / group];  // [S, d]
      auto p = torch::softmax(torch::mv(kh, q[b][h][0]) / std::sqrt(double(d)), 0);
      EXPECT_LE((out[b][h][0] - torch::mv(vh.t(), p)).abs().max().item<double>(), 1e-5) << "b " << b << " head " << h;
    }
}

TEST(TensorParallel, ImpossibleLayoutsAreRefusedWithTheReason) {
  auto spec = fixture_spec("nemotron_h");  // 4 query heads, 2 KV heads, 2 Mamba groups, 8 experts
  EXPECT_EQ(tp_split_problem(spec, 1), "");
  EXPECT_EQ(tp_split_problem(spec, 2), "");
  // TP=4: Mamba's 2 groups would span ranks (layer 0 is the first Mamba layer).
  auto why = tp_split_problem(spec, 4);
  EXPECT_NE(why.find("layers[0].mamba"), std::string::npos) << why;
  EXPECT_NE(why.find("groups"), std::string::npos) << why;
  // Query heads not divisible.
  auto llama = fixture_spec("llama");
  llama.layers[1].attention->num_heads = 6;
  llama.layers[1].attention->num_kv_heads = 3;
  why = tp_split_problem(llama, 4);
  EXPECT_NE(why.find("layers[1].attention"), std::string::npos) << why;
  EXPECT_NE(why.find("6 query heads"), std::string::npos) << why;
  // KV heads fewer than ranks replicate when TP is a multiple of them; otherwise refused.
  llama = fixture_spec("llama");
  llama.layers[0].attention->num_heads = 12;
  llama.layers[0].attention->num_kv_heads = 4;
  llama.layers[1].attention->num_heads = 12;
  llama.layers[1].attention->num_kv_heads = 4;
  llama.layers[0].mlp->ffn_size = 96;
  EXPECT_EQ(tp_split_problem(llama, 2), "");
  why = tp_split_problem(llama, 6);
  EXPECT_NE(why.find("KV heads"), std::string::npos) << why;
  // FFN and experts.
  llama = fixture_spec("llama");
  llama.layers[0].mlp->ffn_size = 97;
  EXPECT_NE(tp_split_problem(llama, 2).find("layers[0].mlp"), std::string::npos);
  spec.layers[3].moe->num_experts = 6;
  why = tp_split_problem(spec, 4);
  EXPECT_NE(why.find("layers[0].mamba"), std::string::npos);  // first problem is reported first
  spec.layers[0].mamba->n_groups = 4;
  spec.layers[4].mamba->n_groups = 4;
  spec.layers[1].attention->num_kv_heads = 4;
  spec.layers[1].attention->num_heads = 4;
  why = tp_split_problem(spec, 4);
  EXPECT_NE(why.find("layers[3].moe"), std::string::npos) << why;
  EXPECT_NE(why.find("6 experts"), std::string::npos) << why;
}

TEST(CausalLM, BadSpecThrowsInputError) {
  auto spec = fixture_spec("llama");
  spec.layers[0].mamba = MambaSpec{};  // attention and mamba in one layer
  spec.layers[0].mamba->num_heads = 2;
  spec.layers[0].mamba->head_dim = 4;
  spec.layers[0].mamba->state_size = 4;
  try {
    CausalLM m(spec);
    FAIL();
  } catch (const ac::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layers[0]"), std::string::npos) << e.what();
  }
}

TEST(CausalLM, BackwardReachesEveryParameter) {
  CausalLM model(fixture_spec("nemotron_h"));
  model->init_weights(3);
  auto ids = torch::randint(0, 96, {2, 9});
  auto logits = model->forward(ids);
  auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 96}), ids.reshape({-1}));
  loss.backward();
  for (const auto& p : model->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    // Every expert might not be routed to; everything else must get a gradient.
    if (p.key().find("experts.") == std::string::npos)
      EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
}

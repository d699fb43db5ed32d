// KD losses. VocabParallel* run at TP = world size (1 and 2 ranks) against the same loss on
// one rank over the full vocabulary, written with torch::log_softmax / kl_div in double:
// value and student gradient within 1e-5 (fp32 inputs). KdLocal.* need no MPI peers
// (intermediate loss, scale_to, argument checks, the self communicator).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>

#include "dist/communicator.h"
#include "dist/tensor_parallel.h"
#include "distill/kd_loss.h"

using namespace ac;
using ac::distill::KdOptions;
using ac::distill::vocab_parallel_kl;

namespace {

std::shared_ptr<dist::Communicator> world_comm() { return dist::make_mpi_communicator(MPI_COMM_WORLD); }

void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  if (a.numel() == 0) return;
  const double err = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
  EXPECT_LE(err, tol) << what << ": max abs error " << err;
}

// This rank's [N, shard] slice of full [N, V] logits; padding columns hold `pad` (a large
// value, so any leak of padding into the loss shows).
torch::Tensor local_shard(const torch::Tensor& full, const dist::VocabShard& vs, double pad = 40.0) {
  torch::Tensor out = torch::full({full.size(0), vs.shard}, pad, full.options());
  if (vs.valid > 0) out.narrow(1, 0, vs.valid).copy_(full.narrow(1, vs.start, vs.valid));
  return out;
}

torch::Tensor keep_of(const torch::Tensor& mask, int64_t n) {
  return mask.defined() ? mask.ne(0).to(torch::kDouble) : torch::ones({n}, torch::kDouble);
}

// T^2 * mean over kept tokens of KL(softmax(t/T) || softmax(s/T)), in double, autograd.
torch::Tensor reference_kl(const torch::Tensor& s_full, const torch::Tensor& t_full, double T,
                           const torch::Tensor& mask = {}) {
  torch::Tensor log_ps = torch::log_softmax(s_full.to(torch::kDouble) / T, 1);
  torch::Tensor p_t = torch::softmax(t_full.to(torch::kDouble) / T, 1);
  torch::Tensor per_token = torch::kl_div(log_ps, p_t, at::Reduction::None).sum(1);
  torch::Tensor keep = keep_of(mask, s_full.size(0));
  return T * T * (per_token * keep).sum() / keep.sum().clamp_min(1.0);
}

// Top-K reference: q = softmax of the teacher's K largest logits / T, student log-probs of
// the full-vocabulary log-softmax at those ids.
torch::Tensor reference_topk_kl(const torch::Tensor& s_full, const torch::Tensor& t_full, double T, int64_t k,
                                const torch::Tensor& mask = {}) {
  auto [vals, ids] = (t_full.to(torch::kDouble) / T).topk(std::min(k, t_full.size(1)), 1);
  torch::Tensor log_q = torch::log_softmax(vals, 1);
  torch::Tensor log_ps = torch::log_softmax(s_full.to(torch::kDouble) / T, 1).gather(1, ids);
  torch::Tensor per_token = (log_q.exp() * (log_q - log_ps)).sum(1);
  torch::Tensor keep = keep_of(mask, s_full.size(0));
  return T * T * (per_token * keep).sum() / keep.sum().clamp_min(1.0);
}

struct Case {
  int64_t tokens = 13, vocab = 37;  // 37: odd, so shards are padded at TP = 2
  double temperature = 2.0;
  int64_t top_k = 0, chunk = 4;
  torch::Dtype dtype = torch::kFloat;
  bool with_mask = true;
  double grad_scale = 3.0;  // the loss is multiplied by this before backward
  bool distinct_teacher = false;  // teacher rows: a permutation of 0, 0.125, 0.25, ... (no ties, exact in bf16)
};

struct Result {
  torch::Tensor loss, grad_local, ref_loss, ref_grad_local;
  dist::VocabShard vs;
};

// Runs the parallel loss and the reference on the same random logits (same seed on every rank).
Result run_case(dist::Communicator& tp, const Case& c, uint64_t seed = 11) {
  torch::manual_seed(seed);
  torch::Tensor s_full = (torch::randn({c.tokens, c.vocab}) * 2.0).to(c.dtype);
  torch::Tensor t_full = (torch::randn({c.tokens, c.vocab}) * 2.0).to(c.dtype);
  if (c.distinct_teacher)
    t_full = (torch::rand({c.tokens, c.vocab}).argsort(int64_t{1}).to(torch::kFloat) * 0.125 - 2.0).to(c.dtype);
  torch::Tensor mask;
  if (c.with_mask) {
    mask = torch::ones({c.tokens});
    mask[1] = 0;
    mask[c.tokens - 2] = 0;
  }
  Result r;
  r.vs = dist::vocab_shard(c.vocab, tp.size(), tp.rank());
  torch::Tensor s_local = local_shard(s_full, r.vs).requires_grad_(true);
  torch::Tensor t_local = local_shard(t_full, r.vs);
  KdOptions o;
  o.temperature = c.temperature;
  o.top_k = c.top_k;
  o.token_chunk = c.chunk;
  r.loss = vocab_parallel_kl(s_local, t_local, tp, c.vocab, o, mask);
  (r.loss * c.grad_scale).backward();
  r.grad_local = s_local.grad();

  torch::Tensor s_ref = s_full.to(torch::kDouble).requires_grad_(true);
  r.ref_loss = c.top_k > 0 ? reference_topk_kl(s_ref, t_full, c.temperature, c.top_k, mask)
                           : reference_kl(s_ref, t_full, c.temperature, mask);
  (r.ref_loss * c.grad_scale).backward();
  r.ref_grad_local = local_shard(s_ref.grad(), r.vs, 0.0);
  return r;
}

void expect_matches_reference(const Result& r, const std::string& what, double tol = 1e-5, double grad_tol = 1e-5) {
  EXPECT_EQ(r.loss.scalar_type(), torch::kFloat) << what;
  EXPECT_EQ(r.loss.dim(), 0) << what;
  expect_close(r.loss, r.ref_loss.detach(), what + ": loss", tol);
  expect_close(r.grad_local.narrow(1, 0, r.vs.valid), r.ref_grad_local.narrow(1, 0, r.vs.valid),
               what + ": student grad", grad_tol);
  if (r.vs.valid < r.vs.shard) {
    EXPECT_EQ(r.grad_local.narrow(1, r.vs.valid, r.vs.shard - r.vs.valid).abs().max().item<double>(), 0.0)
        << what << ": padding columns must get no gradient";
  }
}

}  // namespace

// ---- full-vocabulary KL at TP = world size ---------------------------------------------------

TEST(VocabParallelKl, MatchesFullVocabReferenceWithTemperatureAndMask) {
  auto tp = world_comm();
  Case c;  // vocab 37, T = 2, two masked tokens, chunk 4 < 13 tokens
  expect_matches_reference(run_case(*tp, c), "T=2, mask, chunk 4");
}

TEST(VocabParallelKl, MatchesReferenceAtTemperatureOneWithoutMask) {
  auto tp = world_comm();
  Case c;
  c.temperature = 1.0;
  c.with_mask = false;
  c.vocab = 64;
  c.chunk = 1024;
  expect_matches_reference(run_case(*tp, c), "T=1, no mask, one chunk");
}

TEST(VocabParallelKl, ChunkSizeDoesNotChangeTheResult) {
  auto tp = world_comm();
  Case c;
  c.chunk = 1024;  // one chunk
  Result one = run_case(*tp, c);
  for (int64_t chunk : {1, 3, 5, 12}) {
    c.chunk = chunk;
    Result r = run_case(*tp, c);
    expect_close(r.loss, one.loss, "loss, chunk " + std::to_string(chunk), 1e-6);
    expect_close(r.grad_local, one.grad_local, "grad, chunk " + std::to_string(chunk), 1e-7);
  }
}

TEST(VocabParallelKl, Bf16InputsGiveFp32LossAndBf16Grad) {
  auto tp = world_comm();
  Case c;
  c.dtype = torch::kBFloat16;
  Result r = run_case(*tp, c);
  EXPECT_EQ(r.grad_local.scalar_type(), torch::kBFloat16);
  // The reference sees the same bf16 values (upcast); the gradient is rounded to bf16.
  expect_matches_reference(r, "bf16", 1e-5, 2e-3);
}

TEST(VocabParallelKl, ZeroWhenStudentEqualsTeacher) {
  auto tp = world_comm();
  const int64_t vocab = 37;
  const auto vs = dist::vocab_shard(vocab, tp->size(), tp->rank());
  torch::manual_seed(3);
  torch::Tensor full = torch::randn({9, vocab}) * 3.0;
  torch::Tensor s = local_shard(full, vs).requires_grad_(true);
  KdOptions o;
  o.temperature = 2.0;
  o.token_chunk = 4;
  torch::Tensor loss = vocab_parallel_kl(s, local_shard(full, vs), *tp, vocab, o);
  EXPECT_EQ(loss.item<float>(), 0.0f);
  loss.backward();
  EXPECT_LE(s.grad().abs().max().item<float>(), 1e-7f);
}

TEST(VocabParallelKl, TeacherGetsNoGradientAndLeadingDimsAreTokens) {
  auto tp = world_comm();
  const int64_t vocab = 21;
  const auto vs = dist::vocab_shard(vocab, tp->size(), tp->rank());
  torch::manual_seed(8);
  torch::Tensor s_full = torch::randn({2, 3, vocab}), t_full = torch::randn({2, 3, vocab});
  auto shard3 = [&](const torch::Tensor& f) { return local_shard(f.reshape({6, vocab}), vs).reshape({2, 3, vs.shard}); };
  torch::Tensor s = shard3(s_full).requires_grad_(true);
  torch::Tensor t = shard3(t_full).requires_grad_(true);
  KdOptions o;
  o.token_chunk = 4;
  torch::Tensor loss = vocab_parallel_kl(s, t, *tp, vocab, o, torch::ones({2, 3}, torch::kBool));
  loss.backward();
  EXPECT_FALSE(t.grad().defined());
  ASSERT_TRUE(s.grad().defined());
  EXPECT_EQ(s.grad().sizes(), s.sizes());
  expect_close(loss, reference_kl(s_full.reshape({6, vocab}), t_full.reshape({6, vocab}), 1.0), "[2, 3, shard] loss");
}

TEST(VocabParallelKl, AllTokensMaskedGivesZeroLossAndGrad) {
  auto tp = world_comm();
  const int64_t vocab = 37;
  const auto vs = dist::vocab_shard(vocab, tp->size(), tp->rank());
  torch::manual_seed(4);
  torch::Tensor s = local_shard(torch::randn({5, vocab}), vs).requires_grad_(true);
  torch::Tensor t = local_shard(torch::randn({5, vocab}), vs);
  for (int64_t k : {0, 3}) {
    KdOptions o;
    o.top_k = k;
    torch::Tensor loss = vocab_parallel_kl(s, t, *tp, vocab, o, torch::zeros({5}));
    EXPECT_EQ(loss.item<float>(), 0.0f) << "top_k " << k;
    loss.backward();
    EXPECT_EQ(s.grad().abs().max().item<float>(), 0.0f) << "top_k " << k;
    s.mutable_grad().reset();
  }
}

TEST(VocabParallelKl, RankWithoutVocabularyColumns) {
  // vocab 3 at TP = 4 leaves rank 3 with only padding; at TP = 2 vocab 1 leaves rank 1 empty.
  auto tp = world_comm();
  const int64_t vocab = tp->size() == 1 ? 3 : (tp->size() == 2 ? 1 : 3);
  for (int64_t k : {0, 1}) {
    Case c;
    c.vocab = vocab;
    c.top_k = k;
    c.tokens = 6;
    expect_matches_reference(run_case(*tp, c), "vocab " + std::to_string(vocab) + " top_k " + std::to_string(k));
  }
}

// ---- top-K KL --------------------------------------------------------------------------------

TEST(VocabParallelKl, TopKWithKEqualToVocabEqualsFullKl) {
  auto tp = world_comm();
  Case c;
  Result full = run_case(*tp, c);
  c.top_k = c.vocab;
  Result topk = run_case(*tp, c);
  expect_close(topk.loss, full.loss, "loss", 1e-5);
  expect_close(topk.grad_local, full.grad_local, "grad", 1e-5);
  c.top_k = c.vocab + 10;  // larger than the vocabulary: clamped
  expect_close(run_case(*tp, c).loss, full.loss, "loss, K > vocab", 1e-5);
}

TEST(VocabParallelKl, TopKMatchesSingleRankReference) {
  auto tp = world_comm();
  for (int64_t k : {1, 5, 20}) {
    Case c;
    c.top_k = k;
    expect_matches_reference(run_case(*tp, c), "top_k " + std::to_string(k));
  }
  Case c;  // T = 1, no mask, one chunk, bigger vocabulary
  c.top_k = 8;
  c.temperature = 1.0;
  c.with_mask = false;
  c.vocab = 101;
  c.chunk = 64;
  expect_matches_reference(run_case(*tp, c), "top_k 8, vocab 101");
}

TEST(VocabParallelKl, TopKChunkedAndBf16) {
  auto tp = world_comm();
  Case c;
  c.top_k = 6;
  c.chunk = 1024;
  Result one = run_case(*tp, c);
  c.chunk = 2;
  Result chunked = run_case(*tp, c);
  expect_close(chunked.loss, one.loss, "loss", 1e-6);
  expect_close(chunked.grad_local, one.grad_local, "grad", 1e-7);
  c.dtype = torch::kBFloat16;
  c.distinct_teacher = true;  // ties at the K-th value may be broken either way (documented)
  Result r = run_case(*tp, c);
  EXPECT_EQ(r.grad_local.scalar_type(), torch::kBFloat16);
  expect_matches_reference(r, "top_k bf16", 1e-5, 2e-3);
}

// ---- single-process checks -------------------------------------------------------------------

TEST(KdLocal, SelfCommunicatorMatchesReference) {
  auto self = dist::make_self_communicator();
  Case c;
  c.vocab = 50;
  expect_matches_reference(run_case(*self, c), "self communicator");
  c.top_k = 7;
  expect_matches_reference(run_case(*self, c), "self communicator, top_k 7");
}

TEST(KdLocal, RejectsBadArguments) {
  auto self = dist::make_self_communicator();
  torch::Tensor s = torch::randn({4, 10}), t = torch::randn({4, 10});
  KdOptions bad_t;
  bad_t.temperature = 0.0;
  EXPECT_THROW(vocab_parallel_kl(s, t, *self, 10, bad_t), std::invalid_argument);
  KdOptions bad_chunk;
  bad_chunk.token_chunk = 0;
  EXPECT_THROW(vocab_parallel_kl(s, t, *self, 10, bad_chunk), std::invalid_argument);
  EXPECT_THROW(vocab_parallel_kl(s, t, *self, 12, {}), std::invalid_argument);                  // shard mismatch
  EXPECT_THROW(vocab_parallel_kl(s, torch::randn({3, 10}), *self, 10, {}), std::invalid_argument);
  EXPECT_THROW(vocab_parallel_kl(s, t, *self, 10, {}, torch::ones({5})), std::invalid_argument);  // mask size
}

TEST(KdLocal, IntermediateCosineValueAndGrad) {
  torch::manual_seed(21);
  distill::IntermediateLoss loss(16, 16, distill::IntermediateLossImpl::Kind::Cosine);
  EXPECT_TRUE(loss->projection.is_empty());
  torch::Tensor s = torch::randn({2, 5, 16}, torch::kDouble).requires_grad_(true);
  torch::Tensor t = torch::randn({2, 5, 16}, torch::kDouble).requires_grad_(true);
  torch::Tensor l = loss(s.to(torch::kFloat), t.to(torch::kFloat));
  // Reference by hand: 1 - <s, t> / (|s| |t|), mean over the 10 tokens.
  torch::Tensor sr = s.detach().clone().requires_grad_(true);
  torch::Tensor cos = (sr * t.detach()).sum(-1) / (sr.norm(2, -1) * t.detach().norm(2, -1));
  torch::Tensor ref = (1.0 - cos).mean();
  expect_close(l, ref.detach(), "cosine loss", 1e-6);
  l.backward();
  ref.backward();
  expect_close(s.grad(), sr.grad(), "cosine grad", 1e-6);
  EXPECT_FALSE(t.grad().defined()) << "the teacher hidden state gets no gradient";
  // Same direction, different norm: zero loss.
  torch::Tensor x = torch::randn({3, 16});
  EXPECT_NEAR(loss(x, x * 2.5).item<float>(), 0.0f, 1e-6);
}

TEST(KdLocal, IntermediateMseWithProjection) {
  torch::manual_seed(22);
  distill::IntermediateLoss loss(8, 12, distill::IntermediateLossImpl::Kind::Mse);
  ASSERT_FALSE(loss->projection.is_empty());
  EXPECT_EQ(loss->projection->weight.sizes(), (std::vector<int64_t>{12, 8}));
  auto params = loss->parameters();
  EXPECT_EQ(params.size(), 2u) << "projection weight and bias are trainable parameters";
  torch::Tensor s = torch::randn({4, 3, 8}).requires_grad_(true);
  torch::Tensor t = torch::randn({4, 3, 12});
  torch::Tensor l = loss(s, t);
  torch::Tensor w = loss->projection->weight.detach().clone().requires_grad_(true);
  torch::Tensor b = loss->projection->bias.detach().clone().requires_grad_(true);
  torch::Tensor sr = s.detach().clone().requires_grad_(true);
  torch::Tensor ref = (torch::matmul(sr, w.t()) + b - t).pow(2).mean();
  expect_close(l, ref.detach(), "mse loss", 1e-5);
  l.backward();
  ref.backward();
  expect_close(s.grad(), sr.grad(), "student grad", 1e-6);
  expect_close(loss->projection->weight.grad(), w.grad(), "projection weight grad", 1e-6);
  expect_close(loss->projection->bias.grad(), b.grad(), "projection bias grad", 1e-6);
  EXPECT_THROW(loss(torch::randn({4, 9}), torch::randn({4, 12})), std::exception);
}

TEST(KdLocal, IntermediateCosineWithProjectionInBf16) {
  torch::manual_seed(23);
  distill::IntermediateLoss loss(8, 12, distill::IntermediateLossImpl::Kind::Cosine);
  torch::Tensor s = torch::randn({6, 8}).to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor t = torch::randn({6, 12}).to(torch::kBFloat16);
  torch::Tensor l = loss(s, t);
  EXPECT_EQ(l.scalar_type(), torch::kFloat);
  torch::Tensor p = torch::nn::functional::linear(s.detach().to(torch::kFloat), loss->projection->weight.detach(),
                                                  loss->projection->bias.detach());
  torch::Tensor ref = (1.0 - torch::cosine_similarity(p, t.to(torch::kFloat), -1)).mean();
  expect_close(l, ref, "bf16 cosine", 1e-5);
  l.backward();
  EXPECT_EQ(s.grad().scalar_type(), torch::kBFloat16);
}

TEST(KdLocal, ScaleToMatchesLogitLossAndScalesTheGradient) {
  torch::Tensor x = torch::tensor({2.0}, torch::kFloat).requires_grad_(true);
  torch::Tensor l_int = (x * x).sum();  // 4, d/dx = 2x = 4
  torch::Tensor l_logit = torch::tensor(10.0).requires_grad_(true);
  torch::Tensor scaled = distill::scale_to(l_int, l_logit);
  EXPECT_FLOAT_EQ(scaled.item<float>(), 10.0f);
  scaled.backward();
  EXPECT_FLOAT_EQ(x.grad().item<float>(), 4.0f * (10.0f / 4.0f));  // ratio 2.5 applied to the gradient
  EXPECT_FALSE(l_logit.grad().defined()) << "the ratio is detached";
  // Zero intermediate loss: 0, not NaN.
  torch::Tensor y = torch::zeros({1}).requires_grad_(true);
  torch::Tensor zero = distill::scale_to((y * y).sum(), torch::tensor(3.0));
  EXPECT_EQ(zero.item<float>(), 0.0f);
  zero.backward();
  EXPECT_EQ(y.grad().item<float>(), 0.0f);
}

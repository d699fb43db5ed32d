// Tensor-parallel layers at TP = world size (1, 2, 4) against the same computation done on
// one rank with full weights: outputs and gradients within 1e-5 (fp32).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/communicator.h"
#include "dist/tensor_parallel.h"

using namespace ac::dist;

namespace {

std::shared_ptr<Communicator> world_comm() { return make_mpi_communicator(MPI_COMM_WORLD); }

void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double err = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
  EXPECT_LE(err, tol) << what << ": max abs error " << err;
}

}  // namespace

TEST(TensorParallel, TwoLayerMlpMatchesSingleRank) {
  auto tp = world_comm();
  const int64_t in = 8, hidden = 16, out = 8, batch = 6;
  torch::manual_seed(1234);  // same on every rank: same master weights, same input
  ColumnParallelLinear fc1(in, hidden, /*bias=*/true, /*gather_output=*/false, tp.get());
  RowParallelLinear fc2(hidden, out, /*bias=*/true, /*input_is_parallel=*/true, tp.get());
  torch::Tensor x = torch::randn({batch, in});
  torch::Tensor target = torch::randn({batch, out});

  // Reference on full weights.
  torch::manual_seed(1234);
  torch::nn::Linear r1(torch::nn::LinearOptions(in, hidden));
  torch::nn::Linear r2(torch::nn::LinearOptions(hidden, out));
  {
    // Same draw order as the parallel layers: weight, bias of fc1, then of fc2.
    torch::NoGradGuard ng;
    torch::manual_seed(1234);
    const double b1 = 1.0 / std::sqrt(double(in)), b2 = 1.0 / std::sqrt(double(hidden));
    r1->weight.copy_(torch::empty({hidden, in}).uniform_(-b1, b1));
    r1->bias.copy_(torch::empty({hidden}).uniform_(-b1, b1));
    r2->weight.copy_(torch::empty({out, hidden}).uniform_(-b2, b2));
    r2->bias.copy_(torch::empty({out}).uniform_(-b2, b2));
  }
  torch::Tensor xr = x.clone().requires_grad_(true);
  torch::Tensor yr = r2(torch::gelu(r1(xr)));
  torch::mse_loss(yr, target).backward();

  torch::Tensor xp = x.clone().requires_grad_(true);
  torch::Tensor yp = fc2(torch::gelu(fc1(xp)));
  torch::mse_loss(yp, target).backward();

  const auto rows = shard_range(hidden, tp->size(), tp->rank());
  expect_close(yp, yr, "output");
  expect_close(xp.grad(), xr.grad(), "input grad");
  expect_close(fc1->weight, r1->weight.narrow(0, rows.start, rows.size), "fc1 weight (init)");
  expect_close(fc1->weight.grad(), r1->weight.grad().narrow(0, rows.start, rows.size), "fc1 weight grad");
  expect_close(fc1->bias.grad(), r1->bias.grad().narrow(0, rows.start, rows.size), "fc1 bias grad");
  expect_close(fc2->weight.grad(), r2->weight.grad().narrow(1, rows.start, rows.size), "fc2 weight grad");
  expect_close(fc2->bias.grad(), r2->bias.grad(), "fc2 bias grad");
}

TEST(TensorParallel, GatherOutputAndScatterInput) {
  auto tp = world_comm();
  torch::manual_seed(7);
  const int64_t in = 12, out = 8;
  torch::Tensor w1 = torch::randn({out, in}), b1 = torch::randn({out});
  torch::Tensor w2 = torch::randn({in, out});
  ColumnParallelLinear col(in, out, true, /*gather_output=*/true, tp.get());
  RowParallelLinear row(out, in, false, /*input_is_parallel=*/false, tp.get());
  col->load_full(w1, b1);
  row->load_full(w2);
  torch::Tensor x = torch::randn({3, 5, in});
  torch::Tensor xr = x.clone().requires_grad_(true), xp = x.clone().requires_grad_(true);
  torch::Tensor yr = torch::nn::functional::linear(torch::nn::functional::linear(xr, w1, b1), w2);
  torch::Tensor yp = row(col(xp));
  expect_close(yp, yr, "output", 1e-4);
  yr.pow(2).sum().backward();
  yp.pow(2).sum().backward();
  expect_close(xp.grad(), xr.grad(), "input grad", 1e-3);
}

TEST(TensorParallel, EmbeddingAndCrossEntropyMatchSingleRank) {
  auto tp = world_comm();
  const int64_t vocab = 37, dim = 6, tokens = 10;  // 37: uneven shards, exercising padding
  torch::manual_seed(99);
  torch::Tensor emb_w = torch::randn({vocab, dim});
  torch::Tensor head_w = torch::randn({vocab, dim}) * 0.5;
  torch::Tensor ids = torch::randint(vocab, {tokens}, torch::kLong);
  torch::Tensor targets = torch::randint(vocab, {tokens}, torch::kLong);
  targets[3] = -100;  // ignored token

  // Reference.
  torch::Tensor er = emb_w.clone().requires_grad_(true), hr = head_w.clone().requires_grad_(true);
  torch::Tensor logits_r = torch::nn::functional::linear(torch::embedding(er, ids), hr);
  torch::Tensor loss_r = torch::nn::functional::cross_entropy(
      logits_r, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone).ignore_index(-100));
  loss_r.sum().backward();

  // Parallel: vocab-parallel embedding; the head is column-parallel over the padded vocab.
  VocabParallelEmbedding emb(vocab, dim, tp.get());
  emb->load_full(emb_w);
  const VocabShard vs = emb->range;
  torch::Tensor head_local = torch::zeros({vs.shard, dim});
  if (vs.valid > 0) head_local.narrow(0, 0, vs.valid).copy_(head_w.narrow(0, vs.start, vs.valid));
  head_local.requires_grad_(true);
  torch::Tensor h = emb(ids);
  torch::Tensor logits_p = torch::nn::functional::linear(copy_to_tp(h, *tp), head_local);
  torch::Tensor loss_p = vocab_parallel_cross_entropy(logits_p, targets, *tp, vocab);
  loss_p.sum().backward();

  expect_close(loss_p, loss_r, "per-token loss");
  EXPECT_EQ(loss_p[3].item<float>(), 0.0f);
  if (vs.valid > 0) {
    expect_close(emb->weight.grad().narrow(0, 0, vs.valid), er.grad().narrow(0, vs.start, vs.valid), "embedding grad");
    expect_close(head_local.grad().narrow(0, 0, vs.valid), hr.grad().narrow(0, vs.start, vs.valid), "head grad");
  }
  if (vs.valid < vs.shard) {
    EXPECT_EQ(head_local.grad().narrow(0, vs.valid, vs.shard - vs.valid).abs().max().item<float>(), 0.0f)
        << "padding rows must get no gradient";
  }
}

TEST(TensorParallel, CrossEntropyInBf16LogitsGivesFp32Loss) {
  auto tp = world_comm();
  const int64_t vocab = 16;
  const VocabShard vs = vocab_shard(vocab, tp->size(), tp->rank());
  torch::manual_seed(5);
  torch::Tensor full = torch::randn({4, vocab}).to(torch::kBFloat16);
  torch::Tensor targets = torch::tensor({0, 5, 15, 9}, torch::kLong);
  torch::Tensor local = full.narrow(1, vs.start, vs.valid).clone().requires_grad_(true);
  torch::Tensor loss = vocab_parallel_cross_entropy(local, targets, *tp, vocab);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  torch::Tensor ref = torch::nn::functional::cross_entropy(
      full.to(torch::kFloat), targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  expect_close(loss, ref, "bf16 logits loss");
  loss.sum().backward();
  EXPECT_EQ(local.grad().scalar_type(), torch::kBFloat16);
}

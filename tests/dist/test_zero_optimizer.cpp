// ZeRO-1 AdamW: at DP = world it must give the parameters that torch::optim::AdamW gives at
// DP = 1 on the whole batch (the world-times larger batch), step after step; TP x DP
// combined; the global gradient norm counts TP-replicated parameters once; non-finite
// gradients skip the step on every rank; bf16 parameters are the rounded fp32 masters.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "dist/parallel_layout.h"
#include "dist/tensor_parallel.h"
#include "dist/zero_optimizer.h"

using namespace ac::dist;

namespace {

// Odd row counts (7, 13) so that rows do not split evenly over DP ranks.
struct Net {
  ColumnParallelLinear fc1;
  RowParallelLinear fc2;
  torch::Tensor scale;  // replicated over TP, shape [in]
  Net(int64_t in, int64_t hidden, Communicator* tp)
      : fc1(in, hidden, true, false, tp), fc2(hidden, in, true, true, tp) {
    scale = torch::ones({in}).requires_grad_(true);
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(fc1(x))) * scale; }
  std::vector<OptimParam> optim_params() {
    return {{"fc1.weight", fc1->weight, true, false}, {"fc1.bias", fc1->bias, false, false},
            {"fc2.weight", fc2->weight, true, false}, {"fc2.bias", fc2->bias, false, true},
            {"scale", scale, false, true}};
  }
};

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

void check_matches_adamw(int tp_size, size_t bucket_bytes) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % tp_size != 0) GTEST_SKIP() << "world " << world << " not divisible by tp " << tp_size;
  ParallelLayout layout(MPI_COMM_WORLD, {tp_size, 0, 0});
  const int dp = layout.dp_size();
  const int64_t in = 7, hidden = 26, per_rank = 4;  // hidden / tp = 13 or 26 rows
  const double lr = 1e-2, clip = 0.5;

  auto self = make_self_communicator();
  torch::manual_seed(3);
  Net ref(in, hidden, self.get());
  torch::manual_seed(3);
  Net net(in, hidden, &layout.tp());

  std::vector<torch::Tensor> decay = {ref.fc1->weight, ref.fc2->weight};
  std::vector<torch::Tensor> no_decay = {ref.fc1->bias, ref.fc2->bias, ref.scale};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  torch::optim::AdamW ref_opt(groups);

  AdamWOptions opts;
  opts.bucket_bytes = bucket_bytes;
  ZeroAdamW opt(net.optim_params(), layout.dp(), &layout.tp(), opts);
  if (bucket_bytes < 512) {
    EXPECT_GT(opt.num_buckets(), 1u);
  }

  const auto rows = shard_range(hidden, layout.tp_size(), layout.tp_rank());
  for (int step = 0; step < 10; ++step) {
    torch::Tensor x = torch::randn({per_rank * dp, in});
    torch::Tensor y = torch::randn({per_rank * dp, in});
    // Reference: the whole batch, clipped like the distributed optimizer.
    ref_opt.zero_grad();
    torch::mse_loss(ref.forward(x), y).backward();
    double sq = 0;
    for (auto& p : decay) sq += p.grad().square().sum().item<double>();
    for (auto& p : no_decay) sq += p.grad().square().sum().item<double>();
    const double ref_norm = std::sqrt(sq);
    if (ref_norm > clip) {
      for (auto& p : decay) p.mutable_grad().mul_(clip / (ref_norm + 1e-6));
      for (auto& p : no_decay) p.mutable_grad().mul_(clip / (ref_norm + 1e-6));
    }
    ref_opt.step();

    torch::Tensor xs = x.narrow(0, per_rank * layout.dp_rank(), per_rank);
    torch::Tensor ys = y.narrow(0, per_rank * layout.dp_rank(), per_rank);
    torch::mse_loss(net.forward(xs), ys).backward();
    // fc2.bias and scale are replicated over TP but see the full (reduced) activations: their
    // gradients are identical on every TP rank, as the optimizer assumes.
    StepResult r = opt.step(lr, clip);
    ASSERT_TRUE(r.applied);
    EXPECT_NEAR(r.grad_norm, ref_norm, 1e-5 * std::max(1.0, ref_norm)) << "step " << step;
    EXPECT_FALSE(net.fc1->weight.grad().defined());
  }
  EXPECT_EQ(opt.num_steps(), 10);
  EXPECT_LE(max_diff(net.fc1->weight, ref.fc1->weight.narrow(0, rows.start, rows.size)), 2e-5);
  EXPECT_LE(max_diff(net.fc1->bias, ref.fc1->bias.narrow(0, rows.start, rows.size)), 2e-5);
  EXPECT_LE(max_diff(net.fc2->weight, ref.fc2->weight.narrow(1, rows.start, rows.size)), 2e-5);
  EXPECT_LE(max_diff(net.fc2->bias, ref.fc2->bias), 2e-5);
  EXPECT_LE(max_diff(net.scale, ref.scale), 2e-5);
  // And the parameters really moved (the comparison above is not vacuous).
  torch::manual_seed(3);
  Net init(in, hidden, self.get());
  EXPECT_GT(max_diff(init.fc1->weight, ref.fc1->weight), 1e-2);
}

}  // namespace

TEST(ZeroAdamW, DataParallelEqualsAdamWOnWholeBatch) { check_matches_adamw(1, size_t(25) << 20); }
TEST(ZeroAdamW, ManySmallBuckets) { check_matches_adamw(1, 64); }
TEST(ZeroAdamW, TensorTimesDataParallel) { check_matches_adamw(2, 256); }

TEST(ZeroAdamW, StateIsShardedByRows) {
  ParallelLayout layout(MPI_COMM_WORLD, {1, 0, 0});
  const int dp = layout.dp_size();
  torch::Tensor w = torch::randn({9, 5}).requires_grad_(true);
  ZeroAdamW opt({{"w", w, true, false}}, layout.dp(), nullptr);
  const auto s = opt.shard(0);
  const int64_t per = (9 + dp - 1) / dp;
  EXPECT_EQ(s.row_start, per * layout.dp_rank());
  EXPECT_EQ(s.rows, std::max<int64_t>(0, std::min<int64_t>(9, s.row_start + per) - s.row_start));
  if (s.rows > 0) {
    EXPECT_TRUE(torch::equal(s.master, w.detach().narrow(0, s.row_start, s.rows)));
  }
  EXPECT_EQ(opt.state_bytes(), 3 * per * 5 * 4);
  // Restoring state: write into the master shard, then sync: every rank sees every row.
  if (s.rows > 0) s.master.fill_(float(layout.dp_rank() + 1));
  opt.sync_params_from_master();
  for (int r = 0; r < dp; ++r) {
    const int64_t start = r * per, n = std::max<int64_t>(0, std::min<int64_t>(9, start + per) - start);
    if (n > 0) {
      EXPECT_TRUE(torch::all(w.detach().narrow(0, start, n) == float(r + 1)).item<bool>()) << "rows of rank " << r;
    }
  }
}

TEST(ZeroAdamW, NonFiniteGradientSkipsTheStepOnEveryRank) {
  ParallelLayout layout(MPI_COMM_WORLD, {1, 0, 0});
  torch::Tensor w = torch::ones({6, 3}).requires_grad_(true);
  ZeroAdamW opt({{"w", w, true, false}}, layout.dp(), nullptr);
  (w * 2).sum().backward();
  // Only rank 0 sees an inf; the average makes every rank's shard non-finite or not, but
  // the all-reduced norm is what decides, so all ranks skip together.
  if (layout.dp_rank() == 0) w.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  StepResult r = opt.step(0.1, 1.0);
  EXPECT_FALSE(r.applied);
  EXPECT_FALSE(std::isfinite(r.grad_norm));
  EXPECT_EQ(opt.num_steps(), 0);
  EXPECT_TRUE(torch::all(w.detach() == 1.0f).item<bool>());
  EXPECT_FALSE(w.grad().defined());
  (w * 2).sum().backward();
  r = opt.step(0.1, 1.0);
  EXPECT_TRUE(r.applied);
  EXPECT_TRUE(torch::all(w.detach() < 1.0f).item<bool>());
}

TEST(ZeroAdamW, Bf16ParametersAreRoundedMasters) {
  ParallelLayout layout(MPI_COMM_WORLD, {1, 0, 0});
  torch::manual_seed(5);
  torch::Tensor w = torch::randn({11, 4}).to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor w32 = w.detach().to(torch::kFloat).requires_grad_(true);
  ZeroAdamW opt({{"w", w, true, false}}, layout.dp(), nullptr);
  torch::optim::AdamW ref({w32}, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  for (int i = 0; i < 5; ++i) {
    torch::Tensor g = torch::randn({11, 4});
    w.mutable_grad() = g.to(torch::kBFloat16);
    w32.mutable_grad() = g.to(torch::kBFloat16).to(torch::kFloat);
    ASSERT_TRUE(opt.step(1e-3, 0.0).applied);
    ref.step();
  }
  EXPECT_EQ(w.scalar_type(), torch::kBFloat16);
  // The fp32 master follows fp32 AdamW; the bf16 parameter is its rounding.
  const auto s = opt.shard(0);
  if (s.rows > 0) {
    EXPECT_LE(max_diff(s.master, w32.detach().narrow(0, s.row_start, s.rows)), 1e-6);
    EXPECT_TRUE(torch::equal(w.detach().narrow(0, s.row_start, s.rows), s.master.to(torch::kBFloat16)));
  }
  // Small updates (1e-3) survive: bf16 parameters alone would have lost some of them.
  EXPECT_LE(max_diff(w.detach().to(torch::kFloat), w32.detach()), 8e-3);
}

// Expert parallelism (EP 2 over the DP ranks): the experts' rows are split over the EP group,
// their optimizer state over expert DP. Each holder's gradient is the sum of its EP group's
// contributions (what the MoE all-to-all's backward gives); the optimizer must turn it into the
// DP mean, count every expert once in the norm, and match AdamW on the whole parameters.
TEST(ZeroAdamW, ExpertParametersOverExpertDataParallel) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % 2 != 0) GTEST_SKIP() << "EP 2 needs an even world";
  const int ep = 2;
  ParallelLayout layout(MPI_COMM_WORLD, {1, 0, 0, ep});
  const int dp = layout.dp_size(), q = layout.ep_rank();
  const int64_t E = 6, L = E / ep, d = 5;
  const double lr = 1e-2, clip = 0.7;
  torch::manual_seed(4);
  const torch::Tensor dense0 = torch::randn({3, d}), experts0 = torch::randn({E, 3, d});
  torch::Tensor ref_dense = dense0.clone().requires_grad_(true), ref_experts = experts0.clone().requires_grad_(true);
  torch::optim::AdamW ref_opt({ref_dense, ref_experts},
                              torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  torch::Tensor dense = dense0.clone().requires_grad_(true);
  torch::Tensor mine = experts0.narrow(0, q * L, L).clone().requires_grad_(true);
  AdamWOptions opts;
  opts.bucket_bytes = 64;  // several buckets per group
  ZeroAdamW opt({{"dense", dense, true, false, false}, {"experts", mine, true, false, true}}, layout.dp(), nullptr, opts,
                ExpertGroups{&layout.edp(), &layout.ep()});
  // Expert state is sharded over expert DP (DP / EP ranks), not over all of DP.
  const auto sh = opt.shard(1);
  EXPECT_EQ(sh.row_start, layout.edp_rank() * ((L + layout.edp_size() - 1) / layout.edp_size()));
  const int64_t first = int64_t(layout.edp_rank()) * ep;  // DP ranks of this EP group
  for (int step = 0; step < 6; ++step) {
    torch::manual_seed(100 + step);
    const torch::Tensor gd = torch::randn({dp, 3, d}), ge = torch::randn({dp, E, 3, d});  // per DP rank
    ref_opt.zero_grad();
    ref_dense.mutable_grad() = gd.mean(0);
    ref_experts.mutable_grad() = ge.mean(0);
    const double ref_norm = std::sqrt(gd.mean(0).square().sum().item<double>() + ge.mean(0).square().sum().item<double>());
    if (ref_norm > clip) {
      ref_dense.mutable_grad().mul_(clip / (ref_norm + 1e-6));
      ref_experts.mutable_grad().mul_(clip / (ref_norm + 1e-6));
    }
    ref_opt.step();
    dense.mutable_grad() = gd[layout.dp_rank()].clone();
    mine.mutable_grad() = ge.narrow(0, first, ep).sum(0).narrow(0, q * L, L).clone();
    const StepResult r = opt.step(lr, clip);
    ASSERT_TRUE(r.applied);
    EXPECT_NEAR(r.grad_norm, ref_norm, 1e-5 * ref_norm) << "step " << step;
  }
  EXPECT_LE(max_diff(dense, ref_dense), 2e-5);
  EXPECT_LE(max_diff(mine, ref_experts.narrow(0, q * L, L)), 2e-5);
  EXPECT_GT(max_diff(mine, experts0.narrow(0, q * L, L)), 1e-2);  // they moved
}

// Data parallelism: the bucketed gradient all-reduce at DP = world gives the gradients of
// one process on the whole (world-times larger) batch; TP x DP combined at 4 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/grad_sync.h"
#include "dist/parallel_layout.h"
#include "dist/tensor_parallel.h"

using namespace ac::dist;

namespace {

struct Mlp {
  ColumnParallelLinear fc1;
  RowParallelLinear fc2;
  Mlp(int64_t in, int64_t hidden, Communicator* tp)
      : fc1(in, hidden, true, false, tp), fc2(hidden, in, true, true, tp) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(fc1(x))); }
  std::vector<torch::Tensor> params() {
    auto p = fc1->parameters();
    for (auto& q : fc2->parameters()) p.push_back(q);
    return p;
  }
};

void check_dp_equals_full_batch(int tp_size, size_t bucket_bytes) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % tp_size != 0) GTEST_SKIP() << "world " << world << " not divisible by tp " << tp_size;
  ParallelLayout layout(MPI_COMM_WORLD, {tp_size, 0, 0});
  const int64_t in = 8, hidden = 16, per_rank = 3;
  const int dp = layout.dp_size();

  auto self = make_self_communicator();
  torch::manual_seed(42);
  Mlp full(in, hidden, self.get());  // TP = 1, whole batch
  torch::manual_seed(42);
  Mlp part(in, hidden, &layout.tp());
  torch::Tensor x = torch::randn({per_rank * dp, in});
  torch::Tensor y = torch::randn({per_rank * dp, in});

  torch::mse_loss(full.forward(x), y).backward();

  torch::Tensor xs = x.narrow(0, per_rank * layout.dp_rank(), per_rank);
  torch::Tensor ys = y.narrow(0, per_rank * layout.dp_rank(), per_rank);
  torch::mse_loss(part.forward(xs), ys).backward();  // mean over the local batch
  GradBuckets buckets(part.params(), layout.dp(), bucket_bytes);
  buckets.all_reduce_gradients();  // average over DP = mean over the whole batch

  const auto rows = shard_range(hidden, layout.tp_size(), layout.tp_rank());
  auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>();
  };
  EXPECT_LE(close(part.fc1->weight.grad(), full.fc1->weight.grad().narrow(0, rows.start, rows.size)), 1e-5);
  EXPECT_LE(close(part.fc1->bias.grad(), full.fc1->bias.grad().narrow(0, rows.start, rows.size)), 1e-5);
  EXPECT_LE(close(part.fc2->weight.grad(), full.fc2->weight.grad().narrow(1, rows.start, rows.size)), 1e-5);
  EXPECT_LE(close(part.fc2->bias.grad(), full.fc2->bias.grad()), 1e-5);
  if (bucket_bytes < 256) {
    EXPECT_GT(buckets.num_buckets(), 1u);
  }
}

}  // namespace

TEST(DataParallel, GradientsEqualFullBatchOneBucket) { check_dp_equals_full_batch(1, GradBuckets::kDefaultBucketBytes); }
TEST(DataParallel, GradientsEqualFullBatchManyBuckets) { check_dp_equals_full_batch(1, 64); }
TEST(DataParallel, TensorTimesDataParallel) { check_dp_equals_full_batch(2, 128); }

TEST(DataParallel, MissingGradientCountsAsZero) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto dp = make_mpi_communicator(MPI_COMM_WORLD);
  torch::Tensor p = torch::zeros({4}, torch::requires_grad());
  if (rank == 0) p.mutable_grad() = torch::full({4}, float(world));
  GradBuckets b({p}, *dp);
  b.all_reduce_gradients();
  ASSERT_TRUE(p.grad().defined());
  EXPECT_TRUE(torch::allclose(p.grad(), torch::ones({4})));
}

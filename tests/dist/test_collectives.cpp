// Every collective, every dtype, against hand-computed results, at 1, 2 and 4 ranks.
// Backends: "mpi" on CPU tensors always; "nccl" on CUDA tensors when this build has NCCL
// and LibTorch sees a GPU (otherwise those cases are reported as skipped).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/communicator.h"
#include "dist/parallel_layout.h"
#include "tests/mpi_world.h"

using ac::dist::ReduceOp;

namespace {

using ac::testing::World;

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kLong};

using Param = std::tuple<std::string, torch::ScalarType>;

}  // namespace

class Collectives : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    backend_ = std::get<0>(GetParam());
    dtype_ = std::get<1>(GetParam());
    if (backend_ == "nccl") {
      if (!ac::dist::nccl_available()) GTEST_SKIP() << "built without NCCL";
      if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to LibTorch";
      World w;
      device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(w.rank % torch::cuda::device_count()));
    }
    comm_ = ac::dist::make_communicator(backend_, MPI_COMM_WORLD, device_.is_cuda() ? device_.index() : 0);
  }
  // Values exactly representable in bf16/f16 for every rank count used here.
  torch::Tensor rank_values(int rank, int64_t n) const {
    return (torch::arange(n, torch::kDouble) + 10.0 * (rank + 1)).to(dtype_).to(device_);
  }
  torch::Tensor zeros(at::IntArrayRef shape) const {
    return torch::zeros(shape, torch::TensorOptions().dtype(dtype_).device(device_));
  }
  static torch::Tensor host(const torch::Tensor& t) { return t.to(torch::kCPU).to(torch::kDouble); }

  std::string backend_;
  torch::ScalarType dtype_ = torch::kFloat;
  torch::Device device_ = torch::kCPU;
  std::shared_ptr<ac::dist::Communicator> comm_;
};

TEST_P(Collectives, AllReduceSumMaxAvg) {
  World w;
  auto& comm = comm_;
  const int64_t n = 37;
  double rank_sum = 0;
  for (int r = 0; r < w.size; ++r) rank_sum += 10.0 * (r + 1);
  torch::Tensor idx = torch::arange(n, torch::kDouble);

  torch::Tensor t = rank_values(w.rank, n);
  comm->all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(t.scalar_type(), dtype_);
  EXPECT_TRUE(torch::equal(host(t), idx * w.size + rank_sum));

  t = rank_values(w.rank, n);
  comm->all_reduce(t, ReduceOp::Max);
  EXPECT_TRUE(torch::equal(host(t), idx + 10.0 * w.size));

  t = rank_values(w.rank, n) * w.size;  // so the average is exact for integers too
  comm->all_reduce(t, ReduceOp::Avg);
  EXPECT_TRUE(torch::equal(host(t), (idx * w.size + rank_sum)));
}

TEST_P(Collectives, AllGatherConcatenatesAlongDim0) {
  World w;
  auto& comm = comm_;
  torch::Tensor in = rank_values(w.rank, 6).view({2, 3});
  torch::Tensor out = zeros({2 * w.size, 3});
  comm->all_gather(out, in);
  for (int r = 0; r < w.size; ++r)
    EXPECT_TRUE(torch::equal(host(out.narrow(0, 2 * r, 2)), host(rank_values(r, 6).view({2, 3})))) << "block " << r;
}

TEST_P(Collectives, ReduceScatterGivesEachRankItsBlock) {
  World w;
  auto& comm = comm_;
  const int64_t block = 5;
  torch::Tensor in = rank_values(w.rank, block * w.size);
  torch::Tensor out = zeros({block});
  comm->reduce_scatter(out, in, ReduceOp::Sum);
  double rank_sum = 0;
  for (int r = 0; r < w.size; ++r) rank_sum += 10.0 * (r + 1);
  torch::Tensor want = (torch::arange(block, torch::kDouble) + block * w.rank) * w.size + rank_sum;
  EXPECT_TRUE(torch::equal(host(out), want));

  comm->reduce_scatter(out, in, ReduceOp::Max);
  EXPECT_TRUE(torch::equal(host(out), torch::arange(block, torch::kDouble) + block * w.rank + 10.0 * w.size));
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  World w;
  auto& comm = comm_;
  for (int root = 0; root < w.size; ++root) {
    torch::Tensor t = rank_values(w.rank, 9);
    comm->broadcast(t, root);
    EXPECT_TRUE(torch::equal(host(t), host(rank_values(root, 9)))) << "root " << root;
  }
  comm->barrier();
}

INSTANTIATE_TEST_SUITE_P(BackendsAndDtypes, Collectives,
                         ::testing::Combine(::testing::Values(std::string("mpi"), std::string("nccl")),
                                            ::testing::ValuesIn(kDtypes)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + c10::toString(std::get<1>(info.param));
                         });

TEST(Collectives, NonContiguousTensorsAreReducedInPlace) {
  World w;
  auto comm = ac::dist::make_mpi_communicator(MPI_COMM_WORLD);
  torch::Tensor base = torch::ones({4, 6});
  torch::Tensor view = base.t();  // non-contiguous
  comm->all_reduce(view, ReduceOp::Sum);
  EXPECT_TRUE(torch::equal(base, torch::full({4, 6}, float(w.size))));
}

TEST(Collectives, Bf16SumAccumulatesInFp32) {
  // 256 + 1 + 1 + ... in bf16 per hop would stall at 256; fp32 accumulation does not.
  World w;
  if (w.size < 2) GTEST_SKIP() << "needs 2+ ranks";
  auto comm = ac::dist::make_mpi_communicator(MPI_COMM_WORLD);
  torch::Tensor t = torch::full({3}, w.rank == 0 ? 256.0 : 1.0, torch::kBFloat16);
  comm->all_reduce(t, ReduceOp::Sum);
  const double exact = 256.0 + (w.size - 1);
  const double bf16_exact = torch::tensor(exact, torch::kBFloat16).item<double>();
  EXPECT_EQ(t[0].item<double>(), bf16_exact);
}

TEST(Collectives, RejectsMismatchedShapesAndCudaOnMpi) {
  World w;
  auto comm = ac::dist::make_mpi_communicator(MPI_COMM_WORLD);
  torch::Tensor in = torch::ones({3});
  torch::Tensor out = torch::zeros({3 * w.size + 1});
  EXPECT_THROW(comm->all_gather(out, in), std::invalid_argument);
}

TEST(Collectives, LayoutSubCommunicators) {
  World w;
  const int tp = w.size >= 2 ? 2 : 1;
  ac::dist::ParallelLayout layout(MPI_COMM_WORLD, {tp, 0, 0});
  EXPECT_EQ(layout.tp().size(), tp);
  EXPECT_EQ(layout.dp().size(), w.size / tp);
  EXPECT_EQ(layout.tp().rank(), w.rank % tp);
  EXPECT_EQ(layout.dp().rank(), w.rank / tp);
  // Sum of world ranks inside my TP group: consecutive ranks.
  torch::Tensor t = torch::full({1}, int64_t(w.rank));
  layout.tp().all_reduce(t, ReduceOp::Sum);
  const int first = (w.rank / tp) * tp;
  int64_t want = 0;
  for (int r = first; r < first + tp; ++r) want += r;
  EXPECT_EQ(t.item<int64_t>(), want);
  // DP group: same tp_rank, stride tp.
  t = torch::full({1}, int64_t(w.rank));
  layout.dp().all_reduce(t, ReduceOp::Sum);
  want = 0;
  for (int r = w.rank % tp; r < w.size; r += tp) want += r;
  EXPECT_EQ(t.item<int64_t>(), want);
}

TEST(Collectives, SelfCommunicatorIsIdentity) {
  auto self = ac::dist::make_self_communicator();
  torch::Tensor t = torch::arange(4, torch::kFloat);
  self->all_reduce(t, ReduceOp::Sum);
  EXPECT_TRUE(torch::equal(t, torch::arange(4, torch::kFloat)));
  torch::Tensor out = torch::zeros({4});
  self->all_gather(out, t);
  EXPECT_TRUE(torch::equal(out, t));
}

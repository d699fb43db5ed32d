// Expert parallelism (run under mpiexec -n 2 and -n 4): the routed experts spread over TP x EP
// ranks with the token all-to-all equal one process holding every expert. Each DP rank runs
// its own tokens; the one-process reference runs all of them. Logits and every gradient
// (experts, router, shared expert, latent projections, dense layers) must match. Also: full
// activation recomputation gives the same gradients at every layout.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <set>

#include "dist/communicator.h"
#include "dist/expert_parallel.h"
#include "dist/parallel_layout.h"
#include "model/model.h"
#include "model/recompute.h"
#include "tests/model/fixtures.h"

using namespace ac::model;
using namespace ac::model::testing;

namespace {

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// What a local parameter should hold, assembled from TP = 1 logical tensors.
torch::Tensor assemble(const ParamShard& s, const std::map<std::string, torch::Tensor>& logical) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : s.pieces) {
    auto t = logical.at(p.logical).narrow(p.dim, p.start, p.size);
    parts.push_back(s.stack ? t.unsqueeze(0) : t);
  }
  return torch::cat(parts, s.stack ? 0 : s.pieces[0].dim);
}

// TP x EP x DP over the world against one process on every DP rank's batch. The loss is the
// token sum over all ranks' batches divided by the total, so the DP sum of the local gradients
// is the reference gradient; expert gradients already hold their EP group's tokens and are
// summed over expert DP only (what ZeroAdamW's expert group does, before its mean).
struct EpLayout {
  int tp = 1, ep = 1;
  bool expert_tp = false;  // each expert's FFN over TP (ETP = TP) instead of whole experts
};
std::string str(const EpLayout& l) {
  return "TP " + std::to_string(l.tp) + " x EP " + std::to_string(l.ep) + (l.expert_tp ? " (ETP = TP)" : "");
}

void check_ep_equals_ep1(const ArchSpec& spec, const EpLayout& L, uint64_t seed,
                         const std::function<void(CausalLM&)>& edit = nullptr) {
  const int tp = L.tp, ep = L.ep;
  ac::dist::ParallelLayout layout(MPI_COMM_WORLD, {tp, 0, 0, ep});
  TpGroup tpg{ac::dist::make_mpi_communicator(layout.tp_mpi_comm())};
  EpGroup epg{ac::dist::make_mpi_communicator(layout.ep_mpi_comm()), L.expert_tp, nullptr};
  CausalLM one(spec), many(spec, tpg, ModelOptions{torch::kFloat32, epg});
  one->init_weights(seed);
  many->init_weights(seed);
  if (edit) edit(one), edit(many);
  const int dp = layout.dp_size();
  const int64_t B = 2, T = 7;
  torch::manual_seed(13);  // the same ids on every rank
  auto ids = torch::randint(0, spec.vocab_size, {B * dp, T});
  auto loss_of = [&](const torch::Tensor& logits, const torch::Tensor& x) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, spec.vocab_size}), x.reshape({-1}),
                                                torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
           double(ids.numel());
  };
  auto l1 = one->forward(ids);
  loss_of(l1, ids).backward();
  auto mine = ids.narrow(0, B * layout.dp_rank(), B);
  auto ln = many->forward(mine);
  loss_of(ln, mine).backward();
  EXPECT_LE((l1.detach().narrow(0, B * layout.dp_rank(), B) - ln.detach()).abs().max().item<double>(), 2e-5)
      << spec.name << " logits at " << str(L);

  many->reduce_tp_partial_grads();
  std::set<const void*> experts;
  for (const auto& p : many->expert_parameters()) experts.insert(p.unsafeGetTensorImpl());
  std::map<std::string, torch::Tensor> want;
  for (auto& [k, v] : one->logical_tensors(/*grads=*/true)) want[k] = v;
  auto params = many->named_parameters(true);
  int checked = 0, expert_checked = 0;
  for (const auto& s : many->shard_map()) {
    const auto& p = params[s.param];
    if (!p.requires_grad()) continue;
    auto g = p.grad().defined() ? p.grad().clone() : torch::zeros_like(p);
    const bool expert = experts.count(p.unsafeGetTensorImpl()) > 0;
    (expert ? layout.edp() : layout.dp()).all_reduce(g);
    EXPECT_LE((assemble(s, want) - g).abs().max().item<double>(), 2e-5)
        << spec.name << " grad of " << s.param << " at " << str(L);
    ++checked;
    expert_checked += expert;
  }
  EXPECT_GT(checked, 5);
  EXPECT_GT(expert_checked, 0) << spec.name;
  // This rank holds experts/(TP x EP) of each MoE layer, or experts/EP with a 1/TP FFN slice.
  for (size_t i = 0; i < spec.layers.size(); ++i)
    if (spec.layers[i].moe) {
      const auto& m = *spec.layers[i].moe;
      auto moe = many->layer(i)->moe;
      EXPECT_EQ(moe->local_experts(), m.num_experts / (L.expert_tp ? ep : tp * ep));
      EXPECT_EQ(moe->experts->up_proj.size(1), L.expert_tp ? m.expert_ffn / tp : m.expert_ffn);
    }
}

// The layouts this world size allows (DP = world / TP, EP divides DP).
std::vector<EpLayout> layouts() {
  const int w = world_size();
  std::vector<EpLayout> v;
  if (w == 2) v = {{1, 2, false}, {2, 1, true}};
  if (w == 4) v = {{1, 4, false}, {2, 2, false}, {1, 2, false} /* EP 2 x expert DP 2 */, {2, 2, true}};
  return v;
}

}  // namespace

class Ep_ : public ::testing::TestWithParam<std::string> {};

TEST_P(Ep_, ForwardBackwardEqualEp1) {
  if (layouts().empty()) GTEST_SKIP() << "needs 2 or 4 ranks";
  for (const auto& l : layouts()) check_ep_equals_ep1(fixture_spec(GetParam()), l, 5);
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, Ep_, ::testing::Values("qwen3_moe", "nemotron_h", "nemotron_h_latent"),
                         [](const auto& info) { return info.param; });

// Every token goes to experts 0 and 1 (the selection bias), which the first EP rank of TP
// rank 0 holds: the other ranks dispatch and receive nothing, yet every rank must take part in
// the forward and backward all-to-alls or the EP group deadlocks.
TEST(Ep, NoTokenForMostRanksExperts) {
  if (layouts().empty()) GTEST_SKIP() << "needs 2 or 4 ranks";
  for (const auto& l : layouts())
    check_ep_equals_ep1(fixture_spec("nemotron_h"), l, 7, [](CausalLM& m) {
      torch::NoGradGuard ng;
      for (auto& p : m->named_parameters(true)) {
        if (p.key().find("e_score_correction_bias") == std::string::npos) continue;
        p.value().zero_();
        p.value().narrow(0, 0, 2).fill_(100.0);
      }
    });
}

// A no-grad forward (the frozen teacher, eval) runs the all-to-alls without autograd.
TEST(Ep, NoGradForwardEqualsEp1) {
  if (layouts().empty()) GTEST_SKIP() << "needs 2 or 4 ranks";
  const int ep = world_size();
  ac::dist::ParallelLayout layout(MPI_COMM_WORLD, {1, 0, 0, ep});
  const auto spec = fixture_spec("nemotron_h_latent");
  CausalLM one(spec), many(spec, TpGroup{}, ModelOptions{torch::kFloat32, EpGroup{ac::dist::make_mpi_communicator(layout.ep_mpi_comm()), false, nullptr}});
  one->init_weights(3);
  many->init_weights(3);
  torch::NoGradGuard ng;
  torch::manual_seed(5);
  auto ids = torch::randint(0, spec.vocab_size, {ep, 5});
  auto want = one->forward(ids).narrow(0, layout.dp_rank(), 1);
  EXPECT_LE((many->forward(ids.narrow(0, layout.dp_rank(), 1)) - want).abs().max().item<double>(), 2e-5);
}

// The all-to-all itself: rank r sends (r + 1) * (q + 1) rows to rank q, each row tagged with
// (source, destination, index); the backward returns each gradient row to its source.
TEST(Ep, AllToAllRowsAndItsTranspose) {
  const int n = world_size(), me = [] { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }();
  auto comm = ac::dist::make_mpi_communicator(MPI_COMM_WORLD);
  std::vector<int64_t> send(static_cast<size_t>(n)), want_recv(static_cast<size_t>(n));
  std::vector<torch::Tensor> rows;
  for (int q = 0; q < n; ++q) {
    send[size_t(q)] = (me + 1) * (q + 1) % 3;  // some zero counts
    want_recv[size_t(q)] = (q + 1) * (me + 1) % 3;
    for (int64_t j = 0; j < send[size_t(q)]; ++j)
      rows.push_back(torch::tensor({double(me), double(q), double(j)}, torch::kFloat32).unsqueeze(0));
  }
  auto x = (rows.empty() ? torch::zeros({0, 3}) : torch::cat(rows)).requires_grad_(true);
  EXPECT_EQ(ac::dist::exchange_counts(send, *comm, torch::kCPU), want_recv);
  auto y = ac::dist::all_to_all_rows(x, send, want_recv, *comm);
  int64_t at = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < want_recv[size_t(p)]; ++j, ++at) {
      EXPECT_EQ(y[at][0].item<float>(), p);
      EXPECT_EQ(y[at][1].item<float>(), me);
      EXPECT_EQ(y[at][2].item<float>(), j);
    }
  EXPECT_EQ(at, y.size(0));
  (y * y.detach()).sum().backward();  // dy = y: x's gradient is x when each row comes back to its sender
  if (x.size(0) > 0) {
    EXPECT_TRUE(torch::equal(x.grad(), x.detach()));
  }
}

// Full activation recomputation at EP > 1 (and with TP): the layers run their forward again in
// the backward, all-to-alls and TP reductions included, and give the same gradients as stored
// activations.
TEST(Ep, RecomputedLayersGiveTheSameGradients) {
  if (layouts().empty()) GTEST_SKIP() << "needs 2 or 4 ranks";
  for (const auto& L : layouts()) {
    ac::dist::ParallelLayout layout(MPI_COMM_WORLD, {L.tp, 0, 0, L.ep});
    TpGroup tpg{ac::dist::make_mpi_communicator(layout.tp_mpi_comm())};
    EpGroup epg{ac::dist::make_mpi_communicator(layout.ep_mpi_comm()), L.expert_tp, nullptr};
    const auto spec = fixture_spec("nemotron_h_latent");
    CausalLM a(spec, tpg, ModelOptions{torch::kFloat32, epg}), b(spec, tpg, ModelOptions{torch::kFloat32, epg});
    a->init_weights(21);
    b->init_weights(21);
    torch::manual_seed(17 + layout.dp_rank());  // each DP rank its own tokens
    auto ids = torch::randint(0, spec.vocab_size, {2, 6});
    auto la = a->logits_local(a->hidden_states(ids)).square().mean();
    auto lb = b->logits_local(hidden_states_recomputed(b, ids)).square().mean();
    EXPECT_EQ(la.item<double>(), lb.item<double>()) << str(L);  // the same forward
    la.backward();
    lb.backward();
    auto pa = a->named_parameters(true), pb = b->named_parameters(true);
    int compared = 0;
    for (const auto& p : pa) {
      if (!p.value().requires_grad()) continue;
      auto ga = p.value().grad(), gb = pb[p.key()].grad();
      ASSERT_EQ(ga.defined(), gb.defined()) << p.key();
      if (!ga.defined()) continue;
      EXPECT_LE((ga - gb).abs().max().item<double>(), 1e-6 * (1 + ga.abs().max().item<double>())) << p.key() << " at " << str(L);
      ++compared;
    }
    EXPECT_GT(compared, 10);
  }
}

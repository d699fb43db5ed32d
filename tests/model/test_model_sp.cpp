// Sequence parallelism (run under mpiexec -n 2 and -n 4): with TP > 1 the residual stream,
// norms and embedding output hold 1/TP of the sequence; each tensor-parallel region's input
// is all-gathered along the sequence and its output reduce-scattered. Forward and backward
// must equal TP = 1 and TP without SP (fp32, 2e-5 absolute on logits and gradients of O(1)
// models) for dense, hybrid Mamba/attention/MoE and latent MoE models, with EP and ETP too.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "dist/communicator.h"
#include "dist/error.h"
#include "dist/parallel_layout.h"
#include "dist/tensor_memory.h"
#include "dist/tensor_parallel.h"
#include "model/layers/selective_recompute.h"
#include "model/model.h"
#include "model/recompute.h"
#include "tests/model/counting_communicator.h"
#include "tests/model/fixtures.h"

using namespace ac::model;
using namespace ac::model::testing;

namespace {

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

torch::Tensor assemble(const ParamShard& s, const std::map<std::string, torch::Tensor>& logical, const torch::Tensor& like) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : s.pieces) {
    auto t = logical.at(p.logical).narrow(p.dim, p.start, p.size);
    parts.push_back(s.stack ? t.unsqueeze(0) : t);
  }
  torch::Tensor v;
  if (!parts.empty()) v = torch::cat(parts, s.stack ? 0 : s.pieces[0].dim);
  if (s.pad_rows > 0) {
    auto shape = like.sizes().vec();
    shape[0] = s.pad_rows;
    auto pad = torch::zeros(shape, like.options());
    v = v.defined() ? torch::cat({v, pad}, 0) : pad;
  }
  return v;
}

// A llama fixture with every bias a row-parallel output can have (o_proj, down_proj): with SP
// these are added to sequence slices and their gradients are partial sums over TP.
ArchSpec llama_with_biases() {
  ArchSpec s = fixture_spec("llama");
  s.name = "llama_biases";
  for (auto& l : s.layers) {
    if (l.attention) l.attention->o_bias = l.attention->qkv_bias = true;
    if (l.mlp) l.mlp->bias = true;
  }
  return s;
}

struct Layout {
  int tp = 2, ep = 1;
  bool expert_tp = false;
};
std::string str(const Layout& l) {
  return "TP " + std::to_string(l.tp) + " x EP " + std::to_string(l.ep) + (l.expert_tp ? " (ETP = TP)" : "") + " with SP";
}

// TP x EP x DP with SP against one process (all DP ranks' batches) and against the same
// layout without SP. The loss is the token sum over all batches / total tokens, so the DP sum
// of local gradients (expert ones over expert DP) is the reference gradient.
void check_sp(const ArchSpec& spec, const Layout& L, uint64_t seed, bool recompute = false) {
  ac::dist::ParallelLayout layout(MPI_COMM_WORLD, {L.tp, 0, 0, L.ep});
  auto tp_comm = ac::dist::make_mpi_communicator(layout.tp_mpi_comm());
  TpGroup plain{tp_comm}, sp{tp_comm, /*sequence_parallel=*/true};
  EpGroup epg{ac::dist::make_mpi_communicator(layout.ep_mpi_comm()), L.expert_tp,
              ac::dist::make_mpi_communicator(layout.tp_ep_mpi_comm())};
  CausalLM one(spec), ref(spec, plain, ModelOptions{torch::kFloat32, epg}), par(spec, sp, ModelOptions{torch::kFloat32, epg});
  for (CausalLM* m : {&one, &ref, &par}) (*m)->init_weights(seed);
  const int dp = layout.dp_size();
  const int64_t B = 2, T = 12;  // T splits over TP 2 and 4
  torch::manual_seed(29);
  auto ids = torch::randint(0, spec.vocab_size, {B * dp, T});
  auto mine = ids.narrow(0, B * layout.dp_rank(), B);
  auto loss_of = [&](const torch::Tensor& logits, const torch::Tensor& x) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, spec.vocab_size}), x.reshape({-1}),
                                                torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
           double(ids.numel());
  };
  auto l1 = one->forward(ids);
  loss_of(l1, ids).backward();
  auto lr = ref->forward(mine);
  loss_of(lr, mine).backward();
  torch::Tensor lp;
  if (recompute) {
    lp = par->gather_logits(par->logits_local(hidden_states_recomputed(par, mine)));
  } else {
    // hidden_states is this rank's slice of the sequence.
    auto h = par->hidden_states(mine);
    EXPECT_EQ(h.size(1), T / L.tp);
    lp = par->gather_logits(par->logits_local(h));
  }
  loss_of(lp, mine).backward();
  EXPECT_LE((l1.detach().narrow(0, B * layout.dp_rank(), B) - lp.detach()).abs().max().item<double>(), 2e-5)
      << spec.name << " logits at " << str(L);
  EXPECT_LE((lr.detach() - lp.detach()).abs().max().item<double>(), 2e-5) << spec.name << " logits vs no SP at " << str(L);

  ref->reduce_tp_partial_grads();
  par->reduce_tp_partial_grads();
  std::set<const void*> experts;
  for (const auto& p : par->expert_parameters()) experts.insert(p.unsafeGetTensorImpl());
  std::map<std::string, torch::Tensor> want;
  for (auto& [k, v] : one->logical_tensors(/*grads=*/true)) want[k] = v;
  auto pp = par->named_parameters(true), pr = ref->named_parameters(true);
  int checked = 0;
  for (const auto& s : par->shard_map()) {
    const auto& p = pp[s.param];
    if (!p.requires_grad()) continue;
    auto g = p.grad().defined() ? p.grad().clone() : torch::zeros_like(p);
    auto gr = pr[s.param].grad().defined() ? pr[s.param].grad() : torch::zeros_like(p);
    EXPECT_LE((g - gr).abs().max().item<double>(), 2e-5) << spec.name << " grad of " << s.param << " vs no SP at " << str(L);
    const bool expert = experts.count(p.unsafeGetTensorImpl()) > 0;
    (expert ? layout.edp() : layout.dp()).all_reduce(g);
    EXPECT_LE((assemble(s, want, p) - g).abs().max().item<double>(), 2e-5) << spec.name << " grad of " << s.param << " at " << str(L);
    ++checked;
  }
  EXPECT_GT(checked, 5);
}

// The layouts this world allows for `spec` with TP > 1 (DP = world / TP, EP divides DP).
std::vector<Layout> layouts(const ArchSpec& spec) {
  const int w = world_size();
  std::vector<Layout> cand;
  const bool moe = std::any_of(spec.layers.begin(), spec.layers.end(), [](const LayerSpec& l) { return bool(l.moe); });
  if (w == 2) cand = {{2, 1, false}};
  if (w == 2 && moe) cand.push_back({2, 1, true});
  if (w == 4) cand = {{4, 1, false}, {2, 1, false}};
  if (w == 4 && moe) cand.insert(cand.end(), {{2, 2, false}, {2, 2, true}});
  std::vector<Layout> ok;
  for (const auto& l : cand)
    if (tp_split_problem(spec, l.tp, l.ep, l.expert_tp).empty()) ok.push_back(l);
  return ok;
}

}  // namespace

class Sp_ : public ::testing::TestWithParam<std::string> {};

TEST_P(Sp_, ForwardBackwardEqualTp1AndTpWithoutSp) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  const auto spec = GetParam() == "llama_biases" ? llama_with_biases() : fixture_spec(GetParam());
  const auto ls = layouts(spec);
  ASSERT_FALSE(ls.empty()) << spec.name;
  for (const auto& l : ls) {
    if (world_rank() == 0) std::cout << "  " << spec.name << " at " << str(l) << std::endl;
    check_sp(spec, l, 41);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Sp_,
                         ::testing::Values("llama", "llama_biases", "qwen3", "qwen3_moe", "nemotron_h", "nemotron_h_latent"),
                         [](const auto& info) { return info.param; });

// Full recomputation with SP: the checkpointed layers keep their sequence slice and run their
// gathers and reduce-scatters again in the backward.
TEST(Sp, RecomputedLayersEqualTp1) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  const auto spec = fixture_spec("nemotron_h_latent");
  check_sp(spec, layouts(spec).front(), 43, /*recompute=*/true);
}

// A sequence length TP does not divide is refused by name before any layer runs; so is
// decoding with a cache. At TP 1 the flag changes nothing.
TEST(Sp, RefusesLengthsTpDoesNotDivideAndCaches) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  const auto spec = fixture_spec("nemotron_h");
  ac::dist::ParallelLayout layout(MPI_COMM_WORLD, {2});
  CausalLM m(spec, TpGroup{ac::dist::make_mpi_communicator(layout.tp_mpi_comm()), true});
  m->init_weights(3);
  try {
    m->hidden_states(torch::zeros({1, 7}, torch::kLong));
    ADD_FAILURE() << "7 tokens over TP 2 accepted";
  } catch (const ac::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("sequence length"), std::string::npos) << e.what();
  }
  auto cache = m->new_cache();
  EXPECT_THROW(m->hidden_states(torch::zeros({1, 4}, torch::kLong), &cache), std::invalid_argument);
  CausalLM one(spec, TpGroup{ac::dist::make_self_communicator(), true}), plain(spec);
  one->init_weights(3);
  plain->init_weights(3);
  auto ids = torch::randint(0, spec.vocab_size, {1, 7});
  EXPECT_TRUE(torch::equal(one->forward(ids), plain->forward(ids)));
}

// The collectives themselves, along dim 1 of [2, T, 3]: rank r's slice is positions
// [r T/n, (r + 1) T/n).
TEST(Sp, SequenceCollectivesAndTheirBackward) {
  const int n = world_size(), me = world_rank();
  if (n == 1) GTEST_SKIP() << "needs 2 or more ranks";
  auto comm = ac::dist::make_mpi_communicator(MPI_COMM_WORLD);
  const int64_t t = 3, T = t * n;
  auto full = torch::arange(2 * T * 3, torch::kFloat32).view({2, T, 3});
  auto local = full.narrow(1, me * t, t).clone().requires_grad_(true);
  // All-gather forward; reduce-scatter backward: rank r weighs the gathered tensor by (r + 1),
  // so each slice's gradient is sum_r (r + 1) = n (n + 1) / 2.
  auto g = ac::dist::gather_from_sequence_parallel(local, *comm, 1);
  EXPECT_TRUE(torch::equal(g, full));
  (g * double(me + 1)).sum().backward();
  EXPECT_TRUE(torch::allclose(local.grad(), torch::full_like(local, n * (n + 1) / 2.0)));
  // ... or this rank's slice of the gradient (the same loss on every rank).
  auto local2 = local.detach().clone().requires_grad_(true);
  (ac::dist::gather_from_sequence_parallel(local2, *comm, 1, /*reduce_scatter_grad=*/false) * 2.0).sum().backward();
  EXPECT_TRUE(torch::allclose(local2.grad(), torch::full_like(local2, 2.0)));
  // Reduce-scatter forward (every rank holds `full` * (r + 1)), all-gather backward.
  auto part = (full * double(me + 1)).requires_grad_(true);
  auto rs = ac::dist::reduce_scatter_to_sequence_parallel(part, *comm, 1);
  EXPECT_TRUE(torch::allclose(rs, full.narrow(1, me * t, t) * (n * (n + 1) / 2.0)));
  (rs * double(me + 1)).sum().backward();
  auto want = torch::ones({2, T, 3});
  for (int r = 0; r < n; ++r) want.narrow(1, r * t, t).fill_(r + 1);
  EXPECT_TRUE(torch::equal(part.grad(), want));
  // Scatter forward, all-gather backward.
  auto whole = full.clone().requires_grad_(true);
  auto sc = ac::dist::scatter_to_sequence_parallel(whole, *comm, 1);
  EXPECT_TRUE(torch::equal(sc, full.narrow(1, me * t, t)));
  (sc * double(me + 1)).sum().backward();
  EXPECT_TRUE(torch::equal(whole.grad(), want));
  // A length the group does not divide names the sequence length.
  EXPECT_THROW(ac::dist::scatter_to_sequence_parallel(torch::zeros({1, T + 1, 2}), *comm, 1), ac::InputError);
}

// Selective recomputation (--recompute selective), with SP at this world's TP: the same logits
// and gradients as storing everything, and fewer bytes held by the graph after the forward
// (the attention probabilities and activation outputs are not kept).
TEST(Sp, SelectiveRecomputeEqualsNoneAndKeepsLess) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  ac::dist::tensor_memory::install();
  for (const char* name : {"llama", "nemotron_h_latent"}) {
    const auto spec = fixture_spec(name);
    const Layout L = layouts(spec).front();
    ac::dist::ParallelLayout layout(MPI_COMM_WORLD, {L.tp, 0, 0, L.ep});
    TpGroup sp{ac::dist::make_mpi_communicator(layout.tp_mpi_comm()), true};
    CausalLM a(spec, sp), b(spec, sp);
    a->init_weights(51);
    b->init_weights(51);
    torch::manual_seed(3 + layout.dp_rank());
    auto ids = torch::randint(0, spec.vocab_size, {2, 64});
    auto held = [&](CausalLM& m, bool selective, torch::Tensor& loss) {
      const int64_t before = ac::dist::tensor_memory::current();
      std::optional<SelectiveRecomputeGuard> g;
      if (selective) g.emplace();
      loss = m->logits_local(m->hidden_states(ids)).square().mean();
      return ac::dist::tensor_memory::current() - before;
    };
    torch::Tensor la, lb;
    const int64_t ha = held(a, false, la), hb = held(b, true, lb);
    EXPECT_EQ(la.item<double>(), lb.item<double>()) << name;
    EXPECT_LT(hb, ha) << name << ": selective recompute keeps " << hb << " bytes, storing everything " << ha;
    la.backward();
    lb.backward();
    auto pa = a->named_parameters(true), pb = b->named_parameters(true);
    int compared = 0;
    for (const auto& p : pa) {
      auto ga = p.value().grad(), gb = pb[p.key()].grad();
      ASSERT_EQ(ga.defined(), gb.defined()) << p.key();
      if (!ga.defined()) continue;
      EXPECT_LE((ga - gb).abs().max().item<double>(), 1e-6 * (1 + ga.abs().max().item<double>())) << name << " " << p.key();
      ++compared;
    }
    EXPECT_GT(compared, 5);
  }
}

namespace {
// Bytes on the wire of one rank's collectives in a ring over n ranks (what plan prices):
// all-reduce 2 (n-1)/n of the tensor, reduce-scatter (n-1)/n of its input, all-gather n-1
// times its input.
double wire_bytes(const CommBytes& b, int n) {
  return 2.0 * (n - 1) / n * double(b.all_reduce) + double(n - 1) / n * double(b.reduce_scatter) +
         double(n - 1) * double(b.all_gather);
}

// One forward + backward of `spec` on this rank's batch [kB, kT] with the TP, EP and TP x EP
// groups wrapped in byte counters.
constexpr int64_t kB = 2, kT = 16;
struct StepBytes {
  CommBytes tp, ep, tp_ep;
};
StepBytes count_step(const ArchSpec& spec, const Layout& L, bool sequence_parallel) {
  ac::dist::ParallelLayout layout(MPI_COMM_WORLD, {L.tp, 0, 0, L.ep});
  auto tpc = std::make_shared<CountingCommunicator>(ac::dist::make_mpi_communicator(layout.tp_mpi_comm()));
  auto epc = std::make_shared<CountingCommunicator>(ac::dist::make_mpi_communicator(layout.ep_mpi_comm()));
  auto tpepc = std::make_shared<CountingCommunicator>(ac::dist::make_mpi_communicator(layout.tp_ep_mpi_comm()));
  CausalLM m(spec, TpGroup{tpc, sequence_parallel},
             ModelOptions{torch::kFloat32, L.ep > 1 ? EpGroup{epc, L.expert_tp, tpepc} : EpGroup{nullptr, L.expert_tp, nullptr}});
  m->init_weights(61);
  torch::manual_seed(7 + layout.dp_rank());
  auto ids = torch::randint(0, spec.vocab_size, {kB, kT});
  auto logits = m->gather_logits(m->logits_local(m->hidden_states(ids)));
  torch::nn::functional::cross_entropy(logits.reshape({-1, spec.vocab_size}), ids.reshape({-1})).backward();
  return {tpc->bytes, epc->bytes, tpepc->bytes};
}

int64_t world_sum(int64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}
}  // namespace

// TP volume: SP replaces every all-reduce of a forward + backward by a reduce-scatter and an
// all-gather, the same bytes on the wire (dense Llama and hybrid Nemotron-H, no MoE layer).
TEST(Sp, TpCollectivesCarryTheSameBytesAsAllReduces) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  ArchSpec hybrid = fixture_spec("nemotron_h");
  for (auto& l : hybrid.layers)
    if (l.moe) l.moe.reset(), l.mlp = MlpSpec{128, MlpActivation::ReLU2, false};
  for (const auto& spec : {fixture_spec("llama"), hybrid}) {
    const Layout L{2, 1, false};
    const auto plain = count_step(spec, L, false).tp, sp = count_step(spec, L, true).tp;
    EXPECT_EQ(sp.all_reduce, 0) << spec.name;
    EXPECT_GT(plain.all_reduce, 0) << spec.name;
    EXPECT_DOUBLE_EQ(wire_bytes(sp, 2), wire_bytes(plain, 2)) << spec.name;
  }
}

// EP volume with SP (Megatron's layouts). ETP = TP: each TP rank dispatches only its sequence
// slice's routed copies, so the all-to-all rows (dispatch and combine, forward and backward)
// over the world drop by exactly TP. ETP 1: without SP each TP rank already dispatches, over
// EP, only the copies of its batch that its own experts take (1/TP of them, as routing falls);
// with SP every rank dispatches over TP x EP its slice's copies, B (T/TP) k rows, which is
// plan's per-GPU volume: the world's all-to-all bytes are those of the run without SP (every
// copy once either way) and equal plan's 4 x B (T/TP) k x width per rank (dispatch + combine,
// forward + backward). What SP saves there: no MoE block without a shared expert is a TP
// region any more, so the TP bytes drop by those blocks' all-reduces (forward output,
// backward input gradient), and the router and latent work and activations by TP.
TEST(Sp, ExpertAllToAllVolumeFromTheSlice) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks (TP 2 x EP 2)";
  for (const char* name : {"qwen3_moe", "nemotron_h_latent"}) {
    const auto spec = fixture_spec(name);
    const Layout L{2, 2, true};
    const int64_t plain = world_sum(count_step(spec, L, false).ep.all_to_all_rows);
    const int64_t sp = world_sum(count_step(spec, L, true).ep.all_to_all_rows);
    EXPECT_GT(sp, 0) << name;
    EXPECT_EQ(plain, 2 * sp) << name;
  }
  for (const char* name : {"qwen3_moe", "nemotron_h_latent"}) {
    const auto spec = fixture_spec(name);
    const Layout L{2, 2, false};
    const StepBytes plain = count_step(spec, L, false), sp = count_step(spec, L, true);
    int64_t slice_rows = 0, tp_region_bytes = 0;  // per rank and step: all-to-all bytes of a slice; MoE all-reduces
    for (const auto& l : spec.layers) {
      if (!l.moe) continue;
      const int64_t width = l.moe->latent_size > 0 ? l.moe->latent_size : spec.hidden_size;
      slice_rows += 4 * kB * (kT / L.tp) * l.moe->top_k * width * 4;  // dispatch + combine, forward + backward, fp32
      if (l.moe->shared_ffn == 0) tp_region_bytes += 2 * kB * kT * spec.hidden_size * 4;
    }
    EXPECT_EQ(sp.ep.all_to_all_rows + plain.tp_ep.all_to_all_rows, 0) << name;  // each layout uses one group
    EXPECT_EQ(world_sum(sp.tp_ep.all_to_all_rows), world_size() * slice_rows) << name;
    EXPECT_EQ(world_sum(plain.ep.all_to_all_rows), world_sum(sp.tp_ep.all_to_all_rows)) << name;  // every copy once
    EXPECT_DOUBLE_EQ(wire_bytes(sp.tp, L.tp), wire_bytes(plain.tp, L.tp) - 2.0 * (L.tp - 1) / L.tp * tp_region_bytes) << name;
    if (std::string(name) == "qwen3_moe") {
      EXPECT_GT(tp_region_bytes, 0);
    }
  }
}

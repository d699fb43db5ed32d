// A hybrid CausalLM (Mamba-2, attention, MLP, MoE) saved under one TP x DP layout loads under
// another and gives the same logits. At 4 ranks: saved at TP 2 x DP 2 (only DP rank 0
// writes), loaded at TP 4, TP 2 and TP 1.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>

#include "checkpoint/model_state.h"
#include "dist/error.h"
#include "dist/parallel_layout.h"

namespace fs = std::filesystem;
using namespace ac;

namespace {

model::ArchSpec hybrid_spec() {
  model::ArchSpec s;
  s.name = "ckpt-hybrid";
  s.family = model::ModelFamily::NemotronH;
  s.hidden_size = 64;
  s.vocab_size = 96;
  s.dtype = "float32";
  model::LayerSpec mamba, attn, mlp, moe;
  mamba.mamba = model::MambaSpec{8, 16, 16, 4, 4, 8};
  attn.attention = model::AttentionSpec{8, 4, 8};
  mlp.mlp = model::MlpSpec{128, model::MlpActivation::ReLU2};
  model::MoeSpec m;
  m.num_experts = 8;
  m.top_k = 2;
  m.expert_ffn = 32;
  m.shared_ffn = 64;
  m.activation = model::MlpActivation::ReLU2;
  m.router = model::RouterKind::SigmoidBias;
  m.routed_scaling = 2.0;
  moe.moe = m;
  s.layers = {mamba, moe, attn, mlp, mamba, moe};
  return s;
}

std::string shared_dir(const std::string& name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* base = std::getenv("AC_TEST_TMP");
  fs::path p = fs::path(base ? base : "/tmp/ac-ckpt-test") / name;
  if (rank == 0) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return p.string();
}

torch::Tensor logits_of(model::CausalLM& m, const torch::Tensor& ids) {
  torch::NoGradGuard ng;
  return m->forward(ids);
}

}  // namespace

TEST(ModelCheckpoint, SavedUnderOneLayoutLoadsUnderAnother) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int tp_save = world >= 2 ? 2 : 1;  // TP 2 x DP (world / 2)
  dist::ParallelLayout layout(MPI_COMM_WORLD, {tp_save, 0, 0});
  const auto spec = hybrid_spec();
  model::TpGroup tp{dist::make_mpi_communicator(layout.tp_mpi_comm())};
  model::CausalLM saved(spec, tp);
  saved->init_weights(1234);
  torch::manual_seed(5);
  const torch::Tensor ids = torch::randint(0, spec.vocab_size, {2, 11});
  const torch::Tensor want = logits_of(saved, ids);

  const std::string dir = shared_dir("model");
  const std::string path = checkpoint::save_checkpoint(
      MPI_COMM_WORLD, dir, 42, checkpoint::model_tensors(saved, layout.dp_rank() == 0),
      {{"layout", {{"tp", layout.tp_size()}, {"dp", layout.dp_size()}}}});
  checkpoint::CheckpointReader reader(path);
  EXPECT_TRUE(reader.verify().empty());

  // TP = 1 on every rank, independently.
  model::CausalLM single(spec, model::TpGroup{dist::make_self_communicator()});
  checkpoint::load_model(single, reader);
  EXPECT_LE((logits_of(single, ids) - want).abs().max().item<double>(), 1e-5) << "TP 1";

  // TP = world (4 at 4 ranks), and the saving layout itself (bitwise).
  model::CausalLM wide(spec, model::TpGroup{dist::make_mpi_communicator(MPI_COMM_WORLD)});
  checkpoint::load_model(wide, reader);
  EXPECT_LE((logits_of(wide, ids) - want).abs().max().item<double>(), 1e-5) << "TP " << world;
  model::CausalLM same(spec, tp);
  checkpoint::load_model(same, reader);
  EXPECT_TRUE(torch::equal(logits_of(same, ids), want)) << "same layout must be bitwise";
}

TEST(ModelCheckpoint, ArchSpecMismatchNamesFileAndDataset) {
  const std::string dir = shared_dir("model-mismatch");
  auto spec = hybrid_spec();
  model::CausalLM m(spec, model::TpGroup{dist::make_self_communicator()});
  m->init_weights(1);
  const std::string path = checkpoint::save_checkpoint(MPI_COMM_WORLD, dir, 1, checkpoint::model_tensors(m, true), {});
  spec.layers[3].mlp->ffn_size = 192;  // the student the caller thinks it has
  model::CausalLM other(spec, model::TpGroup{dist::make_self_communicator()});
  checkpoint::CheckpointReader reader(path);
  try {
    checkpoint::load_model(other, reader);
    FAIL() << "a shape mismatch was not detected";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("step_1.h5: model/layers.3."), std::string::npos) << msg;
    EXPECT_NE(msg.find("the ArchSpec wants"), std::string::npos) << msg;
  }
}

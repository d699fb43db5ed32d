// Importance scores (search/importance/importance.h) on a small hybrid teacher (Mamba-2, attention, MLP,
// MoE with shared expert and latent projections) with some units zeroed by construction:
// the file round-trips, the scores do not depend on the TP x DP layout (every TP size that
// divides the world against TP 1 x DP 1 on one rank), zeroed units score zero, and damaged
// or foreign files are refused naming the file. Runs at 1, 2 and 4 ranks.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "data/indexed_dataset.h"
#include "dist/error.h"
#include "model/model.h"
#include "search/importance/importance.h"

namespace fs = std::filesystem;
using namespace ac;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

model::ArchSpec hybrid_spec() {
  model::ArchSpec s;
  s.name = "importance-hybrid";
  s.family = model::ModelFamily::NemotronH;
  s.hidden_size = 64;
  s.vocab_size = 96;
  s.dtype = "float32";
  model::LayerSpec mamba, attn, mlp, moe, moe_latent;
  mamba.mamba = model::MambaSpec{8, 8, 16, 4, 4, 8};  // 8 heads x 8, 4 groups: splits up to TP 4
  attn.attention = model::AttentionSpec{4, 2, 16};     // GQA, 2 heads per KV group
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
  m.latent_size = 32;
  m.shared_ffn = 0;
  m.router = model::RouterKind::Softmax;
  m.activation = model::MlpActivation::SwiGLU;
  moe_latent.moe = m;
  s.layers = {mamba, moe, attn, mlp, mamba, moe_latent};
  return s;
}

// Units zeroed in the teacher (by the weights that feed them), checked by ZeroedUnitsScoreZero.
constexpr int kZeroHidden = 5;            // every norm's weight at this channel
constexpr int kZeroMambaHead = 3;         // layer 0: x rows of in_proj of this head
constexpr int kZeroMambaDim = 6;          // layer 4: x rows of this channel in every head
constexpr int kZeroKvHead = 0;            // layer 2: v_proj rows of KV head 0 (query heads 0, 1)
constexpr int kZeroNeuron = 17;           // layer 3: up_proj row; its down_proj is all zero (identity layer)
constexpr int kZeroExpert = 6;            // layer 1: down_proj of this expert
constexpr int kZeroExpertNeuron = 9;      // layer 1, expert 2: up_proj row
constexpr int kZeroShared = 40;           // layer 1: shared expert up_proj row
constexpr int kZeroLatent = 11;           // layer 5: fc1_latent_proj row

struct Fixture {
  std::string dir, teacher, data;
  model::ArchSpec spec;
};

std::string shared_dir(const std::string& name) {
  const char* base = std::getenv("AC_TEST_TMP");
  fs::path p = fs::path(base ? base : "/tmp/ac-importance-test") / name;
  if (world_rank() == 0) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return p.string();
}

// Rank 0 writes the teacher checkpoint and a random-token dataset; everyone gets the paths.
const Fixture& fixture() {
  static Fixture f = [] {
    Fixture x;
    x.dir = shared_dir("fixture");
    x.spec = hybrid_spec();
    x.teacher = x.dir + "/teacher";
    x.data = x.dir + "/calib";
    if (world_rank() == 0) {
      torch::NoGradGuard ng;
      model::CausalLM m(x.spec, model::TpGroup{dist::make_self_communicator()});
      m->init_weights(7);
      // Std 0.1 instead of 0.02: sublayers change the residual stream visibly, so the depth
      // scores are well above float rounding.
      for (auto& p : m->named_parameters())
        if (p.value().dim() >= 2) p.value().mul_(5.0);
      const int64_t P = 8, DI = 64;
      auto& l0 = *m->layer(0)->mamba;
      l0.in_proj->weight.narrow(0, DI + kZeroMambaHead * P, P).zero_();
      auto& l4 = *m->layer(4)->mamba;
      for (int h = 0; h < 8; ++h) l4.in_proj->weight[DI + h * P + kZeroMambaDim].zero_();
      m->layer(2)->attention->v_proj->weight.narrow(0, kZeroKvHead * 16, 16).zero_();
      m->layer(3)->mlp->up_proj->weight[kZeroNeuron].zero_();
      m->layer(3)->mlp->down_proj->weight.zero_();
      auto& moe = *m->layer(1)->moe;
      moe.experts->down_proj[kZeroExpert].zero_();
      moe.experts->up_proj[2][kZeroExpertNeuron].zero_();
      moe.shared_experts->up_proj->weight[kZeroShared].zero_();
      m->layer(5)->moe->fc1_latent_proj->weight[kZeroLatent].zero_();
      for (size_t i = 0; i < m->layers->size(); ++i)
        for (auto* n : {&m->layer(i)->mixer_norm, &m->layer(i)->ffn_norm})
          if (*n) (*n)->weight[kZeroHidden].zero_();
      checkpoint::save_checkpoint(MPI_COMM_SELF, x.teacher, 0, checkpoint::model_tensors(m, true),
                                  {{checkpoint::kArchSpecAttribute, model::arch_to_json(x.spec)}});
      data::IndexedDatasetWriter w(x.data, data::DType::U16);
      std::mt19937 rng(11);
      for (int d = 0; d < 24; ++d) {
        std::vector<int64_t> doc(30 + d % 7);
        for (auto& t : doc) t = int64_t(rng() % 96);
        w.add_document(doc.data(), doc.size());
      }
      w.finalize();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return x;
  }();
  return f;
}

search::ImportanceOptions options(int tp) {
  const auto& f = fixture();
  search::ImportanceOptions o;
  o.teacher = f.teacher;
  o.data = {f.data};
  o.split = "0,1,0";
  o.calib_samples = 6;  // not a multiple of micro_batch x DP at DP 4: a ragged last step
  o.seq_len = 16;
  o.micro_batch = 2;
  o.tp = tp;
  o.seed = 3;
  o.depth_loss_samples = 4;
  o.dtype = "f32";
  return o;
}

// Every score vector of a result, by dataset name.
std::vector<std::pair<std::string, const std::vector<double>*>> vectors(const search::ImportanceScores& s) {
  std::vector<std::pair<std::string, const std::vector<double>*>> out{{"hidden", &s.hidden}};
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const auto& l = s.layers[i];
    const std::string p = "layers/" + std::to_string(i) + "/";
    for (auto [n, v] : std::vector<std::pair<const char*, const std::vector<double>*>>{
             {"attn_heads", &l.attn_heads}, {"attn_kv_groups", &l.attn_kv_groups}, {"mlp_neurons", &l.mlp_neurons},
             {"mamba_heads", &l.mamba_heads}, {"mamba_head_dim", &l.mamba_head_dim}, {"moe_experts", &l.moe_experts},
             {"moe_expert_tokens", &l.moe_expert_tokens}, {"moe_expert_neurons", &l.moe_expert_neurons},
             {"moe_shared_neurons", &l.moe_shared_neurons}, {"moe_latent", &l.moe_latent}})
      out.push_back({p + n, v});
  }
  return out;
}

// |a - b| <= rel * max(|a|, |b|) element by element; one failure reported per vector.
void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rel, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    const double tol = rel * std::max(std::abs(a[i]), std::abs(b[i])) + 1e-300;
    if (!(std::abs(a[i] - b[i]) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i] << " (relative "
                    << std::abs(a[i] - b[i]) / std::max(std::abs(a[i]), std::abs(b[i])) << ")";
      return;
    }
  }
}

// The index of the smallest value and whether it is unique.
size_t argmin(const std::vector<double>& v) { return size_t(std::min_element(v.begin(), v.end()) - v.begin()); }

template <typename F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no ac::InputError)";
}

}  // namespace

TEST(Importance, LayoutIndependent) {
  // Reference: TP 1 x DP 1, each rank on its own.
  const search::ImportanceScores ref = search::compute_importance(options(1), MPI_COMM_SELF);
  EXPECT_EQ(ref.depth_loss_samples, 4);
  EXPECT_GT(ref.base_loss, 1.0);
  for (int tp = 1; tp <= world_size(); tp *= 2) {
    if (world_size() % tp) continue;
    SCOPED_TRACE("TP " + std::to_string(tp) + " x DP " + std::to_string(world_size() / tp));
    const search::ImportanceScores got = search::compute_importance(options(tp), MPI_COMM_WORLD);
    const auto a = vectors(ref), b = vectors(got);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) expect_close(*a[k].second, *b[k].second, 1e-5, a[k].first);
    expect_close({ref.base_loss}, {got.base_loss}, 1e-5, "base_loss");
    for (size_t i = 0; i < ref.layers.size(); ++i) {
      expect_close({ref.layers[i].depth_cosine}, {got.layers[i].depth_cosine}, 1e-5,
                   "layers/" + std::to_string(i) + " depth_cosine");
      // A difference of two float32 losses: reproducible to their rounding, not relative to itself.
      EXPECT_NEAR(ref.layers[i].depth_loss_increase, got.layers[i].depth_loss_increase, 1e-5 * ref.base_loss)
          << "layer " << i;
    }
    EXPECT_EQ(got.teacher_fingerprint, ref.teacher_fingerprint);
  }
}

TEST(Importance, ZeroedUnitsScoreZero) {
  const int tp = world_size() >= 2 ? 2 : 1;
  const search::ImportanceScores s = search::compute_importance(options(tp), MPI_COMM_WORLD);
  ASSERT_EQ(s.layers.size(), 6u);
  EXPECT_EQ(s.hidden[kZeroHidden], 0.0);
  EXPECT_EQ(argmin(s.hidden), size_t(kZeroHidden));
  EXPECT_GT(*std::min_element(s.hidden.begin() + kZeroHidden + 1, s.hidden.end()), 0.0);
  // Mamba: one head, and one head-dim channel of every head.
  EXPECT_EQ(s.layers[0].mamba_heads[kZeroMambaHead], 0.0);
  EXPECT_EQ(argmin(s.layers[0].mamba_heads), size_t(kZeroMambaHead));
  EXPECT_GT(*std::min_element(s.layers[0].mamba_head_dim.begin(), s.layers[0].mamba_head_dim.end()), 0.0);
  EXPECT_EQ(s.layers[4].mamba_head_dim[kZeroMambaDim], 0.0);
  EXPECT_EQ(argmin(s.layers[4].mamba_head_dim), size_t(kZeroMambaDim));
  EXPECT_GT(*std::min_element(s.layers[4].mamba_heads.begin(), s.layers[4].mamba_heads.end()), 0.0);
  // Attention: KV head 0 has zero values, so its group and both of its query heads score 0
  // (at TP 2 they are rank 0's: rank 1's heads must land in slots 2 and 3).
  const auto& at = s.layers[2];
  EXPECT_EQ(at.attn_kv_groups[kZeroKvHead], 0.0);
  EXPECT_GT(at.attn_kv_groups[1], 0.0);
  EXPECT_EQ(at.attn_heads[0], 0.0);
  EXPECT_EQ(at.attn_heads[1], 0.0);
  EXPECT_GT(at.attn_heads[2], 0.0);
  EXPECT_GT(at.attn_heads[3], 0.0);
  // Dense MLP neuron; the layer itself is an identity (down_proj zero): both depth scores ~0.
  const auto& mlp = s.layers[3];
  EXPECT_EQ(mlp.mlp_neurons[kZeroNeuron], 0.0);
  EXPECT_EQ(argmin(mlp.mlp_neurons), size_t(kZeroNeuron));
  EXPECT_LT(mlp.depth_cosine, 1e-12);
  EXPECT_EQ(mlp.depth_loss_increase, 0.0);  // skipping an exact identity changes nothing, bitwise
  for (size_t i = 0; i < s.layers.size(); ++i)
    if (i != 3) {
      EXPECT_GT(s.layers[i].depth_cosine, 1e-4) << "layer " << i;
      EXPECT_NE(s.layers[i].depth_loss_increase, 0.0) << "layer " << i;
    }
  // MoE: an expert whose output is zero (still routed to), an expert neuron, a shared neuron.
  const auto& moe = s.layers[1];
  EXPECT_GT(moe.moe_expert_tokens[kZeroExpert], 0.0);
  EXPECT_EQ(moe.moe_experts[kZeroExpert], 0.0);
  EXPECT_EQ(argmin(moe.moe_experts), size_t(kZeroExpert));
  double routed = 0;
  for (double t : moe.moe_expert_tokens) routed += t;
  EXPECT_EQ(routed, 6.0 * 16 * 2);  // every token to top_k = 2 experts
  const std::vector<double> e2(moe.moe_expert_neurons.begin() + 2 * 32, moe.moe_expert_neurons.begin() + 3 * 32);
  EXPECT_EQ(e2[kZeroExpertNeuron], 0.0);
  EXPECT_EQ(argmin(e2), size_t(kZeroExpertNeuron));
  EXPECT_EQ(moe.moe_shared_neurons[kZeroShared], 0.0);
  EXPECT_EQ(argmin(moe.moe_shared_neurons), size_t(kZeroShared));
  EXPECT_EQ(s.layers[5].moe_latent[kZeroLatent], 0.0);
  EXPECT_EQ(argmin(s.layers[5].moe_latent), size_t(kZeroLatent));
  EXPECT_TRUE(s.layers[5].moe_shared_neurons.empty());
}

TEST(Importance, FileRoundTripAndBadFiles) {
  const search::ImportanceScores s = search::compute_importance(options(1), MPI_COMM_WORLD);
  const std::string dir = shared_dir("files");
  const std::string path = dir + "/scores_" + std::to_string(world_rank()) + ".h5";
  search::save_importance(s, path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const search::ImportanceScores r = search::load_importance(path, s.teacher_fingerprint);
  const auto a = vectors(s), b = vectors(r);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(*a[k].second, *b[k].second) << a[k].first;
  EXPECT_EQ(r.base_loss, s.base_loss);
  EXPECT_EQ(r.seed, 3u);
  EXPECT_EQ(r.calib_samples, 6);
  EXPECT_EQ(r.seq_len, 16);
  EXPECT_EQ(r.teacher_checkpoint, fixture().teacher);
  EXPECT_EQ(r.data, fixture().data);
  EXPECT_EQ(model::arch_to_json(r.teacher_arch), model::arch_to_json(fixture().spec));
  for (size_t i = 0; i < s.layers.size(); ++i) {
    EXPECT_EQ(r.layers[i].depth_cosine, s.layers[i].depth_cosine);
    EXPECT_EQ(r.layers[i].depth_loss_increase, s.layers[i].depth_loss_increase);
  }

  // Another teacher's fingerprint.
  std::string msg = input_error([&] { search::load_importance(path, "0123456789abcdef"); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("teacher_fingerprint"), std::string::npos) << msg;

  // Truncated: the first half of the file.
  const std::string cut = dir + "/cut_" + std::to_string(world_rank()) + ".h5";
  fs::copy_file(path, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  msg = input_error([&] { search::load_importance(cut); });
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;

  // A dataset of the wrong shape (as if written for another architecture).
  const std::string bad = dir + "/shape_" + std::to_string(world_rank()) + ".h5";
  fs::copy_file(path, bad);
  {
    hid_t f = H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    H5Ldelete(f, "layers/3/mlp_neurons", H5P_DEFAULT);
    hsize_t n = 96;
    hid_t sp = H5Screate_simple(1, &n, nullptr);
    hid_t d = H5Dcreate2(f, "layers/3/mlp_neurons", H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<double> v(96, 1.0);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(f);
  }
  msg = input_error([&] { search::load_importance(bad); });
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  EXPECT_NE(msg.find("layers/3/mlp_neurons"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128]"), std::string::npos) << msg;

  // Not a file at all.
  msg = input_error([&] { search::load_importance(dir + "/missing.h5"); });
  EXPECT_NE(msg.find("missing.h5"), std::string::npos) << msg;
}

TEST(Importance, FingerprintFollowsTheWeights) {
  const auto& f = fixture();
  checkpoint::CheckpointReader reader(checkpoint::resolve_checkpoint(f.teacher));
  const std::string fp = checkpoint::model_fingerprint(reader);
  EXPECT_EQ(fp.size(), 16u);
  EXPECT_EQ(checkpoint::model_fingerprint(reader), fp);
  // Another weight (one element), and the same weights without stored checksums.
  const std::string dir = shared_dir("fingerprint");
  if (world_rank() == 0) {
    model::CausalLM m(f.spec, model::TpGroup{dist::make_self_communicator()});
    checkpoint::load_model(m, reader);
    checkpoint::SaveOptions no_sums;
    no_sums.checksums = false;
    const std::string plain = checkpoint::save_checkpoint(MPI_COMM_SELF, dir + "/plain", 0, checkpoint::model_tensors(m, true),
                                                          {{checkpoint::kArchSpecAttribute, model::arch_to_json(f.spec)}},
                                                          nullptr, no_sums);
    {
      torch::NoGradGuard ng;
      m->layer(2)->attention->q_proj->weight[0][0].add_(1.0);
    }
    const std::string other = checkpoint::save_checkpoint(MPI_COMM_SELF, dir + "/other", 0, checkpoint::model_tensors(m, true),
                                                          {{checkpoint::kArchSpecAttribute, model::arch_to_json(f.spec)}});
    const std::string other_plain = checkpoint::save_checkpoint(
        MPI_COMM_SELF, dir + "/other_plain", 0, checkpoint::model_tensors(m, true),
        {{checkpoint::kArchSpecAttribute, model::arch_to_json(f.spec)}}, nullptr, no_sums);
    const std::string fp_other = checkpoint::model_fingerprint(checkpoint::CheckpointReader(other));
    const std::string fp_plain = checkpoint::model_fingerprint(checkpoint::CheckpointReader(plain));
    const std::string fp_other_plain = checkpoint::model_fingerprint(checkpoint::CheckpointReader(other_plain));
    EXPECT_NE(fp_other, fp);
    EXPECT_NE(fp_plain, fp_other_plain);  // hashed from the data when there are no checksums
    EXPECT_EQ(fp_plain, checkpoint::model_fingerprint(checkpoint::CheckpointReader(plain)));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Importance, DepthLossOffLeavesTheRestBitwise) {
  // The skipped-layer forwards run without the observer: turning them off changes nothing
  // else, bitwise, on the same layout.
  const int tp = world_size() >= 2 ? 2 : 1;
  const search::ImportanceScores with = search::compute_importance(options(tp), MPI_COMM_WORLD);
  search::ImportanceOptions o = options(tp);
  o.depth_loss = false;
  const search::ImportanceScores without = search::compute_importance(o, MPI_COMM_WORLD);
  EXPECT_EQ(without.depth_loss_samples, 0);
  const auto a = vectors(with), b = vectors(without);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(*a[k].second, *b[k].second) << a[k].first;
  EXPECT_EQ(with.base_loss, without.base_loss);
  for (size_t i = 0; i < with.layers.size(); ++i) {
    EXPECT_EQ(with.layers[i].depth_cosine, without.layers[i].depth_cosine) << i;
    EXPECT_EQ(without.layers[i].depth_loss_increase, 0.0) << i;
  }
}

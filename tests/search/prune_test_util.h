// Shared pieces of the pruning and Minitron tests: toy teachers with every prunable part,
// checkpoints in a per-test scratch directory, seeded importance scores.
#pragma once

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/communicator.h"
#include "model/model.h"
#include "search/importance/importance.h"

namespace ac::prune_test {

namespace fs = std::filesystem;

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline std::string shared_dir(const std::string& name) {
  const char* base = std::getenv("AC_TEST_TMP");
  fs::path p = fs::path(base ? base : "/tmp/ac-prune-test") / name;
  if (world_rank() == 0) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return p.string();
}

// Nemotron-H style hybrid with every prunable part: Mamba (4 B/C groups), MoE with a shared
// expert, GQA attention, a dense MLP, a latent MoE.
inline model::ArchSpec hybrid_spec() {
  model::ArchSpec s;
  s.name = "prune-hybrid";
  s.family = model::ModelFamily::NemotronH;
  s.hidden_size = 64;
  s.vocab_size = 96;
  s.norm_eps = 1e-10;  // the pruned RMSNorms match the teacher's up to eps (docs/pruning.md)
  s.dtype = "float32";
  model::LayerSpec mamba, attn, mlp, moe, latent;
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
  m.latent_size = 32;
  latent.moe = m;
  s.layers = {mamba, moe, attn, mlp, latent, mamba};
  return s;
}

// Llama style: RoPE, q/k/v biases, SwiGLU.
inline model::ArchSpec llama_spec() {
  model::ArchSpec s;
  s.name = "prune-llama";
  s.family = model::ModelFamily::Llama;
  s.hidden_size = 64;
  s.vocab_size = 96;
  s.norm_eps = 1e-10;
  s.dtype = "float32";
  model::LayerSpec l;
  l.attention = model::AttentionSpec{8, 4, 8, /*qkv_bias=*/true};
  l.mlp = model::MlpSpec{128, model::MlpActivation::SwiGLU};
  s.layers = {l, l};
  return s;
}

inline model::TpGroup self_tp() { return model::TpGroup{dist::make_self_communicator()}; }

// A TP = 1 teacher with larger-than-default weights (so that removing a unit that matters
// shows in the logits), optionally edited.
inline model::CausalLM make_teacher(const model::ArchSpec& spec, const std::function<void(model::CausalLM&)>& edit = nullptr) {
  model::CausalLM m(spec, self_tp());
  m->init_weights(77);
  torch::NoGradGuard ng;
  for (auto& p : m->named_parameters(true))
    if (p.value().dim() >= 2) p.value().mul_(4.0);
  if (edit) edit(m);
  return m;
}

inline std::string save_teacher(model::CausalLM& m, const std::string& dir) {
  return checkpoint::save_checkpoint(MPI_COMM_WORLD, dir, 0, checkpoint::model_tensors(m, world_rank() == 0),
                                     {{checkpoint::kArchSpecAttribute, model::arch_to_json(m->spec())}});
}

inline torch::Tensor& param(model::CausalLM& m, const std::string& name) {
  auto* p = m->named_parameters(true).find(name);
  if (!p) throw std::runtime_error("no parameter " + name);
  return *p;
}

// Every score positive and distinct-ish (seeded), sized from the teacher.
inline search::ImportanceScores full_scores(const model::ArchSpec& t, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto rnd = [&](int64_t n) {
    auto v = (torch::rand({n}, gen, torch::kFloat64) + 1.0).contiguous();
    return std::vector<double>(v.data_ptr<double>(), v.data_ptr<double>() + n);
  };
  search::ImportanceScores s;
  s.teacher_arch = t;
  s.hidden = rnd(t.hidden_size);
  for (const auto& l : t.layers) {
    search::LayerImportance li;
    if (l.attention) {
      li.attn_heads = rnd(l.attention->num_heads);
      li.attn_kv_groups = rnd(l.attention->num_kv_heads);
    }
    if (l.mamba) {
      li.mamba_heads = rnd(l.mamba->num_heads);
      li.mamba_head_dim = rnd(l.mamba->head_dim);
    }
    if (l.mlp) li.mlp_neurons = rnd(l.mlp->ffn_size);
    if (l.moe) {
      li.moe_experts = rnd(l.moe->num_experts);
      li.moe_expert_tokens = rnd(l.moe->num_experts);
      li.moe_expert_neurons = rnd(l.moe->num_experts * l.moe->expert_ffn);
      li.moe_shared_neurons = rnd(l.moe->shared_ffn);
      li.moe_latent = rnd(l.moe->latent_size);
    }
    li.depth_cosine = rnd(1)[0];
    s.layers.push_back(li);
  }
  return s;
}

inline model::CausalLM load_student(const std::string& dir) {
  checkpoint::CheckpointReader r(checkpoint::resolve_latest(dir));
  model::CausalLM m(checkpoint::checkpoint_arch(r), self_tp());
  checkpoint::load_model(m, r);
  return m;
}

inline torch::Tensor logits(model::CausalLM& m, const torch::Tensor& ids) {
  torch::NoGradGuard ng;
  return m->forward(ids);
}

}  // namespace ac::prune_test

// Pruning (search/prune/prune.h), run at 1, 2 and 4 MPI ranks: the teacher's own ArchSpec gives a
// bitwise copy; units whose contribution is made exactly zero in the teacher and that get the
// lowest scores are the ones removed, and the student's logits equal the teacher's (while
// removing other units does change them); TP 2 / TP 4 students equal the TP 1 student
// tensor for tensor; bad students are refused and nothing is written.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/communicator.h"
#include "dist/error.h"
#include "model/model.h"
#include "search/prune/prune.h"
#include "tests/search/prune_test_util.h"

namespace fs = std::filesystem;
using namespace ac;
using namespace ac::prune_test;

namespace {

torch::Tensor test_ids(int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  return torch::randint(0, vocab, {2, 13}, gen);
}

int prune_tp(const model::ArchSpec& student) {
  const int n = world_size();
  return n % 2 == 0 && model::tp_split_problem(student, 2).empty() ? 2 : 1;
}

// One zero-importance case: `zero` makes some units contribute exactly nothing, `low` gives
// those units the lowest (or, with `high`, the highest) scores, `shrink` is the student.
struct ZeroCase {
  std::string name;
  std::function<void(model::CausalLM&)> zero;
  std::function<void(search::ImportanceScores&, double value)> mark;
  std::function<void(model::ArchSpec&)> shrink;
  std::function<void(const search::PrunePlan&)> check_units;
};

void run_zero_case(const model::ArchSpec& spec, const ZeroCase& c) {
  SCOPED_TRACE(spec.name + " / " + c.name);
  const std::string dir = shared_dir("zero-" + spec.name + "-" + c.name);
  auto teacher = make_teacher(spec, c.zero);
  save_teacher(teacher, dir + "/teacher");
  model::ArchSpec student = spec;
  c.shrink(student);
  auto scores = full_scores(spec, 11);
  c.mark(scores, 0.0);
  const auto plan = search::plan_prune(spec, student, scores);
  c.check_units(plan);
  search::PruneOptions opt;
  opt.tp = prune_tp(student);
  const auto res = search::prune_checkpoint(MPI_COMM_WORLD, dir + "/teacher", scores, student, dir + "/student", opt);
  EXPECT_EQ(res.tp, opt.tp);
  auto s = load_student(dir + "/student");
  const auto ids = test_ids(spec.vocab_size);
  const auto want = logits(teacher, ids), got = logits(s, ids);
  const double diff = (want - got).abs().max().item<double>();
  EXPECT_LT(diff, 2e-5) << "logits differ from the teacher's by " << diff;

  // Control: the same student with the zeroed units ranked highest keeps them and removes
  // units that matter, so the logits move.
  auto bad = full_scores(spec, 11);
  c.mark(bad, 1e9);
  search::prune_checkpoint(MPI_COMM_WORLD, dir + "/teacher", bad, student, dir + "/control", opt);
  auto sc = load_student(dir + "/control");
  const double moved = (want - logits(sc, ids)).abs().max().item<double>();
  EXPECT_GT(moved, std::max(1e-4, 50 * diff)) << "removing important units changed the logits by only " << moved;
  if (world_rank() == 0)
    std::printf("  %s / %s at TP %d: max |logit diff| %.2e with the dead units removed, %.2e with live ones removed\n",
                spec.name.c_str(), c.name.c_str(), opt.tp, diff, moved);
}

}  // namespace

TEST(Prune, TeacherArchSpecGivesBitwiseCopy) {
  for (const auto& spec : {hybrid_spec(), llama_spec()}) {
    SCOPED_TRACE(spec.name);
    const std::string dir = shared_dir("identity-" + spec.name);
    auto teacher = make_teacher(spec);
    const std::string tpath = save_teacher(teacher, dir + "/teacher");
    search::ImportanceScores none;  // nothing is ranked: no scores needed
    search::PruneOptions opt;
    opt.tp = world_size() >= 2 ? 2 : 1;
    const auto res = search::prune_checkpoint(MPI_COMM_WORLD, dir + "/teacher", none, spec, dir + "/student", opt);
    auto s = load_student(dir + "/student");
    const auto ids = test_ids(spec.vocab_size);
    EXPECT_TRUE(torch::equal(logits(teacher, ids), logits(s, ids)));
    checkpoint::CheckpointReader a(tpath), b(res.path);
    ASSERT_EQ(a.datasets().size(), b.datasets().size());
    for (const auto& d : a.datasets()) EXPECT_TRUE(torch::equal(a.read(d.name), b.read(d.name))) << d.name;
    EXPECT_EQ(checkpoint::checkpoint_arch(b).layers.size(), spec.layers.size());
  }
}

TEST(Prune, PlanCoversExactlyTheStudentTensors) {
  auto spec = hybrid_spec();
  auto student = spec;
  student.hidden_size = 48;
  student.layers[0].mamba->num_heads = 4;
  student.layers[0].mamba->head_dim = 8;
  student.layers[1].moe->num_experts = 6;
  student.layers[1].moe->expert_ffn = 16;
  student.layers[1].moe->shared_ffn = 0;  // shared expert dropped
  student.layers[2].attention->num_kv_heads = 2;
  student.layers[2].attention->num_heads = 2;
  student.layers[3] = model::LayerSpec{};  // dropped layer
  student.layers[4].moe->latent_size = 16;
  const auto plan = search::plan_prune(spec, student, full_scores(spec, 3));
  const auto want = checkpoint::model_tensor_shapes(student);
  const auto have_t = checkpoint::model_tensor_shapes(spec);
  ASSERT_EQ(plan.tensors.size(), want.size());
  for (const auto& t : plan.tensors) {
    ASSERT_TRUE(want.count(t.name)) << t.name;
    EXPECT_EQ(t.shape(), want.at(t.name)) << t.name;
    ASSERT_TRUE(have_t.count(t.source)) << t.source;
    EXPECT_EQ(t.source_shape, have_t.at(t.source)) << t.source;
    for (size_t d = 0; d < t.keep.size(); ++d) {
      if (!t.keep[d]) continue;
      const auto& k = *t.keep[d];
      EXPECT_TRUE(std::is_sorted(k.begin(), k.end())) << t.name;  // original order
      EXPECT_LT(k.back(), t.source_shape[d]) << t.name;
    }
  }
  // Kept units are the top-ranked ones: every kept expert scores at least every removed one.
  const auto scores = full_scores(spec, 3);
  const auto& kept = plan.layers[1].moe_experts;
  ASSERT_EQ(kept.size(), 6u);
  std::set<int64_t> in(kept.begin(), kept.end());
  for (int64_t e = 0; e < 8; ++e) {
    if (in.count(e)) continue;
    for (int64_t k : kept) EXPECT_GE(scores.layers[1].moe_experts[size_t(k)], scores.layers[1].moe_experts[size_t(e)]);
  }
  // Mamba heads stay within their B/C group: one head per group of 2.
  const auto& mh = plan.layers[0].mamba_heads;
  ASSERT_EQ(mh.size(), 4u);
  for (size_t g = 0; g < 4; ++g) EXPECT_EQ(mh[g] / 2, int64_t(g));
}

TEST(Prune, ZeroImportanceUnitsAreRemovedAndLogitsMatch) {
  const int P = 16;  // Mamba head dim
  std::vector<ZeroCase> hybrid_cases = {
      {"mamba-heads",  // head 2g+1 of every group: its gate z is zero, so y * silu(z) = 0
       [&](model::CausalLM& m) {
         torch::NoGradGuard ng;
         for (int l : {0, 5})
           for (int g = 0; g < 4; ++g)
             param(m, "layers." + std::to_string(l) + ".mamba.in_proj.weight").narrow(0, (2 * g + 1) * P, P).zero_();
       },
       [](search::ImportanceScores& s, double v) {
         for (int l : {0, 5})
           for (int g = 0; g < 4; ++g) s.layers[size_t(l)].mamba_heads[size_t(2 * g + 1)] = v;
       },
       [](model::ArchSpec& s) { s.layers[0].mamba->num_heads = s.layers[5].mamba->num_heads = 4; },
       [](const search::PrunePlan& p) { EXPECT_EQ(p.layers[0].mamba_heads, (std::vector<int64_t>{0, 2, 4, 6})); }},
      {"mamba-head-dim",  // channels 3, 7, 8, 15 of every head
       [&](model::CausalLM& m) {
         torch::NoGradGuard ng;
         for (int l : {0, 5})
           for (int h = 0; h < 8; ++h)
             for (int c : {3, 7, 8, 15}) param(m, "layers." + std::to_string(l) + ".mamba.in_proj.weight")[h * P + c].zero_();
       },
       [](search::ImportanceScores& s, double v) {
         for (int l : {0, 5})
           for (int c : {3, 7, 8, 15}) s.layers[size_t(l)].mamba_head_dim[size_t(c)] = v;
       },
       [](model::ArchSpec& s) { s.layers[0].mamba->head_dim = s.layers[5].mamba->head_dim = 12; },
       [](const search::PrunePlan& p) {
         EXPECT_EQ(p.layers[5].mamba_head_dim, (std::vector<int64_t>{0, 1, 2, 4, 5, 6, 9, 10, 11, 12, 13, 14}));
       }},
      {"experts",  // experts 1 and 6 of both MoE layers: never routed (bias), outputs zero
       [](model::CausalLM& m) {
         torch::NoGradGuard ng;
         for (int l : {1, 4})
           for (int e : {1, 6}) {
             const std::string p = "layers." + std::to_string(l) + ".moe.";
             param(m, p + "experts.down_proj")[e].zero_();
             param(m, p + "gate.e_score_correction_bias")[e].fill_(-100.0);
           }
       },
       [](search::ImportanceScores& s, double v) {
         for (int l : {1, 4})
           for (int e : {1, 6}) s.layers[size_t(l)].moe_experts[size_t(e)] = v;
       },
       [](model::ArchSpec& s) { s.layers[1].moe->num_experts = s.layers[4].moe->num_experts = 6; },
       [](const search::PrunePlan& p) { EXPECT_EQ(p.layers[4].moe_experts, (std::vector<int64_t>{0, 2, 3, 4, 5, 7})); }},
      {"expert-ffn-shared-latent",  // expert neurons 0..7, shared neurons 10..25, latent 4..11
       [](model::CausalLM& m) {
         torch::NoGradGuard ng;
         for (int l : {1, 4}) {
           const std::string p = "layers." + std::to_string(l) + ".moe.";
           param(m, p + "experts.down_proj").narrow(2, 0, 8).zero_();
           param(m, p + "shared_experts.down_proj.weight").narrow(1, 10, 16).zero_();
         }
         // Latent channels 4..11: not written by fc1 (so the experts read zeros) and not read by fc2.
         param(m, "layers.4.moe.fc1_latent_proj.weight").narrow(0, 4, 8).zero_();
         param(m, "layers.4.moe.fc2_latent_proj.weight").narrow(1, 4, 8).zero_();
       },
       [](search::ImportanceScores& s, double v) {
         for (int l : {1, 4}) {
           auto& li = s.layers[size_t(l)];
           for (int e = 0; e < 8; ++e)
             for (int j = 0; j < 8; ++j) li.moe_expert_neurons[size_t(e * 32 + j)] = v;
           for (int j = 10; j < 26; ++j) li.moe_shared_neurons[size_t(j)] = v;
         }
         for (int c = 4; c < 12; ++c) s.layers[4].moe_latent[size_t(c)] = v;
       },
       [](model::ArchSpec& s) {
         for (int l : {1, 4}) {
           s.layers[size_t(l)].moe->expert_ffn = 24;
           s.layers[size_t(l)].moe->shared_ffn = 48;
         }
         s.layers[4].moe->latent_size = 24;
       },
       [](const search::PrunePlan& p) {
         EXPECT_EQ(p.layers[4].moe_latent.front(), 0);
         EXPECT_EQ(p.layers[4].moe_latent[4], 12);
       }},
      {"ffn-neurons",  // neurons 0..31 of the dense MLP
       [](model::CausalLM& m) {
         torch::NoGradGuard ng;
         param(m, "layers.3.mlp.down_proj.weight").narrow(1, 0, 32).zero_();
       },
       [](search::ImportanceScores& s, double v) {
         for (int j = 0; j < 32; ++j) s.layers[3].mlp_neurons[size_t(j)] = v;
       },
       [](model::ArchSpec& s) { s.layers[3].mlp->ffn_size = 96; },
       [](const search::PrunePlan& p) { EXPECT_EQ(p.layers[3].mlp_neurons.front(), 32); }},
  };
  auto attention_cases = [](int layer) {
    const std::string o = "layers." + std::to_string(layer) + ".attention.o_proj.weight";
    const size_t L = size_t(layer);
    return std::vector<ZeroCase>{
        {"heads",  // the second head of every KV group (heads 1, 3, 5, 7)
         [=](model::CausalLM& m) {
           torch::NoGradGuard ng;
           for (int h : {1, 3, 5, 7}) param(m, o).narrow(1, h * 8, 8).zero_();
         },
         [=](search::ImportanceScores& s, double v) {
           for (int h : {1, 3, 5, 7}) s.layers[L].attn_heads[size_t(h)] = v;
         },
         [=](model::ArchSpec& s) { s.layers[L].attention->num_heads = 4; },
         [=](const search::PrunePlan& p) { EXPECT_EQ(p.layers[L].attn_heads, (std::vector<int64_t>{0, 2, 4, 6})); }},
        {"kv-groups",  // KV groups 0 and 2: both of their query heads contribute nothing
         [=](model::CausalLM& m) {
           torch::NoGradGuard ng;
           for (int g : {0, 2}) param(m, o).narrow(1, g * 16, 16).zero_();
         },
         [=](search::ImportanceScores& s, double v) {
           for (int g : {0, 2}) s.layers[L].attn_kv_groups[size_t(g)] = v;
         },
         [=](model::ArchSpec& s) {
           s.layers[L].attention->num_kv_heads = 2;
           s.layers[L].attention->num_heads = 4;
         },
         [=](const search::PrunePlan& p) { EXPECT_EQ(p.layers[L].attn_kv_groups, (std::vector<int64_t>{1, 3})); }},
    };
  };
  // Hidden channels 5, 17, 30, 31, 40, 41, 42, 63: zero in the embedding and in every weight
  // that writes the residual stream, so they stay zero in every layer.
  const std::vector<int64_t> dead = {5, 17, 30, 31, 40, 41, 42, 63};
  ZeroCase hidden{"hidden",
                  [&](model::CausalLM& m) {
                    torch::NoGradGuard ng;
                    for (auto& p : m->named_parameters(true)) {
                      const std::string& n = p.key();
                      auto& t = p.value();
                      for (int64_t c : dead) {
                        if (n == "embed.weight") t.select(1, c).zero_();
                        else if (n.find("o_proj.weight") != std::string::npos || n.find("out_proj.weight") != std::string::npos ||
                                 n.find("down_proj.weight") != std::string::npos || n.find("fc2_latent_proj") != std::string::npos)
                          t[c].zero_();
                        else if (n.find("experts.down_proj") != std::string::npos && t.size(1) == 64)
                          t.select(1, c).zero_();  // routed experts of a plain MoE write the residual
                        else if (n.find("o_proj.bias") != std::string::npos || n.find("down_proj.bias") != std::string::npos)
                          t[c].zero_();
                      }
                    }
                  },
                  [&](search::ImportanceScores& s, double v) {
                    for (int64_t c : dead) s.hidden[size_t(c)] = v;
                  },
                  [](model::ArchSpec& s) { s.hidden_size = 56; },
                  [&](const search::PrunePlan& p) {
                    ASSERT_EQ(p.hidden.size(), 56u);
                    for (int64_t c : dead) EXPECT_FALSE(std::binary_search(p.hidden.begin(), p.hidden.end(), c));
                  }};
  for (const auto& c : hybrid_cases) run_zero_case(hybrid_spec(), c);
  for (const auto& c : attention_cases(2)) run_zero_case(hybrid_spec(), c);
  run_zero_case(hybrid_spec(), hidden);
  for (const auto& c : attention_cases(1)) run_zero_case(llama_spec(), c);
  run_zero_case(llama_spec(), hidden);
  // A Llama layer whose attention is dropped entirely (o_proj zero) and a dropped FFN.
  ZeroCase dropped{"dropped-sublayers",
                   [](model::CausalLM& m) {
                     torch::NoGradGuard ng;
                     param(m, "layers.0.attention.o_proj.weight").zero_();
                     param(m, "layers.1.mlp.down_proj.weight").zero_();
                   },
                   [](search::ImportanceScores&, double) {},
                   [](model::ArchSpec& s) {
                     s.layers[0].attention.reset();
                     s.layers[1].mlp.reset();
                   },
                   [](const search::PrunePlan& p) { EXPECT_EQ(p.find("layers.0.attention.q_proj.weight"), nullptr); }};
  {
    // No control here (no ranking involved): only the match.
    const auto spec = llama_spec();
    const std::string dir = shared_dir("zero-llama-dropped");
    auto teacher = make_teacher(spec, dropped.zero);
    save_teacher(teacher, dir + "/teacher");
    auto student = spec;
    dropped.shrink(student);
    dropped.check_units(search::plan_prune(spec, student, {}));
    search::prune_checkpoint(MPI_COMM_WORLD, dir + "/teacher", {}, student, dir + "/student", {prune_tp(student)});
    auto s = load_student(dir + "/student");
    const auto ids = test_ids(spec.vocab_size);
    EXPECT_LT((logits(teacher, ids) - logits(s, ids)).abs().max().item<double>(), 2e-5);
  }
}

TEST(Prune, StudentsPrunedAtAnyTpAreEqual) {
  const auto spec = hybrid_spec();
  const std::string dir = shared_dir("tp-equal");
  auto teacher = make_teacher(spec);
  save_teacher(teacher, dir + "/teacher");
  auto student = spec;
  student.hidden_size = 48;
  student.layers[0].mamba->num_heads = 4;
  student.layers[0].mamba->head_dim = 12;
  student.layers[1].moe->num_experts = 4;
  student.layers[1].moe->expert_ffn = 24;
  student.layers[2].attention->num_kv_heads = 4;
  student.layers[2].attention->num_heads = 4;
  student.layers[3].mlp->ffn_size = 80;
  student.layers[4].moe->latent_size = 20;
  student.layers[5] = model::LayerSpec{};
  const auto scores = full_scores(spec, 21);
  std::vector<int> tps = {1};
  for (int tp : {2, 4})
    if (world_size() % tp == 0 && model::tp_split_problem(student, tp).empty()) tps.push_back(tp);
  std::vector<std::string> paths;
  for (int tp : tps) {
    search::PruneOptions o;
    o.tp = tp;
    paths.push_back(search::prune_checkpoint(MPI_COMM_WORLD, dir + "/teacher", scores, student,
                                             dir + "/tp" + std::to_string(tp), o).path);
  }
  if (world_size() >= 2) {
    EXPECT_GE(tps.size(), 2u);
  }
  checkpoint::CheckpointReader ref(paths[0]);
  EXPECT_TRUE(checkpoint::verify_model_shapes(ref).empty());
  for (size_t k = 1; k < paths.size(); ++k) {
    SCOPED_TRACE("TP " + std::to_string(tps[k]));
    checkpoint::CheckpointReader r(paths[k]);
    ASSERT_EQ(r.datasets().size(), ref.datasets().size());
    for (const auto& d : ref.datasets()) EXPECT_TRUE(torch::equal(ref.read(d.name), r.read(d.name))) << d.name;
  }
}

TEST(Prune, NotASubArchitectureIsRefusedAndNothingIsWritten) {
  const auto spec = hybrid_spec();
  const std::string dir = shared_dir("refused");
  auto teacher = make_teacher(spec);
  save_teacher(teacher, dir + "/teacher");
  struct Bad {
    std::function<void(model::ArchSpec&)> edit;
    std::string field;
  };
  const std::vector<Bad> bad = {
      {[](model::ArchSpec& s) { s.layers[2].attention->num_kv_heads = 8; }, "layers[2].attention.num_kv_heads"},
      {[](model::ArchSpec& s) { s.layers[2].attention->num_heads = 12; s.layers[2].attention->num_kv_heads = 4; },
       "layers[2].attention.num_heads"},
      {[](model::ArchSpec& s) { s.layers[0].mamba->n_groups = 2; }, "layers[0].mamba.n_groups"},
      {[](model::ArchSpec& s) { s.layers[3].mlp->ffn_size = 256; }, "layers[3].mlp.ffn_size"},
      {[](model::ArchSpec& s) { s.layers[3].mlp.reset(); s.layers[3].moe = s.layers[1].moe; }, "layers[3].moe"},
      {[](model::ArchSpec& s) { s.layers[4].moe->latent_size = 0; }, "layers[4].moe.latent_size"},
      {[](model::ArchSpec& s) { s.hidden_size = 72; }, "hidden_size"},
      {[](model::ArchSpec& s) { s.layers.pop_back(); }, "layers"},
  };
  for (const auto& b : bad) {
    auto student = spec;
    b.edit(student);
    EXPECT_FALSE(search::is_sub_architecture(spec, student).empty()) << b.field;
    try {
      search::prune_checkpoint(MPI_COMM_WORLD, dir + "/teacher", full_scores(spec, 1), student, dir + "/out");
      ADD_FAILURE() << b.field << ": accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("student ArchSpec: " + b.field + ":"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir + "/out")) << b.field;
  }
  // Scores of another shape name the importance field.
  auto student = spec;
  student.layers[3].mlp->ffn_size = 64;
  auto scores = full_scores(spec, 1);
  scores.layers[3].mlp_neurons.resize(100);
  try {
    search::prune_checkpoint(MPI_COMM_WORLD, dir + "/teacher", scores, student, dir + "/out");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("importance: layers[3].mlp_neurons: has 100 scores"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

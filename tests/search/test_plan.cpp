// search/plan/plan.h against published figures: mixed-precision Adam bytes per parameter (ZeRO
// paper, Megatron's distributed-optimizer table), Korthikanti et al.'s activation memory per
// transformer layer (with TP, SP, selective and full recompute), ZeRO's communication volume,
// and the issue-20 claims about Nemotron 3 Super 120B -> 74B on 80 GB GPUs.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/error.h"
#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"
#include "search/plan/plan.h"

namespace {

using namespace ac::search;
using ac::model::ArchSpec;
using ac::model::LayerSpec;

const std::string kConfigs = std::string(AC_SOURCE_DIR) + "/configs";

// A GPT layer as Korthikanti et al. count it: multi-head attention (a heads, head dim h / a)
// and a non-gated 4h MLP.
LayerSpec gpt_layer(int64_t h, int a) {
  LayerSpec l;
  l.attention = ac::model::AttentionSpec{a, a, int(h / a)};
  l.mlp = ac::model::MlpSpec{4 * h, ac::model::MlpActivation::ReLU2, false};
  return l;
}

ArchSpec dense_model(int layers, int64_t h, int a, int64_t vocab) {
  ArchSpec s;
  s.name = "dense";
  s.hidden_size = h;
  s.vocab_size = vocab;
  for (int i = 0; i < layers; ++i) s.layers.push_back(gpt_layer(h, a));
  return s;
}

HardwareProfile profile(const std::string& id) { return load_hardware(id, kConfigs); }

double model_state_bytes(const Plan& p) {
  return p.item("student weights") + p.item("student gradients") + p.item("student optimizer states");
}

Plan plan_at(const ArchSpec& t, const ArchSpec& s, const std::string& cluster, int tp, int zero, PlanOptions o = {},
             int ep = 1, int etp = 0) {
  const Cluster c = parse_cluster(cluster);
  PlanLayout L;
  L.tp = tp;
  L.zero = zero;
  L.ep = ep;
  L.etp = etp;
  return make_plan(t, &s, c, profile(c.kind), L, o);
}

// ---- bytes per parameter ----------------------------------------------------------------
TEST(Plan, MixedPrecisionAdamBytesPerParameterMatchZeroAndMegatron) {
  const ArchSpec m = dense_model(4, 1024, 16, 32000);
  const double P = double(ac::model::count_params(m).total());
  PlanOptions o;
  // ZeRO paper (Rajbhandari et al. 2020, sec. 3.1 / fig. 1): 2 + 2 + K with K = 12, and
  // P_os: 4 + K / Nd. DP = 8 on one node, 64 on eight.
  EXPECT_NEAR(model_state_bytes(plan_at(m, m, "1x8xh100", 1, 0, o)) / P, 16.0, 1e-9);
  EXPECT_NEAR(model_state_bytes(plan_at(m, m, "1x8xh100", 1, 1, o)) / P, 4.0 + 12.0 / 8, 1e-9);
  EXPECT_NEAR(model_state_bytes(plan_at(m, m, "8x8xh100", 1, 1, o)) / P, 4.0 + 12.0 / 64, 1e-9);
  // P_os+g: 2 + (2 + K) / Nd.
  EXPECT_NEAR(model_state_bytes(plan_at(m, m, "1x8xh100", 1, 2, o)) / P, 2.0 + 14.0 / 8, 1e-9);
  // Megatron docs/source/api-guide/dist_optimizer.md, bf16 params + fp32 grads: 18 / 6 + 12/d.
  o.grad_bytes = 4;
  EXPECT_NEAR(model_state_bytes(plan_at(m, m, "1x8xh100", 1, 0, o)) / P, 18.0, 1e-9);
  EXPECT_NEAR(model_state_bytes(plan_at(m, m, "2x8xh100", 1, 1, o)) / P, 6.0 + 12.0 / 16, 1e-9);
}

TEST(Plan, TensorParallelDividesAllButTheReplicatedNorms) {
  const ArchSpec m = dense_model(4, 1024, 16, 32000);
  const ac::model::ParamCounts pc = ac::model::count_params(m);
  double norms = double(pc.final_norm);
  for (const auto& l : pc.layers) norms += double(l.norms);
  const double P = double(pc.total());
  for (int tp : {2, 4, 8}) {
    const Plan p = plan_at(m, m, "1x8xh100", tp, 1);
    EXPECT_NEAR(p.student_dense_gpu, (P - norms) / tp + norms, 1e-6) << "tp " << tp;
    EXPECT_NEAR(p.teacher_params_gpu, (P - norms) / tp + norms, 1e-6);
    EXPECT_EQ(p.student_expert_gpu, 0);
  }
  // GQA with fewer KV heads than TP: each rank holds one whole KV head (replicated).
  ArchSpec g = m;
  for (auto& l : g.layers) l.attention->num_kv_heads = 2;
  const double kv_layer = 2.0 * 2 * 64 * 1024;  // K and V of 2 heads x 64
  const double base = plan_at(g, g, "1x8xh100", 8, 1).student_dense_gpu;
  const ac::model::ParamCounts gc = ac::model::count_params(g);
  EXPECT_NEAR(base, (double(gc.total()) - norms - 4 * kv_layer) / 8 + norms + 4 * kv_layer / 2, 1e-6);
}

// ---- activations (Korthikanti et al., arXiv 2205.05198, sec. 4) --------------------------
TEST(Plan, ActivationsMatchKorthikantiPerLayer) {
  const int64_t s = 2048, b = 4, h = 1024;
  const int a = 16;
  const double sbh = double(s) * b * h;
  const LayerSpec l = gpt_layer(h, a);
  ActivationShape sh;
  sh.seq_len = s;
  sh.micro_batch = b;
  sh.dropout = true;
  sh.flash_attention = false;
  sh.recompute = Recompute::None;
  // No parallelism: sbh (34 + 5 a s / h).
  EXPECT_NEAR(layer_activations(l, h, sh).saved, sbh * (34 + 5.0 * a * s / h), 1e-3);
  for (int t : {2, 4, 8}) {
    sh.tp = sh.etp = t;
    sh.sequence_parallel = false;  // TP only: sbh (10 + 24 / t + 5 a s / (h t))
    sh.recompute = Recompute::None;
    EXPECT_NEAR(layer_activations(l, h, sh).saved, sbh * (10 + 24.0 / t + 5.0 * a * s / (h * t)), 1e-3) << t;
    sh.sequence_parallel = true;   // TP + SP: sbh (34 + 5 a s / h) / t
    EXPECT_NEAR(layer_activations(l, h, sh).saved, sbh * (34 + 5.0 * a * s / h) / t, 1e-3) << t;
    sh.recompute = Recompute::Selective;  // 34 sbh / t
    EXPECT_NEAR(layer_activations(l, h, sh).saved, 34 * sbh / t, 1e-3) << t;
    sh.recompute = Recompute::Full;  // the layer input, 2 sbh / t
    EXPECT_NEAR(layer_activations(l, h, sh).saved, 2 * sbh / t, 1e-3) << t;
    EXPECT_NEAR(layer_activations(l, h, sh).working, sbh * (34 + 5.0 * a * s / h) / t, 1e-3) << t;
  }
  // Flash attention keeps no s^2 tensor: doubling s doubles the layer's memory.
  sh.tp = sh.etp = 1;
  sh.recompute = Recompute::None;
  sh.flash_attention = true;
  const double one = layer_activations(l, h, sh).saved;
  sh.seq_len = 2 * s;
  EXPECT_NEAR(layer_activations(l, h, sh).saved, 2 * one, 1e-3);
  EXPECT_LT(one, sbh * 35);
}

TEST(Plan, Mamba2LayerIsAbout17sbhAtNemotronH8B) {
  // SEARCH.md part 2 sec. 3: mamba_ssm's fused kernel saves zxbcdt, out_x, rstd; with
  // Nemotron-H 8B's dims about 17 sbh per layer and no s^2 term.
  LayerSpec l;
  l.mamba = ac::model::MambaSpec{};
  l.mamba->num_heads = 128;
  l.mamba->head_dim = 64;
  l.mamba->state_size = 128;
  l.mamba->n_groups = 8;
  ActivationShape sh;
  sh.seq_len = 4096;
  sh.micro_batch = 2;
  sh.recompute = Recompute::Selective;  // nothing to recompute in a Mamba layer
  const double sbh = 4096.0 * 2 * 4096;
  const double per = layer_activations(l, 4096, sh).saved / sbh;
  EXPECT_GT(per, 16.9);
  EXPECT_LT(per, 17.2);
  sh.tp = 8;  // TP + SP divides it by 8
  EXPECT_NEAR(layer_activations(l, 4096, sh).saved / sbh, per / 8, 1e-9);
}

TEST(Plan, ExpertParallelismDoesNotReduceActivations) {
  const ArchSpec t = ac::model::load_arch(kConfigs + "/models/nemotron-3-super.json");
  const ArchSpec s = ac::model::load_arch(kConfigs + "/models/nemotron-3-super-74b.json");
  const Plan ep1 = plan_at(t, s, "8x8xh100", 4, 1, {}, 1, 1);
  const Plan ep4 = plan_at(t, s, "8x8xh100", 4, 1, {}, 4, 1);
  EXPECT_DOUBLE_EQ(ep1.item("student activations"), ep4.item("student activations"));
  EXPECT_NEAR(ep1.student_expert_gpu / ep4.student_expert_gpu, 4.0, 1e-9);
  EXPECT_NEAR(ep1.student_dense_gpu, ep4.student_dense_gpu, 1e-6);
  // Routed experts are ~95% of Super's weights (REFERENCE.md).
  EXPECT_GT(ep1.student_expert_gpu / (ep1.student_expert_gpu + ep1.student_dense_gpu), 0.9);
}

// ---- communication ------------------------------------------------------------------------
TEST(Plan, ZeroStage1MovesWhatDataParallelAllReduceMoves) {
  // ZeRO paper sec. 7: P_os and P_os+g have the communication volume of plain DP: a
  // reduce-scatter plus an all-gather instead of one all-reduce (2 (d - 1) / d x params each).
  const ArchSpec m = dense_model(4, 1024, 16, 32000);
  PlanOptions o;
  o.dp_reduce_bytes = 2;  // same dtype both ways, as in the paper's accounting
  auto dp_bytes = [](const Plan& p) {
    double v = 0;
    for (const auto& c : p.comm)
      if (c.group == "DP") v += c.bytes_per_step;
    return v;
  };
  const Plan z0 = plan_at(m, m, "2x8xh100", 2, 0, o), z1 = plan_at(m, m, "2x8xh100", 2, 1, o);
  const double P = z0.student_dense_gpu, d = 8;
  EXPECT_NEAR(dp_bytes(z0), 2 * (d - 1) / d * 2 * P, 1);
  EXPECT_NEAR(dp_bytes(z1), dp_bytes(z0), 1);
  // TP = 2 inside a node; the DP group of 8 spans both nodes.
  for (const auto& c : z1.comm) EXPECT_EQ(c.inter_node, c.group == "DP") << c.group << " " << c.what;
}

TEST(Plan, StepTimeIsFlopsOverPeakTimesEfficiencyPlusCommunication) {
  const ArchSpec m = dense_model(4, 1024, 16, 32000);
  PlanOptions o;
  o.seq_len = 512;  // attention FLOPs are then a small, separately timed part
  o.recompute = Recompute::None;
  const Plan p = plan_at(m, m, "1x8xh100", 8, 1, o);
  const HardwareProfile hw = profile("h100");
  // student 3 x forward + teacher forward; DP 1, so one sequence per step over 8 GPUs
  const double fwd = ac::model::prefill_flops_per_token(m, 512);
  EXPECT_NEAR(p.flops_per_gpu, 512.0 * 4 * fwd / 8, 1e-9 * p.flops_per_gpu);
  EXPECT_GT(p.compute_s, p.flops_per_gpu / (hw.peak_flops * hw.gemm.max));
  EXPECT_LT(p.compute_s, p.flops_per_gpu / (hw.peak_flops * hw.attention.max));
  EXPECT_GT(p.tp_comm_s, 0);
  EXPECT_GE(p.step_s, p.compute_s + p.tp_comm_s);
  // TP 8 inside the node: volume over NVLink bandwidth x efficiency.
  double tp_bytes = 0;
  for (const auto& c : p.comm)
    if (c.group == "TP") tp_bytes += c.bytes_per_step;
  EXPECT_NEAR(p.tp_comm_s, tp_bytes / (hw.interconnect.intra_node_bandwidth * hw.interconnect.efficiency), 1e-12);
  // Each of the (2 per layer + embedding + head) blocks gathers and scatters [s, b, h] bf16
  // once per pass (student forward and backward, teacher forward): 2 (t - 1) / t x 2 s b h.
  const double sbh2 = 2.0 * 512 * 1 * 1024;
  EXPECT_NEAR(tp_bytes, 3 * (2 * 4 + 2) * 2 * 7.0 / 8 * sbh2 + 2 * 7.0 / 8 * 16 * 512, 1);
}

// With SP the trainer's routed experts take their tokens from the sequence slice (ETP 1: one
// all-to-all over TP x EP, which plan's EP is; ETP = TP: over EP, then gathered over ETP), so a
// MoE block without a shared expert moves nothing over TP and the all-to-all sends each GPU's
// slice's copies, s b k / t (the trainer's counts: Sp.ExpertAllToAllVolumeFromTheSlice).
TEST(Plan, SequenceParallelMoeDispatchesFromTheSlice) {
  ArchSpec m = dense_model(4, 1024, 16, 32000);
  for (auto& l : m.layers) {
    l.mlp.reset();
    ac::model::MoeSpec e;
    e.num_experts = 8, e.top_k = 2, e.expert_ffn = 512;
    l.moe = e;
  }
  auto bytes = [](const Plan& p, const std::string& group, const std::string& what) {
    double v = 0;
    for (const auto& c : p.comm)
      if (c.group == group && c.what == what) v += c.bytes_per_step;
    return v;
  };
  PlanOptions o;
  o.seq_len = 512;
  o.recompute = Recompute::None;
  PlanOptions no_sp = o;
  no_sp.sequence_parallel = false;
  const Plan sp = plan_at(m, m, "1x8xh100", 2, 1, o, 4, 1), plain = plan_at(m, m, "1x8xh100", 2, 1, no_sp, 4, 1);
  const double block = 2 * 1.0 / 2 * 2 * 512 * 1024;  // one block, one pass: 2 (t - 1) / t x 2 s b h
  EXPECT_NEAR(bytes(plain, "TP", "student layer inputs and outputs"), 2 * (2 + 4 + 4) * block, 1);
  EXPECT_NEAR(bytes(sp, "TP", "student layer inputs and outputs"), 2 * (2 + 4) * block, 1);  // attention, embedding, head
  // dispatch + combine per layer per pass (forward, backward) of 512 / 2 tokens x 2 copies, bf16, over EP 4
  EXPECT_NEAR(bytes(sp, "EP", "student routed tokens"), 4 * 2 * 2 * (512 / 2 * 2) * 1024 * 2 * 3.0 / 4, 1);
  // a shared expert keeps its TP region
  for (auto& l : m.layers) l.moe->shared_ffn = 256;
  EXPECT_NEAR(bytes(plan_at(m, m, "1x8xh100", 2, 1, o, 4, 1), "TP", "student layer inputs and outputs"), 2 * (2 + 4 + 4) * block, 1);
}

// ---- input checks --------------------------------------------------------------------------
TEST(Plan, ClusterStringsAndBadLayoutsNameTheField) {
  EXPECT_EQ(parse_cluster("8x8xh100").world(), 64);
  EXPECT_EQ(parse_cluster("4x8xb200").kind, "b200");
  for (const char* bad : {"8x8", "8xh100x8", "0x8xh100", "8x0xh100", "x8xh100", "8x8xh100 extra"}) {
    try {
      parse_cluster(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const ac::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--cluster"), std::string::npos) << e.what();
    }
  }
  const ArchSpec t = ac::model::load_arch(kConfigs + "/models/nemotron-3-super.json");
  const ArchSpec s = ac::model::load_arch(kConfigs + "/models/nemotron-3-super-74b.json");
  auto message = [&](const std::string& cluster, int tp, int ep, int etp) -> std::string {
    try {
      plan_at(t, s, cluster, tp, 1, {}, ep, etp);
    } catch (const ac::InputError& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(message("8x8xh100", 8, 8, 1), "--ep: 8: does not divide the 300 experts of student layers[1]");
  EXPECT_EQ(message("2x8xh100", 16, 1, 1), "--tp: 16: does not divide the 8 Mamba groups of teacher layers[0]");
  EXPECT_EQ(message("1x6xh100", 3, 1, 1), "--tp: 3: does not divide the 128 Mamba heads of teacher layers[0]");
  const ArchSpec d = dense_model(2, 1024, 16, 1000);
  try {
    plan_at(d, d, "1x6xh100", 3, 1);
    ADD_FAILURE() << "TP 3 with 16 heads accepted";
  } catch (const ac::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "--tp: 3: does not divide the 16 attention heads of teacher layers[0]");
  }
  EXPECT_NE(message("1x8xh100", 4, 4, 4).find("EP x ETP = 16 does not divide the 8 GPUs"), std::string::npos);
  EXPECT_NE(message("1x8xh100", 4, 1, 3).find("--etp: 3"), std::string::npos);
}

TEST(Plan, HardwareInterconnectFieldsAreOptionalAndChecked) {
  const HardwareProfile h = profile("h100");
  EXPECT_DOUBLE_EQ(h.interconnect.intra_node_bandwidth, 450e9);
  EXPECT_DOUBLE_EQ(h.interconnect.inter_node_bandwidth, 50e9);
  EXPECT_EQ(h.interconnect.gpus_per_node, 8);
  EXPECT_FALSE(profile("rtx5090").interconnect.present());
  nlohmann::json j = hardware_to_json(h);
  EXPECT_EQ(hardware_to_json(hardware_from_json(j, "rt")), j);
  j["interconnect"]["nvlink"] = 1;
  try {
    hardware_from_json(j, "x.json");
    ADD_FAILURE() << "unknown field accepted";
  } catch (const ac::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "x.json: interconnect.nvlink: unknown field");
  }
  // Without an interconnect the plan still gives memory, and no communication times.
  const ArchSpec m = dense_model(2, 512, 8, 1000);
  const Cluster c = parse_cluster("1x1xrtx5090");
  const Plan p = make_plan(m, &m, c, profile("rtx5090"), PlanLayout{}, PlanOptions{});
  EXPECT_FALSE(p.has_interconnect);
  EXPECT_GT(p.total_bytes, 0);
  EXPECT_TRUE(p.to_json()["step"]["step_s"].is_null());
}

// ---- issue 20: Nemotron 3 Super 120B -> 74B on 80 GB GPUs -----------------------------------
class SuperPlan : public ::testing::Test {
 protected:
  ArchSpec teacher = ac::model::load_arch(kConfigs + "/models/nemotron-3-super.json");
  ArchSpec student = ac::model::load_arch(kConfigs + "/models/nemotron-3-super-74b.json");
};

TEST_F(SuperPlan, Tp8AndZero1AloneDoNotFitOnH100AtAnyDp) {
  // TP 8 slices every expert 8 ways (ETP = TP, EP 1); ZeRO-1 shards only the optimizer. At
  // 8K tokens, micro-batch 1, selective recompute: no DP from 1 to 128 nodes fits, and the
  // model states alone (teacher + student weights + bf16 grads) exceed what DP can shrink.
  double last = 1e300;
  for (int nodes : {1, 2, 4, 8, 16, 32, 64, 128}) {
    const Plan p = plan_at(teacher, student, std::to_string(nodes) + "x8xh100", 8, 1);
    EXPECT_FALSE(p.fits) << nodes << " nodes: " << p.total_bytes / (1 << 30) << " GiB";
    EXPECT_LE(p.total_bytes, last);  // more DP, less optimizer state per GPU
    last = p.total_bytes;
  }
  const Plan p = plan_at(teacher, student, "128x8xh100", 8, 1);
  const double floor = p.total_bytes - p.item("student optimizer states");  // DP -> infinity
  EXPECT_GT(floor, p.usable_bytes);
  // With fp32 gradients (Megatron's 6 + 12/d row, the estimate) not even full
  // recompute makes it fit.
  PlanOptions o;
  o.grad_bytes = 4;
  o.recompute = Recompute::Full;
  for (int nodes : {1, 8, 128}) EXPECT_FALSE(plan_at(teacher, student, std::to_string(nodes) + "x8xh100", 8, 1, o).fits);
  // The exception the plan finds: bf16 gradients with full recompute (activations 2sbh/t per
  // layer) squeeze under 80 GB once the optimizer is spread thin, from 32 nodes on (a margin
  // smaller than the reserve's uncertainty).
  o.grad_bytes = 2;
  EXPECT_FALSE(plan_at(teacher, student, "16x8xh100", 8, 1, o).fits);
  const Plan full = plan_at(teacher, student, "64x8xh100", 8, 1, o);
  EXPECT_TRUE(full.fits);
  EXPECT_LT(full.usable_bytes - full.total_bytes, 4.0 * (1 << 30));
}

TEST_F(SuperPlan, ExpertParallelismMakesItFitOnEightH100Nodes) {
  // TP 8 with experts over EP 4 x ETP 8 (32-way), ZeRO-1 with EDP 2 (8 x 8 H100).
  const Plan p = plan_at(teacher, student, "8x8xh100", 8, 1, {}, 4, 8);
  EXPECT_TRUE(p.fits) << p.overflow();
  EXPECT_EQ(p.edp, 2);
  // The teacher's 123.6B parameters: its experts 32-way, the rest 8-way.
  EXPECT_NEAR(p.teacher_params / 1e9, 123.611, 0.001);
  EXPECT_LT(p.item("teacher weights") / (1 << 30), 10.0);
  // The same layout on 4 nodes leaves EDP 1: the experts' optimizer states are not sharded.
  const Plan four = plan_at(teacher, student, "4x8xh100", 8, 1, {}, 4, 8);
  EXPECT_FALSE(four.fits);
  EXPECT_GT(four.item("student optimizer states"), 1.8 * p.item("student optimizer states"));
  // The planner's own search on 8 x 8 H100 finds only layouts with EP > 1.
  const Cluster c = parse_cluster("8x8xh100");
  const auto fit = fitting_layouts(teacher, &student, c, profile("h100"), PlanOptions{});
  ASSERT_FALSE(fit.empty());
  for (const auto& f : fit) {
    EXPECT_TRUE(f.fits);
    EXPECT_GT(f.layout.ep, 1) << f.layout.to_string();
    EXPECT_EQ(300 % f.layout.ep, 0);
    EXPECT_EQ(512 % f.layout.ep, 0);
  }
  // One 8-GPU H100 node holds no layout at all.
  EXPECT_TRUE(fitting_layouts(teacher, &student, parse_cluster("1x8xh100"), profile("h100"), PlanOptions{}).empty());
}

TEST_F(SuperPlan, TheTrainersOwnLayoutFitsOnEightH100NodesWithFullRecompute) {
  // What `distill --tp 8 --ep 4 --etp 8` runs: no sequence parallelism (activations replicated
  // over TP, every TP rank dispatching all of its tokens' routed copies). Without recomputation
  // ZeRO-1 fits at no node count (the backward's activations and gradients exceed the device
  // even with no optimizer state), ZeRO-2 not on 32 nodes; with the trainer's
  // `--recompute full` ZeRO-1 fits on 8 nodes, and on 4 (EDP 1).
  PlanOptions o;
  o.sequence_parallel = false;
  o.recompute = Recompute::None;
  for (int zero : {1, 2}) {
    const Plan p = plan_at(teacher, student, "32x8xh100", 8, zero, o, 4, 8);
    EXPECT_FALSE(p.fits) << "ZeRO-" << zero << ": " << p.total_bytes / (1 << 30);
    if (zero == 1) EXPECT_GT(p.always_bytes - p.item("student optimizer states") + p.phase_bytes[2], p.usable_bytes);
  }
  o.recompute = Recompute::Full;
  const Plan p = plan_at(teacher, student, "8x8xh100", 8, 1, o, 4, 8);
  EXPECT_TRUE(p.fits) << p.overflow();
  EXPECT_LT(p.total_bytes, 0.7 * p.usable_bytes);
  EXPECT_TRUE(plan_at(teacher, student, "4x8xh100", 8, 1, o, 4, 8).fits);
  // Without SP the partial expert outputs are kept at full width: more than with SP.
  PlanOptions sp = o;
  sp.sequence_parallel = true;
  o.recompute = sp.recompute = Recompute::None;
  EXPECT_GT(plan_at(teacher, student, "8x8xh100", 8, 1, o, 4, 8).item("student activations"),
            1.5 * plan_at(teacher, student, "8x8xh100", 8, 1, sp, 4, 8).item("student activations"));
}

TEST_F(SuperPlan, TeacherMayUseItsOwnExpertParallelism) {
  // The frozen teacher's 512 experts allow EP 64 while the 300-expert student stays at EP 4
  // (ETP 1, as ModelOpt distils): only the teacher's expert share and its all-to-all change.
  const Cluster c = parse_cluster("8x8xh100");
  PlanLayout L;
  L.tp = 8;
  L.etp = 1;
  L.ep = 4;
  const Plan same = make_plan(teacher, &student, c, profile("h100"), L, PlanOptions{});
  L.teacher_ep = 64;
  const Plan own = make_plan(teacher, &student, c, profile("h100"), L, PlanOptions{});
  EXPECT_EQ(own.teacher_edp, 1);
  EXPECT_EQ(own.edp, 16);
  const double experts = 512.0 * 1024 * 2688 * 2 * 41;  // 40 MoE layers + the MTP one
  EXPECT_NEAR(same.teacher_params_gpu - own.teacher_params_gpu, experts / 4 - experts / 64, 1e3);
  EXPECT_DOUBLE_EQ(same.item("student weights"), own.item("student weights"));
  EXPECT_DOUBLE_EQ(same.item("student activations"), own.item("student activations"));
  L.teacher_ep = 3;
  try {
    make_plan(teacher, &student, parse_cluster("3x8xh100"), profile("h100"), L, PlanOptions{});
    ADD_FAILURE() << "teacher EP 3 accepted";
  } catch (const ac::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "--teacher-ep: 3: does not divide the 512 experts of teacher layers[1]");
  }
}

TEST_F(SuperPlan, ImportanceAndSearchStagesHoldOneCopyOfTheTeacher) {
  const Cluster c = parse_cluster("1x8xb200");
  PlanLayout L;
  L.tp = 8;
  L.etp = 8;
  PlanOptions o;
  o.stage = PlanStage::Importance;
  const Plan imp = make_plan(teacher, nullptr, c, profile("b200"), L, o);
  o.stage = PlanStage::Search;
  const Plan srch = make_plan(teacher, &student, c, profile("b200"), L, o);
  o.stage = PlanStage::Distill;
  const Plan dist = make_plan(teacher, &student, c, profile("b200"), L, o);
  EXPECT_DOUBLE_EQ(imp.item("teacher weights"), dist.item("teacher weights"));
  EXPECT_DOUBLE_EQ(srch.item("teacher weights"), dist.item("teacher weights"));
  EXPECT_EQ(imp.item("student weights"), 0);
  EXPECT_EQ(srch.item("student weights"), 0);  // masked student shares the frozen weights
  EXPECT_GT(srch.item("masked student activations"), 0);
  EXPECT_LT(imp.total_bytes, srch.total_bytes);
  EXPECT_LT(srch.total_bytes, dist.total_bytes);
  EXPECT_TRUE(imp.fits);  // 123.6B bf16 over 8 B200s: ~29 GiB each
  EXPECT_NEAR(imp.item("teacher weights") / (1 << 30), 123.611e9 * 2 / 8 / (1 << 30), 1.5);
}

}  // namespace

// Cost model known answers (issue 6): Super does not fit one B200 in BF16, a ~74B variant
// fits at 128K and reports its concurrency, KV per token 8 KiB for Super and 128 KiB for
// Llama-3-8B, the Mamba state per sequence, expected experts touched, the quadratic prefill
// term, and clear messages for invalid inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "dist/error.h"
#include "model/arch_spec.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/formulas.h"
#include "search/costmodel/profiles.h"

using namespace ac::search;
using ac::model::ArchSpec;
using ac::model::load_arch;
using nlohmann::json;

namespace {
const std::string kRoot = AC_SOURCE_DIR;
const std::string kConfigs = kRoot + "/configs";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ac::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

Prediction run(const ArchSpec& s, const std::string& hw, const std::string& engine, const std::string& workload) {
  return predict(s, load_hardware(hw, kConfigs), load_engine(engine, kConfigs), load_workload(workload, kConfigs));
}

// Super with its routed experts cut to `experts` per MoE layer (the search's biggest lever).
ArchSpec super_with_experts(int experts) {
  ArchSpec s = load_arch(kConfigs + "/models/nemotron-3-super.json");
  for (auto& l : s.layers)
    if (l.moe) l.moe->num_experts = experts;
  return s;
}
}  // namespace

TEST(CostModel, SuperDoesNotFitOneB200InBf16) {
  const ArchSpec s = load_arch(kConfigs + "/models/nemotron-3-super.json");
  const Prediction p = run(s, "b200", "vllm", "long-context-128k");
  EXPECT_NEAR(p.weight_bytes / 1e9, 241.3, 0.5);  // 120.67B parameters x 2 bytes (MTP not served)
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.max_concurrency, 0);
  EXPECT_NE(p.problem.find("exceed"), std::string::npos) << p.problem;
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 8192.0);  // 8 attention layers x 2 x 2 KV heads x 128 x 2 B
  // fp32 SSM state 128 x 64 x 128 x 4 B + conv state 3 x 10240 x 2 B, over 40 Mamba layers: ~162 MiB.
  EXPECT_DOUBLE_EQ(p.state_bytes_per_seq, 40.0 * (128 * 64 * 128 * 4 + 3 * 10240 * 2));
  EXPECT_NEAR(p.state_bytes_per_seq / 1048576.0, 162.3, 0.1);
  EXPECT_FALSE(run(s, "b200", "trtllm", "long-context-128k").fits);
}

TEST(CostModel, SeventyFourBVariantFitsAt128K) {
  const ArchSpec s = super_with_experts(300);
  const Prediction p = run(s, "b200", "vllm", "long-context-128k");
  EXPECT_NEAR(p.params / 1e9, 74.0, 0.5);
  EXPECT_TRUE(p.fits) << p.problem;
  EXPECT_GE(p.max_concurrency, 1);
  EXPECT_EQ(p.max_concurrency, int64_t(std::floor(p.kv_budget_bytes / p.bytes_per_seq)));
  EXPECT_EQ(p.concurrency, p.max_concurrency);  // the workload asks for as many as fit
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 8192.0);
  // vLLM's hybrid page rule: a page holds one Mamba state, so a 128K sequence takes
  // 40 Mamba pages + 8 attention layers x ceil(131072 / block) pages; more than the raw sum.
  const double raw = 131072.0 * 8192 + p.state_bytes_per_seq;
  EXPECT_GT(p.bytes_per_seq, raw);
  EXPECT_LT(p.bytes_per_seq, 1.2 * raw);
  // TensorRT-LLM-like engine: no page rule, 32-token blocks.
  const Prediction t = run(s, "b200", "trtllm", "long-context-128k");
  EXPECT_DOUBLE_EQ(t.bytes_per_seq, raw);
  EXPECT_TRUE(t.fits);
  EXPECT_GT(p.ttft_s, 0);
  EXPECT_GT(p.tpot_s, 0);
  EXPECT_NEAR(p.decode_tok_s, p.concurrency / p.tpot_s, 1e-9);
}

TEST(CostModel, Llama3_8BPublishedMemoryFigures) {
  const ArchSpec s = load_arch(kConfigs + "/models/llama-3-8b.json");
  const Prediction p = run(s, "h100", "vllm", "batched-serving");
  EXPECT_DOUBLE_EQ(p.weight_bytes, 8030261248.0 * 2);  // 16.06 GB in bf16
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 131072.0);    // 32 layers x 2 x 8 KV heads x 128 x 2 B = 128 KiB
  EXPECT_DOUBLE_EQ(p.state_bytes_per_seq, 0.0);
  EXPECT_TRUE(p.fits);
  // 2560-token sequences in 16-token blocks.
  EXPECT_DOUBLE_EQ(p.bytes_per_seq, 2560.0 * 131072);
  EXPECT_EQ(p.max_concurrency, std::min<int64_t>(256, int64_t(p.kv_budget_bytes / p.bytes_per_seq)));
  // vLLM budget: 0.9 x 80 GB minus weights, activations and reserves.
  EXPECT_NEAR(p.kv_budget_bytes, 0.9 * 80e9 - p.weight_bytes - p.activation_bytes - p.reserved_bytes, 1.0);
  // Per-layer breakdown sums to the totals.
  double w = 0, kv = 0, dec = 0;
  for (const auto& l : p.layers) w += l.weight_bytes, kv += l.kv_bytes_per_token, dec += l.decode_s;
  EXPECT_NEAR(w + 2.0 * (2 * 128256.0 * 4096 + 4096), p.weight_bytes, 1.0);
  EXPECT_DOUBLE_EQ(kv, p.kv_bytes_per_token);
  EXPECT_LT(dec, p.tpot_s);
  EXPECT_GT(dec, 0.5 * p.tpot_s);
}

TEST(CostModel, ExpectedExpertsTouchedMatchesSimulation) {
  using ac::search::detail::Vec;
  std::mt19937 rng(7);
  for (auto [E, k, n] : {std::tuple<int, int, int>{512, 22, 1}, {512, 22, 8}, {128, 6, 64}, {8, 2, 3}}) {
    double mean = 0;
    const int trials = 400;
    for (int t = 0; t < trials; ++t) {
      std::set<int> hit;
      for (int tok = 0; tok < n; ++tok) {
        std::vector<int> ids(E);
        for (int i = 0; i < E; ++i) ids[i] = i;
        std::shuffle(ids.begin(), ids.end(), rng);
        hit.insert(ids.begin(), ids.begin() + k);
      }
      mean += double(hit.size()) / trials;
    }
    const Vec got = ac::search::detail::experts_touched(Vec(1, E), Vec(1, k), double(n));
    EXPECT_NEAR(got[0], mean, 0.03 * mean + 0.05) << E << " " << k << " " << n;
  }
}

TEST(CostModel, DecodeReadsMoreExpertsAtLargerBatch) {
  // Per-token decode cost falls with batch size (weights shared), but the MoE layer's time
  // grows with the experts touched.
  const ArchSpec s = super_with_experts(300);
  auto hw = load_hardware("b200", kConfigs);
  auto e = load_engine("trtllm", kConfigs);
  auto w = load_workload("in-game", kConfigs);
  const Prediction one = predict(s, hw, e, w);
  w.concurrency = 64;
  const Prediction many = predict(s, hw, e, w);
  ASSERT_EQ(many.concurrency, 64);
  EXPECT_GT(many.layers[1].decode_s, 5 * one.layers[1].decode_s);  // 22 -> ~296 experts read
  EXPECT_LT(many.tpot_s / 64, one.tpot_s);
}

TEST(CostModel, PrefillHasQuadraticAttention) {
  const ArchSpec s = load_arch(kConfigs + "/models/llama-3-8b.json");
  auto hw = load_hardware("h100", kConfigs);
  auto e = load_engine("vllm", kConfigs);
  auto w = load_workload("long-context-coding", kConfigs);
  w.prompt_tokens = 16384;
  const double t16 = predict(s, hw, e, w).ttft_s;
  w.prompt_tokens = 65536;
  const double t64 = predict(s, hw, e, w).ttft_s;
  EXPECT_GT(t64 / t16, 4.5);  // linear work x4, attention x16
  // A Mamba layer's prefill is linear in the prompt.
  const ArchSpec h = load_arch(kConfigs + "/models/nemotron-h-8b.json");
  w.prompt_tokens = 16384;
  const double m16 = predict(h, hw, e, w).layers[0].prefill_s;
  w.prompt_tokens = 65536;
  EXPECT_NEAR(predict(h, hw, e, w).layers[0].prefill_s / m16, 4.0, 0.1);
}

TEST(CostModel, InvalidInputsGiveClearMessages) {
  EXPECT_NE(error_of([] { load_hardware("tpu9", kConfigs); }).find("--hardware: tpu9: unknown hardware id (known in"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_hardware("tpu9", kConfigs); }).find("b200"), std::string::npos);
  json hw = json::parse(R"({"format": "autocompress.hardware", "version": 1, "id": "x", "peak_flops": -1,
    "memory_bandwidth": 1e12, "memory_bytes": 1e10, "efficiency": {}})");
  EXPECT_EQ(error_of([&] { hardware_from_json(hw, "x.json"); }), "x.json: peak_flops: -1 must be positive");
  hw["peak_flops"] = 1e12;
  EXPECT_EQ(error_of([&] { hardware_from_json(hw, "x.json"); }), "x.json: efficiency.gemm: missing");
  json wl = json::parse(R"({"format": "autocompress.workload", "version": 1, "id": "w", "prompt_tokens": 100,
    "output_tokens": 10, "context_tokens": 50})");
  EXPECT_EQ(error_of([&] { workload_from_json(wl, "w.json"); }),
            "w.json: context_tokens: 50 is less than prompt_tokens + output_tokens (110)");
  wl["context_tokens"] = 2000000;
  wl["prompt_tokens"] = -3;
  EXPECT_EQ(error_of([&] { workload_from_json(wl, "w.json"); }), "w.json: prompt_tokens: -3 must be positive");
  // A workload that cannot fit at all: one 2M-token Llama-3-8B sequence needs 256 GiB of KV.
  wl["prompt_tokens"] = 1990000;
  const Prediction p = predict(load_arch(kConfigs + "/models/llama-3-8b.json"), load_hardware("h100", kConfigs),
                               load_engine("vllm", kConfigs), workload_from_json(wl, "w.json"));
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.problem.find("one sequence of 2000000 tokens needs 244.14 GiB"), std::string::npos) << p.problem;
  json eng = json::parse(R"({"format": "autocompress.engine", "version": 1, "id": "e", "memory_policy": "all",
    "memory_fraction": 0.9, "kv_block_tokens": 16, "max_num_batched_tokens": 8192, "max_num_seqs": 8})");
  EXPECT_EQ(error_of([&] { engine_from_json(eng, "e.json"); }),
            "e.json: memory_policy: \"all\" is not fraction_of_total or fraction_of_free");
}

TEST(CostModel, ProfilesLoadAndRoundTrip) {
  for (const char* id : {"b200", "h100", "h200", "rtx5090", "rtx5080", "rtx5070", "l40s", "a100"}) {
    const HardwareProfile h = load_hardware(id, kConfigs);
    EXPECT_EQ(h.id, id);
    EXPECT_EQ(hardware_to_json(hardware_from_json(hardware_to_json(h), "rt")), hardware_to_json(h));
  }
  EXPECT_DOUBLE_EQ(load_hardware("b200", kConfigs).peak_flops, 2250e12);
  EXPECT_DOUBLE_EQ(load_hardware("rtx5070", kConfigs).memory_bandwidth, 0.67e12);
  for (const char* id : {"long-context-coding", "batched-serving", "in-game", "long-context-128k"})
    EXPECT_EQ(load_workload(id, kConfigs).id, id);
  EXPECT_EQ(load_engine("trtllm", kConfigs).kv_block_tokens, 32);
  // A path works in place of an id.
  EXPECT_EQ(load_engine(kConfigs + "/engines/vllm.json", kConfigs).kv_block_tokens, 16);
}

TEST(CostModel, EngineHeterogeneousFfnMultiple) {
  // vLLM serves heterogeneous Llama students as DeciLM block_configs, whose FFN widths are
  // multiples of 256 (ffn_mult rounding); engines without the field take any width.
  EXPECT_EQ(load_engine("vllm", kConfigs).per_layer_ffn_multiple, 256);
  EXPECT_EQ(load_engine("local-eager", kConfigs).per_layer_ffn_multiple, 1);
  json eng = json::parse(R"({"format": "autocompress.engine", "version": 1, "id": "e", "memory_policy": "fraction_of_total",
    "memory_fraction": 0.9, "kv_block_tokens": 16, "max_num_batched_tokens": 8192, "max_num_seqs": 8,
    "heterogeneous": {"format": "x", "per_layer": ["ffn"], "ffn_multiple": 0}})");
  EXPECT_EQ(error_of([&] { engine_from_json(eng, "e.json"); }), "e.json: heterogeneous.ffn_multiple: must be an integer >= 1");
  eng["heterogeneous"]["ffn_multiple"] = 128;
  EXPECT_EQ(engine_from_json(eng, "e.json").per_layer_ffn_multiple, 128);
}

// ArchSpec: JSON round trip, validation messages, parameter counts against published
// figures (Nemotron 3 Super, Llama-3-8B), FLOPs per token.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dist/error.h"
#include "model/arch_spec.h"

using namespace ac::model;
using nlohmann::json;

namespace {

// Nemotron 3 Super 120B-A12B as REFERENCE.md describes it, built field by field (the HF
// config reader is tested against the same numbers in test_arch_spec_hf.cpp).
ArchSpec nemotron_super() {
  const std::string pattern =
      "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME";
  ArchSpec s;
  s.name = "super";
  s.family = ModelFamily::NemotronH;
  s.hidden_size = 4096;
  s.vocab_size = 131072;
  s.max_position_embeddings = 262144;
  MambaSpec m;
  m.num_heads = 128, m.head_dim = 64, m.state_size = 128, m.n_groups = 8;
  AttentionSpec a;
  a.num_heads = 32, a.num_kv_heads = 2, a.head_dim = 128;
  MoeSpec e;
  e.num_experts = 512, e.top_k = 22, e.expert_ffn = 2688, e.shared_ffn = 5376, e.latent_size = 1024;
  e.router = RouterKind::SigmoidBias, e.routed_scaling = 5.0, e.activation = MlpActivation::ReLU2;
  for (char c : pattern) {
    LayerSpec l;
    if (c == 'M') l.mamba = m;
    if (c == '*') l.attention = a;
    if (c == 'E') l.moe = e;
    s.layers.push_back(l);
  }
  s.mtp.num_predict_layers = 1;
  LayerSpec la, le;
  la.attention = a;
  le.moe = e;
  s.mtp.layers = {la, le};
  return s;
}

ArchSpec llama3_8b() {
  ArchSpec s;
  s.family = ModelFamily::Llama;
  s.hidden_size = 4096;
  s.vocab_size = 128256;
  AttentionSpec a;
  a.num_heads = 32, a.num_kv_heads = 8, a.head_dim = 128;
  MlpSpec f;
  f.ffn_size = 14336;
  for (int i = 0; i < 32; ++i) {
    LayerSpec l;
    l.attention = a;
    l.mlp = f;
    s.layers.push_back(l);
  }
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ac::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// REFERENCE.md: 123,611,012,096 parameters in the BF16 checkpoint, 2,942,324,736 of them in
// the MTP layer. We compare both ways: the full count including MTP (what the checkpoint
// holds) and the serving model without MTP (120,668,687,360), because serving and the cost
// model drop the MTP head while the checkpoint figure includes it. The router's
// e_score_correction_bias is a buffer in transformers (not in num_parameters()), and the
// published figure agrees: counting it would add 40 x 512.
TEST(ArchSpecParams, NemotronSuperMatchesReference) {
  const ParamCounts c = count_params(nemotron_super());
  const int64_t ref_with_mtp = 123611012096LL, ref_mtp = 2942324736LL;
  EXPECT_NEAR(double(c.total_with_mtp()), double(ref_with_mtp), 0.005 * ref_with_mtp);
  EXPECT_NEAR(double(c.total()), double(ref_with_mtp - ref_mtp), 0.005 * (ref_with_mtp - ref_mtp));
  // The shapes follow transformers' modules exactly, so the counts agree to the parameter.
  EXPECT_EQ(c.total_with_mtp(), ref_with_mtp);
  EXPECT_EQ(c.mtp, ref_mtp);
  // 12.77B active per token (REFERENCE.md), ~2.82B of routed experts per MoE layer.
  EXPECT_NEAR(double(c.active()), 12.77e9, 0.01e9);
  EXPECT_EQ(c.layers[1].moe_routed, 512LL * 2 * 1024 * 2688);
  EXPECT_EQ(c.layers[1].buffers, 512);
  int64_t mamba = 0, attention = 0;
  for (const auto& l : c.layers) mamba += l.mamba, attention += l.attention;
  EXPECT_NEAR(double(mamba), 4.4e9, 0.05e9);
  EXPECT_NEAR(double(attention), 0.29e9, 0.01e9);
}

// Meta's published Llama-3-8B count: 8,030,261,248.
TEST(ArchSpecParams, Llama3_8B) {
  const ArchSpec s = llama3_8b();
  const ParamCounts c = count_params(s);
  EXPECT_EQ(c.total(), 8030261248LL);
  EXPECT_EQ(c.active(), c.total());
  EXPECT_EQ(c.mtp, 0);
  ArchSpec tied = s;
  tied.tie_embeddings = true;
  EXPECT_EQ(count_params(tied).total(), 8030261248LL - 128256LL * 4096);
}

TEST(ArchSpecParams, MambaLayerMatchesTransformersShapes) {
  // NemotronHMamba2Mixer with hidden 64, H 4, P 16, N 8, G 2, K 4: in_proj [64+80+4, 64],
  // conv1d [80, 1, 4] + bias 80, dt_bias/A_log/D 4 each, norm 64, out_proj [64, 64].
  LayerSpec l;
  MambaSpec m;
  m.num_heads = 4, m.head_dim = 16, m.state_size = 8, m.n_groups = 2;
  l.mamba = m;
  const LayerParams p = count_layer_params(l, 64);
  EXPECT_EQ(p.mamba, 64 * (64 + 96 + 4) + 96 * 4 + 96 + 12 + 64 + 64 * 64);
  EXPECT_EQ(p.norms, 64);
}

TEST(ArchSpecJson, RoundTripHeterogeneous) {
  ArchSpec s = nemotron_super();
  s.layers[3].moe->num_experts = 256;  // heterogeneous: one layer differs
  s.layers[3].moe->top_k = 8;
  s.layers[7].attention->num_kv_heads = 4;
  s.layers[10] = LayerSpec{};  // skipped
  s.layers[0].mamba->time_step_limit_max = std::numeric_limits<double>::infinity();
  const json j = arch_to_json(s);
  EXPECT_EQ(j["layers"][3]["moe"], (json{{"num_experts", 256}, {"top_k", 8}}));
  EXPECT_EQ(j["layers"][10]["kind"], ".");
  const ArchSpec back = arch_from_json(j, "mem.json");
  EXPECT_EQ(arch_to_json(back), j);
  EXPECT_EQ(back.layers[3].moe->num_experts, 256);
  EXPECT_FALSE(back.layers[10].attention || back.layers[10].mamba || back.layers[10].mlp || back.layers[10].moe);
  EXPECT_EQ(count_params(back).total_with_mtp(), count_params(s).total_with_mtp());
}

TEST(ArchSpecJson, PatternWithDefaults) {
  const json j = json::parse(R"({"format": "autocompress.archspec", "version": 1, "hidden_size": 64,
    "vocab_size": 100, "defaults": {"mamba": {"num_heads": 4, "head_dim": 16, "state_size": 8, "n_groups": 2},
    "attention": {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16}, "mlp": {"ffn_size": 128}},
    "pattern": "M*-."})");
  const ArchSpec s = arch_from_json(j, "p.json");
  ASSERT_EQ(s.layers.size(), 4u);
  EXPECT_EQ(layer_kind(s.layers[0]), "M");
  EXPECT_EQ(layer_kind(s.layers[1]), "*");
  EXPECT_EQ(layer_kind(s.layers[2]), "-");
  EXPECT_EQ(layer_kind(s.layers[3]), ".");
  EXPECT_EQ(s.layers[1].attention->num_kv_heads, 2);
}

TEST(ArchSpecValidate, MessagesNameLayerAndField) {
  ArchSpec s = llama3_8b();
  s.layers[3].attention->num_kv_heads = 5;
  EXPECT_EQ(error_of([&] { validate(s, "arch.json"); }),
            "arch.json: layers[3].attention.num_kv_heads: 5 does not divide num_heads 32");
  s = nemotron_super();
  s.layers[1].moe->top_k = 600;
  EXPECT_EQ(error_of([&] { validate(s, "a.json"); }), "a.json: layers[1].moe.top_k: 600 exceeds num_experts 512");
  s = nemotron_super();
  s.layers[0].mamba->n_groups = 3;
  EXPECT_EQ(error_of([&] { validate(s, "a.json"); }), "a.json: layers[0].mamba.n_groups: 3 does not divide num_heads 128");
  s = llama3_8b();
  s.layers[2].mlp->ffn_size = -4;
  EXPECT_EQ(error_of([&] { validate(s, "a.json"); }), "a.json: layers[2].mlp.ffn_size: -4 must be positive");
  s.layers[2].mlp->ffn_size = 8;
  s.layers[2].mamba = MambaSpec{};
  EXPECT_NE(error_of([&] { validate(s, "a.json"); }).find("layers[2]: has both attention and mamba"), std::string::npos);
}

TEST(ArchSpecValidate, JsonErrors) {
  json j = arch_to_json(llama3_8b());
  json bad = j;
  bad["layers"][2]["attention"]["num_headz"] = 3;
  EXPECT_EQ(error_of([&] { arch_from_json(bad, "x.json"); }), "x.json: layers[2].attention.num_headz: unknown field");
  bad = j;
  bad["layers"][1]["mlp"]["ffn_size"] = "big";
  EXPECT_EQ(error_of([&] { arch_from_json(bad, "x.json"); }), "x.json: layers[1].mlp.ffn_size: expected an integer, got \"big\"");
  bad = j;
  bad["version"] = 7;
  EXPECT_NE(error_of([&] { arch_from_json(bad, "x.json"); }).find("x.json: version: 7 is not supported"), std::string::npos);
  bad = j;
  bad["layers"][0]["kind"] = "M";
  EXPECT_NE(error_of([&] { arch_from_json(bad, "x.json"); }).find("layers[0].kind"), std::string::npos);
  bad = j;
  bad.erase("layers");
  bad["pattern"] = "M*X";
  bad["defaults"] = json::object();
  EXPECT_NE(error_of([&] { arch_from_json(bad, "x.json"); }).find("x.json: pattern: letter 'M' at 0 needs defaults.mamba"),
            std::string::npos);
  bad["layers"] = json::array();
  EXPECT_NE(error_of([&] { arch_from_json(bad, "x.json"); }).find("either layers or pattern"), std::string::npos);
}

TEST(ArchSpecFlops, DecodeAndPrefill) {
  const ArchSpec s = llama3_8b();
  const ParamCounts c = count_params(s);
  // Decode at context 0: every matmul weight once (2 FLOPs per weight) plus attention to self.
  const double matmul_weights = double(c.total() - c.embedding - c.final_norm - 32 * 2 * 4096);
  const double attn_self = 32 * 4.0 * 32 * 128;
  EXPECT_DOUBLE_EQ(decode_flops_per_token(s, 0), 2 * matmul_weights + attn_self);
  // Decode grows by 4 * heads * head_dim per cached token per layer.
  EXPECT_DOUBLE_EQ(decode_flops_per_token(s, 1000) - decode_flops_per_token(s, 0), 32 * 4.0 * 32 * 128 * 1000);
  // Prefill per token grows with sequence length at half the decode slope (causal average).
  EXPECT_DOUBLE_EQ(prefill_flops_per_token(s, 2048) - prefill_flops_per_token(s, 1024), 32 * 2.0 * 32 * 128 * 1024);
  // MoE: routed expert FLOPs use top_k, not all experts.
  const ArchSpec sup = nemotron_super();
  const LayerFlops f = layer_flops_decode(sup.layers[1], sup.hidden_size, 0);
  EXPECT_DOUBLE_EQ(f.experts, 2.0 * 22 * 2 * 1024 * 2688);
  EXPECT_GT(layer_flops_prefill(sup.layers[0], sup.hidden_size, 4096).ssm, 0);
  // Active-parameter rule of thumb: decode FLOPs ~ 2 x active non-embedding parameters.
  const double active_matmul = double(count_params(sup).active() - count_params(sup).embedding);
  EXPECT_NEAR(decode_flops_per_token(sup, 0) / (2 * active_matmul), 1.0, 0.02);
}

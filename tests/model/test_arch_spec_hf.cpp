// Hugging Face config.json readers and writers: the committed example configs give the
// published parameter counts, heterogeneous students round-trip through per_layer_config and
// block_configs, and unsupported inputs name the file and field.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dist/error.h"
#include "model/arch_spec.h"
#include "model/hf_config.h"

using namespace ac::model;
using nlohmann::json;

namespace {
const std::string kModels = std::string(AC_SOURCE_DIR) + "/configs/models/";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ac::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

json round_trip_hf(const ArchSpec& s, HfHeterogeneity how = HfHeterogeneity::Auto) {
  const json hf = arch_to_hf_config(s, how);
  return arch_to_json(arch_from_hf_config(hf, "rt.json"));
}
json plain(ArchSpec s) {  // the ArchSpec JSON without the fields a config.json does not carry
  s.name.clear();
  json j = arch_to_json(s);
  j.erase("name");
  j.erase("family");
  return j;
}
json plain(const json& archspec_json) {
  json j = archspec_json;
  j.erase("name");
  j.erase("family");
  return j;
}
}  // namespace

TEST(HfConfig, NemotronSuperConfigCountsMatchReference) {
  const ArchSpec s = load_arch(kModels + "nemotron-3-super.json");
  EXPECT_EQ(s.family, ModelFamily::NemotronH);
  ASSERT_EQ(s.layers.size(), 88u);
  EXPECT_EQ(s.mtp.num_predict_layers, 1);
  const ParamCounts c = count_params(s);
  EXPECT_EQ(c.total_with_mtp(), 123611012096LL);  // REFERENCE.md, BF16 checkpoint incl. MTP
  EXPECT_EQ(c.mtp, 2942324736LL);
  EXPECT_TRUE(s.layers[0].mamba->ssm_state_fp32);
  EXPECT_EQ(s.layers[1].moe->latent_size, 1024);
  EXPECT_EQ(s.layers[1].moe->router, RouterKind::SigmoidBias);
  EXPECT_DOUBLE_EQ(s.layers[1].moe->routed_scaling, 5.0);
}

TEST(HfConfig, LlamaAndQwenPublishedCounts) {
  EXPECT_EQ(count_params(load_arch(kModels + "llama-3-8b.json")).total(), 8030261248LL);
  // Qwen2-0.5B (q/k/v biases, tied): 494,032,768 parameters.
  const json qwen2 = json::parse(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "vocab_size": 151936, "tie_word_embeddings": true, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0})");
  EXPECT_EQ(count_params(arch_from_hf_config(qwen2, "qwen2.json")).total(), 494032768LL);
  // Qwen3-0.6B (q/k norms, head_dim 128 != hidden/heads, tied): 596,049,920 parameters.
  const json qwen3 = json::parse(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": true, "rope_parameters": {"rope_theta": 1000000}})");
  const ArchSpec q3 = arch_from_hf_config(qwen3, "qwen3.json");
  EXPECT_EQ(count_params(q3).total(), 596049920LL);
  EXPECT_DOUBLE_EQ(q3.rope_theta, 1000000.0);
  // Mistral-7B: 7,241,732,096.
  const json mistral = json::parse(R"({"architectures": ["MistralForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "head_dim": null})");
  EXPECT_EQ(count_params(arch_from_hf_config(mistral, "m.json")).total(), 7241732096LL);
}

TEST(HfConfig, HomogeneousWritersRoundTrip) {
  for (const char* f : {"llama-3-8b.json", "nemotron-3-super.json", "nemotron-h-8b.json", "nemotron-3-nano.json"}) {
    const ArchSpec s = load_arch(kModels + f);
    const json hf = arch_to_hf_config(s);
    EXPECT_FALSE(hf.contains("per_layer_config")) << f;
    EXPECT_FALSE(hf.contains("block_configs")) << f;  // uniform: the plain family config
    EXPECT_EQ(hf_layout_of(hf), "plain") << f;
    EXPECT_EQ(plain(round_trip_hf(s)), plain(s)) << f;
  }
  EXPECT_EQ(arch_to_hf_config(load_arch(kModels + "llama-3-8b.json"))["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(arch_to_hf_config(load_arch(kModels + "nemotron-h-8b.json"))["architectures"][0], "NemotronHForCausalLM");
  // block-configs asked for: DeciLM / Puzzle even for a uniform student.
  const ArchSpec llama = load_arch(kModels + "llama-3-8b.json");
  const json deci = arch_to_hf_config(llama, HfHeterogeneity::BlockConfigs);
  EXPECT_EQ(deci["architectures"][0], "DeciLMForCausalLM");
  EXPECT_EQ(plain(round_trip_hf(llama, HfHeterogeneity::BlockConfigs)), plain(llama));
  EXPECT_EQ(arch_to_hf_config(load_arch(kModels + "nemotron-h-8b.json"), HfHeterogeneity::BlockConfigs)["model_type"],
            "nemotron_h_puzzle");
}

TEST(HfConfig, LayoutNames) {
  EXPECT_EQ(parse_hf_layout("auto"), HfHeterogeneity::Auto);
  EXPECT_EQ(parse_hf_layout("per-layer-config"), HfHeterogeneity::PerLayerConfig);
  EXPECT_EQ(parse_hf_layout("block-configs"), HfHeterogeneity::BlockConfigs);
  EXPECT_EQ(error_of([] { parse_hf_layout("decilm"); }),
            "command line: --hf-layout: 'decilm' is not auto, per-layer-config or block-configs");
}

TEST(HfConfig, HeterogeneousLlamaPerLayerConfig) {
  ArchSpec s = load_arch(kModels + "llama-3-8b.json");
  s.layers[3].attention->num_kv_heads = 4;
  s.layers[3].mlp->ffn_size = 9216;
  s.layers[12].attention.reset();
  s.layers[20].mlp.reset();
  const json hf = arch_to_hf_config(s, HfHeterogeneity::PerLayerConfig);
  ASSERT_TRUE(hf.contains("per_layer_config"));
  EXPECT_EQ(hf["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(hf_layout_of(hf), "per-layer-config");
  const json& p = hf["per_layer_config"];
  EXPECT_EQ(p.size(), 3u);
  EXPECT_EQ(p["03"], (json{{"num_key_value_heads", 4}, {"intermediate_size", 9216}}));
  EXPECT_EQ(p["12"]["skip"], json::array({"attention"}));
  EXPECT_EQ(p["20"]["skip"], json::array({"mlp"}));
  EXPECT_EQ(plain(round_trip_hf(s, HfHeterogeneity::PerLayerConfig)), plain(s));
  // Auto: DeciLM block_configs (Nemotron-51B style, what vLLM's DeciLMForCausalLM serves):
  // FFN widths through ffn_mult, GQA through n_heads_in_group, removed sublayers as no_op.
  const json deci = arch_to_hf_config(s);
  EXPECT_EQ(deci["architectures"][0], "DeciLMForCausalLM");
  EXPECT_EQ(deci["model_type"], "nemotron-nas");
  EXPECT_EQ(hf_layout_of(deci), "block-configs");
  EXPECT_FALSE(deci.contains("per_layer_config"));
  ASSERT_EQ(deci["block_configs"].size(), 32u);
  EXPECT_EQ(deci["num_attention_heads"], 32);
  EXPECT_EQ(deci["block_configs"][0]["attention"]["n_heads_in_group"], 4);
  EXPECT_EQ(deci["block_configs"][3]["attention"]["n_heads_in_group"], 8);
  EXPECT_EQ(deci["block_configs"][12]["attention"]["no_op"], true);
  EXPECT_EQ(deci["block_configs"][20]["ffn"]["no_op"], true);
  EXPECT_EQ(decilm_ffn_size(deci["block_configs"][3]["ffn"]["ffn_mult"].get<double>(), 4096), 9216);
  EXPECT_EQ(decilm_ffn_size(deci["block_configs"][0]["ffn"]["ffn_mult"].get<double>(), 4096), 14336);
  EXPECT_EQ(plain(round_trip_hf(s)), plain(s));
  // The ffn_mult survives the text of config.json (what Python reads) exactly.
  EXPECT_EQ(plain(arch_to_json(arch_from_hf_config(json::parse(deci.dump()), "rt.json"))), plain(s));
  // A hidden-pruned student keeps head_dim 128 with hidden 3072: written as the global head_dim.
  ArchSpec h = s;
  h.hidden_size = 3072;
  const json hd = arch_to_hf_config(h);
  EXPECT_EQ(hd["head_dim"], 128);
  EXPECT_EQ(plain(round_trip_hf(h)), plain(h));
  // A DeciLM-family spec (imported from a Nemotron-NAS checkpoint) stays DeciLM, uniform or not.
  ArchSpec d = load_arch(kModels + "llama-3-8b.json");
  d.family = ModelFamily::DeciLM;
  EXPECT_EQ(arch_to_hf_config(d)["architectures"][0], "DeciLMForCausalLM");
  EXPECT_EQ(arch_to_hf_config(d, HfHeterogeneity::PerLayerConfig)["architectures"][0], "LlamaForCausalLM");
}

// Every FFN width a multiple of 256 is reachable through a 6-decimal ffn_mult, for the
// hidden sizes of the models we compress; other widths are refused.
TEST(HfConfig, DeciLMFfnWidthsOfEveryMultipleOf256) {
  for (int64_t hidden : {576, 960, 2048, 4096, 8192}) {
    ArchSpec s = load_arch(kModels + "llama-3-8b.json");
    s.hidden_size = hidden;
    s.layers.resize(1);
    s.layers[0].attention->num_heads = int(hidden / 64);
    s.layers[0].attention->num_kv_heads = 1;
    s.layers[0].attention->head_dim = 64;
    for (int64_t ffn = 256; ffn <= 8 * hidden; ffn += 256) {
      s.layers[0].mlp->ffn_size = ffn;
      const json c = arch_to_hf_config(s, HfHeterogeneity::BlockConfigs);
      const double m = c["block_configs"][0]["ffn"]["ffn_mult"].get<double>();
      ASSERT_EQ(decilm_ffn_size(json::parse(c.dump())["block_configs"][0]["ffn"]["ffn_mult"].get<double>(), hidden), ffn)
          << "hidden " << hidden << " ffn_mult " << m;
    }
  }
}

// Students DeciLM cannot hold exactly are refused naming the layer and the field, pointing
// at per_layer_config (which holds them).
TEST(HfConfig, DeciLMRefusesWhatItCannotExpress) {
  const ArchSpec base = load_arch(kModels + "llama-3-8b.json");
  const std::string hint = "; export it with --hf-layout per-layer-config";
  ArchSpec s = base;
  s.layers[3].mlp->ffn_size = 9000;  // not a multiple of 256
  EXPECT_EQ(error_of([&] { arch_to_hf_config(s); }),
            "config.json: layers[3].mlp.ffn_size: 9000 is not a DeciLM FFN width: DeciLM derives it from ffn.ffn_mult as "
            "round_up(int(2 * ffn_mult * hidden / 3), 256), so it must be a multiple of 256" + hint);
  EXPECT_NO_THROW(arch_to_hf_config(s, HfHeterogeneity::PerLayerConfig));
  s = base;
  s.layers[5].attention->num_heads = 24;  // query heads pruned, KV heads kept
  EXPECT_EQ(error_of([&] { arch_to_hf_config(s); }),
            "config.json: layers[5].attention.num_heads: 24 query heads where layer 0 has 32: DeciLM has one global "
            "num_attention_heads, per layer only n_heads_in_group (the KV groups)" + hint);
  EXPECT_EQ(plain(round_trip_hf(s, HfHeterogeneity::PerLayerConfig)), plain(s));
  s = base;
  s.layers[1].mlp->bias = true;  // (per_layer_config cannot hold it either)
  EXPECT_NE(error_of([&] { arch_to_hf_config(s, HfHeterogeneity::BlockConfigs); }).find("config.json: layers[1].mlp.bias: "),
            std::string::npos);
  // Qwen3 attention has q/k norms, which DeciLM has not.
  ArchSpec q = base;
  q.family = ModelFamily::Qwen3;
  for (auto& l : q.layers) l.attention->qk_norm = true;
  EXPECT_EQ(arch_to_hf_config(q)["architectures"][0], "Qwen3ForCausalLM");  // uniform: fine
  q.layers[2].mlp->ffn_size = 8192;
  EXPECT_EQ(error_of([&] { arch_to_hf_config(q); }),
            "config.json: layers[0].attention.qk_norm: DeciLM attention has no q/k norm" + hint);
}

TEST(HfConfig, DeciLMReadsPublishedStyle) {
  const json c = json::parse(R"({"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas",
    "hidden_size": 8192, "num_attention_heads": 64, "vocab_size": 128256, "num_hidden_layers": 3,
    "block_configs": [
      {"attention": {"n_heads_in_group": 8, "no_op": false, "replace_with_linear": false},
       "ffn": {"ffn_mult": 5.25, "no_op": false, "replace_with_linear": false}},
      {"attention": {"n_heads_in_group": null, "no_op": true, "replace_with_linear": false},
       "ffn": {"ffn_mult": 2.625, "no_op": false, "replace_with_linear": false}},
      {"attention": {"n_heads_in_group": 64, "no_op": false, "replace_with_linear": false},
       "ffn": {"ffn_mult": null, "no_op": true, "replace_with_linear": false}}]})");
  const ArchSpec s = arch_from_hf_config(c, "deci.json");
  EXPECT_EQ(s.layers[0].mlp->ffn_size, 28672);  // Llama-3-70B's width
  EXPECT_EQ(s.layers[0].attention->num_kv_heads, 8);
  EXPECT_FALSE(s.layers[1].attention);
  EXPECT_EQ(s.layers[1].mlp->ffn_size, 14336);
  EXPECT_EQ(s.layers[2].attention->num_kv_heads, 1);
  EXPECT_FALSE(s.layers[2].mlp);
  json bad = c;
  bad["block_configs"][1]["ffn"]["replace_with_linear"] = true;
  EXPECT_EQ(error_of([&] { arch_from_hf_config(bad, "deci.json"); }),
            "deci.json: block_configs[1]: replace_with_linear blocks are not supported by ArchSpec");
}

TEST(HfConfig, HeterogeneousNemotronH) {
  ArchSpec s = load_arch(kModels + "nemotron-3-super.json");
  s.layers[1].moe->num_experts = 256;
  s.layers[1].moe->top_k = 12;
  s.layers[5].moe->expert_ffn = 1280;
  ArchSpec wide = s;  // also Mamba heads and KV heads per layer: per_layer_config only
  wide.layers[0].mamba->num_heads = 96;
  wide.layers[7].attention->num_kv_heads = 1;
  // per_layer_config (transformers' heterogeneity)
  const json hf = arch_to_hf_config(wide, HfHeterogeneity::PerLayerConfig);
  EXPECT_EQ(hf["architectures"][0], "NemotronHForCausalLM");
  EXPECT_EQ(hf["per_layer_config"]["01"], (json{{"n_routed_experts", 256}, {"num_experts_per_tok", 12}}));
  EXPECT_EQ(hf["per_layer_config"]["00"], (json{{"mamba_num_heads", 96}}));
  EXPECT_EQ(plain(round_trip_hf(wide, HfHeterogeneity::PerLayerConfig)), plain(wide));
  // Auto: block_configs (Nemotron-H Puzzle), the per-layer MoE and MLP sizes it carries.
  const json puzzle = arch_to_hf_config(s);
  EXPECT_EQ(puzzle["architectures"][0], "NemotronHPuzzleForCausalLM");
  EXPECT_EQ(puzzle["model_type"], "nemotron_h_puzzle");
  EXPECT_EQ(hf_layout_of(puzzle), "block-configs");
  EXPECT_FALSE(puzzle.contains("per_layer_config"));
  EXPECT_EQ(puzzle["block_configs"][5], (json{{"block_type", "moe"}, {"moe_intermediate_size", 1280}}));
  EXPECT_EQ(puzzle["block_configs"][1],
            (json{{"block_type", "moe"}, {"n_routed_experts", 256}, {"num_experts_per_tok", 12}}));
  EXPECT_EQ(puzzle["block_configs"][0], (json{{"block_type", "mamba"}}));
  EXPECT_EQ(plain(round_trip_hf(s)), plain(s));
  // Per-layer Mamba heads or KV heads are not in the Puzzle schema.
  const std::string hint = "; export it with --hf-layout per-layer-config";
  EXPECT_EQ(error_of([&] { arch_to_hf_config(wide); }),
            "config.json: layers[0].mamba.num_heads: 96 where the other layers have 128 (mamba_num_heads): "
            "nemotron_h_puzzle block_configs carry per-layer MLP and MoE sizes only, not Mamba fields" + hint);
  ArchSpec kv = s;
  kv.layers[7].attention->num_kv_heads = 1;
  EXPECT_NE(error_of([&] { arch_to_hf_config(kv, HfHeterogeneity::BlockConfigs); })
                .find("config.json: layers[7].attention.num_kv_heads: 1 where the other layers have 2"),
            std::string::npos);
  // A skipped layer is left out of the pattern (and is not a per-layer difference).
  ArchSpec u = load_arch(kModels + "nemotron-3-super.json");
  u.layers[2] = LayerSpec{};
  const json dropped = arch_to_hf_config(u);
  EXPECT_EQ(dropped["hybrid_override_pattern"].get<std::string>().size(), 87u);
  EXPECT_EQ(dropped["architectures"][0], "NemotronHForCausalLM");
}

TEST(HfConfig, NemotronHLayersBlockTypeNames) {
  json c = json::parse(R"({"model_type": "nemotron_h", "hidden_size": 64, "vocab_size": 100,
    "layers_block_type": ["mamba", "moe", "full_attention", "mlp", "linear_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
    "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 2,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 64})");
  const ArchSpec s = arch_from_hf_config(c, "h.json");
  std::string kinds;
  for (const auto& l : s.layers) kinds += layer_kind(l);
  EXPECT_EQ(kinds, "ME*-M");
  c["layers_block_type"][2] = "sliding_window";
  EXPECT_EQ(error_of([&] { arch_from_hf_config(c, "h.json"); }),
            "h.json: layers_block_type[2]: unknown layer type \"sliding_window\" (expected mamba, attention, mlp or moe)");
}

TEST(HfConfig, ErrorsNameFileAndField) {
  const json gpt2 = json::parse(R"({"architectures": ["GPT2LMHeadModel"], "n_embd": 768})");
  EXPECT_NE(error_of([&] { arch_from_hf_config(gpt2, "gpt2/config.json"); })
                .find("gpt2/config.json: architectures: unsupported architecture \"GPT2LMHeadModel\""),
            std::string::npos);
  json llama = json::parse(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 10,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3, "intermediate_size": 128})");
  EXPECT_EQ(error_of([&] { arch_from_hf_config(llama, "c.json"); }),
            "c.json: layers[0].attention.num_kv_heads: 3 does not divide num_heads 4");
  llama["num_key_value_heads"] = 2;
  llama["per_layer_config"] = {{"5", {{"intermediate_size", 4}}}};
  EXPECT_EQ(error_of([&] { arch_from_hf_config(llama, "c.json"); }),
            "c.json: per_layer_config.5: key is not a layer index in [0, 2)");
  llama["per_layer_config"] = {{"1", {{"num_key_value_heads", "two"}}}};
  EXPECT_EQ(error_of([&] { arch_from_hf_config(llama, "c.json"); }),
            "c.json: per_layer_config.1.num_key_value_heads: expected an integer, got \"two\"");
  llama.erase("per_layer_config");
  llama.erase("intermediate_size");
  EXPECT_EQ(error_of([&] { arch_from_hf_config(llama, "c.json"); }), "c.json: intermediate_size: missing");
  // A Llama layer (attention + MLP in one block) cannot be written as NemotronH; the writer
  // says which layer.
  ArchSpec llama_as_h = load_arch(kModels + "llama-3-8b.json");
  llama_as_h.family = ModelFamily::NemotronH;
  EXPECT_EQ(error_of([&] { arch_to_hf_config(llama_as_h); }),
            "config.json: layers[0]: a NemotronH block has exactly one of M * - E, this layer is *-");
}

TEST(HfConfig, LoadAndSaveFiles) {
  const std::string dir = ::testing::TempDir();
  const ArchSpec tiny = load_arch(kModels + "tiny-hybrid.json");
  EXPECT_EQ(tiny.layers.size(), 8u);
  save_arch(tiny, dir + "/tiny_arch.json");
  EXPECT_EQ(arch_to_json(load_arch(dir + "/tiny_arch.json")), arch_to_json(tiny));
  ArchSpec t = tiny;
  t.layers.pop_back();  // NemotronH cannot hold a skipped layer at the end of the numbering
  save_hf_config(t, dir + "/config.json");
  EXPECT_EQ(plain(arch_to_json(load_arch(dir + "/config.json"))), plain(t));
  std::ofstream(dir + "/broken.json") << "{\"format\": ";
  EXPECT_NE(error_of([&] { load_arch(dir + "/broken.json"); }).find("broken.json: (json): not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([&] { load_arch(dir + "/nope.json"); }).find("nope.json: (file): cannot open"), std::string::npos);
}

TEST(HfConfig, Qwen3MoeDenseLayersAndSparseStep) {
  json c = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"hidden_size", 64},
            {"vocab_size", 96}, {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
            {"head_dim", 16}, {"intermediate_size", 96}, {"moe_intermediate_size", 32}, {"num_experts", 8},
            {"num_experts_per_tok", 2}, {"decoder_sparse_step", 2}, {"mlp_only_layers", {3}},
            {"norm_topk_prob", true}, {"rms_norm_eps", 1e-6}};
  const ArchSpec s = arch_from_hf_config(c, "qwen3moe.json");
  ASSERT_EQ(s.layers.size(), 4u);
  EXPECT_TRUE(s.layers[0].mlp && !s.layers[0].moe);  // (0 + 1) % 2 != 0
  EXPECT_TRUE(s.layers[1].moe && !s.layers[1].mlp);
  EXPECT_TRUE(s.layers[3].mlp && !s.layers[3].moe);  // mlp_only_layers
  EXPECT_EQ(s.layers[1].moe->num_experts, 8);
  EXPECT_TRUE(s.layers[1].moe->norm_topk_prob);
  EXPECT_TRUE(s.layers[1].attention->qk_norm);
  const json hf = arch_to_hf_config(s);
  EXPECT_EQ(hf["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(hf["mlp_only_layers"], json({0, 2, 3}));
  EXPECT_EQ(plain(round_trip_hf(s)), plain(s));
  ArchSpec bad = s;
  bad.layers[1].moe->shared_ffn = 16;
  EXPECT_NE(error_of([&] { arch_to_hf_config(bad); }).find("config.json: layers[1]: "), std::string::npos);
}

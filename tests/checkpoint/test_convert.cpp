// Hugging Face import and deployment export. A committed transformers fixture (Nemotron-H:
// Mamba-2, attention, MLP, MoE) is imported at TP = 2 (TP 2 x DP 2 at 4 ranks; TP 1 at one
// rank), exported as sharded safetensors and imported again: same tensors, same logits,
// and transformers' logits. The bf16 HDF5 export verifies; shapes that do not match the
// ArchSpec and bad Hugging Face directories are reported naming the file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/communicator.h"
#include "dist/error.h"
#include "model/hf_config.h"
#include "model/hf_import.h"
#include "model/safetensors.h"

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

std::string fixture(const std::string& name) { return std::string(AC_MODEL_FIXTURES) + "/" + name; }

std::string shared_dir(const std::string& name) {
  const char* base = std::getenv("AC_TEST_TMP");
  fs::path p = fs::path(base ? base : "/tmp/ac-ckpt-test") / name;
  if (world_rank() == 0) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return p.string();
}

struct Golden {
  torch::Tensor ids, logits;
};
Golden golden(const std::string& name) {
  model::SafetensorsReader r(fixture(name) + "/golden.safetensors");
  return {r.read("input_ids"), r.read("logits")};
}

// A TP = 1 model (on this rank alone) filled from a checkpoint file, and its logits.
torch::Tensor checkpoint_logits(const std::string& path, const torch::Tensor& ids) {
  checkpoint::CheckpointReader reader(path);
  const auto spec = checkpoint::checkpoint_arch(reader);
  model::CausalLM m(spec, model::TpGroup{dist::make_self_communicator()},
                    model::ModelOptions{checkpoint::parse_dtype(spec.dtype)});
  checkpoint::load_model(m, reader);
  torch::NoGradGuard ng;
  return m->forward(ids).to(torch::kFloat32);
}

// Runs `body` on rank 0 only; every rank learns whether it threw (so no rank waits alone).
void on_root(const std::function<void()>& body) {
  int ok = 1;
  std::string what;
  if (world_rank() == 0) {
    try {
      body();
    } catch (const std::exception& e) {
      ok = 0;
      what = e.what();
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ASSERT_TRUE(ok) << "rank 0: " << what;
}

}  // namespace

TEST(HfImport, ImportExportImportKeepsTensorsAndLogits) {
  const int tp = world_size() >= 2 ? 2 : 1;
  const std::string dir = shared_dir("hf-roundtrip");
  const auto g = golden("nemotron_h");

  checkpoint::ImportOptions opt;
  opt.dtype = "f32";
  opt.tp = tp;
  const auto first = checkpoint::import_hf(MPI_COMM_WORLD, fixture("nemotron_h"), dir + "/first", opt);
  EXPECT_EQ(first.tp, tp);
  EXPECT_EQ(first.dp, world_size() / tp);
  EXPECT_EQ(first.path, dir + "/first/step_0.h5");
  {
    checkpoint::CheckpointReader reader(first.path);
    EXPECT_TRUE(reader.verify().empty());
    EXPECT_TRUE(checkpoint::verify_model_shapes(reader).empty());
    EXPECT_EQ(reader.attributes().at("arch_spec").at("dtype"), "float32");
    EXPECT_EQ(reader.attributes().at("layout").at("tp"), tp);
  }
  const torch::Tensor logits = checkpoint_logits(first.path, g.ids);
  EXPECT_LE((logits - g.logits).abs().max().item<double>(), 1e-4) << "imported weights vs transformers";

  // Export as sharded safetensors (small shards: an index and several files), import again.
  on_root([&] {
    const auto files = checkpoint::export_safetensors(dir + "/first", dir + "/hf", torch::kFloat32, 64 << 10);
    ASSERT_GT(files.size(), 3u) << "expected several shards, an index and config.json";
    EXPECT_TRUE(fs::exists(dir + "/hf/model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(dir + "/hf/config.json"));
  });
  const auto second = checkpoint::import_hf(MPI_COMM_WORLD, dir + "/hf", dir + "/second", opt);
  EXPECT_LE((checkpoint_logits(second.path, g.ids) - logits).abs().max().item<double>(), 1e-5);

  checkpoint::CheckpointReader a(first.path), b(second.path);
  ASSERT_EQ(a.datasets().size(), b.datasets().size());
  for (const auto& d : a.datasets()) EXPECT_TRUE(torch::equal(a.read(d.name), b.read(d.name))) << d.name;
  EXPECT_EQ(a.attributes().at("arch_spec"), b.attributes().at("arch_spec"));
}

TEST(HfImport, Bf16Hdf5ExportVerifiesAndHoldsRoundedWeights) {
  const std::string dir = shared_dir("hf-bf16");
  checkpoint::ImportOptions opt;
  opt.dtype = "f32";
  opt.tp = world_size() >= 2 ? 2 : 1;
  const auto src = checkpoint::import_hf(MPI_COMM_WORLD, fixture("nemotron_h_latent"), dir + "/src", opt);
  on_root([&] {
    const std::string path = checkpoint::export_hdf5(src.path, dir + "/serve", torch::kBFloat16);
    EXPECT_EQ(path, dir + "/serve/step_0.h5");
    EXPECT_EQ(checkpoint::resolve_checkpoint(dir + "/serve"), path);
    checkpoint::CheckpointReader out(path), in(src.path);
    EXPECT_TRUE(out.verify().empty());
    EXPECT_TRUE(checkpoint::verify_model_shapes(out).empty());
    EXPECT_EQ(out.attributes().at("arch_spec").at("dtype"), "bfloat16");
    ASSERT_EQ(out.datasets().size(), in.datasets().size());
    int bf16 = 0;
    for (const auto& d : out.datasets()) {
      const bool router = d.name.find("gate.weight") != std::string::npos ||
                          d.name.find("e_score_correction_bias") != std::string::npos;
      EXPECT_EQ(d.dtype, router ? "float32" : "bfloat16") << d.name;
      bf16 += d.dtype == "bfloat16";
      const auto want = in.read(d.name).to(router ? torch::kFloat32 : torch::kBFloat16);
      EXPECT_TRUE(torch::equal(out.read(d.name), want)) << d.name;
    }
    EXPECT_GT(bf16, 10);
    // Exporting into the source's own directory is refused.
    EXPECT_THROW(checkpoint::export_hdf5(src.path, dir + "/src", torch::kBFloat16), InputError);
  });
}

TEST(HfImport, VerifyReportsShapesThatDoNotMatchTheArchSpec) {
  const std::string dir = shared_dir("hf-mismatch");
  on_root([&] {
    const auto spec = model::load_arch(fixture("llama") + "/config.json");
    model::CausalLM m(spec, model::TpGroup{dist::make_self_communicator()});
    m->init_weights(3);
    auto other = spec;
    other.layers[1].mlp->ffn_size = 128;  // the ArchSpec says 128, the tensors have 96
    other.tie_embeddings = true;          // and no lm_head
    const std::string path = checkpoint::save_checkpoint(MPI_COMM_SELF, dir, 1, checkpoint::model_tensors(m, true),
                                                         {{"arch_spec", model::arch_to_json(other)}});
    checkpoint::CheckpointReader reader(path);
    EXPECT_TRUE(reader.verify().empty());  // readable, checksums fine
    const auto problems = checkpoint::verify_model_shapes(reader);
    std::string all;
    for (const auto& p : problems) all += p + "\n";
    EXPECT_EQ(problems.size(), 4u) << all;  // gate, up, down of layer 1; lm_head
    EXPECT_NE(all.find(path + ": model/layers.1.mlp.up_proj.weight: has shape [96, 64], the ArchSpec wants [128, 64]"),
              std::string::npos)
        << all;
    EXPECT_NE(all.find(path + ": model/lm_head.weight: not a tensor of the ArchSpec"), std::string::npos) << all;

    // A checkpoint without an ArchSpec has nothing to compare; a missing dataset is named.
    model::CausalLM tied(other, model::TpGroup{dist::make_self_communicator()});
    auto tensors = checkpoint::model_tensors(tied, true);
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const auto& t) { return t.name == "model/final_norm.weight"; }),
                  tensors.end());
    const std::string p2 = checkpoint::save_checkpoint(MPI_COMM_SELF, dir, 2, tensors, {{"arch_spec", model::arch_to_json(other)}});
    checkpoint::CheckpointReader r2(p2);
    const auto missing = checkpoint::verify_model_shapes(r2);
    ASSERT_EQ(missing.size(), 1u);
    EXPECT_NE(missing[0].find(p2 + ": model/final_norm.weight: missing"), std::string::npos) << missing[0];
  });
}

// A model weight stored as int32 (same shape) is not a model weight: verify names it, and
// loading it (eval, export, generate) is refused instead of converting the integers.
TEST(HfImport, IntegerModelDatasetIsRefusedByVerifyAndLoad) {
  const std::string dir = shared_dir("hf-int32");
  on_root([&] {
    const auto spec = model::load_arch(fixture("llama") + "/config.json");
    model::CausalLM m(spec, model::TpGroup{dist::make_self_communicator()});
    m->init_weights(3);
    auto tensors = checkpoint::model_tensors(m, true);
    for (auto& t : tensors)
      if (t.name == "model/final_norm.weight") t.local = t.local.to(torch::kInt);
    const std::string path = checkpoint::save_checkpoint(MPI_COMM_SELF, dir, 1, tensors, {{"arch_spec", model::arch_to_json(spec)}});
    checkpoint::CheckpointReader reader(path);
    const auto problems = checkpoint::verify_model_shapes(reader);
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_NE(problems[0].find("model/final_norm.weight: has dtype int32"), std::string::npos) << problems[0];
    model::CausalLM again(spec, model::TpGroup{dist::make_self_communicator()});
    try {
      checkpoint::load_model(again, reader);
      ADD_FAILURE() << "an int32 weight was loaded";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("model/final_norm.weight: has dtype int32"), std::string::npos) << e.what();
    }
  });
}

TEST(HfImport, BadHuggingFaceDirectoriesNameTheFile) {
  const std::string dir = shared_dir("hf-bad");
  if (world_rank() == 0) {
    fs::create_directories(dir + "/no-config");
    fs::copy_file(fixture("llama") + "/model.safetensors", dir + "/no-config/model.safetensors");
    fs::create_directories(dir + "/truncated");
    fs::copy_file(fixture("llama") + "/config.json", dir + "/truncated/config.json");
    fs::copy_file(fixture("llama") + "/model.safetensors", dir + "/truncated/model.safetensors");
    fs::resize_file(dir + "/truncated/model.safetensors", fs::file_size(dir + "/truncated/model.safetensors") / 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto message = [&](const std::string& hf) {
    try {
      checkpoint::import_hf(MPI_COMM_WORLD, hf, dir + "/out", {});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(dir + "/no-config").find(dir + "/no-config/config.json"), std::string::npos)
      << message(dir + "/no-config");
  const std::string t = message(dir + "/truncated");
  EXPECT_NE(t.find("truncated/model.safetensors"), std::string::npos) << t;
  EXPECT_NE(message(dir + "/nowhere").find("no such directory"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/out/latest"));  // nothing half-written
}

// On rank 0: builds a student from `s` with weights from `seed`, saves it as a checkpoint at
// dir/student (step `step`), exports it to dir/hf as f32 safetensors, and hands back its
// logits on `ids` and the exported config.json. The other ranks wait at the end.
void export_student(const model::ArchSpec& s, const std::string& dir, uint64_t seed, int64_t step,
                    const torch::Tensor& ids, const std::function<void(const nlohmann::json&)>& check_root,
                    torch::Tensor* want, model::HfHeterogeneity how = model::HfHeterogeneity::Auto) {
  on_root([&] {
    model::CausalLM m(s, model::TpGroup{dist::make_self_communicator()});
    m->init_weights(seed);
    {
      torch::NoGradGuard ng;
      *want = m->forward(ids);
    }
    checkpoint::save_checkpoint(MPI_COMM_SELF, dir + "/student", step, checkpoint::model_tensors(m, true),
                                {{"arch_spec", model::arch_to_json(s)}});
    nlohmann::json written;
    checkpoint::export_safetensors(dir + "/student", dir + "/hf", torch::kFloat32, int64_t(5) << 30, how, &written);
    std::ifstream in(dir + "/hf/config.json");
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir + "/hf/config.json")), written);
    check_root(nlohmann::json::parse(in));
  });
}

// A pruned Nemotron-H student (fixture M*-EM-E): MLP and MoE sizes per layer, and with
// `mixers` Mamba heads and KV heads per layer too (which only per_layer_config carries).
model::ArchSpec pruned_nemotron(bool mixers) {
  model::ArchSpec s = model::load_arch(fixture("nemotron_h") + "/config.json");
  if (mixers) {
    s.layers[0].mamba->num_heads = 4;
    s.layers[1].attention->num_kv_heads = 4;
  }
  s.layers[2].mlp->ffn_size = 64;
  s.layers[3].moe->num_experts = 4;
  s.layers[3].moe->expert_ffn = 16;
  s.layers[5].mlp->ffn_size = 32;
  return s;
}

TEST(HfImport, HeterogeneousStudentExportsWithPerLayerOverrides) {
  // Every layer kind with its own dimensions.
  const model::ArchSpec s = pruned_nemotron(true);
  const std::string dir = shared_dir("hf-hetero");
  torch::manual_seed(11);
  const torch::Tensor ids = torch::randint(0, s.vocab_size, {2, 9});
  torch::Tensor want;
  export_student(s, dir, 17, 5, ids, [](const nlohmann::json& config) {
    ASSERT_TRUE(config.contains("per_layer_config")) << config.dump(2);
    EXPECT_EQ(config["per_layer_config"].value("5", nlohmann::json::object()).value("intermediate_size", 0), 32)
        << config.dump(2);  // the globals take the most common value, layer 5 differs
  }, &want, model::HfHeterogeneity::PerLayerConfig);
  checkpoint::ImportOptions opt;
  opt.tp = world_size() >= 2 ? 2 : 1;
  const auto back = checkpoint::import_hf(MPI_COMM_WORLD, dir + "/hf", dir + "/back", opt);
  EXPECT_EQ(model::arch_to_json(back.spec).dump(), [&] {
    auto t = s;
    t.dtype = "float32";
    return model::arch_to_json(t).dump();
  }());
  const torch::Tensor got = checkpoint_logits(back.path, ids);
  if (world_rank() == 0) {
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
  }
}

TEST(HfImport, SkippedNemotronLayersAreLeftOutOfTheExport) {
  // A depth-pruned student: layers 2 (MLP) and 4 (Mamba) skipped entirely.
  model::ArchSpec s = model::load_arch(fixture("nemotron_h") + "/config.json");  // M*-EM-E
  s.layers[2] = model::LayerSpec{};
  s.layers[4] = model::LayerSpec{};
  const std::string dir = shared_dir("hf-skipped");
  torch::manual_seed(12);
  const torch::Tensor ids = torch::randint(0, s.vocab_size, {2, 9});
  torch::Tensor want;
  export_student(s, dir, 19, 3, ids, [&](const nlohmann::json& config) {
    EXPECT_EQ(config["hybrid_override_pattern"], "M*E-E") << config.dump(2);
    model::SafetensorsReader st(dir + "/hf");
    EXPECT_TRUE(st.contains("backbone.layers.4.mixer.gate.weight"));  // was layer 6
    EXPECT_FALSE(st.contains("backbone.layers.5.norm.weight"));
  }, &want);
  checkpoint::ImportOptions opt;
  opt.tp = world_size() >= 2 ? 2 : 1;
  const auto back = checkpoint::import_hf(MPI_COMM_WORLD, dir + "/hf", dir + "/back", opt);
  EXPECT_EQ(back.spec.layers.size(), 5u);
  const torch::Tensor got = checkpoint_logits(back.path, ids);
  if (world_rank() == 0) {
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
  }
}

namespace {
// The ArchSpec JSON without what a config.json does not carry (name; family: a Llama student
// comes back from DeciLM block_configs as family "decilm", the same model).
nlohmann::json plain_arch(model::ArchSpec s) {
  s.name.clear();
  nlohmann::json j = model::arch_to_json(s);
  j.erase("name");
  j.erase("family");
  return j;
}
// Every regular file under `dir` with its bytes.
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) {
      std::ifstream in(e.path(), std::ios::binary);
      out[fs::relative(e.path(), dir).string()] = std::string(std::istreambuf_iterator<char>(in), {});
    }
  return out;
}
}  // namespace

// `checkpoint import` of dir/hf into dir/back (TP 2 from 2 ranks on): the ArchSpec it read,
// and on rank 0 the max |diff| of its logits on `ids` against `want` (printed with `what`).
model::ArchSpec import_back(const std::string& dir, const torch::Tensor& ids, const torch::Tensor& want,
                            const std::string& what, double* diff) {
  checkpoint::ImportOptions opt;
  opt.tp = world_size() >= 2 ? 2 : 1;
  const auto back = checkpoint::import_hf(MPI_COMM_WORLD, dir + "/hf", dir + "/back", opt);
  const torch::Tensor got = checkpoint_logits(back.path, ids);
  *diff = 0;
  if (world_rank() == 0) {
    *diff = (got - want).abs().max().item<double>();
    std::cout << what << " export -> import at TP " << opt.tp << ", logits at TP 1: max |logit diff| " << *diff
              << " (tolerance 1e-5)\n";
  }
  return back.spec;
}

TEST(HfImport, HeterogeneousLlamaStudentExportsAsDeciLM) {
  // A pruned Llama student as the search makes them for vLLM: per-layer FFN widths that are
  // multiples of 256, one attention removed, one MLP removed, KV groups differing per layer.
  model::ArchSpec s = model::load_arch(fixture("llama") + "/config.json");  // 4 heads, 2 KV heads
  const model::LayerSpec first = s.layers[0];
  s.layers.resize(4, first);
  s.layers[0].mlp->ffn_size = 512;
  s.layers[1].attention.reset();
  s.layers[1].mlp->ffn_size = 256;
  s.layers[2].attention->num_kv_heads = 1;
  s.layers[2].mlp.reset();
  s.layers[3].attention->num_kv_heads = 4;
  s.layers[3].mlp->ffn_size = 768;
  const std::string dir = shared_dir("hf-decilm");
  torch::manual_seed(13);
  const torch::Tensor ids = torch::randint(0, s.vocab_size, {2, 11});
  torch::Tensor want;
  export_student(s, dir, 23, 4, ids, [&](const nlohmann::json& config) {
    EXPECT_EQ(config["architectures"][0], "DeciLMForCausalLM") << config.dump(2);
    EXPECT_EQ(config["model_type"], "nemotron-nas");
    EXPECT_EQ(model::hf_layout_of(config), "block-configs");
    ASSERT_EQ(config["block_configs"].size(), 4u);
    EXPECT_EQ(config["block_configs"][1]["attention"]["no_op"], true);
    EXPECT_EQ(config["block_configs"][2]["ffn"]["no_op"], true);
    EXPECT_EQ(config["block_configs"][2]["attention"]["n_heads_in_group"], 4);
    EXPECT_EQ(config["block_configs"][3]["attention"]["n_heads_in_group"], 1);
    EXPECT_EQ(model::decilm_ffn_size(config["block_configs"][3]["ffn"]["ffn_mult"].get<double>(), 64), 768);
    // Our reader gives the same ArchSpec back.
    EXPECT_EQ(plain_arch(model::arch_from_hf_config(config, "config.json")), plain_arch([&] {
      auto t = s;
      t.dtype = "float32";
      return t;
    }()));
    // No weights for the removed sublayers (vLLM's DeciLM builds no norm for a no-op block).
    model::SafetensorsReader st(dir + "/hf");
    EXPECT_FALSE(st.contains("model.layers.1.self_attn.q_proj.weight"));
    EXPECT_FALSE(st.contains("model.layers.1.input_layernorm.weight"));
    EXPECT_FALSE(st.contains("model.layers.2.post_attention_layernorm.weight"));
    EXPECT_TRUE(st.contains("model.layers.3.mlp.gate_proj.weight"));
  }, &want);
  // `checkpoint import` of the export: same logits as the source checkpoint (fp32 on both sides).
  double diff = 0;
  EXPECT_EQ(import_back(dir, ids, want, "DeciLM", &diff).family, model::ModelFamily::DeciLM);
  EXPECT_LE(diff, 1e-5);  // fp32 on both sides
}

TEST(HfImport, HeterogeneousNemotronStudentExportsAsPuzzle) {
  // Layers that differ in MLP and MoE sizes only.
  const model::ArchSpec s = pruned_nemotron(false);
  const std::string dir = shared_dir("hf-puzzle");
  torch::manual_seed(14);
  const torch::Tensor ids = torch::randint(0, s.vocab_size, {2, 9});
  torch::Tensor want;
  export_student(s, dir, 29, 6, ids, [&](const nlohmann::json& config) {
    EXPECT_EQ(config["architectures"][0], "NemotronHPuzzleForCausalLM") << config.dump(2);
    EXPECT_EQ(config["model_type"], "nemotron_h_puzzle");
    ASSERT_EQ(config["block_configs"].size(), 7u);
    // A block's value: its override, else the global (the most common value, first on ties).
    auto at = [&](int j, const char* k) {
      const auto& b = config["block_configs"][j];
      return b.contains(k) ? b[k] : config[k];
    };
    EXPECT_EQ(config["block_configs"][2]["block_type"], "mlp");
    EXPECT_EQ(at(2, "intermediate_size"), 64);
    EXPECT_EQ(at(5, "intermediate_size"), 32);
    EXPECT_EQ(at(3, "n_routed_experts"), 4);
    EXPECT_EQ(at(3, "moe_intermediate_size"), 16);
    EXPECT_EQ(at(6, "n_routed_experts"), 8);
    EXPECT_EQ(at(6, "moe_intermediate_size"), 32);
    EXPECT_EQ(config["block_configs"][0], (nlohmann::json{{"block_type", "mamba"}}));
    EXPECT_EQ(plain_arch(model::arch_from_hf_config(config, "config.json")), plain_arch([&] {
      auto t = s;
      t.dtype = "float32";
      return t;
    }()));
  }, &want);
  double diff = 0;
  EXPECT_EQ(import_back(dir, ids, want, "nemotron_h_puzzle", &diff).family, model::ModelFamily::NemotronH);
  EXPECT_LE(diff, 1e-5);
}

TEST(HfImport, InexpressibleStudentWritesNothing) {
  // A good export first; then a student DeciLM cannot hold (FFN width 300, not a multiple of
  // 256) into the same directory: InputError naming the layer and field, and the directory
  // is byte for byte what the good export left.
  model::ArchSpec s = model::load_arch(fixture("llama") + "/config.json");
  s.layers[0].mlp->ffn_size = 256;
  s.layers[1].mlp->ffn_size = 512;
  const std::string dir = shared_dir("hf-inexpressible");
  const torch::Tensor ids = torch::randint(0, s.vocab_size, {1, 5});
  torch::Tensor want;
  export_student(s, dir, 31, 1, ids, [](const nlohmann::json& c) { EXPECT_EQ(c["architectures"][0], "DeciLMForCausalLM"); },
                 &want);
  on_root([&] {
    const auto before = files_of(dir + "/hf");
    model::ArchSpec bad = s;
    bad.layers[1].mlp->ffn_size = 300;
    model::CausalLM m(bad, model::TpGroup{dist::make_self_communicator()});
    m->init_weights(37);
    checkpoint::save_checkpoint(MPI_COMM_SELF, dir + "/bad", 1, checkpoint::model_tensors(m, true),
                                {{"arch_spec", model::arch_to_json(bad)}});
    std::string what = "(no error)";
    try {
      checkpoint::export_safetensors(dir + "/bad", dir + "/hf", torch::kFloat32);
    } catch (const InputError& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("layers[1].mlp.ffn_size: 300 is not a DeciLM FFN width"), std::string::npos) << what;
    EXPECT_NE(what.find("--hf-layout per-layer-config"), std::string::npos) << what;
    EXPECT_EQ(files_of(dir + "/hf"), before);
    // Into a new directory: nothing is created.
    EXPECT_THROW(checkpoint::export_safetensors(dir + "/bad", dir + "/hf-new", torch::kFloat32), InputError);
    EXPECT_FALSE(fs::exists(dir + "/hf-new"));
    // per_layer_config holds it.
    checkpoint::export_safetensors(dir + "/bad", dir + "/hf-new", torch::kFloat32, int64_t(5) << 30,
                                   model::HfHeterogeneity::PerLayerConfig);
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir + "/hf-new/config.json"))["architectures"][0], "LlamaForCausalLM");
  });
}

// Golden tests: Hugging Face checkpoints made by transformers load into CausalLM and give
// transformers' logits; export writes them back unchanged; parameter counts agree.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dist/error.h"
#include "model/hf_import.h"
#include "tests/model/fixtures.h"

using namespace ac::model;
using namespace ac::model::testing;
namespace fs = std::filesystem;

class Golden_ : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden_, LogitsMatchTransformers) {
  const auto name = GetParam();
  CausalLM model(fixture_spec(name));
  SafetensorsReader reader(fixture_dir(name));
  load_hf_weights(model, reader);
  auto g = load_golden(name);
  torch::NoGradGuard ng;
  auto logits = model->forward(g.input_ids);
  ASSERT_EQ(logits.sizes(), g.logits.sizes());
  const double err = (logits - g.logits).abs().max().item<double>();
  EXPECT_LE(err, 1e-4) << name;
  RecordProperty("max_abs_err", std::to_string(err));
}

TEST_P(Golden_, ParameterCountMatchesTransformers) {
  const auto name = GetParam();
  std::ifstream f(fixture_dir(name) + "/meta.json");
  auto meta = nlohmann::json::parse(f);
  CausalLM model(fixture_spec(name));
  EXPECT_EQ(model->logical_parameter_count(), meta["num_parameters"].get<int64_t>()) << name;
}

TEST_P(Golden_, ExportReproducesCheckpoint) {
  const auto name = GetParam();
  CausalLM model(fixture_spec(name));
  SafetensorsReader reader(fixture_dir(name));
  load_hf_weights(model, reader);
  const fs::path out = fs::temp_directory_path() / ("ac_export_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(out);
  save_hf_weights(model, out.string(), torch::kFloat32);
  SafetensorsReader back(out.string());
  auto want = reader.names();
  EXPECT_EQ(back.names(), want);
  for (const auto& n : want) EXPECT_TRUE(torch::equal(back.read(n), reader.read(n))) << n;
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden_, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

TEST(HfImport, MissingTensorAndWrongShapeNameFileAndTensor) {
  const fs::path d = fs::temp_directory_path() / ("ac_hf_bad_" + std::to_string(::getpid()));
  fs::remove_all(d);
  SafetensorsReader good(fixture_dir("llama"));
  std::vector<std::pair<std::string, torch::Tensor>> ts;
  for (const auto& n : good.names())
    if (n != "model.layers.1.mlp.up_proj.weight") ts.push_back({n, good.read(n)});
  save_safetensors(d.string(), ts);
  CausalLM model(fixture_spec("llama"));
  try {
    load_hf_weights(model, SafetensorsReader(d.string()));
    FAIL() << "missing tensor accepted";
  } catch (const ac::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not found"), std::string::npos) << e.what();
  }
  ts.push_back({"model.layers.1.mlp.up_proj.weight", torch::zeros({95, 64})});
  save_safetensors(d.string(), ts);
  try {
    load_hf_weights(model, SafetensorsReader(d.string()));
    FAIL() << "wrong shape accepted";
  } catch (const ac::InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((d / "model.safetensors").string()), std::string::npos) << m;
    EXPECT_NE(m.find("[95, 64]"), std::string::npos) << m;
    EXPECT_NE(m.find("[96, 64]"), std::string::npos) << m;
  }
}

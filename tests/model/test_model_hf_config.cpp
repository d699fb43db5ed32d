// The ArchSpec readers and the model together: config.json -> ArchSpec -> CausalLM gives
// transformers' logits, the ArchSpec's parameter count equals the model's, and an export
// (safetensors + config.json written by save_hf_config) reads back to the same model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "model/arch_spec.h"
#include "model/hf_config.h"
#include "model/hf_import.h"
#include "tests/model/fixtures.h"

using namespace ac::model;
using namespace ac::model::testing;
namespace fs = std::filesystem;

class HfConfig_ : public ::testing::TestWithParam<std::string> {};

TEST_P(HfConfig_, ConfigJsonBuildsTheGoldenModel) {
  const auto name = GetParam();
  ArchSpec spec = load_arch(fixture_dir(name) + "/config.json");
  CausalLM model(spec);
  load_hf_weights(model, SafetensorsReader(fixture_dir(name)));
  auto g = load_golden(name);
  torch::NoGradGuard ng;
  EXPECT_LE((model->forward(g.input_ids) - g.logits).abs().max().item<double>(), 1e-4) << name;
  EXPECT_EQ(count_params(spec).total(), model->logical_parameter_count()) << name;
}

TEST_P(HfConfig_, ExportWithConfigReadsBack) {
  const auto name = GetParam();
  ArchSpec spec = load_arch(fixture_dir(name) + "/config.json");
  CausalLM model(spec);
  load_hf_weights(model, SafetensorsReader(fixture_dir(name)));
  // The directory scripts/make_model_fixtures.py --check-export loads into transformers.
  const fs::path out = fs::path(AC_MODEL_EXPORT_DIR) / name;
  fs::remove_all(out);
  save_hf_weights(model, out.string(), torch::kFloat32);
  save_hf_config(spec, (out / "config.json").string());
  ArchSpec back = load_arch((out / "config.json").string());
  CausalLM again(back);
  load_hf_weights(again, SafetensorsReader(out.string()));
  auto g = load_golden(name);
  torch::NoGradGuard ng;
  EXPECT_LE((again->forward(g.input_ids) - g.logits).abs().max().item<double>(), 1e-4) << name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfConfig_, ::testing::ValuesIn(config_fixture_names()),
                         [](const auto& info) { return info.param; });

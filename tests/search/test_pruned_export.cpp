// A uniformly pruned Llama and Nemotron-H, exported to the Hugging Face layout, give the
// logits transformers computed from the same export (issue 14). scripts/check_pruned_export.py
// made the golden by hand (tests/fixtures/pruned/<name>/: the student ArchSpec, the importance
// file, the export's config.json and transformers' logits on the model fixture's input ids);
// this test repeats our side without torch: import the fixture teacher, prune it to the same
// student with the same importance file, export it, and compare.
//
// AC_PRUNED_FIXTURES overrides the fixture directory (the script points it at fresh results).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/communicator.h"
#include "model/hf_import.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "search/importance/importance.h"
#include "search/prune/prune.h"

using namespace ac;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// fp32 on both sides; the fixtures' logits are O(1) (measured differences in docs/pruning.md).
constexpr double kLogitTol = 1e-4;

std::string fixtures() {
  const char* e = std::getenv("AC_PRUNED_FIXTURES");
  return e && *e ? e : AC_PRUNED_FIXTURES_DEFAULT;
}

std::string scratch(const std::string& name) {
  const char* base = std::getenv("AC_TEST_TMP");
  fs::path p = fs::path(base ? base : fs::temp_directory_path().string() + "/ac_pruned_export") / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path << ": cannot open";
  return json::parse(f);
}

torch::Tensor logits_of(model::CausalLM& m, const torch::Tensor& ids) {
  torch::NoGradGuard ng;
  m->eval();
  return m->forward(ids);
}

class PrunedExport : public ::testing::TestWithParam<std::string> {};

TEST_P(PrunedExport, LoadsWithTransformersLogits) {
  const std::string name = GetParam();
  const std::string golden_dir = fixtures() + "/" + name;
  const std::string tmp = scratch(name);

  // The teacher: the model fixture as a checkpoint, as `checkpoint import --dtype f32` makes it.
  checkpoint::ImportOptions imp;
  imp.dtype = "f32";
  const auto teacher = checkpoint::import_hf(MPI_COMM_WORLD, std::string(AC_MODEL_FIXTURES) + "/" + name, tmp + "/teacher", imp);
  const std::string fingerprint = checkpoint::model_fingerprint(checkpoint::CheckpointReader(teacher.path));
  // The committed scores are for exactly this teacher (load_importance checks the fingerprint).
  const auto scores = search::load_importance(golden_dir + "/importance.h5", fingerprint);
  const auto student = model::load_arch(golden_dir + "/student.json");
  search::PruneOptions po;
  po.student_source = golden_dir + "/student.json";
  po.scores_source = golden_dir + "/importance.h5";
  search::prune_checkpoint(MPI_COMM_WORLD, tmp + "/teacher", scores, student, tmp + "/student", po);
  checkpoint::export_safetensors(tmp + "/student", tmp + "/hf", torch::kFloat32);

  // The config.json transformers loaded is the one we write now.
  json ours = read_json(tmp + "/hf/config.json"), want = read_json(golden_dir + "/config.json");
  EXPECT_EQ(ours.dump(1), want.dump(1)) << name << ": the export's config.json differs from the one transformers loaded";

  const auto golden = model::SafetensorsReader(golden_dir + "/golden.safetensors");
  const auto ids = golden.read("input_ids"), want_logits = golden.read("logits");

  // The export, read back the way a Hugging Face teacher comes in (config.json + safetensors).
  const auto spec = model::load_arch(tmp + "/hf/config.json");
  model::CausalLM from_hf(spec);
  model::load_hf_weights(from_hf, model::SafetensorsReader(tmp + "/hf"));
  const auto a = logits_of(from_hf, ids);
  ASSERT_EQ(a.sizes(), want_logits.sizes());
  const double err_export = (a - want_logits).abs().max().item<double>();

  // The pruned checkpoint itself (the student the trainer would start from).
  checkpoint::CheckpointReader r(checkpoint::resolve_checkpoint(tmp + "/student"));
  model::CausalLM pruned(checkpoint::checkpoint_arch(r), model::TpGroup{dist::make_self_communicator()});
  checkpoint::load_model(pruned, r);
  const auto b = logits_of(pruned, ids);
  const double err_ckpt = (b - want_logits).abs().max().item<double>();

  const auto meta = read_json(golden_dir + "/meta.json");
  EXPECT_EQ(pruned->logical_parameter_count(), meta["num_parameters"].get<int64_t>()) << name;
  EXPECT_LT(pruned->logical_parameter_count(), meta["teacher_num_parameters"].get<int64_t>()) << name;
  std::cout << name << " pruned (" << pruned->logical_parameter_count() << " of "
            << meta["teacher_num_parameters"].get<int64_t>() << " parameters) vs transformers "
            << meta["transformers"].get<std::string>() << " " << meta["class"].get<std::string>()
            << ": max |logit diff| " << err_export << " (export), " << err_ckpt << " (pruned checkpoint), logits "
            << want_logits.abs().max().item<double>() << " at most\n";
  EXPECT_LE(err_export, kLogitTol) << name;
  EXPECT_LE(err_ckpt, kLogitTol) << name;
  fs::remove_all(tmp);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrunedExport, ::testing::Values("llama", "nemotron_h"),
                         [](const auto& info) { return info.param; });

}  // namespace

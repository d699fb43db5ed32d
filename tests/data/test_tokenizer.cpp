// Byte-level BPE against the `tokenizers` library: ids for ~3,000 lines of real English
// text plus hard strings (tests/fixtures/data/tokenizer, made by
// scripts/data_make_fixtures.py), for GPT-2's tokenizer.json and for the same vocabulary
// behind Llama-3's Split regex; Llama-3.2's own tokenizer.json when the script extracted it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/bpe_tokenizer.h"
#include "test_util.h"

namespace ac::data {
namespace {

using test::fixture;
using test::input_error;
using test::read_file;

const nlohmann::json& cases() {
  static const nlohmann::json j = nlohmann::json::parse(read_file(fixture("tokenizer/expected_ids.json")));
  return j;
}

std::string gpt2_json() { return read_file(fixture("tokenizer/gpt2.tokenizer.json")); }

std::string with_llama3_split(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", cases().at("llama3_regex").get<std::string>()}}}, {"behavior", "Isolated"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  return j.dump();
}

// Compares every case; reports the first few mismatches in full.
void check_all(const BpeTokenizer& tok, const std::string& key) {
  auto ws = tok.make_workspace();
  int mismatches = 0, checked = 0;
  for (const auto& c : cases().at("cases")) {
    if (!c.contains(key)) continue;
    const std::string text = c.at("text").get<std::string>();
    auto want = c.at(key).get<std::vector<int64_t>>();
    std::vector<int64_t> got;
    tok.encode(text, *ws, &got);
    ++checked;
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << key << ": text \"" << text << "\"\n want " << ::testing::PrintToString(want) << "\n got  "
                    << ::testing::PrintToString(got);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  EXPECT_GT(checked, 3000);
}

TEST(BpeTokenizer, Gpt2MatchesTokenizersLibrary) {
  auto tok = BpeTokenizer::from_file(fixture("tokenizer/gpt2.tokenizer.json"));
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->default_eos_id(), 50256);
  check_all(*tok, "gpt2");
}

// gpt2-4k.tokenizer.json (scripts/make_gpt2_4k_tokenizer.py; the tiny test teacher's): GPT-2
// cut after its first 3,839 merges. Every text round-trips within 4,096 ids, and where GPT-2's
// own ids (from `tokenizers`) all lie below 4,095, the cut tokenizer gives exactly those: a
// token's parts always rank below it, so such a text never needed a merge past the cut.
TEST(BpeTokenizer, Gpt2CutTo4kIsGpt2WhereItsMergesSuffice) {
  auto tok = BpeTokenizer::from_file(fixture("tokenizer/gpt2-4k.tokenizer.json"));
  EXPECT_EQ(tok->vocab_size(), 4096);
  EXPECT_EQ(tok->default_eos_id(), 4095);
  auto ws = tok->make_workspace();
  int same = 0, round_trips = 0, checked = 0;
  for (const auto& c : cases().at("cases")) {
    if (!c.contains("gpt2")) continue;
    const std::string text = c.at("text").get<std::string>();
    const auto full = c.at("gpt2").get<std::vector<int64_t>>();
    std::vector<int64_t> got;
    tok->encode(text, *ws, &got);
    ++checked;
    for (const int64_t id : got) ASSERT_LT(id, 4096) << text;
    round_trips += tok->decode(got) == text;
    if (std::all_of(full.begin(), full.end(), [](int64_t id) { return id < 4095; })) {
      EXPECT_EQ(got, full) << text;
      ++same;
    } else {
      EXPECT_GE(got.size(), full.size()) << text;  // fewer merges: as many tokens or more
    }
  }
  EXPECT_EQ(round_trips, checked);
  EXPECT_GT(same, 200) << "of " << checked;
}

TEST(BpeTokenizer, Llama3SplitRegexMatchesTokenizersLibrary) {
  auto tok = BpeTokenizer::from_json_text(with_llama3_split(gpt2_json()), "gpt2+llama3-split");
  check_all(*tok, "gpt2_llama3_split");
}

TEST(BpeTokenizer, Llama32TokenizerJsonWhenExtracted) {
  const std::string path = fixture("llama32/tokenizer.json");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "run scripts/data_make_fixtures.py --llama to extract it";
  auto tok = BpeTokenizer::from_file(path);
  EXPECT_EQ(tok->vocab_size(), 128257);  // 128,000 BPE tokens + 256 special + <|image|> (the Vision variant)
  EXPECT_EQ(tok->default_eos_id(), 128001);  // <|end_of_text|>
  check_all(*tok, "llama32");
}

TEST(BpeTokenizer, DecodeInvertsEncode) {
  auto tok = BpeTokenizer::from_file(fixture("tokenizer/gpt2.tokenizer.json"));
  for (const auto& c : cases().at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(tok->decode(tok->encode(text)), text);
  }
}

TEST(BpeTokenizer, SpecialTokenInTextIsOneId) {
  auto tok = BpeTokenizer::from_file(fixture("tokenizer/gpt2.tokenizer.json"));
  auto ids = tok->encode("a<|endoftext|>b");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 50256);
}

TEST(BpeTokenizer, Utf8Validation) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), std::string::npos);
  EXPECT_EQ(find_invalid_utf8("caf\xc3\xa9 \xf0\x9f\x98\x80"), std::string::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);             // never valid
  EXPECT_EQ(find_invalid_utf8("ab\xc3"), 2u);             // truncated sequence
  EXPECT_EQ(find_invalid_utf8("x\xc0\xaf"), 1u);          // overlong '/'
  EXPECT_EQ(find_invalid_utf8("xy\xed\xa0\x80"), 2u);     // UTF-16 surrogate
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);   // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ok\xe2\x82"), 2u);         // cut in the middle
}

// Invalid UTF-8 would be undefined behaviour in the regexes (run without PCRE2's own check):
// encode refuses it, naming the tokenizer and the byte (it segfaulted on "\xff").
TEST(BpeTokenizer, EncodeRefusesInvalidUtf8) {
  auto tok = BpeTokenizer::from_file(fixture("tokenizer/gpt2-4k.tokenizer.json"));
  for (const char* bad : {"\xff", "ab\xc3(", "x\xed\xa0\x80y"}) {
    const std::string m = input_error([&] { tok->encode(bad); });
    EXPECT_NE(m.find("gpt2-4k.tokenizer.json: text to encode: invalid UTF-8 at byte"), std::string::npos) << m;
  }
  EXPECT_FALSE(tok->encode("caf\xc3\xa9").empty());
}

TEST(BpeTokenizer, BadTokenizerJson) {
  auto j = nlohmann::json::parse(gpt2_json());
  auto err = [&](const nlohmann::json& v) { return input_error([&] { BpeTokenizer::from_json_text(v.dump(), "tok.json"); }); };
  {
    auto v = j;
    v["model"]["type"] = "WordPiece";
    EXPECT_NE(err(v).find("model.type"), std::string::npos);
  }
  {
    auto v = j;
    v["normalizer"] = {{"type", "NFKC"}};
    EXPECT_NE(err(v).find("normalizer"), std::string::npos);
  }
  {
    auto v = j;
    v["pre_tokenizer"] = {{"type", "Whitespace"}};
    EXPECT_NE(err(v).find("pre_tokenizer.type"), std::string::npos);
  }
  {
    auto v = j;
    v["model"]["merges"][5] = "nospace";
    EXPECT_NE(err(v).find("model.merges[5]"), std::string::npos);
  }
  {
    auto v = j;
    v["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}, {"invert", false}};
    std::string m = err(v);
    EXPECT_NE(m.find("regex"), std::string::npos) << m;
  }
  {
    auto v = j;
    v["model"]["vocab"]["zzz-duplicate"] = v["model"]["vocab"]["!"];  // two tokens, one id
    std::string m = err(v);
    EXPECT_NE(m.find("tok.json: model.vocab[\"zzz-duplicate\"]: id 0 is also the id of \"!\""), std::string::npos) << m;
  }
  {
    auto v = j;
    v["added_tokens"].push_back({{"id", 50256}, {"content", "<|other|>"}});  // 50256 is <|endoftext|>
    std::string m = err(v);
    EXPECT_NE(m.find("is also the id of added token"), std::string::npos) << m;
  }
  EXPECT_NE(input_error([] { BpeTokenizer::from_json_text("{not json", "tok.json"); }).find("tok.json: byte"), std::string::npos);
  EXPECT_NE(input_error([] { BpeTokenizer::from_file("/dev/null"); }).find("/dev/null: tokenizer.json: is a character device"), std::string::npos);
  EXPECT_NE(input_error([] { BpeTokenizer::from_file("/nonexistent/tokenizer.json"); }).find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace ac::data

// Preprocessing: JSONL and plain text to both formats, the same output with 1 and 2
// workers, and every bad input ending in a message with file and line and no output files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/bpe_tokenizer.h"
#include "data/hdf5_store.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "test_util.h"

namespace ac::data {
namespace {

using test::fixture;
using test::input_error;
using test::read_file;
using test::TempDir;
using test::write_file;

const std::string kTok = fixture("tokenizer/gpt2.tokenizer.json");

std::vector<std::vector<int64_t>> all_docs(const TokenSource& s) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t d = 0; d < s.num_documents(); ++d) {
    std::vector<int64_t> v(s.document_length(d));
    s.read(d, 0, v.size(), v.data());
    out.push_back(v);
  }
  return out;
}

PreprocessConfig config(const std::vector<std::string>& in, const std::string& out) {
  PreprocessConfig c;
  c.inputs = in;
  c.tokenizer_path = kTok;
  c.output_prefix = out;
  return c;
}

TEST(Preprocess, CorpusSampleBothFormatsAndWorkers) {
  TempDir dir;
  const std::string corpus = fixture("corpus/fortunes_sample.jsonl");
  auto c1 = config({corpus}, dir / "w1");
  c1.batch_bytes = 8192;  // many batches, so ordering across workers is exercised
  auto r1 = preprocess(c1);
  auto c2 = c1;
  c2.output_prefix = dir / "w2";
  c2.workers = 2;
  auto r2 = preprocess(c2);
  auto c3 = c2;
  c3.output_prefix = dir / "h";
  c3.format = OutputFormat::Hdf5;
  auto r3 = preprocess(c3);
  EXPECT_EQ(r1.dtype, DType::U16);  // GPT-2's 50,257 ids fit, as megatron-core would choose
  EXPECT_EQ(read_file(dir / "w1.bin"), read_file(dir / "w2.bin"));
  EXPECT_EQ(read_file(dir / "w1.idx"), read_file(dir / "w2.idx"));
  IndexedDataset mega(dir / "w1");
  Hdf5TokenStore h5(dir / "h.h5");
  EXPECT_EQ(all_docs(mega), all_docs(h5));
  EXPECT_EQ(r1.tokens, r3.tokens);
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"h.h5", "w1.bin", "w1.idx", "w2.bin", "w2.idx"}));

  // Every document is the tokenizer's ids for its text, then <|endoftext|>.
  auto tok = BpeTokenizer::from_file(kTok);
  std::stringstream lines(read_file(corpus));
  std::string line;
  int64_t d = 0;
  while (std::getline(lines, line)) {
    auto ids = tok->encode(nlohmann::json::parse(line)["text"].get<std::string>());
    ids.push_back(50256);
    ASSERT_EQ(mega.sequence(d), ids) << "document " << d;
    ++d;
  }
  EXPECT_EQ(d, mega.num_documents());
  EXPECT_EQ(r1.documents, d);
}

TEST(Preprocess, ProgressReportsGrowToTheInputSize) {
  TempDir dir;
  const std::string corpus = fixture("corpus/fortunes_sample.jsonl");
  auto c = config({corpus}, dir / "p");
  c.batch_bytes = 16384;
  c.progress_interval_s = 0;  // report after every batch
  std::vector<PreprocessProgress> seen;
  c.on_progress = [&](const PreprocessProgress& p) { seen.push_back(p); };
  auto r = preprocess(c);
  ASSERT_GT(seen.size(), 10u);
  const int64_t size = static_cast<int64_t>(read_file(corpus).size());
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_GT(seen[i].bytes_done, seen[i - 1].bytes_done);
    EXPECT_GE(seen[i].tokens, seen[i - 1].tokens);
    EXPECT_EQ(seen[i].bytes_total, size);
  }
  EXPECT_EQ(seen.back().bytes_done, size);  // every input byte is accounted for
  EXPECT_EQ(seen.back().tokens, r.tokens);
}

TEST(Preprocess, PlainTextParagraphsAndJsonKey) {
  TempDir dir;
  write_file(dir / "a.txt", "First paragraph\nstill first.\n\n\nSecond one.\n   \nThird.");
  write_file(dir / "b.jsonl", "{\"body\": \"x y\", \"text\": 1}\n\n{\"body\": \"\"}\n{\"body\": \"z\"}\n");
  auto c = config({dir / "a.txt", dir / "b.jsonl"}, dir / "out");
  c.json_key = "body";
  auto r = preprocess(c);
  auto tok = BpeTokenizer::from_file(kTok);
  IndexedDataset ds(dir / "out");
  std::vector<std::string> texts = {"First paragraph\nstill first.", "Second one.", "Third.", "x y", "z"};
  ASSERT_EQ(ds.num_documents(), 5);
  for (int d = 0; d < 5; ++d) {
    auto ids = tok->encode(texts[d]);
    ids.push_back(50256);
    EXPECT_EQ(ds.sequence(d), ids) << d;
  }
  EXPECT_EQ(r.skipped_empty, 1);
}

class PreprocessBad : public ::testing::Test {
 protected:
  std::string fail(const std::string& name, const std::string& content, PreprocessConfig* tweak = nullptr) {
    write_file(dir / name, content);
    PreprocessConfig c = tweak ? *tweak : config({}, "");
    c.inputs = {dir / name};
    c.tokenizer_path = kTok;
    c.output_prefix = dir / "out";
    std::string m = input_error([&] { preprocess(c); });
    c.format = OutputFormat::Hdf5;
    std::string m2 = input_error([&] { preprocess(c); });
    EXPECT_EQ(m, m2);
    EXPECT_EQ(dir.files(), std::vector<std::string>{name}) << "partial output left behind";  // nothing else
    std::filesystem::remove(dir / name);
    return m;
  }
  static void expect_has(const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing \"" << p << "\" in: " << msg;
  }
  TempDir dir;
};

TEST_F(PreprocessBad, InvalidUtf8InJsonl) {
  expect_has(fail("in.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": \"b\xff\"}\n"), {"in.jsonl", "line 3", "invalid UTF-8", "byte 11"});
}

TEST_F(PreprocessBad, InvalidUtf8InPlainText) {
  expect_has(fail("in.txt", "one\n\ntwo\nthr\xc3\x28\n"), {"in.txt", "line 4", "invalid UTF-8", "byte 3"});
}

TEST_F(PreprocessBad, EmptyInput) {
  expect_has(fail("in.jsonl", ""), {"in.jsonl", "empty"});
  expect_has(fail("blank.txt", "\n\n  \n"), {"blank.txt", "no documents"});
}

TEST_F(PreprocessBad, BadJsonAndMissingKey) {
  expect_has(fail("in.jsonl", "{\"text\": \"a\"}\n{\"text\": \n"), {"in.jsonl", "line 2", "not valid JSON"});
  expect_has(fail("k.jsonl", "{\"text\": \"a\"}\n{\"txt\": \"b\"}\n"), {"k.jsonl", "line 2", "\"text\""});
}

TEST_F(PreprocessBad, DocumentTooLong) {
  PreprocessConfig c;
  c.max_document_tokens = 8;
  expect_has(fail("in.jsonl", "{\"text\": \"short\"}\n{\"text\": \"this one has quite a few more tokens than eight\"}\n", &c),
             {"in.jsonl", "line 2", "more than the 8"});
}

TEST_F(PreprocessBad, UnknownEosToken) {
  PreprocessConfig c;
  c.eos_token = "</nope>";
  expect_has(fail("in.jsonl", "{\"text\": \"a\"}\n", &c), {"gpt2.tokenizer.json", "</nope>"});
}

}  // namespace
}  // namespace ac::data

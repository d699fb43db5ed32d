// Megatron indexed dataset: round trips for every dtype code, compatibility with files
// written by megatron-core (tests/fixtures/data/megatron, made by
// scripts/data_make_fixtures.py), and every kind of bad input.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.h"
#include "test_util.h"

namespace ac::data {
namespace {

using test::fixture;
using test::input_error;
using test::read_file;
using test::TempDir;
using test::write_file;

std::vector<std::vector<int64_t>> sample_docs(DType t) {
  std::vector<std::vector<int64_t>> docs = {{1, 2, 3}, {}, {7}, {0, 5, 9, 11, 100, 42}};
  // Each dtype's extremes survive the trip.
  switch (t) {
    case DType::U8: docs.push_back({0, 255}); break;
    case DType::I8: docs.push_back({-128, 127}); break;
    case DType::I16: docs.push_back({-32768, 32767}); break;
    case DType::U16: docs.push_back({0, 65535}); break;
    case DType::I32: docs.push_back({INT32_MIN, INT32_MAX}); break;
    case DType::I64: docs.push_back({INT64_MIN, INT64_MAX}); break;
    case DType::F32: docs.push_back({-(1 << 24), 1 << 24}); break;
    case DType::F64: docs.push_back({-(1ll << 53), 1ll << 53}); break;
  }
  return docs;
}

void write_docs(const std::string& prefix, DType t, const std::vector<std::vector<int64_t>>& docs) {
  IndexedDatasetWriter w(prefix, t);
  for (const auto& d : docs) w.add_document(d.data(), d.size());
  w.finalize();
}

class IndexedDtype : public ::testing::TestWithParam<int> {};

TEST_P(IndexedDtype, RoundTrip) {
  DType t;
  ASSERT_TRUE(dtype_from_code(GetParam(), &t));
  TempDir dir;
  auto docs = sample_docs(t);
  write_docs(dir / "ds", t, docs);
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"ds.bin", "ds.idx"}));  // no temp files left
  IndexedDataset ds(dir / "ds");
  EXPECT_EQ(ds.dtype(), t);
  ASSERT_EQ(ds.num_documents(), static_cast<int64_t>(docs.size()));
  ASSERT_EQ(ds.num_sequences(), static_cast<int64_t>(docs.size()));
  int64_t total = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(ds.sequence(i), docs[i]) << "dtype " << dtype_name(t) << " doc " << i;
    EXPECT_EQ(ds.document_length(i), static_cast<int64_t>(docs[i].size()));
    EXPECT_EQ(ds.sequence_pointer(i), total * static_cast<int64_t>(dtype_size(t)));
    total += docs[i].size();
  }
  EXPECT_EQ(ds.num_tokens(), total);
  // Partial reads through the TokenSource interface.
  std::vector<int64_t> part(3);
  ds.read(3, 2, 3, part.data());
  EXPECT_EQ(part, (std::vector<int64_t>{9, 11, 100}));
}

// megatron-core wrote these; we must read the same tokens and, writing the same documents,
// produce the same bytes (so megatron-core reads ours).
TEST_P(IndexedDtype, MegatronCoreFixture) {
  DType t;
  ASSERT_TRUE(dtype_from_code(GetParam(), &t));
  auto expected = nlohmann::json::parse(read_file(fixture("megatron/expected.json")));
  const auto& e = expected.at(dtype_name(t));
  ASSERT_EQ(e.at("code").get<int>(), GetParam());
  auto seqs = e.at("sequences").get<std::vector<std::vector<int64_t>>>();
  IndexedDataset ds(fixture(std::string("megatron/") + dtype_name(t)));
  EXPECT_EQ(ds.dtype(), t);
  ASSERT_EQ(ds.num_sequences(), static_cast<int64_t>(seqs.size()));
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(ds.sequence(i), seqs[i]) << i;

  TempDir dir;
  write_docs(dir / "ours", t, seqs);
  EXPECT_EQ(read_file(dir / "ours.idx"), read_file(fixture(std::string("megatron/") + dtype_name(t) + ".idx")));
  EXPECT_EQ(read_file(dir / "ours.bin"), read_file(fixture(std::string("megatron/") + dtype_name(t) + ".bin")));
}

INSTANTIATE_TEST_SUITE_P(AllCodes, IndexedDtype, ::testing::Range(1, 9),
                         [](const auto& info) { DType t; dtype_from_code(info.param, &t); return std::string(dtype_name(t)); });

TEST(IndexedDataset, MegatronMultiSequenceDocuments) {
  auto expected = nlohmann::json::parse(read_file(fixture("megatron/expected.json"))).at("multi_int32");
  auto seqs = expected.at("sequences").get<std::vector<std::vector<int64_t>>>();
  auto doc_idx = expected.at("document_indices").get<std::vector<int64_t>>();
  IndexedDataset ds(fixture("megatron/multi_int32"));
  ASSERT_EQ(ds.num_documents() + 1, static_cast<int64_t>(doc_idx.size()));
  for (size_t j = 0; j < doc_idx.size(); ++j) EXPECT_EQ(ds.document_index(j), doc_idx[j]);
  // A document reads as the concatenation of its sequences.
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    std::vector<int64_t> want;
    for (int64_t q = doc_idx[d]; q < doc_idx[d + 1]; ++q) want.insert(want.end(), seqs[q].begin(), seqs[q].end());
    std::vector<int64_t> got(ds.document_length(d));
    ds.read(d, 0, got.size(), got.data());
    EXPECT_EQ(got, want) << d;
  }
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "m", DType::I32);
    for (size_t d = 0; d + 1 < doc_idx.size(); ++d) {
      for (int64_t q = doc_idx[d]; q < doc_idx[d + 1]; ++q) w.add_item(seqs[q].data(), seqs[q].size());
      w.end_document();
    }
    w.finalize();
  }
  EXPECT_EQ(read_file(dir / "m.idx"), read_file(fixture("megatron/multi_int32.idx")));
  EXPECT_EQ(read_file(dir / "m.bin"), read_file(fixture("megatron/multi_int32.bin")));
}

// The format allows sequences anywhere in the .bin (pointers need not be back to back):
// such files take the general read path.
TEST(IndexedDataset, NonContiguousPointers) {
  TempDir dir;
  write_docs(dir / "ds", DType::I32, {{1, 2, 3}, {4, 5}});
  std::string idx = read_file(dir / "ds.idx");
  const int32_t bin[5] = {4, 5, 1, 2, 3};
  write_file(dir / "ds.bin", std::string(reinterpret_cast<const char*>(bin), sizeof bin));
  const int64_t ptr[2] = {8, 0};  // sequence 0 now lives after sequence 1
  std::memcpy(idx.data() + 34 + 4 * 2, ptr, sizeof ptr);
  write_file(dir / "ds.idx", idx);
  IndexedDataset ds(dir / "ds");
  EXPECT_EQ(ds.sequence(0), (std::vector<int64_t>{1, 2, 3}));
  std::vector<int64_t> got(2);
  ds.read(0, 1, 2, got.data());
  EXPECT_EQ(got, (std::vector<int64_t>{2, 3}));
  ds.read(1, 0, 2, got.data());
  EXPECT_EQ(got, (std::vector<int64_t>{4, 5}));
}

TEST(IndexedDataset, OptimalDtypeFollowsMegatron) {
  EXPECT_EQ(optimal_dtype(50257), DType::U16);
  EXPECT_EQ(optimal_dtype(65499), DType::U16);
  EXPECT_EQ(optimal_dtype(65500), DType::I32);
  EXPECT_EQ(optimal_dtype(131072), DType::I32);
}

TEST(IndexedDatasetWriter, TokenOutOfRangeAndAbortLeaveNothing) {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "ds", DType::U16);
    std::vector<int64_t> ok = {1, 2}, bad = {1, 70000};
    w.add_document(ok.data(), ok.size());
    std::string msg = input_error([&] { w.add_document(bad.data(), bad.size()); });
    EXPECT_NE(msg.find("70000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("uint16"), std::string::npos) << msg;
  }  // destroyed without finalize
  EXPECT_TRUE(dir.files().empty());
}

// ---- bad input -------------------------------------------------------------------------------

class BadIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    write_docs(dir / "ds", DType::I32, {{1, 2, 3}, {4, 5}, {6}});
    idx = read_file(dir / "ds.idx");
    bin = read_file(dir / "ds.bin");
  }
  std::string open_error() {
    write_file(dir / "ds.idx", idx);
    write_file(dir / "ds.bin", bin);
    return input_error([&] { IndexedDataset ds(dir / "ds"); });
  }
  static void expect_has(const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing \"" << p << "\" in: " << msg;
  }
  TempDir dir;
  std::string idx, bin;
};

TEST_F(BadIndex, WrongMagic) {
  idx[0] = 'X';
  expect_has(open_error(), {"ds.idx", "byte 0", "magic"});
}

TEST_F(BadIndex, WrongVersion) {
  idx[9] = 2;
  expect_has(open_error(), {"ds.idx", "byte 9", "version 2"});
}

TEST_F(BadIndex, UnknownDtypeCode) {
  idx[17] = 9;
  expect_has(open_error(), {"ds.idx", "byte 17", "dtype code 9"});
  idx[17] = 0;
  expect_has(open_error(), {"dtype code 0"});
}

TEST_F(BadIndex, TruncatedHeader) {
  idx.resize(20);
  expect_has(open_error(), {"ds.idx", "truncated", "34 bytes"});
}

TEST_F(BadIndex, TruncatedArrays) {
  idx.resize(idx.size() - 5);
  expect_has(open_error(), {"ds.idx", "truncated"});
}

TEST_F(BadIndex, TrailingBytes) {
  idx += std::string(7, '\0');
  expect_has(open_error(), {"ds.idx", "must be"});
}

TEST_F(BadIndex, HugeSequenceCount) {
  uint64_t s = 1ull << 60;
  std::memcpy(idx.data() + 18, &s, 8);
  expect_has(open_error(), {"ds.idx", "byte 18", "sequence count"});
}

TEST_F(BadIndex, BinTooShort) {
  bin.resize(bin.size() - 4);
  expect_has(open_error(), {"ds.idx", "sequence 2", "ds.bin"});
}

TEST_F(BadIndex, BinTooLong) {
  bin += std::string(4, '\0');
  expect_has(open_error(), {"ds.bin", "size", "6 tokens"});
}

TEST_F(BadIndex, NegativeLength) {
  int32_t v = -1;
  std::memcpy(idx.data() + 34 + 4, &v, 4);
  expect_has(open_error(), {"ds.idx", "byte 38", "negative length"});
}

TEST_F(BadIndex, DocumentIndicesOutOfOrder) {
  // document_indices start at 34 + 12 * 3 = 70: [0, 1, 2, 3]; make entry 2 larger than S.
  int64_t v = 9;
  std::memcpy(idx.data() + 70 + 16, &v, 8);
  expect_has(open_error(), {"ds.idx", "byte 86", "document_indices[2]"});
}

TEST_F(BadIndex, DocumentIndicesNotStartingAtZero) {
  int64_t v = 1;
  std::memcpy(idx.data() + 70, &v, 8);
  expect_has(open_error(), {"ds.idx", "byte 70", "start with 0"});
}

TEST_F(BadIndex, MissingFiles) {
  std::filesystem::remove(dir / "ds.bin");
  std::string msg = input_error([&] { IndexedDataset ds(dir / "ds"); });
  expect_has(msg, {"ds.bin", "cannot open"});
  msg = input_error([&] { IndexedDataset ds(dir / "nothing"); });
  expect_has(msg, {"nothing.idx", "cannot open"});
}

}  // namespace
}  // namespace ac::data

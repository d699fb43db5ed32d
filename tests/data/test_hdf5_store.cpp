// HDF5 token store: round trip, partial reads, and bad files.
#include <gtest/gtest.h>
#include <hdf5.h>

#include "data/hdf5_store.h"
#include "test_util.h"

namespace ac::data {
namespace {

using test::input_error;
using test::read_file;
using test::TempDir;
using test::write_file;

std::vector<std::vector<int64_t>> docs() {
  std::vector<std::vector<int64_t>> d;
  for (int i = 0; i < 50; ++i) {
    std::vector<int64_t> v;
    for (int k = 0; k < (i * 37) % 101; ++k) v.push_back((i * 1000 + k * 7) % 60000);
    d.push_back(v);
  }
  return d;
}

void write_store(const std::string& path, DType t, int64_t chunk = 64) {
  Hdf5StoreOptions o;
  o.dtype = t;
  o.chunk_tokens = chunk;  // many chunks even for a small test
  Hdf5TokenWriter w(path, o);
  for (const auto& d : docs()) w.add_document(d.data(), d.size());
  w.finalize();
}

TEST(Hdf5Store, RoundTripEveryDtype) {
  for (DType t : {DType::U16, DType::I32, DType::I64}) {
    TempDir dir;
    write_store(dir / "t.h5", t);
    EXPECT_EQ(dir.files(), std::vector<std::string>{"t.h5"});
    Hdf5TokenStore s(dir / "t.h5");
    EXPECT_EQ(s.dtype(), t);
    auto d = docs();
    ASSERT_EQ(s.num_documents(), static_cast<int64_t>(d.size()));
    int64_t total = 0;
    for (size_t i = 0; i < d.size(); ++i) {
      std::vector<int64_t> got(s.document_length(i));
      s.read(i, 0, got.size(), got.data());
      EXPECT_EQ(got, d[i]) << i;
      total += d[i].size();
    }
    EXPECT_EQ(s.num_tokens(), total);
    std::vector<int64_t> part(5);
    s.read(4, 10, 5, part.data());
    EXPECT_EQ(part, std::vector<int64_t>(d[4].begin() + 10, d[4].begin() + 15));
  }
}

TEST(Hdf5Store, CompressionShrinksRepetitiveTokens) {
  TempDir dir;
  Hdf5StoreOptions o;
  o.dtype = DType::I32;
  std::vector<int64_t> v(200000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 100;
  {
    Hdf5TokenWriter w(dir / "c.h5", o);
    w.add_document(v.data(), v.size());
    w.finalize();
  }
  EXPECT_LT(read_file(dir / "c.h5").size(), v.size() * 4 / 4);  // well under the raw 800 kB
}

TEST(Hdf5Store, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  {
    Hdf5StoreOptions o;
    Hdf5TokenWriter w(dir / "x.h5", o);
    std::vector<int64_t> v = {1, 2, 3};
    w.add_document(v.data(), v.size());
  }
  EXPECT_TRUE(dir.files().empty());
}

TEST(Hdf5Store, BadFiles) {
  TempDir dir;
  EXPECT_NE(input_error([&] { Hdf5TokenStore s(dir / "missing.h5"); }).find("cannot open"), std::string::npos);
  write_file(dir / "text.h5", "this is not hdf5");
  EXPECT_NE(input_error([&] { Hdf5TokenStore s(dir / "text.h5"); }).find("not an HDF5 file"), std::string::npos);
  write_store(dir / "good.h5", DType::I32);
  std::string bytes = read_file(dir / "good.h5");
  write_file(dir / "trunc.h5", bytes.substr(0, bytes.size() / 2));
  std::string m = input_error([&] {
    Hdf5TokenStore s(dir / "trunc.h5");
    std::vector<int64_t> all(s.num_tokens());
    for (int64_t d = 0, at = 0; d < s.num_documents(); at += s.document_length(d), ++d) s.read(d, 0, s.document_length(d), all.data() + at);
  });
  EXPECT_NE(m.find("trunc.h5"), std::string::npos) << m;
  // An HDF5 file that is not a token store.
  hid_t f = H5Fcreate((dir / "other.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Fclose(f);
  m = input_error([&] { Hdf5TokenStore s(dir / "other.h5"); });
  EXPECT_NE(m.find("attribute format"), std::string::npos) << m;
  // Offsets that do not match /tokens.
  write_store(dir / "bad_off.h5", DType::I32);
  f = H5Fopen((dir / "bad_off.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "document_offsets", H5P_DEFAULT);
  int64_t big = 1 << 30;
  hid_t fs = H5Dget_space(d);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(fs, &n, nullptr);
  hsize_t start = n - 1, cnt = 1;
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, nullptr, &cnt, nullptr);
  hid_t ms = H5Screate_simple(1, &cnt, nullptr);
  H5Dwrite(d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, &big);
  H5Sclose(ms);
  H5Sclose(fs);
  H5Dclose(d);
  H5Fclose(f);
  m = input_error([&] { Hdf5TokenStore s(dir / "bad_off.h5"); });
  EXPECT_NE(m.find("/document_offsets"), std::string::npos) << m;
}

}  // namespace
}  // namespace ac::data

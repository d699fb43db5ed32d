// Checkpoint save/load: bitwise round trips, loads under any partition, attributes, atomic
// pointer and retention, and bad files (truncated, corrupt with checksums, missing dataset,
// wrong shape, newer format). Runs at 1, 2 and 4 ranks.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksums.h"
#include "checkpoint/hdf5_util.h"
#include "dist/error.h"
#include "tests/mpi_world.h"

namespace fs = std::filesystem;
using namespace ac::checkpoint;

namespace {

using ac::testing::World;

// A scratch directory shared by all ranks of this test.
std::string scratch(const std::string& name) {
  const char* base = std::getenv("AC_TEST_TMP");
  fs::path p = fs::path(base ? base : "/tmp/ac-ckpt-test") / name;
  World w;
  if (w.rank == 0) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return p.string();
}

// The full tensors every rank can compute, and the pieces it saves.
torch::Tensor full_tensor(const std::string& name, torch::ScalarType dt) {
  torch::manual_seed(std::hash<std::string>{}(name) % 100000);
  if (dt == torch::kLong) return torch::randint(-1000000, 1000000, {12, 8}, torch::kLong);
  return torch::randn({12, 8}).to(dt);
}

template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const ac::InputError& e) {
    return e.what();
  }
  return "";
}

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kLong};

std::vector<ShardedTensor> sharded_state(const World& w) {
  std::vector<ShardedTensor> ts;
  for (auto dt : kDtypes) {
    const std::string base = std::string("model/") + c10::toString(dt);
    torch::Tensor full = full_tensor(base, dt);
    // Rows split over the world (TP column-parallel style; 12 rows split over 1, 2, 4).
    const int64_t r = 12 / w.size;
    ts.push_back({base + ".rows", {12, 8}, {r * w.rank, 0}, full.narrow(0, r * w.rank, r).clone(), true});
    // Columns split (row-parallel style).
    const int64_t c = 8 / w.size;
    ts.push_back({base + ".cols", {12, 8}, {0, c * w.rank}, full.narrow(1, c * w.rank, c).clone(), true});
    // Replicated: only rank 0 writes.
    ts.push_back({base + ".replicated", {12, 8}, {0, 0}, full.clone(), w.rank == 0});
  }
  ts.push_back({"optimizer/step_count", {}, {}, torch::tensor(int64_t(7)), w.rank == 0});
  return ts;
}

}  // namespace

TEST(Checkpoint, RoundTripIsBitwiseAndAnyPartitionLoads) {
  World w;
  const std::string dir = scratch("roundtrip");
  const std::string path = save_checkpoint(MPI_COMM_WORLD, dir, 10, sharded_state(w), {{"tokens_seen", 12345}});
  EXPECT_EQ(resolve_latest(dir), path);
  CheckpointReader r(path);
  EXPECT_EQ(r.step(), 10);
  for (auto dt : kDtypes) {
    const std::string base = std::string("model/") + c10::toString(dt);
    const torch::Tensor full = full_tensor(base, dt);
    for (const char* kind : {".rows", ".cols", ".replicated"}) {
      const std::string name = base + kind;
      torch::Tensor back = r.read(name);
      EXPECT_EQ(back.scalar_type(), dt) << name;
      EXPECT_TRUE(torch::equal(back, full)) << name << " is not bitwise equal";
      // Load under other layouts: 1, 2, 3, 4 and 6 parts along either dim, each part alone.
      for (int parts : {1, 2, 3, 4, 6}) {
        for (int part = 0; part < parts; ++part) {
          const int64_t rows = 12 / parts;
          torch::Tensor slice = r.read(name, {rows * part, 0}, {rows, 8});
          EXPECT_TRUE(torch::equal(slice, full.narrow(0, rows * part, rows))) << name << " part " << part;
        }
      }
      torch::Tensor cols = torch::empty({12, 2}, torch::TensorOptions().dtype(torch::kDouble));
      r.read_into(name, cols, {0, 6}, {12, 8});
      EXPECT_TRUE(torch::equal(cols, full.narrow(1, 6, 2).to(torch::kDouble))) << name;
    }
  }
  EXPECT_EQ(r.read("optimizer/step_count").item<int64_t>(), 7);
  EXPECT_TRUE(r.verify().empty());
}

TEST(Checkpoint, AttributesRoundTrip) {
  World w;
  const std::string dir = scratch("attrs");
  nlohmann::json attrs = {{"tokens_seen", int64_t(1) << 40},
                          {"arch_spec", {{"hidden_size", 64}, {"layers", {1, 2, 3}}}},
                          {"layout", {{"tp", w.size}, {"dp", 1}}},
                          {"software", "autocompress test"}};
  const std::string path = save_checkpoint(MPI_COMM_WORLD, dir, 3, sharded_state(w), attrs,
                                           {{"rng", 1000 + w.rank}});
  CheckpointReader r(path);
  const auto& a = r.attributes();
  EXPECT_EQ(a.at("format").get<std::string>(), kFormatName);
  EXPECT_EQ(a.at("format_version").get<int>(), kFormatVersion);
  EXPECT_EQ(a.at("tokens_seen").get<int64_t>(), int64_t(1) << 40);
  EXPECT_EQ(a.at("arch_spec"), attrs["arch_spec"]);
  EXPECT_EQ(a.at("layout"), attrs["layout"]);
  EXPECT_EQ(a.at("software").get<std::string>(), "autocompress test");
  ASSERT_EQ(a.at("per_rank").size(), size_t(w.size));
  for (int rr = 0; rr < w.size; ++rr) EXPECT_EQ(a.at("per_rank")[rr]["rng"].get<int>(), 1000 + rr);
  EXPECT_EQ(a.at("world_size").get<int>(), w.size);
}

TEST(Checkpoint, LatestPointerAndRetention) {
  World w;
  const std::string dir = scratch("retention");
  SaveOptions opt;
  opt.keep_last = 2;
  for (int step = 1; step <= 5; ++step)
    save_checkpoint(MPI_COMM_WORLD, dir, step * 100, sharded_state(w), {}, nullptr, opt);
  EXPECT_EQ(resolve_latest(dir), (fs::path(dir) / "step_500.h5").string());
  if (w.rank == 0) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files, (std::vector<std::string>{"latest", "step_400.h5", "step_500.h5"}));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Write-behind splits each piece into several H5Dwrite rounds (here: a row or a few per
// call, and ranks with different numbers of calls, so some rounds select nothing). The
// file must be the same as without it: bitwise data, one crc32_slices entry per piece.
TEST(Checkpoint, WriteBehindRoundsGiveTheSameFile) {
  World w;
  std::vector<ShardedTensor> ts = sharded_state(w);
  // Uneven rows: rank 0 holds 12 - 2 * (size - 1) rows, every other rank 2.
  torch::Tensor full = full_tensor("model/uneven", torch::kFloat);
  const int64_t first = w.rank == 0 ? 0 : 12 - 2 * (w.size - w.rank);
  const int64_t rows = w.rank == 0 ? 12 - 2 * (w.size - 1) : 2;
  ts.push_back({"model/uneven", {12, 8}, {first, 0}, full.narrow(0, first, rows).clone(), true});
  SaveOptions plain, behind;
  plain.write_behind_bytes = 0;
  plain.max_bytes_per_write = 100;  // several pieces per slice
  behind = plain;
  behind.write_behind_bytes = 40;  // 1 row of 8 f32 per call, a few rows of narrower slices
  const std::string a = save_checkpoint(MPI_COMM_WORLD, scratch("wb_off"), 1, ts, {}, nullptr, plain);
  const std::string b = save_checkpoint(MPI_COMM_WORLD, scratch("wb_on"), 1, ts, {}, nullptr, behind);
  CheckpointReader ra(a), rb(b);
  EXPECT_TRUE(rb.verify(true).empty());
  ASSERT_EQ(ra.datasets().size(), rb.datasets().size());
  for (const auto& d : ra.datasets()) {
    EXPECT_TRUE(torch::equal(ra.read(d.name), rb.read(d.name))) << d.name;
  }
  EXPECT_TRUE(torch::equal(rb.read("model/uneven"), full));
  // The checksum attributes (one entry per piece, in rank order) are identical.
  for (const auto& d : ra.datasets()) {
    hid_t fa = H5Fopen(a.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), fb = H5Fopen(b.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t da = H5Dopen2(fa, d.name.c_str(), H5P_DEFAULT), db = H5Dopen2(fb, d.name.c_str(), H5P_DEFAULT);
    const std::string sa = ac::checkpoint::h5::read_string_attr(da, "crc32_slices", a);
    const std::string sb = ac::checkpoint::h5::read_string_attr(db, "crc32_slices", b);
    EXPECT_EQ(sa, sb) << d.name;
    EXPECT_NE(sa, "[]") << d.name;
    H5Dclose(da);
    H5Dclose(db);
    H5Fclose(fa);
    H5Fclose(fb);
  }
}

TEST(Checkpoint, StaleTemporaryIsRemovedAndPreviousKept) {
  World w;
  const std::string dir = scratch("stale");
  save_checkpoint(MPI_COMM_WORLD, dir, 1, sharded_state(w), {});
  if (w.rank == 0) std::ofstream(fs::path(dir) / "step_2.h5.tmp") << "half-written by a crashed job";
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(resolve_latest(dir), (fs::path(dir) / "step_1.h5").string());  // the pointer never saw step 2
  save_checkpoint(MPI_COMM_WORLD, dir, 3, sharded_state(w), {});
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step_2.h5.tmp"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step_1.h5"));
}

TEST(Checkpoint, RanksThatDisagreeOnATensorAreRefused) {
  World w;
  if (w.size < 2) GTEST_SKIP() << "needs 2+ ranks";
  const std::string dir = scratch("disagree");
  std::vector<ShardedTensor> ts{{"model/x", {4, int64_t(w.rank == 0 ? 4 : 5)}, {0, 0}, torch::zeros({1, 4}), false}};
  const std::string msg = input_error([&] { save_checkpoint(MPI_COMM_WORLD, dir, 1, ts, {}); });
  EXPECT_NE(msg.find("model/x: ranks disagree on the tensor"), std::string::npos) << msg;
}

// ---- bad files: read by one rank, written by rank 0 ----------------------------------------

class BadFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    World w;
    dir_ = scratch("bad");
    path_ = save_checkpoint(MPI_COMM_WORLD, dir_, 1, sharded_state(w), {});
    if (w.rank != 0) GTEST_SKIP() << "file corruption checks run on rank 0";
  }
  std::string copy_to(const std::string& name) {
    const std::string p = (fs::path(dir_) / name).string();
    fs::copy_file(path_, p, fs::copy_options::overwrite_existing);
    return p;
  }
  std::string dir_, path_;
};

TEST_F(BadFiles, TruncatedFileNamesTheFile) {
  const std::string p = copy_to("truncated.h5");
  fs::resize_file(p, fs::file_size(p) / 2);
  const std::string msg = input_error([&] {
    CheckpointReader r(p);
    for (const auto& d : r.datasets()) r.read(d.name);
  });
  EXPECT_NE(msg.find("truncated.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST_F(BadFiles, FlippedByteIsCaughtByChecksums) {
  const std::string p = copy_to("flipped.h5");
  haddr_t where = 0;
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "model/Float.rows", H5P_DEFAULT);
    where = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
  }
  ASSERT_NE(where, HADDR_UNDEF);
  {
    std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(where + 17));
    char c = 0;
    io.read(&c, 1);
    c ^= 0x10;
    io.seekp(static_cast<std::streamoff>(where + 17));
    io.write(&c, 1);
  }
  CheckpointReader r(p);
  const auto problems = r.verify(true);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("flipped.h5: dataset model/Float.rows: checksum mismatch"), std::string::npos)
      << problems[0];
  EXPECT_TRUE(r.verify(false).empty()) << "without checksums the flip is invisible";
  // Loading checks the CRC32s of the slices it reads whole (eval, export, generate load so).
  const std::string msg = input_error([&] { r.read("model/Float.rows"); });
  EXPECT_NE(msg.find("flipped.h5: model/Float.rows: checksum mismatch"), std::string::npos) << msg;
  r.set_check_checksums(false);
  EXPECT_NO_THROW(r.read("model/Float.rows"));
}

// Flips one bit of the element at `index` (row-major) of a float32 dataset, in the file.
void flip_bit(const std::string& path, const std::string& dataset, int64_t index) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  const haddr_t where = H5Dget_offset(d) + haddr_t(index) * 4 + 1;
  H5Dclose(d);
  H5Fclose(f);
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(where));
  char c = 0;
  io.read(&c, 1);
  c ^= 0x10;
  io.seekp(static_cast<std::streamoff>(where));
  io.write(&c, 1);
}

// Rewrites a dataset's crc32_slices without its tile CRCs, as files from before them were.
void drop_tile_crcs(const std::string& path, const std::string& dataset) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  nlohmann::json slices = nlohmann::json::parse(h5::read_string_attr(d, "crc32_slices", path));
  for (auto& s : slices) {
    s.erase("tile");
    s.erase("tile_crc32");
  }
  H5Adelete(d, "crc32_slices");
  h5::write_string_attr(d, "crc32_slices", slices.dump());
  H5Dclose(d);
  H5Fclose(f);
}

// A rank that reads part of a slice (a load at another TP size than the writer's) checks the
// blocks of the slice's tile grid that it touches, and only those. [256, 96] f32 (96 KiB):
// blocks of [64, 48] (at most 16 KiB) at every world size; rows written by every rank.
TEST(Checkpoint, PartialReadsCheckTheBlocksTheyTouch) {
  World w;
  const std::string dir = scratch("tiles");
  torch::manual_seed(11);
  const torch::Tensor full = torch::randn({256, 96});
  const int64_t r = 256 / w.size;
  const std::string path = save_checkpoint(MPI_COMM_WORLD, dir, 1,
                                           {{"model/w", {256, 96}, {r * w.rank, 0}, full.narrow(0, r * w.rank, r).clone(), true}}, {});
  if (w.rank != 0) return;  // the file is damaged and read by rank 0 alone
  {
    CheckpointReader clean(path);
    EXPECT_TRUE(torch::equal(clean.read("model/w", {5, 3}, {72, 47}), full.narrow(0, 5, 72).narrow(1, 3, 47)));
  }
  flip_bit(path, "model/w", 200 * 96 + 70);
  {
    CheckpointReader rd(path);
    for (const auto& [o, c] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {{0, 0}, {128, 96}}, {{0, 0}, {256, 48}}, {{130, 50}, {20, 10}}, {{192, 0}, {64, 48}}})
      EXPECT_NO_THROW(rd.read("model/w", o, c)) << "a read that does not touch block [192, 48]";
    for (const auto& [o, c] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {{192, 48}, {64, 48}}, {{128, 48}, {128, 48}}, {{199, 60}, {2, 20}}, {{0, 47}, {256, 2}}}) {
      const std::string msg = input_error([&] { rd.read("model/w", o, c); });
      EXPECT_NE(msg.find("model/w: checksum mismatch in the block at offset [192, 48] of shape [64, 48]"), std::string::npos)
          << msg;
    }
    const auto problems = rd.verify(true);
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_NE(problems[0].find("(first bad block at offset [192, 48])"), std::string::npos) << problems[0];
    rd.set_check_checksums(false);
    EXPECT_NO_THROW(rd.read("model/w", {192, 48}, {64, 48}));
  }  // closed: HDF5 opens a file once per process, and the next step writes it
  // A file from before the tile CRCs: a slice is checked when read whole, not in part.
  drop_tile_crcs(path, "model/w");
  CheckpointReader old(path);
  EXPECT_NO_THROW(old.read("model/w", {192, 48}, {64, 48}));
  EXPECT_NE(input_error([&] { old.read("model/w"); }).find("model/w: checksum mismatch"), std::string::npos);
  EXPECT_EQ(old.verify(true).size(), 1u);
}

// Tile CRCs are the CRC32s of the blocks' bytes in row-major order; crc32_of takes any strides.
TEST(Checksums, TileCrcsAreTheBlocksCrcs) {
  torch::manual_seed(3);
  const torch::Tensor t = torch::randn({101, 70}, torch::kDouble);  // 56,560 bytes
  EXPECT_EQ(crc_tile_shape({101, 70}, 8, t.numel() * 8), (std::vector<int64_t>{51, 35}));
  EXPECT_EQ(crc_tile_shape({4, 4}, 4, int64_t(1) << 40), (std::vector<int64_t>{4, 4}));
  const nlohmann::json j = slice_checksums({0, 0}, t, t.numel() * 8);
  ASSERT_EQ(j.at("tile_crc32").size(), 4u);
  EXPECT_EQ(j.at("crc32").get<uint32_t>(), crc32_of(t));
  const torch::Tensor last = t.narrow(0, 51, 50).narrow(1, 35, 35);
  EXPECT_FALSE(last.is_contiguous());
  EXPECT_EQ(crc32_of(last), crc32_of(last.contiguous()));
  EXPECT_EQ(j.at("tile_crc32")[3].get<uint32_t>(), crc32_of(last.contiguous()));
  EXPECT_NE(j.at("tile_crc32")[2].get<uint32_t>(), j.at("tile_crc32")[3].get<uint32_t>());
}

TEST_F(BadFiles, DatasetWithoutChecksumIsReported) {
  const std::string p = copy_to("no-crc.h5");
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "model/Float.rows", H5P_DEFAULT);
    ASSERT_GE(H5Adelete(d, "crc32_slices"), 0);
    H5Dclose(d);
    H5Fclose(f);
  }
  CheckpointReader r(p);
  const auto problems = r.verify(true);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("no-crc.h5: dataset model/Float.rows: no crc32_slices attribute"), std::string::npos)
      << problems[0];
  EXPECT_TRUE(r.verify(false).empty());
}

TEST_F(BadFiles, MissingDatasetAndWrongShapeNameFileAndDataset) {
  CheckpointReader r(path_);
  std::string msg = input_error([&] { r.read("model/nope"); });
  EXPECT_NE(msg.find("step_1.h5: model/nope: no such dataset"), std::string::npos) << msg;
  torch::Tensor out = torch::empty({12, 8});
  msg = input_error([&] { r.read_into("model/Float.rows", out, {0, 0}, {12, 9}); });
  EXPECT_NE(msg.find("model/Float.rows: has shape [12, 8], expected [12, 9]"), std::string::npos) << msg;
  msg = input_error([&] { r.read("model/Float.rows", {10, 0}, {4, 8}); });
  EXPECT_NE(msg.find("outside [12, 8]"), std::string::npos) << msg;
}

TEST_F(BadFiles, NewerFormatVersionAndForeignFilesAreRefused) {
  const std::string p = copy_to("newer.h5");
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    int64_t v = 99;
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Fclose(f);
  }
  std::string msg = input_error([&] { CheckpointReader r(p); });
  EXPECT_NE(msg.find("newer.h5: format_version: file has format version 99"), std::string::npos) << msg;

  const std::string text = (fs::path(dir_) / "not_hdf5.h5").string();
  std::ofstream(text) << "hello";
  msg = input_error([&] { CheckpointReader r(text); });
  EXPECT_NE(msg.find("not_hdf5.h5: file: not an HDF5 file"), std::string::npos) << msg;

  const std::string foreign = (fs::path(dir_) / "foreign.h5").string();
  hid_t f = H5Fcreate(foreign.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Fclose(f);
  msg = input_error([&] { CheckpointReader r(foreign); });
  EXPECT_NE(msg.find("foreign.h5: format: not an autocompress checkpoint"), std::string::npos) << msg;

  msg = input_error([&] { resolve_latest((fs::path(dir_) / "empty-dir").string()); });
  EXPECT_NE(msg.find("no checkpoint pointer"), std::string::npos) << msg;
}

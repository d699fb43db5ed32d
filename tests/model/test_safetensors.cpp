// safetensors reader/writer: round trip, sliced reads, sharded index, corrupt files.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dist/error.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;
using namespace ac::model;

namespace {
fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("ac_st_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
std::string expect_input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ac::InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ac::InputError";
  return "";
}
}  // namespace

TEST(Safetensors, RoundTripDtypesAndSlices) {
  auto d = temp_dir("rt");
  auto a = torch::arange(24, torch::kFloat32).view({2, 3, 4});
  auto b = torch::randn({5, 6}).to(torch::kBFloat16);
  auto c = torch::randn({7}).to(torch::kFloat16);
  write_safetensors_file((d / "x.safetensors").string(), {{"a", a}, {"b", b}, {"c", c}});
  SafetensorsReader r((d / "x.safetensors").string());
  EXPECT_EQ(r.names().size(), 3u);
  EXPECT_TRUE(torch::equal(r.read("a"), a));
  EXPECT_TRUE(torch::equal(r.read("b"), b));
  EXPECT_EQ(r.read("b").scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(r.read("c"), c));
  EXPECT_TRUE(torch::equal(r.read("b", torch::kFloat32), b.to(torch::kFloat32)));
  // Slices along each dim equal narrow() of the original.
  for (int64_t dim = 0; dim < 3; ++dim)
    EXPECT_TRUE(torch::equal(r.read_slice("a", dim, 1, a.size(dim) - 1), a.narrow(dim, 1, a.size(dim) - 1)))
        << "dim " << dim;
  EXPECT_TRUE(torch::equal(r.read_slice("b", 1, 2, 3), b.narrow(1, 2, 3)));
  auto msg = expect_input_error([&] { r.read_slice("a", 1, 2, 5); });
  EXPECT_NE(msg.find("a"), std::string::npos);
  EXPECT_NE(msg.find("outside shape [2, 3, 4]"), std::string::npos) << msg;
}

TEST(Safetensors, ShardedWithIndex) {
  auto d = temp_dir("sh");
  std::vector<std::pair<std::string, torch::Tensor>> ts;
  for (int i = 0; i < 5; ++i) ts.push_back({"t" + std::to_string(i), torch::full({64}, float(i))});
  SafetensorsWriteOptions o;
  o.max_shard_bytes = 600;  // 256 bytes per tensor: two per shard
  auto files = save_safetensors(d.string(), ts, o);
  ASSERT_EQ(files.size(), 4u);  // 3 shards + index
  EXPECT_TRUE(fs::exists(d / "model-00001-of-00003.safetensors"));
  SafetensorsReader r(d.string());
  EXPECT_EQ(r.files().size(), 3u);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(torch::equal(r.read("t" + std::to_string(i)), ts[size_t(i)].second));
  EXPECT_NE(r.file_of("t4").find("00003"), std::string::npos);
  for (const auto& e : fs::directory_iterator(d)) EXPECT_EQ(e.path().extension() == ".tmp", false);
}

TEST(Safetensors, BadInputNamesFileAndTensor) {
  auto d = temp_dir("bad");
  const auto path = (d / "m.safetensors").string();
  write_safetensors_file(path, {{"w", torch::ones({16, 16})}});
  SafetensorsReader ok(path);
  auto msg = expect_input_error([&] { ok.read("nope"); });
  EXPECT_NE(msg.find("nope"), std::string::npos);
  msg = expect_input_error([&] { ok.expect_shape("w", {16, 8}); });
  EXPECT_NE(msg.find("[16, 16]"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;

  // Truncated data: the header promises more bytes than the file holds.
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 100);
  msg = expect_input_error([&] { SafetensorsReader r(path); });
  EXPECT_NE(msg.find(path), std::string::npos);
  EXPECT_NE(msg.find("w:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  // Header length past the end of the file.
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    uint64_t len = 1000;
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << "{}";
  }
  msg = expect_input_error([&] { SafetensorsReader r(path); });
  EXPECT_NE(msg.find("header"), std::string::npos) << msg;

  // Index naming a tensor its shard does not hold.
  write_safetensors_file((d / "s1.safetensors").string(), {{"x", torch::ones({2})}});
  {
    std::ofstream f(d / "model.safetensors.index.json");
    f << R"({"weight_map": {"x": "s1.safetensors", "y": "s1.safetensors"}})";
  }
  msg = expect_input_error([&] { SafetensorsReader r(d.string()); });
  EXPECT_NE(msg.find("weight_map.y"), std::string::npos) << msg;
}

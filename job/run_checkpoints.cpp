// The job's run checkpoints (job/run_checkpoints.h).
#include "job/run_checkpoints.h"

#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "job/metrics.h"

namespace fs = std::filesystem;

namespace ac::job {

RunCheckpoints::RunCheckpoints(MPI_Comm world, std::string dir, int keep_last, std::string label)
    : world_(world), dir_(std::move(dir)), label_(std::move(label)), keep_last_(keep_last) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  root_ = rank == 0;
  if (root_) fs::create_directories(dir_);
  MPI_Barrier(world);
  resuming_ = fs::exists(dir_ + "/latest");
}

std::string RunCheckpoints::latest() const { return checkpoint::resolve_latest(dir_); }

std::string RunCheckpoints::save(int64_t step, const std::vector<checkpoint::ShardedTensor>& tensors,
                                 const nlohmann::json& attributes, const nlohmann::json& per_rank, const char* why) const {
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::SaveOptions so;
  so.keep_last = keep_last_;
  const std::string path = checkpoint::save_checkpoint(world_, dir_, step, tensors, attributes, per_rank, so);
  if (root_)
    std::cout << label_ << " " << path << " (" << why << ", " << std::fixed << std::setprecision(1)
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s)" << std::endl;
  return path;
}

void restore_rank_rng(const nlohmann::json& a, int world_rank, int world_size) {
  const nlohmann::json& per_rank = a.contains("per_rank") ? a.at("per_rank") : nlohmann::json();
  if (per_rank.is_array() && per_rank.size() == static_cast<size_t>(world_size) &&
      per_rank[static_cast<size_t>(world_rank)].contains("torch_rng"))
    set_rng_state_hex(per_rank[static_cast<size_t>(world_rank)]["torch_rng"].get<std::string>());
}

void announce_resume(bool root, const std::string& metrics_path, int64_t step, const std::string& line) {
  if (!root) return;
  truncate_metrics(metrics_path, step);  // later lines belong to the lost timeline
  std::cout << line << std::endl;
}

std::string hex_encode(const torch::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  const auto t = bytes.contiguous();
  const auto* p = t.data_ptr<uint8_t>();
  std::string s;
  s.reserve(size_t(t.numel()) * 2);
  for (int64_t i = 0; i < t.numel(); ++i) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}

torch::Tensor hex_decode(const std::string& s) {
  torch::Tensor t = torch::empty({int64_t(s.size() / 2)}, torch::kUInt8);
  auto* p = t.data_ptr<uint8_t>();
  auto nib = [](char c) { return uint8_t(c <= '9' ? c - '0' : c - 'a' + 10); };
  for (size_t i = 0; i + 1 < s.size(); i += 2) p[i / 2] = uint8_t(nib(s[i]) << 4 | nib(s[i + 1]));
  return t;
}

std::string rng_state_hex() { return hex_encode(at::detail::getDefaultCPUGenerator().get_state()); }
void set_rng_state_hex(const std::string& hex) {
  at::Generator(at::detail::getDefaultCPUGenerator()).set_state(hex_decode(hex));
}

}  // namespace ac::job

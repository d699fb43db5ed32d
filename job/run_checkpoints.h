// The step_N.h5 checkpoints of a resumable job with their `latest` pointer, and the RNG
// state they carry as text.
#pragma once

#include <mpi.h>
#include <torch/torch.h>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace ac::job {

// The step_N.h5 checkpoints of one job in `dir` (created on rank 0; collective), with `latest`.
class RunCheckpoints {
 public:
  RunCheckpoints(MPI_Comm world, std::string dir, int keep_last, std::string label);
  const std::string& dir() const { return dir_; }
  // The checkpoint to resume from (collective view: decided once at construction).
  bool resuming() const { return resuming_; }
  std::string latest() const;
  // Collective: writes step_<step>.h5 and moves `latest`; rank 0 prints "<label> PATH (why, s)".
  std::string save(int64_t step, const std::vector<checkpoint::ShardedTensor>& tensors, const nlohmann::json& attributes,
                   const nlohmann::json& per_rank, const char* why) const;

 private:
  MPI_Comm world_;
  std::string dir_, label_;
  int keep_last_;
  bool resuming_ = false, root_ = false;
};

// Resuming, written once for every resumable job: the default CPU generator's state this rank
// saved in the checkpoint's `per_rank` attribute ({"torch_rng": hex} per rank), restored when
// the checkpoint has one for this rank under the same world size.
void restore_rank_rng(const nlohmann::json& attributes, int world_rank, int world_size);
// Rank 0 after a resume: cuts `metrics_path` back to `step` (later lines belong to the lost
// timeline) and prints `line`. Other ranks do nothing.
void announce_resume(bool root, const std::string& metrics_path, int64_t step, const std::string& line);

// The default CPU generator's state as hex text and back (checkpoint attributes).
std::string rng_state_hex();
void set_rng_state_hex(const std::string& hex);
std::string hex_encode(const torch::Tensor& bytes);
torch::Tensor hex_decode(const std::string& s);

}  // namespace ac::job

// The components of a long-running, resumable job that pretraining, distillation
// (distill/trainer.h) and the architecture search (search/das.h) are built from, each with
// one small interface so a job swaps what differs (its models, loss and optimizer) and keeps
// the rest: the device and rank grid, the token batches and their cursor, the frozen
// TP-sharded teacher, checkpoints with resume, stop signals with Slurm requeue, the JSONL
// metrics file, and the step loop that ties them together (torchtitan's train.py shape).
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <csignal>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "data/sampler.h"
#include "dist/cpu_features.h"
#include "dist/device.h"
#include "dist/parallel_layout.h"
#include "model/model.h"

namespace ac::distill {

// ---- device, dtype and rank grid --------------------------------------------------------------

struct RunDevice {
  dist::DeviceChoice choice;
  torch::Device device{torch::kCPU};
  bool tf32 = false;
  dist::DtypeChoice dtype_choice;
  torch::Dtype dtype = torch::kFloat32;
};
// `--device`, `--dtype` resolved (dist::choose_device / choose_dtype), the TF32 policy applied.
// Call it first: `--device cuda` where there is none stops every rank before any model.
RunDevice choose_run_device(const std::string& device, int local_rank, const std::string& dtype);
// What the manifest and the checkpoints record of the layout (with the expert-TP size `etp`)
// and device.
nlohmann::json layout_json(const dist::ParallelLayout& layout, const RunDevice& d, int etp = 1);

// ---- data and cursor ---------------------------------------------------------------------------

// The blended token datasets of one job (`--data PATH|WEIGHT:PATH ...`, `--split`), one sampler
// per split on request.
class TokenData {
 public:
  TokenData(const std::vector<std::string>& data, const std::string& split, int64_t seq_len, uint64_t seed);
  std::shared_ptr<data::BlendedSampler> sampler(data::Split which) const;
  int64_t seq_len() const { return seq_len_; }

 private:
  std::vector<data::BlendEntry> entries_;
  data::SplitSpec split_;
  int64_t seq_len_;
  uint64_t seed_;
};

// One micro-batch on the device: input [B, T] and next-token labels [B * T], int64.
struct Batch {
  torch::Tensor input, labels;
};
// The loader's next micro-batch (int32 on the host: half the bytes; widened on the device).
Batch next_batch(data::DataLoader& loader, int64_t micro_batch, int64_t seq_len, const torch::Device& device);

// The data cursor a checkpoint's attributes hold (`data_cursor`), checked against `sampler`.
data::DataCursor restore_cursor(const nlohmann::json& attributes, const data::BlendedSampler& sampler,
                                const std::string& path);

// ---- models ---------------------------------------------------------------------------------------

// The teacher checkpoint `path` (file or directory with `latest`) as a frozen model sharded
// over `tp` at `dtype`: eval mode, no parameter requires grad. A teacher that cannot split
// over the TP size throws ac::InputError naming the file.
// `ep`: the expert-parallel group its MoE layers use (the trainer's; default EP 1).
model::CausalLM load_frozen_teacher(const std::string& path, const model::TpGroup& tp, torch::Dtype dtype,
                                    const model::EpGroup& ep = {});

// ---- checkpoint and resume ---------------------------------------------------------------------

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

// ---- stop signals ------------------------------------------------------------------------------

// Installs SIGUSR1/SIGTERM handlers for its lifetime (restoring the previous ones after).
// SIGTERM (a cancel) outranks SIGUSR1 (a preemption warning) whatever order they arrive in.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // Collective over `world`: the highest signal any rank has seen (0: none). Call it at the
  // same point of every step on every rank.
  int agree(MPI_Comm world) const;

 private:
  struct sigaction old_usr1_ {}, old_term_ {};
};

// After a signal-triggered checkpoint, on rank 0: under Slurm (SLURM_JOB_ID) and for SIGUSR1
// only (scancel sends SIGTERM), `scontrol requeue` the job unless AC_NO_REQUEUE=1.
void requeue_after_signal(int signo);
const char* signal_name(int signo);

// ---- metrics and progress ---------------------------------------------------------------------

// Rank 0 on resume: drops the lines of `path` (JSONL with a "step" field) logged after `step`,
// which belong to the timeline the resumed checkpoint does not contain. Atomic.
void truncate_metrics(const std::string& path, int64_t step);

// The job's metrics.jsonl, appended on rank 0 only (other ranks' writes are dropped). Opened on
// the first line, so a resume's truncate_metrics() comes first.
class MetricsLog {
 public:
  MetricsLog(std::string path, bool root) : path_(std::move(path)), root_(root) {}
  const std::string& path() const { return path_; }
  void write(const nlohmann::json& line);

 private:
  std::string path_;
  bool root_;
  std::unique_ptr<std::ofstream> out_;
};

// The default CPU generator's state as hex text and back (checkpoint attributes).
std::string rng_state_hex();
void set_rng_state_hex(const std::string& hex);
std::string hex_encode(const torch::Tensor& bytes);
torch::Tensor hex_decode(const std::string& s);

// ---- the step loop ---------------------------------------------------------------------------

// What a job does at each point of its loop; the loop owns the cadence, the stop signals and
// the interval clock.
struct StepLoop {
  int64_t steps = 0;          // the loop ends when the step count reaches this
  int64_t log_interval = 1;
  int64_t eval_interval = 0;  // 0: no eval
  int64_t save_interval = 0;  // 0: only at the end and on signals
  // One step at step count `step` (0-based); the loop counts it afterwards.
  std::function<void(int64_t step)> step;
  // Every log_interval steps and at the last: `seconds` and `steps` of training since the
  // last line (eval and checkpoint time excluded). Called on every rank.
  std::function<void(int64_t step, double seconds, int64_t steps)> log;
  std::function<void(int64_t step)> eval;  // every eval_interval steps and at the last
  std::function<void(const char* why)> save;  // "interval" | "final" | "signal"
};

// Runs `loop` from `step` (advanced in place) to loop.steps on every rank of `world`. Every step
// starts with the ranks agreeing on a pending stop signal; on one the state is saved (unless it
// was saved at this step), Slurm requeues on SIGUSR1, and the loop returns kExitRequeue.
// Returns 0 when all steps are done.
int run_steps(const StepLoop& loop, int64_t& step, MPI_Comm world);

}  // namespace ac::distill

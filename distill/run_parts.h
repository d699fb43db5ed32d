// Parts of a long-running, resumable job that the trainer (pretrain, distill) and the
// architecture search (search/das.h) share: stop signals agreed by every rank with Slurm
// requeue, the JSONL metrics file cut back to the resumed step, RNG state as text for a
// checkpoint attribute, and the frozen TP-sharded teacher.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <csignal>
#include <cstdint>
#include <string>

#include "model/model.h"

namespace ac::distill {

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

// Rank 0 on resume: drops the lines of `path` (JSONL with a "step" field) logged after `step`,
// which belong to the timeline the resumed checkpoint does not contain. Atomic.
void truncate_metrics(const std::string& path, int64_t step);

// The default CPU generator's state as hex text and back (checkpoint attributes).
std::string rng_state_hex();
void set_rng_state_hex(const std::string& hex);
std::string hex_encode(const torch::Tensor& bytes);
torch::Tensor hex_decode(const std::string& s);

// The teacher checkpoint `path` (file or directory with `latest`) as a frozen model sharded
// over `tp` at `dtype`: eval mode, no parameter requires grad. A teacher that cannot split
// over the TP size throws ac::InputError naming the file.
model::CausalLM load_frozen_teacher(const std::string& path, const model::TpGroup& tp, torch::Dtype dtype);

}  // namespace ac::distill

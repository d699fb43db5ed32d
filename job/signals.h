// Stop signals of a job (SIGUSR1: a preemption warning, SIGTERM: a cancel), agreed over
// every rank, and the Slurm requeue with its exit code.
#pragma once

#include <mpi.h>
#include <csignal>

namespace ac::job {

// Exit code after a signal-triggered checkpoint: the job wants to be requeued. Slurm
// clusters list it in RequeueExit (scripts/slurm_cluster.sh does); docs/slurm.md.
constexpr int kExitRequeue = 75;

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

}  // namespace ac::job

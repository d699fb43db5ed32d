// The job's signals (job/signals.h).
#include "job/signals.h"

#include <cstdlib>
#include <iostream>
#include <string>

namespace ac::job {

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int signo) {
  if (signo > g_signal) g_signal = signo;
}
}  // namespace

StopSignals::StopSignals() {
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, &old_usr1_);
  sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGUSR1, &old_usr1_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

int StopSignals::agree(MPI_Comm world) const {
  int stop = static_cast<int>(g_signal);
  MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, world);
  return stop;
}

const char* signal_name(int signo) { return signo == SIGUSR1 ? "SIGUSR1" : signo == SIGTERM ? "SIGTERM" : "signal"; }

void requeue_after_signal(int signo) {
  if (signo != SIGUSR1) return;
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* no = std::getenv("AC_NO_REQUEUE");
  if (!job || (no && std::string(no) == "1")) return;
  const std::string cmd = "scontrol requeue " + std::string(job);
  std::cout << "requeueing: " << cmd << std::endl;
  if (std::system(cmd.c_str()) != 0) std::cerr << "warning: '" << cmd << "' failed" << std::endl;
}

}  // namespace ac::job

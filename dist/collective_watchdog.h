// The watchdog of the NCCL communicator: a rank whose peer died, stalled or issued another
// collective must not wait forever inside a collective. NCCL kernels spin on the GPU until
// their peers arrive, and a host thread that then synchronizes the stream (an .item(), a
// checkpoint copy) blocks with them; only an abort of the communicator frees them.
//
// The same scheme as c10d's ProcessGroupNCCL, written for this project: each collective in
// flight is registered with a completion probe (a CUDA event query) and what it keeps alive;
// a background thread polls them, retires the finished ones and, when one has been in flight
// longer than the timeout or the communicator reports an asynchronous error (a peer's socket
// closed, ...), calls the abort hook once: the NCCL communicator's hook aborts the
// communicator (ncclCommAbort) and stops the whole job (MPI_Abort), so that no rank hangs.
//
// This file has no CUDA in it: the clock, the probes and the hooks are injected, so the
// timeout logic is tested on the CPU (tests/dist/test_watchdog.cpp) with a fake clock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ac::dist {

// The watchdog's timeout: AC_NCCL_TIMEOUT (seconds, a positive number; default 600, as
// PyTorch's ProcessGroupNCCL). Anything else throws ac::InputError naming the variable.
double nccl_timeout_seconds();
// Parses a timeout text ("600", "1.5"): a finite number > 0, else ac::InputError(`what`).
double parse_timeout_seconds(const std::string& text, const std::string& what);

struct WatchdogHooks {
  std::function<double()> now;                     // monotonic seconds
  std::function<std::string()> async_error;        // "" or the communicator's asynchronous error
  std::function<void(const std::string&)> abort;   // called once, with the reason, on the first failure
};

// A monotonic wall clock in seconds (std::chrono::steady_clock).
double steady_seconds();

// Polls `in_progress` until it is false or `timeout_s` has passed on `now`, calling `pause`
// between polls (a short sleep in production, a clock step in tests). Returns true when it
// finished, false on timeout. Used for a nonblocking NCCL communicator's init and calls,
// which return ncclInProgress and must be polled (ncclCommGetAsyncError) until done.
bool wait_while(const std::function<bool()>& in_progress, double timeout_s, const std::function<double()>& now,
                const std::function<void()>& pause);

class CollectiveWatchdog {
 public:
  // timeout_s > 0. `name` goes into the messages (e.g. "nccl group of 8 ranks, rank 3").
  CollectiveWatchdog(std::string name, double timeout_s, WatchdogHooks hooks);
  ~CollectiveWatchdog();  // stops the thread; the ops still pending are dropped
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // Registers a collective in flight: `what` describes it ("all_reduce of 4096 bf16"),
  // `done` says whether it has finished (may be called from the watchdog thread), `keep`
  // holds what must stay alive until then (tensors a side stream still reads). Returns the
  // sequence number (1, 2, ... in issue order). Thread-safe.
  uint64_t add(std::string what, std::function<bool()> done, std::shared_ptr<void> keep = nullptr);

  // One pass: retires the finished ops (oldest first; an op counts as finished only when all
  // older ones have, since one stream runs them in order), then checks the communicator's
  // asynchronous error and the oldest op's age. Returns "" when all is well, else the reason;
  // on the first failure it calls hooks.abort(reason) (once: later passes return the same
  // reason without calling it again).
  std::string poll();

  size_t pending() const;
  bool failed() const;
  double timeout_seconds() const { return timeout_s_; }

  // Polls every interval_s on a background thread until stop() or destruction.
  void start(double interval_s);
  void stop();

 private:
  struct Op {
    uint64_t seq;
    std::string what;
    double issued_at;
    std::function<bool()> done;
    std::shared_ptr<void> keep;
  };
  std::string name_;
  double timeout_s_;
  WatchdogHooks hooks_;
  mutable std::mutex mu_;
  std::deque<Op> ops_;
  uint64_t next_seq_ = 1;
  std::string failure_;
  std::thread thread_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

}  // namespace ac::dist

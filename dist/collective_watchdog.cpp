// The collective watchdog (see collective_watchdog.h).
#include "dist/collective_watchdog.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "dist/error.h"

namespace ac::dist {

double parse_timeout_seconds(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0)
    throw InputError(what, text, "expected a timeout in seconds, a number > 0");
  return v;
}

double nccl_timeout_seconds() {
  const char* env = std::getenv("AC_NCCL_TIMEOUT");
  return env == nullptr ? 600.0 : parse_timeout_seconds(env, "AC_NCCL_TIMEOUT");
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool wait_while(const std::function<bool()>& in_progress, double timeout_s, const std::function<double()>& now,
                const std::function<void()>& pause) {
  const double start = now();
  while (in_progress()) {
    if (now() - start >= timeout_s) return false;
    pause();
  }
  return true;
}

CollectiveWatchdog::CollectiveWatchdog(std::string name, double timeout_s, WatchdogHooks hooks)
    : name_(std::move(name)), timeout_s_(timeout_s), hooks_(std::move(hooks)) {
  if (!(timeout_s_ > 0)) throw std::invalid_argument("CollectiveWatchdog: the timeout must be > 0");
  if (!hooks_.now) hooks_.now = steady_seconds;
}

CollectiveWatchdog::~CollectiveWatchdog() { stop(); }

uint64_t CollectiveWatchdog::add(std::string what, std::function<bool()> done, std::shared_ptr<void> keep) {
  const double t = hooks_.now();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = next_seq_++;
  ops_.push_back(Op{seq, std::move(what), t, std::move(done), std::move(keep)});
  return seq;
}

std::string CollectiveWatchdog::poll() {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty()) return failure_;
    while (!ops_.empty() && ops_.front().done()) ops_.pop_front();
    std::string async = hooks_.async_error ? hooks_.async_error() : std::string();
    if (!async.empty()) {
      reason = name_ + ": asynchronous NCCL error: " + async +
               (ops_.empty() ? std::string()
                             : " (oldest collective in flight: #" + std::to_string(ops_.front().seq) + " " +
                                   ops_.front().what + ")");
    } else if (!ops_.empty()) {
      const double age = hooks_.now() - ops_.front().issued_at;
      if (age >= timeout_s_) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.0f s (timeout %.0f s", age, timeout_s_);
        reason = name_ + ": collective #" + std::to_string(ops_.front().seq) + " " + ops_.front().what +
                 " has not completed after " + buf +
                 ", AC_NCCL_TIMEOUT): a peer died, stalled or issued another collective";
      }
    }
    if (reason.empty()) return reason;
    failure_ = reason;
  }
  if (hooks_.abort) hooks_.abort(reason);  // outside the lock: it may end the process
  return reason;
}

size_t CollectiveWatchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_.size();
}

bool CollectiveWatchdog::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !failure_.empty();
}

void CollectiveWatchdog::start(double interval_s) {
  if (thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
  }
  const auto interval = std::chrono::duration<double>(interval_s);
  thread_ = std::thread([this, interval] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, interval, [this] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      const bool failed_now = !poll().empty();
      lock.lock();
      if (failed_now) break;  // the abort hook ran; nothing left to watch
    }
  });
}

void CollectiveWatchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ac::dist

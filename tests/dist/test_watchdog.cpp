// The NCCL communicator's watchdog and its nonblocking-call wait, on the CPU: a fake clock and
// fake completion probes stand in for CUDA events and ncclCommGetAsyncError, so the timeout
// and abort logic is tested where no GPU is (the communicator itself runs on a GPU only).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/collective_watchdog.h"
#include "dist/error.h"

namespace {

using ac::dist::CollectiveWatchdog;
using ac::dist::WatchdogHooks;

struct FakeJob {
  double t = 0;
  std::string async_error;
  std::vector<std::string> aborts;
  WatchdogHooks hooks() {
    WatchdogHooks h;
    h.now = [this] { return t; };
    h.async_error = [this] { return async_error; };
    h.abort = [this](const std::string& why) { aborts.push_back(why); };
    return h;
  }
};

TEST(WaitWhile, ReturnsOnceTheCallIsNoLongerInProgress) {
  double t = 0;
  int polls = 0, pauses = 0;
  const bool ok = ac::dist::wait_while([&] { return ++polls <= 3; }, 10.0, [&] { return t; },
                                       [&] { ++pauses, t += 1.0; });
  EXPECT_TRUE(ok);
  EXPECT_EQ(polls, 4);
  EXPECT_EQ(pauses, 3);
}

TEST(WaitWhile, GivesUpAtTheTimeout) {
  double t = 100;
  int pauses = 0;
  const bool ok = ac::dist::wait_while([] { return true; }, 5.0, [&] { return t; }, [&] { ++pauses, t += 1.0; });
  EXPECT_FALSE(ok);
  EXPECT_EQ(pauses, 5);
  EXPECT_DOUBLE_EQ(t, 105.0);
}

TEST(Watchdog, RetiresFinishedCollectivesInIssueOrder) {
  FakeJob job;
  CollectiveWatchdog w("group", 10.0, job.hooks());
  bool done[3] = {false, false, false};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(w.add("op" + std::to_string(i), [&done, i] { return done[i]; }), uint64_t(i + 1));
  done[1] = true;  // the second finished, the first not yet: one stream runs them in order
  EXPECT_EQ(w.poll(), "");
  EXPECT_EQ(w.pending(), 3u);
  done[0] = true;
  EXPECT_EQ(w.poll(), "");
  EXPECT_EQ(w.pending(), 1u);
  done[2] = true;
  EXPECT_EQ(w.poll(), "");
  EXPECT_EQ(w.pending(), 0u);
  EXPECT_TRUE(job.aborts.empty());
}

TEST(Watchdog, AbortsOnceWhenTheOldestCollectiveOutlivesTheTimeout) {
  FakeJob job;
  CollectiveWatchdog w("NCCL group of 2 ranks (rank 1, cuda:1)", 10.0, job.hooks());
  w.add("all_reduce of 4096 BFloat16", [] { return false; });
  job.t = 5;
  w.add("broadcast of 8 Float", [] { return false; });
  job.t = 9.9;
  EXPECT_EQ(w.poll(), "");
  EXPECT_FALSE(w.failed());
  job.t = 10.0;
  const std::string why = w.poll();
  ASSERT_EQ(job.aborts.size(), 1u);
  EXPECT_EQ(job.aborts[0], why);
  EXPECT_NE(why.find("NCCL group of 2 ranks (rank 1, cuda:1)"), std::string::npos) << why;
  EXPECT_NE(why.find("collective #1 all_reduce of 4096 BFloat16"), std::string::npos) << why;
  EXPECT_NE(why.find("after 10 s (timeout 10 s, AC_NCCL_TIMEOUT)"), std::string::npos) << why;
  EXPECT_TRUE(w.failed());
  job.t = 20;
  EXPECT_EQ(w.poll(), why);  // the same verdict, and no second abort
  EXPECT_EQ(job.aborts.size(), 1u);
}

TEST(Watchdog, AnIdleCommunicatorNeverTimesOut) {
  FakeJob job;
  CollectiveWatchdog w("group", 1.0, job.hooks());
  w.add("all_gather of 2 Float", [] { return true; });
  job.t = 1000;
  EXPECT_EQ(w.poll(), "");
  EXPECT_TRUE(job.aborts.empty());
}

TEST(Watchdog, AnAsynchronousNcclErrorAbortsBeforeTheTimeout) {
  FakeJob job;
  CollectiveWatchdog w("group", 600.0, job.hooks());
  w.add("reduce_scatter of 1024 Float", [] { return false; });
  job.t = 1;
  EXPECT_EQ(w.poll(), "");
  job.async_error = "remote process exited or there was a network error";
  const std::string why = w.poll();
  ASSERT_EQ(job.aborts.size(), 1u);
  EXPECT_NE(why.find("asynchronous NCCL error: remote process exited"), std::string::npos) << why;
  EXPECT_NE(why.find("#1 reduce_scatter of 1024 Float"), std::string::npos) << why;
}

TEST(Watchdog, KeepsWhatACollectiveReadsAliveUntilItFinished) {
  FakeJob job;
  CollectiveWatchdog w("group", 10.0, job.hooks());
  bool done = false;
  auto buffer = std::make_shared<std::vector<float>>(16, 1.0f);
  std::weak_ptr<std::vector<float>> watch = buffer;
  w.add("all_gather (async) of 16 Float", [&] { return done; }, buffer);
  buffer.reset();  // the caller let go; the side stream still reads it
  EXPECT_EQ(w.poll(), "");
  EXPECT_FALSE(watch.expired());
  done = true;
  EXPECT_EQ(w.poll(), "");
  EXPECT_TRUE(watch.expired());
}

TEST(Watchdog, ItsThreadAbortsAHungCollective) {
  std::atomic<int> aborts{0};
  std::string reason;
  WatchdogHooks h;
  h.now = ac::dist::steady_seconds;
  h.abort = [&](const std::string& why) {
    reason = why;
    aborts.fetch_add(1);
  };
  CollectiveWatchdog w("group", 0.2, h);
  w.add("barrier", [] { return false; });
  w.start(0.01);
  for (int i = 0; i < 500 && aborts.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  w.stop();
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_NE(reason.find("collective #1 barrier has not completed"), std::string::npos) << reason;
}

TEST(Watchdog, ItsThreadLeavesFinishedCollectivesAlone) {
  std::atomic<int> aborts{0};
  WatchdogHooks h;
  h.now = ac::dist::steady_seconds;
  h.abort = [&](const std::string&) { aborts.fetch_add(1); };
  CollectiveWatchdog w("group", 0.05, h);
  w.start(0.01);
  for (int i = 0; i < 20; ++i) w.add("all_reduce of 1 Float", [] { return true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  w.stop();
  EXPECT_EQ(aborts.load(), 0);
  EXPECT_EQ(w.pending(), 0u);
}

TEST(NcclTimeout, ComesFromAcNcclTimeoutAndRefusesNonsense) {
  EXPECT_DOUBLE_EQ(ac::dist::parse_timeout_seconds("600", "X"), 600.0);
  EXPECT_DOUBLE_EQ(ac::dist::parse_timeout_seconds("1.5", "X"), 1.5);
  for (const char* bad : {"", "0", "-3", "abc", "10s", "inf", "nan"}) {
    try {
      ac::dist::parse_timeout_seconds(bad, "AC_NCCL_TIMEOUT");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ac::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("AC_NCCL_TIMEOUT: " + std::string(bad) + ": expected a timeout in seconds"),
                std::string::npos)
          << e.what();
    }
  }
  unsetenv("AC_NCCL_TIMEOUT");
  EXPECT_DOUBLE_EQ(ac::dist::nccl_timeout_seconds(), 600.0);
  setenv("AC_NCCL_TIMEOUT", "30", 1);
  EXPECT_DOUBLE_EQ(ac::dist::nccl_timeout_seconds(), 30.0);
  setenv("AC_NCCL_TIMEOUT", "never", 1);
  EXPECT_THROW(ac::dist::nccl_timeout_seconds(), ac::InputError);
  unsetenv("AC_NCCL_TIMEOUT");
}

}  // namespace

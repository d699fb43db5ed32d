// How far a calibrated profile's points drift within one process (issue 37): the speed
// reference of `cost validate` (search/costmodel/calibrate.h: three GEMMs, the smallest model's
// cold decode step and prefill) probed again and again, each point printed as its time now /
// its calibrated time (the baseline: the profile), with the page faults the probe took, between
// gaps of sleep, of GEMMs, or of back-to-back probes.
//
//   bench_speed_drift PROFILE.json DTYPE [GAP...]
//     GAP: N (sleep N s), bN (N s of 512x1024x1024 f32 GEMMs), dN (N s of probes, untimed)
//
// Runs as `cost calibrate` / `cost validate` run by default: one thread (process CPU time),
// GOMP_SPINCOUNT as the launcher sets it, the tensor allocator installed.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>
#include <thread>

#include "dist/omp_env.h"
#include "dist/tensor_memory.h"
#include "search/costmodel/calibrate.h"
#include "search/costmodel/profiles.h"

namespace {

// Nanoseconds per dependent load over a random cycle through 256 MiB (DRAM latency with TLB
// misses): the median of 5 chases of 2M loads.
double chase_ns() {
  static std::vector<uint32_t> next = [] {
    const size_t n = (size_t(256) << 20) / 64;  // one entry per 64-byte line
    std::vector<uint32_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = uint32_t(i);
    std::mt19937 rng(1);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<uint32_t> nx(n * 16);
    for (size_t i = 0; i < n; ++i) nx[size_t(order[i]) * 16] = order[(i + 1) % n];
    return nx;
  }();
  std::vector<double> t;
  uint32_t at = 0;
  for (int r = 0; r < 5; ++r) {
    const auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < (1 << 21); ++i) at = next[size_t(at) * 16];
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() * 1e9 / (1 << 21));
  }
  if (at == 0xffffffffu) std::printf("-");  // keeps the chase
  std::sort(t.begin(), t.end());
  return t[2];
}

void report(ac::search::SpeedReference& ref, const char* label, int gap) {
  rusage a{}, b{};
  getrusage(RUSAGE_SELF, &a);
  const auto probes = ref.probe();
  getrusage(RUSAGE_SELF, &b);
  std::printf("%-6s gap %4d s  majflt %5ld minflt %7ld ", label, gap, b.ru_majflt - a.ru_majflt, b.ru_minflt - a.ru_minflt);
  for (const auto& p : probes) std::printf(" %s=%.2f", p.point.substr(0, p.point.find(' ')).c_str(), p.ratio());
  std::printf("  chase %.0f ns\n", chase_ns());
  std::fflush(stdout);
}

// Spends `seconds` as the gap's kind says.
void gap(ac::search::SpeedReference& ref, char kind, int seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  torch::NoGradGuard no_grad;
  if (kind == 'b') {
    const auto a = torch::randn({512, 1024}), w = torch::randn({1024, 1024});
    while (elapsed() < seconds) (void)torch::mm(a, w);
  } else if (kind == 'd') {
    while (elapsed() < seconds) (void)ref.probe(0.0);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_speed_drift PROFILE.json DTYPE [N | bN | dN ...]\n");
    return 2;
  }
  ac::dist::default_omp_wait(argc, argv);
  ac::dist::default_flush_denormals();
  ac::dist::set_compute_threads(1);
  ac::dist::tensor_memory::install(1);
  const auto hw = ac::search::load_hardware(argv[1], ac::search::default_configs_dir());
  ac::search::SpeedReference ref(hw, argv[2]);
  report(ref, "start", 0);
  report(ref, "again", 0);
  for (int i = 3; i < argc; ++i) {
    const std::string g = argv[i];
    const char kind = (g[0] == 'b' || g[0] == 'd') ? g[0] : 's';
    const int seconds = std::atoi(g.c_str() + (kind == 's' ? 0 : 1));
    gap(ref, kind, seconds);
    report(ref, kind == 'b' ? "gemms" : kind == 'd' ? "probes" : "sleep", seconds);
  }
  return 0;
}

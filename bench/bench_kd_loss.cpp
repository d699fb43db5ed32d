// vocab_parallel_kl (TP = 1, chunked, recompute in backward) against the PyTorch-eager way
// of writing the same loss in the same run: fp32 copies of both logits, log_softmax of each,
// kl_div(log_target) summed / N, times T^2, forward + backward. Times alternate (ours,
// eager, ours, ...) and the median is reported; peak extra memory (above the inputs) is
// measured in a child process per variant (peak RSS), because RSS peaks are per process.
//
//   build/bench/bench_kd_loss [--tokens 2048] [--vocab 32000] [--chunk 1024] [--reps 5] [--top-k 0]
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "distill/kd_loss.h"

using Clock = std::chrono::steady_clock;
namespace dist = ac::dist;

namespace {

struct Args {
  int64_t tokens = 2048, vocab = 32000, chunk = 1024, reps = 5, top_k = 0;
  double temperature = 2.0;
  std::string child_variant, child_dtype;  // --child VARIANT DTYPE: memory probe
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_kd_loss: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--tokens") a.tokens = std::stoll(next());
    else if (k == "--vocab") a.vocab = std::stoll(next());
    else if (k == "--chunk") a.chunk = std::stoll(next());
    else if (k == "--reps") a.reps = std::stoll(next());
    else if (k == "--top-k") a.top_k = std::stoll(next());
    else if (k == "--child") {
      a.child_variant = next();
      a.child_dtype = next();
    } else {
      std::fprintf(stderr, "usage: bench_kd_loss [--tokens N] [--vocab V] [--chunk C] [--reps R] [--top-k K]\n");
      std::exit(2);
    }
  }
  return a;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// Random logits written row block by row block, so creating them has no fp32 full-size peak.
torch::Tensor make_logits(int64_t n, int64_t v, torch::Dtype dtype) {
  torch::Tensor x = torch::empty({n, v}, dtype);
  for (int64_t r = 0; r < n; r += 128) {
    const int64_t c = std::min<int64_t>(128, n - r);
    x.narrow(0, r, c).copy_(torch::randn({c, v}) * 3.0);
  }
  return x;
}

// One forward + backward; returns the loss. The student's gradient is left in place.
double run_ours(const torch::Tensor& s, const torch::Tensor& t, dist::Communicator& self, const Args& a) {
  ac::distill::KdOptions o;
  o.temperature = a.temperature;
  o.token_chunk = a.chunk;
  o.top_k = a.top_k;
  torch::Tensor loss = ac::distill::vocab_parallel_kl(s, t, self, a.vocab, o);
  loss.backward();
  return loss.item<double>();
}

double run_eager(const torch::Tensor& s, const torch::Tensor& t, const Args& a) {
  const double T = a.temperature;
  torch::Tensor log_ps = torch::log_softmax(s.to(torch::kFloat) / T, 1);
  torch::Tensor log_pt = torch::log_softmax(t.to(torch::kFloat) / T, 1);
  torch::Tensor loss;
  if (a.top_k > 0) {
    auto [vals, ids] = log_pt.topk(a.top_k, 1);
    torch::Tensor log_q = torch::log_softmax(vals, 1);
    loss = (log_q.exp() * (log_q - log_ps.gather(1, ids))).sum() * (T * T / double(s.size(0)));
  } else {
    loss = torch::kl_div(log_ps, log_pt, at::Reduction::Sum, /*log_target=*/true) * (T * T / double(s.size(0)));
  }
  loss.backward();
  return loss.item<double>();
}

torch::Dtype dtype_of(const std::string& d) { return d == "bf16" ? torch::kBFloat16 : torch::kFloat; }

int child(const Args& a) {
  auto self = dist::make_self_communicator();
  const torch::Dtype dt = dtype_of(a.child_dtype);
  torch::manual_seed(1);
  torch::Tensor s = make_logits(a.tokens, a.vocab, dt).requires_grad_(true);
  torch::Tensor t = make_logits(a.tokens, a.vocab, dt);
  const int64_t before = rss_bytes();
  const double loss = a.child_variant == "ours" ? run_ours(s, t, *self, a) : run_eager(s, t, a);
  const int64_t peak = peak_rss_bytes();
  std::printf("peak_extra_bytes %lld grad_bytes %lld loss %.9g\n", static_cast<long long>(peak - before),
              static_cast<long long>(s.grad().numel() * s.grad().element_size()), loss);
  return 0;
}

// Runs this program as `--child variant dtype` and reads its peak extra memory.
double child_peak_mib(const Args& a, const char* variant, const char* dtype) {
  char exe[4096] = {0};
  if (readlink("/proc/self/exe", exe, sizeof(exe) - 1) <= 0) return -1;
  std::string cmd = std::string(exe) + " --tokens " + std::to_string(a.tokens) + " --vocab " + std::to_string(a.vocab) +
                    " --chunk " + std::to_string(a.chunk) + " --top-k " + std::to_string(a.top_k) + " --child " +
                    variant + " " + dtype;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  long long peak = -1, grad = 0;
  double loss = 0;
  if (std::fscanf(p, "peak_extra_bytes %lld grad_bytes %lld loss %lf", &peak, &grad, &loss) != 3) peak = -1;
  pclose(p);
  return peak < 0 ? -1 : double(peak) / (1 << 20);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (!a.child_variant.empty()) return child(a);
  auto self = dist::make_self_communicator();
  std::printf("bench_kd_loss: N=%lld tokens, vocab %lld, T=%.1f, chunk %lld, top_k %lld, torch threads %d, %lld reps\n",
              static_cast<long long>(a.tokens), static_cast<long long>(a.vocab), a.temperature,
              static_cast<long long>(a.chunk), static_cast<long long>(a.top_k), torch::get_num_threads(),
              static_cast<long long>(a.reps));
  std::printf("%-5s %12s %12s %8s %14s %14s %12s\n", "dtype", "ours ms", "eager ms", "ratio", "ours peak MiB",
              "eager peak MiB", "|dloss|");
  for (const char* dname : {"bf16", "f32"}) {
    const torch::Dtype dt = dtype_of(dname);
    torch::manual_seed(1);
    torch::Tensor s = make_logits(a.tokens, a.vocab, dt).requires_grad_(true);
    torch::Tensor t = make_logits(a.tokens, a.vocab, dt);
    double l_ours = run_ours(s, t, *self, a), l_eager = 0;  // warm-up
    s.mutable_grad().reset();
    l_eager = run_eager(s, t, a);
    s.mutable_grad().reset();
    std::vector<double> ours, eager;
    for (int64_t r = 0; r < a.reps; ++r) {
      auto t0 = Clock::now();
      l_ours = run_ours(s, t, *self, a);
      ours.push_back(seconds_since(t0));
      s.mutable_grad().reset();
      t0 = Clock::now();
      l_eager = run_eager(s, t, a);
      eager.push_back(seconds_since(t0));
      s.mutable_grad().reset();
    }
    const double mo = median(ours), me = median(eager);
    const double peak_o = child_peak_mib(a, "ours", dname), peak_e = child_peak_mib(a, "eager", dname);
    std::printf("%-5s %12.1f %12.1f %8.2f %14.0f %14.0f %12.2e\n", dname, mo * 1e3, me * 1e3, me / mo, peak_o, peak_e,
                std::abs(l_ours - l_eager));
  }
  std::printf("ratio = eager time / ours (> 1: ours faster). peak = peak RSS above the inputs during one\n"
              "forward+backward, in a fresh process; both include the student gradient (N x V in the\n"
              "student's dtype: %.0f MiB bf16, %.0f MiB f32).\n",
              double(a.tokens * a.vocab * 2) / (1 << 20), double(a.tokens * a.vocab * 4) / (1 << 20));
  return 0;
}

// small_linear (the small-M kernel of decode steps, model/layers/small_gemm.h) against torch's
// linear (the BLAS GEMM) on one model's projection weights, in the same run. Like a decode
// step, one pass multiplies M rows by every weight of the model in turn, so the weights come
// from memory, not cache (the defaults are SmolLM2-135M's shapes: 30 layers of q, k, v, o,
// gate, up, down, then the 49152-row LM head; 538 MB in fp32). Passes alternate (BLAS, each
// kernel, BLAS, ...); the best of --reps per variant is reported, with the ratio and the
// largest error of each against an fp64 product.
//
// Both at --threads (the kernels split W's rows over OpenMP threads).
//
//   build/bench/bench_small_gemm [--rows 2,4,8,16] [--threads 1] [--reps 5]
//       [--hidden 576 --kv 192 --ffn 1536 --layers 30 --vocab 49152]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "dist/omp_env.h"
#include "model/layers/small_gemm.h"

namespace {

struct Args {
  std::vector<int64_t> rows = {2, 4, 8, 16};
  int threads = 1, reps = 5;
  int64_t hidden = 576, kv = 192, ffn = 1536, layers = 30, vocab = 49152;
};

[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr,
               "bench_small_gemm: error: %s\nusage: bench_small_gemm [--rows 2,4,8,16] [--threads 1] [--reps 5] "
               "[--hidden 576 --kv 192 --ffn 1536 --layers 30 --vocab 49152]\n",
               msg.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(k + " needs a value");
    const std::string v = argv[++i];
    try {
      if (k == "--rows") {
        a.rows.clear();
        std::stringstream ss(v);
        for (std::string t; std::getline(ss, t, ',');) a.rows.push_back(std::stoll(t));
      } else if (k == "--threads") a.threads = std::stoi(v);
      else if (k == "--reps") a.reps = std::stoi(v);
      else if (k == "--hidden") a.hidden = std::stoll(v);
      else if (k == "--kv") a.kv = std::stoll(v);
      else if (k == "--ffn") a.ffn = std::stoll(v);
      else if (k == "--layers") a.layers = std::stoll(v);
      else if (k == "--vocab") a.vocab = std::stoll(v);
      else usage("unexpected argument '" + k + "'");
    } catch (const std::logic_error&) {
      usage(k + ": not a number: '" + v + "'");
    }
  }
  for (int64_t m : a.rows)
    if (m < 2 || m > 16) usage("--rows: each in [2, 16] (small_linear's range), got " + std::to_string(m));
  if (a.threads < 1 || a.reps < 1) usage("--threads and --reps must be >= 1");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  ac::dist::set_compute_threads(a.threads);
  torch::NoGradGuard ng;
  torch::manual_seed(0);
  std::vector<torch::Tensor> ws;  // [N, K] per projection, in a decode step's order
  for (int64_t l = 0; l < a.layers; ++l)
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
             {a.hidden, a.hidden}, {a.kv, a.hidden}, {a.kv, a.hidden}, {a.hidden, a.hidden},
             {a.ffn, a.hidden}, {a.ffn, a.hidden}, {a.hidden, a.ffn}})
      ws.push_back(torch::randn({n, k}) / std::sqrt(double(k)));
  ws.push_back(torch::randn({a.vocab, a.hidden}) / std::sqrt(double(a.hidden)));
  double mb = 0;
  for (const auto& w : ws) mb += double(w.numel()) * 4 / 1e6;
  std::vector<std::string> isas;
  for (const std::string isa : {"avx2", "avx512"})
    if (ac::model::small_linear(torch::zeros({2, 8}), torch::zeros({8, 8}), isa).defined()) isas.push_back(isa);
  std::string names;
  for (const auto& i : isas) names += (names.empty() ? "" : ", ") + i;
  std::printf("# %zu weights, %.0f MB fp32, %d thread(s); small_linear kernels on this CPU: %s (default: %s)\n",
              ws.size(), mb, a.threads, names.empty() ? "none" : names.c_str(),
              ac::model::small_linear_isa().empty() ? "none" : ac::model::small_linear_isa().c_str());
  if (isas.empty()) return 0;
  std::printf("| rows | BLAS linear ms | ");
  for (const auto& i : isas) std::printf("%s ms | ratio | ", i.c_str());
  std::printf("max error vs fp64: BLAS | ");
  for (const auto& i : isas) std::printf("%s | ", i.c_str());
  std::printf("\n|---|---|");
  for (size_t i = 0; i < isas.size(); ++i) std::printf("---|---|");
  for (size_t i = 0; i <= isas.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (int64_t M : a.rows) {
    std::vector<torch::Tensor> xs;  // one input per width (K)
    auto input = [&](int64_t K) {
      for (auto& x : xs)
        if (x.size(1) == K) return x;
      xs.push_back(torch::randn({M, K}));
      return xs.back();
    };
    auto pass = [&](const std::string& isa) {  // "" = BLAS
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& w : ws) {
        auto x = input(w.size(1));
        auto y = isa.empty() ? torch::nn::functional::linear(x, w) : ac::model::small_linear(x, w, isa);
      }
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    std::vector<double> best(isas.size() + 1, 1e300);
    for (int r = 0; r < a.reps; ++r)
      for (size_t v = 0; v <= isas.size(); ++v) best[v] = std::min(best[v], pass(v == 0 ? "" : isas[v - 1]));
    std::vector<double> err(isas.size() + 1, 0);
    for (size_t i = 0; i < ws.size(); i += 7) {  // one weight of each shape kind is enough
      auto x = input(ws[i].size(1));
      auto ref = torch::nn::functional::linear(x.to(torch::kFloat64), ws[i].to(torch::kFloat64));
      for (size_t v = 0; v <= isas.size(); ++v) {
        auto y = v == 0 ? torch::nn::functional::linear(x, ws[i]) : ac::model::small_linear(x, ws[i], isas[v - 1]);
        err[v] = std::max(err[v], (y.to(torch::kFloat64) - ref).abs().max().item<double>());
      }
    }
    std::printf("| %lld | %.1f | ", (long long)M, best[0]);
    for (size_t v = 1; v <= isas.size(); ++v) std::printf("%.1f | **%.2f** | ", best[v], best[0] / best[v]);
    for (size_t v = 0; v <= isas.size(); ++v) std::printf("%.1e | ", err[v]);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

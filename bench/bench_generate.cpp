// bench_generate: the local engine's decode (eval::generate_static_batch, what `autocompress
// scorecard` measures) and a plain forward of one checkpoint. bench/bench_generate.py runs this,
// `autocompress eval` and Hugging Face transformers on the same teacher, prompts, threads and
// dtype in one run, and prints the ratios.
//
//   bench_generate --model CKPT --prompts FILE.json --concurrency C --new-tokens N
//                  [--threads 1] [--rounds 3] [--dtype f32] [--clock wall|cpu]
//     FILE.json: {"prompts": [[ids...], ...]} (one length; the first C are served as one
//     static batch). Prints one JSON line: decode tokens/s (batched decode steps only, the
//     best of the rounds), end-to-end output tokens/s, the greedy ids.
//   bench_generate --model CKPT --forward --seq L [--batch 1] [--iters 8] [--threads 1]
//     The plain forward: logits of every position of [batch, L] random ids, tokens/s (best of
//     --rounds).
// --clock cpu times with the process's CPU time (std::clock: all threads) instead of the wall
// clock: on a machine shared with other work it counts this process's work, not its share.
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/communicator.h"
#include "dist/omp_env.h"
#include "eval/generate.h"
#include "model/model.h"

using namespace ac;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
int usage(const std::string& why) {
  std::cerr << "bench_generate: error: " << why
            << "\nusage: bench_generate --model CKPT (--prompts FILE.json --concurrency C --new-tokens N | --forward --seq L "
               "[--batch B] [--iters K]) [--threads T] [--rounds R] [--dtype f32|bf16] [--clock wall|cpu]\n";
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  dist::default_omp_wait(argc, argv);  // as the autocompress launcher does
  dist::default_flush_denormals();
  std::map<std::string, std::string> a = {{"--threads", "1"}, {"--rounds", "3"}, {"--dtype", "f32"},
                                          {"--batch", "1"},   {"--iters", "8"},  {"--concurrency", "1"},
                                          {"--clock", "wall"}};
  bool forward = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--forward") {
      forward = true;
    } else if (i + 1 < argc && k.rfind("--", 0) == 0) {
      a[k] = argv[++i];
    } else {
      return usage("unexpected argument '" + k + "'");
    }
  }
  if (!a.count("--model")) return usage("--model is required");
  if (!forward && (!a.count("--prompts") || !a.count("--new-tokens")))
    return usage("--prompts and --new-tokens are required (or --forward --seq L)");
  if (forward && !a.count("--seq")) return usage("--forward needs --seq");
  if (a["--clock"] != "wall" && a["--clock"] != "cpu") return usage("--clock: '" + a["--clock"] + "': wall or cpu");
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    dist::set_compute_threads(std::stoi(a["--threads"]));
    const std::string path = checkpoint::resolve_checkpoint(a["--model"]);
    checkpoint::CheckpointReader reader(path);
    const model::ArchSpec spec = checkpoint::checkpoint_arch(reader);
    model::CausalLM m(spec, model::TpGroup{dist::make_self_communicator()},
                      model::ModelOptions{checkpoint::parse_dtype(a["--dtype"])});
    checkpoint::load_model(m, reader);
    m->eval();
    torch::NoGradGuard ng;
    const auto wall0 = std::chrono::steady_clock::now();
    const bool cpu_clock = a["--clock"] == "cpu";
    const std::function<double()> clock = [&]() -> double {
      return cpu_clock ? double(std::clock()) / CLOCKS_PER_SEC : seconds_since(wall0);
    };
    const int rounds = std::max(1, std::stoi(a["--rounds"]));
    nlohmann::json j = {{"model", path}, {"threads", std::stoi(a["--threads"])}, {"dtype", a["--dtype"]},
                        {"rounds", rounds}, {"clock", a["--clock"]}};
    if (forward) {
      const int64_t B = std::stoll(a["--batch"]), T = std::stoll(a["--seq"]);
      const int iters = std::max(1, std::stoi(a["--iters"]));
      torch::manual_seed(0);
      torch::Tensor ids = torch::randint(0, spec.vocab_size, {B, T});
      m->forward(ids);  // warm-up
      double best = 1e30, checksum = 0;
      for (int r = 0; r < rounds; ++r) {
        const double t0 = clock();
        for (int i = 0; i < iters; ++i) checksum = m->forward(ids).to(torch::kFloat32).sum().item<double>();
        best = std::min(best, (clock() - t0) / iters);
      }
      j.update({{"mode", "forward"}, {"batch", B}, {"seq", T}, {"iters", iters},
                {"forward_tokens_per_s", double(B * T) / best}, {"checksum", checksum}});
    } else {
      std::ifstream in(a["--prompts"]);
      if (!in) throw std::runtime_error(a["--prompts"] + ": cannot open");
      const nlohmann::json pj = nlohmann::json::parse(in);
      const auto all = pj.at("prompts").get<std::vector<std::vector<int64_t>>>();
      const size_t C = std::stoul(a["--concurrency"]);
      const int64_t N = std::stoll(a["--new-tokens"]);
      if (C == 0 || C > all.size()) throw std::runtime_error("--concurrency " + std::to_string(C) + ": the prompts file has " +
                                                             std::to_string(all.size()) + " prompts");
      if (N < 2) throw std::runtime_error("--new-tokens must be at least 2 (decode steps follow the first token)");
      const std::vector<std::vector<int64_t>> prompts(all.begin(), all.begin() + long(C));
      const std::vector<int64_t> lengths(C, N);
      (void)eval::generate_static_batch(m, prompts, std::vector<int64_t>(C, 4));  // warm-up
      double best_decode = 0, best_e2e = 0, best_prefill = 1e30;
      std::vector<std::vector<int64_t>> ids;
      for (int r = 0; r < rounds; ++r) {
        const eval::BatchTimings t = eval::generate_static_batch(m, prompts, lengths, clock);
        double step_s = 0, step_tokens = 0, prefill = 0;
        for (size_t s = 0; s < t.step_s.size(); ++s) step_s += t.step_s[s], step_tokens += double(t.step_rows[s]);
        for (double x : t.ttft_s) prefill += x;
        best_decode = std::max(best_decode, step_tokens / step_s);
        best_e2e = std::max(best_e2e, double(C * size_t(N)) / t.seconds);
        best_prefill = std::min(best_prefill, prefill);
        ids = t.ids;
      }
      j.update({{"mode", "decode"}, {"concurrency", C}, {"prompt_tokens", prompts[0].size()}, {"new_tokens", N},
                {"decode_tokens_per_s", best_decode}, {"e2e_tokens_per_s", best_e2e}, {"prefill_s", best_prefill},
                {"ids", ids}});
    }
    std::cout << j.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "bench_generate: error: " << e.what() << "\n";
    rc = 2;
  }
  MPI_Finalize();
  return rc;
}

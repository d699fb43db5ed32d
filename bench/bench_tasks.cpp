// bench_tasks: scored tokens per second of the zero-shot benchmark scorer (eval/loglikelihood.h,
// what `autocompress eval --tasks` runs) against the plain forward over the same token
// sequences, in one run. bench/bench_tasks.py runs this and transformers on the same requests
// and threads and prints every ratio.
//
//   bench_tasks --model CKPT --tokenizer tokenizer.json --tasks-dir DIR --tasks a,b --limit N
//               [--threads 1] [--rounds 2] [--dtype f32] [--batch-tokens 4096] [--requests OUT.json]
//
// The same requests (lm-eval's context / continuation split) are scored three ways, each the
// best of --rounds by the wall clock:
//   shared   score_loglikelihood with shared contexts (a document's context runs once, its KV /
//            Mamba state reused by each choice): `eval --tasks`;
//   separate score_loglikelihood, each request's context + continuation on its own (batched by
//            length, the vocabulary projection only at continuation positions);
//   plain    the plain forward: each request's tokens batched by length (the same batches as
//            `separate`), logits at every position, log-softmax, the continuation's gathered.
// Scored tokens: the context + continuation tokens of every request (the same numerator for all
// three). --requests writes the encoded requests (for transformers in bench_tasks.py).
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "data/bpe_tokenizer.h"
#include "dist/communicator.h"
#include "dist/omp_env.h"
#include "eval/loglikelihood.h"
#include "eval/tasks.h"
#include "model/model.h"

using namespace ac;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The plain forward: requests sorted by length, right-padded batches of up to `batch_tokens`
// padded tokens, full logits, log-softmax at every position; returns the sum of the
// continuations' log-probs (a checksum against the scorer's).
double plain_forward(model::CausalLM& m, const std::vector<eval::EncodedRequest>& reqs, int64_t batch_tokens) {
  std::vector<size_t> order(reqs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto len = [&](size_t i) { return int64_t(reqs[i].context.size() + reqs[i].continuation.size()) - 1; };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return len(a) > len(b); });
  double total = 0;
  for (size_t s = 0; s < order.size();) {
    const int64_t L = len(order[s]);
    size_t e = s + 1;
    while (e < order.size() && int64_t(e - s + 1) * L <= batch_tokens) ++e;
    torch::Tensor ids = torch::zeros({int64_t(e - s), L}, torch::kLong);
    for (size_t r = s; r < e; ++r) {
      std::vector<int64_t> all = reqs[order[r]].context;
      all.insert(all.end(), reqs[order[r]].continuation.begin(), reqs[order[r]].continuation.end());
      all.pop_back();
      ids[int64_t(r - s)].narrow(0, 0, int64_t(all.size())).copy_(torch::tensor(all, torch::kLong));
    }
    torch::Tensor lp = torch::log_softmax(m->forward(ids).to(torch::kFloat32), -1);
    for (size_t r = s; r < e; ++r) {
      const auto& q = reqs[order[r]];
      const int64_t c = int64_t(q.context.size()), k = int64_t(q.continuation.size());
      torch::Tensor tgt = torch::tensor(q.continuation, torch::kLong);
      total += lp[int64_t(r - s)].narrow(0, c - 1, k).gather(1, tgt.unsqueeze(1)).sum().item<double>();
    }
    s = e;
  }
  return total;
}

int usage(const std::string& why) {
  std::cerr << "bench_tasks: error: " << why
            << "\nusage: bench_tasks --model CKPT --tokenizer FILE --tasks-dir DIR --tasks a,b --limit N [--threads 1] "
               "[--rounds 2] [--dtype f32] [--batch-tokens 4096] [--requests OUT.json]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  dist::default_omp_wait(argc, argv);
  dist::default_flush_denormals();
  std::map<std::string, std::string> a = {{"--threads", "1"}, {"--rounds", "2"}, {"--dtype", "f32"},
                                          {"--batch-tokens", "4096"}, {"--limit", "20"}};
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  for (const char* k : {"--model", "--tokenizer", "--tasks-dir", "--tasks"})
    if (!a.count(k)) return usage(std::string(k) + " is required");
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
    const auto tok = data::BpeTokenizer::from_file(a["--tokenizer"]);
    const int64_t eot = *tok->default_eos_id();
    std::vector<eval::EncodedRequest> reqs;
    nlohmann::json out_reqs = nlohmann::json::array();
    int64_t scored = 0;
    for (const auto& name : eval::expand_task_list(a["--tasks"])) {
      const eval::Task t = eval::load_task(a["--tasks-dir"], name, "rc_0shot", std::stoll(a["--limit"]));
      for (const auto& q : t.requests) {
        reqs.push_back(eval::encode_request([&](std::string_view s) { return tok->encode(s); }, q.context,
                                            q.continuation, eot));
        scored += int64_t(reqs.back().context.size() + reqs.back().continuation.size());
        out_reqs.push_back({{"task", name}, {"doc_id", q.doc_id}, {"choice", q.choice},
                            {"context", reqs.back().context}, {"continuation", reqs.back().continuation}});
      }
    }
    if (a.count("--requests")) std::ofstream(a["--requests"]) << nlohmann::json{{"requests", out_reqs}}.dump() << "\n";
    const int rounds = std::max(1, std::stoi(a["--rounds"]));
    eval::LoglikelihoodOptions opt;
    opt.max_length = spec.max_position_embeddings;
    opt.batch_tokens = std::stoll(a["--batch-tokens"]);
    nlohmann::json j = {{"model", path}, {"threads", std::stoi(a["--threads"])}, {"dtype", a["--dtype"]}, {"rounds", rounds},
                        {"requests", reqs.size()}, {"scored_tokens", scored}, {"batch_tokens", opt.batch_tokens}};
    auto best_of = [&](const std::function<double()>& run, double* checksum) {
      double best = 1e30;
      for (int r = 0; r < rounds; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        *checksum = run();
        best = std::min(best, seconds_since(t0));
      }
      return best;
    };
    auto scorer = [&](bool shared) {
      opt.shared_context = shared;
      double sum = 0;
      for (const auto& s : eval::score_loglikelihood(m, reqs, opt)) sum += s.logprob;
      return sum;
    };
    double cs_shared = 0, cs_sep = 0, cs_plain = 0;
    const double t_shared = best_of([&] { return scorer(true); }, &cs_shared);
    const double t_sep = best_of([&] { return scorer(false); }, &cs_sep);
    const double t_plain = best_of([&] { return plain_forward(m, reqs, opt.batch_tokens); }, &cs_plain);
    j["seconds"] = {{"shared", t_shared}, {"separate", t_sep}, {"plain", t_plain}};
    j["tokens_per_second"] = {{"shared", double(scored) / t_shared}, {"separate", double(scored) / t_sep},
                              {"plain", double(scored) / t_plain}};
    j["logprob_sum"] = {{"shared", cs_shared}, {"separate", cs_sep}, {"plain", cs_plain}};
    j["ratio_shared_vs_plain"] = t_plain / t_shared;
    j["ratio_separate_vs_plain"] = t_plain / t_sep;
    std::cout << j.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "bench_tasks: error: " << e.what() << "\n";
    rc = 2;
  }
  MPI_Finalize();
  return rc;
}

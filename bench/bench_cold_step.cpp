// Does the way a cold decode step is timed change its time (issue 37, the fp32 decode B=1 lean)?
// One model, one process, by the calibration's clock (process CPU time, one thread), each step
// after evict_cpu_caches(), four ways per round, their order rotating from round to round:
//   in turn      the twenty-first to twenty-eighth sessions' calibration (the baseline): ColdStep
//                (a copy of one 8-token cache, the same token, the copy dropped inside the timed
//                span), call by call in turn with a second model (ARCH2)
//   alone        the same, the one model only (`ColdStep::time`: the calibration since, and the
//                speed reference's probe)
//   validation   a prefill of 8 tokens, then 16 steps on the growing cache
//   warm         `cost validate`'s whole sequence: an untimed prefill and 16 untimed steps, three
//                prefills, then the 16 timed steps
// each the median of its calls, and each over the in-turn one; then K instances of the model
// (alternately weight seed 1 and 1234) in turn: how far one model's copies differ.
//
//   bench_cold_step ARCH.json ARCH2.json DTYPE [ROUNDS=6] [INSTANCES=6]
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/convert.h"
#include "dist/omp_env.h"
#include "dist/tensor_memory.h"
#include "model/arch_spec.h"
#include "model/model.h"
#include "search/costmodel/calibrate.h"

namespace {

using ac::model::CausalLM;
using ac::model::InferenceCache;
using ac::search::median;

struct Bench {
  ac::model::ArchSpec spec, spec2;
  std::string dtype;
  ac::search::Stopwatch clock{true};
  torch::Tensor tok;

  CausalLM build(const ac::model::ArchSpec& s, uint64_t seed) const {
    CausalLM m(s, ac::model::TpGroup{}, ac::model::ModelOptions(ac::checkpoint::parse_dtype(dtype)));
    m->init_weights(seed);
    m->eval();
    return m;
  }
  InferenceCache filled(CausalLM& m) const {
    InferenceCache c;
    (void)m->forward(torch::randint(0, spec.vocab_size, {1, 8}, torch::kLong), &c);
    return c;
  }
  // The calibration's cold step: a copy of `f`, one step, the copy dropped, all timed.
  double cold_step(CausalLM& m, const InferenceCache& f) const {
    ac::search::evict_cpu_caches();
    const double a = clock.now();
    {
      InferenceCache c = f;
      (void)m->forward(tok, &c);
    }
    return clock.now() - a;
  }
  // Validation's decode: a prefill of 8 tokens, then 16 timed steps on the growing cache. `warm`:
  // `cost validate`'s whole sequence (measure_case), an untimed prefill and 16 untimed steps and
  // two more prefills first, the timed steps then on the third prefill's cache.
  double validation_steps(CausalLM& m, bool warm) const {
    const auto ids = torch::randint(0, spec.vocab_size, {1, 8}, torch::kLong);
    const auto toks = torch::randint(0, spec.vocab_size, {16, 1, 1}, torch::kLong);
    InferenceCache cache;
    auto prefill = [&] {
      cache = m->new_cache();
      ac::search::evict_cpu_caches();
      (void)m->logits_local(m->hidden_states(ids, &cache).slice(1, 7, 8));
    };
    if (warm) {
      prefill();
      for (int64_t s = 0; s < 16; ++s) ac::search::evict_cpu_caches(), (void)m->forward(toks[s], &cache);
      prefill(), prefill();
    }
    prefill();
    std::vector<double> t;
    for (int64_t s = 0; s < 16; ++s) {
      ac::search::evict_cpu_caches();
      const double a = clock.now();
      (void)m->forward(toks[s], &cache);
      t.push_back(clock.now() - a);
    }
    return median(t);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: bench_cold_step ARCH.json ARCH2.json DTYPE [ROUNDS=6] [INSTANCES=6]\n");
    return 2;
  }
  ac::dist::default_omp_wait(argc, argv);
  ac::dist::default_flush_denormals();
  ac::dist::set_compute_threads(1);
  ac::dist::tensor_memory::install(1);
  torch::NoGradGuard no_grad;
  Bench b{ac::model::load_arch(argv[1]), ac::model::load_arch(argv[2]), argv[3], {true}, {}};
  b.spec.dtype = b.spec2.dtype = b.dtype;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 6, instances = argc > 5 ? std::atoi(argv[5]) : 6;
  b.tok = torch::randint(0, b.spec.vocab_size, {1, 1}, torch::kLong);
  CausalLM m = b.build(b.spec, 1), m2 = b.build(b.spec2, 1);
  const InferenceCache f = b.filled(m), f2 = b.filled(m2);
  constexpr int kCalls = 9;
  // The four ways, in an order that rotates from round to round (a trend within a round, e.g.
  // a speed state changing, then falls on each way alike).
  auto turn = [&] {
    std::vector<double> t;
    for (int i = 0; i <= kCalls; ++i) {
      const double s = b.cold_step(m, f);
      (void)b.cold_step(m2, f2);
      if (i > 0) t.push_back(s);
    }
    return median(t);
  };
  auto alone = [&] {
    std::vector<double> t;
    for (int i = 0; i <= kCalls; ++i)
      if (const double s = b.cold_step(m, f); i > 0) t.push_back(s);
    return median(t);
  };
  const std::vector<std::function<double()>> ways = {turn, alone, [&] { return b.validation_steps(m, false); },
                                                     [&] { return b.validation_steps(m, true); }};
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> t(ways.size());
    for (size_t k = 0; k < ways.size(); ++k) {
      const size_t w = (k + size_t(r)) % ways.size();
      t[w] = ways[w]();
    }
    std::printf("round %d  in turn %.3f ms  alone %.3f ms  validation %.3f ms  warm %.3f ms  / in turn: "
                "alone %.2f  validation %.2f  warm %.2f\n", r, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3, t[3] * 1e3,
                t[1] / t[0], t[2] / t[0], t[3] / t[0]);
    std::fflush(stdout);
  }
  std::vector<CausalLM> ms;
  std::vector<InferenceCache> fs;
  for (int k = 0; k < instances; ++k) ms.push_back(b.build(b.spec, k % 2 ? 1234 : 1)), fs.push_back(b.filled(ms.back()));
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::vector<double>> t(static_cast<size_t>(instances));
    for (int i = 0; i <= 2 * kCalls; ++i)
      for (int k = 0; k < instances; ++k)
        if (const double s = b.cold_step(ms[size_t(k)], fs[size_t(k)]); i > 0) t[size_t(k)].push_back(s);
    std::printf("round %d  instances (seed 1, 1234, ...):", r);
    for (auto& v : t) std::printf(" %.3f", median(v) * 1e3);
    std::printf(" ms\n");
    std::fflush(stdout);
  }
  return 0;
}

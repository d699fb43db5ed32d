// bench_model: forward and forward+backward tokens/s of CausalLM on a Hugging Face
// checkpoint directory (config.json + safetensors). bench/bench_model.py runs this and
// PyTorch eager on the same weights, threads and input, and prints the ratio.
//
//   bench_model --model DIR [--dtype float32|bfloat16] [--batch 2] [--seq 256]
//               [--threads 1] [--iters 5] [--warmup 1] [--ids FILE.safetensors]
//               [--profile TRACE.json]   (one extra fwd+bwd step under the autograd profiler)
// Prints one JSON line: {"fwd_tokens_per_s": ..., "fwdbwd_tokens_per_s": ..., ...}.
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/error.h"
#include "dist/omp_env.h"
#include "model/arch_spec.h"
#include "model/hf_import.h"

using namespace ac::model;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  ac::dist::default_omp_wait(argc, argv);  // as the autocompress launcher does
  ac::dist::default_flush_denormals();
  std::map<std::string, std::string> a = {{"--dtype", "float32"}, {"--batch", "2"}, {"--seq", "256"},
                                          {"--threads", "1"},      {"--iters", "5"},  {"--warmup", "1"}};
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  if (!a.count("--model")) {
    std::cerr << "usage: bench_model --model DIR [--dtype float32|bfloat16] [--batch B] [--seq T] "
                 "[--threads N] [--iters N] [--warmup N] [--ids FILE] [--profile TRACE.json]\n";
    return 2;
  }
  try {
    ac::dist::set_compute_threads(std::stoi(a["--threads"]));
    const std::string dir = a["--model"];
    ArchSpec spec = load_arch(dir + "/config.json");
    const auto dtype = a["--dtype"] == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
    CausalLM model(spec, TpGroup{}, ModelOptions{dtype});
    load_hf_weights(model, SafetensorsReader(dir));
    const int64_t B = std::stoll(a["--batch"]), T = std::stoll(a["--seq"]);
    torch::Tensor ids;
    if (a.count("--ids")) {
      ids = SafetensorsReader(a["--ids"]).read("input_ids");
    } else {
      torch::manual_seed(0);
      ids = torch::randint(0, spec.vocab_size, {B, T});
    }
    const int iters = std::stoi(a["--iters"]), warmup = std::stoi(a["--warmup"]);
    const double tokens = double(ids.numel());
    double fwd = 0, fwdbwd = 0, checksum = 0;
    {
      torch::NoGradGuard ng;
      for (int i = 0; i < warmup; ++i) model->forward(ids);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) checksum = model->forward(ids).to(torch::kFloat32).sum().item<double>();
      fwd = seconds_since(t0) / iters;
    }
    auto step = [&] {
      auto logits = model->forward(ids);
      auto loss = torch::nn::functional::cross_entropy(
          logits.reshape({-1, spec.vocab_size}).to(torch::kFloat32), ids.reshape({-1}));
      loss.backward();
      model->zero_grad(/*set_to_none=*/true);  // as the PyTorch side (and the trainer) do
    };
    for (int i = 0; i < warmup; ++i) step();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) step();
    fwdbwd = seconds_since(t0) / iters;
    if (a.count("--profile")) {  // one more fwd+bwd step under the autograd profiler (chrome trace)
      torch::autograd::profiler::RecordProfile guard(a["--profile"]);
      step();
    }
    nlohmann::json out = {{"impl", "autocompress"},
                          {"dtype", a["--dtype"]},
                          {"threads", torch::get_num_threads()},
                          {"omp_wait", ac::dist::omp_wait_setting()},
                          {"tokens", tokens},
                          {"params", model->logical_parameter_count()},
                          {"fwd_s", fwd},
                          {"fwdbwd_s", fwdbwd},
                          {"fwd_tokens_per_s", tokens / fwd},
                          {"fwdbwd_tokens_per_s", tokens / fwdbwd},
                          {"logits_sum", checksum}};
    std::cout << out.dump() << std::endl;
    return 0;
  } catch (const ac::InputError& e) {
    std::cerr << "bench_model: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bench_model: " << e.what() << "\n";
    return 1;
  }
}

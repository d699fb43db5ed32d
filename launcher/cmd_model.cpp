// `autocompress model info`: an architecture (ArchSpec JSON or Hugging Face config.json) as a
// per-layer table with kinds, dimensions, total and active parameters, and FLOPs per token.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/error.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "model/arch_spec.h"

namespace ac::launcher {
namespace {

std::string dims(const model::LayerSpec& l) {
  std::ostringstream o;
  if (const auto& m = l.mamba)
    o << "mamba " << m->num_heads << "x" << m->head_dim << " N" << m->state_size << " G" << m->n_groups << " K"
      << m->conv_kernel << "  ";
  if (const auto& a = l.attention) o << "attn " << a->num_heads << "q/" << a->num_kv_heads << "kv x" << a->head_dim << "  ";
  if (const auto& m = l.mlp) o << "mlp " << m->ffn_size << " " << model::to_string(m->activation) << "  ";
  if (const auto& m = l.moe) {
    o << "moe " << m->num_experts << "e top" << m->top_k << " ffn" << m->expert_ffn;
    if (m->shared_ffn) o << " shared" << m->shared_ffn;
    if (m->latent_size) o << " latent" << m->latent_size;
    o << "  ";
  }
  std::string s = o.str();
  return s.empty() ? "(skipped)" : s.substr(0, s.size() - 2);
}

std::string billions(double n) {
  char b[32];
  std::snprintf(b, sizeof b, n >= 1e9 ? "%.3fB" : "%.2fM", n >= 1e9 ? n / 1e9 : n / 1e6);
  return b;
}

int run_model_info(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  if (!vm.count("arch")) throw InputError("autocompress model info: give the architecture: --arch FILE (see --help)");
  const std::string path = vm["arch"].as<std::string>();
  const model::ArchSpec s = model::load_arch(path);
  const model::ParamCounts c = model::count_params(s);
  const int64_t seq = vm["seq-len"].as<int64_t>();
  if (seq <= 0) throw InputError("--seq-len", std::to_string(seq), "must be positive");
  if (vm["json"].as<bool>()) {
    nlohmann::json layers = nlohmann::json::array();
    for (size_t i = 0; i < s.layers.size(); ++i)
      layers.push_back({{"index", i},
                        {"kind", model::layer_kind(s.layers[i])},
                        {"dims", dims(s.layers[i])},
                        {"params", c.layers[i].total()},
                        {"active_params", c.layers[i].active()}});
    nlohmann::json j = {{"file", path},
                        {"arch", model::arch_to_json(s)},
                        {"params",
                         {{"total", c.total()},
                          {"active", c.active()},
                          {"embedding", c.embedding},
                          {"head", c.head},
                          {"mtp", c.mtp},
                          {"total_with_mtp", c.total_with_mtp()}}},
                        {"flops_per_token",
                         {{"seq_len", seq},
                          {"prefill", model::prefill_flops_per_token(s, seq)},
                          {"decode", model::decode_flops_per_token(s, seq)}}},
                        {"layers", layers}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf("%s: %s (%s), %zu layers, hidden %lld, vocab %lld, %s%s\n", path.c_str(),
              s.name.empty() ? "(unnamed)" : s.name.c_str(), model::to_string(s.family).c_str(), s.layers.size(),
              (long long)s.hidden_size, (long long)s.vocab_size, s.dtype.c_str(),
              s.tie_embeddings ? ", tied embeddings" : "");
  std::printf("  layer kind  %-58s %12s %12s\n", "dimensions", "params", "active");
  for (size_t i = 0; i < s.layers.size(); ++i)
    std::printf("  %5zu %-4s  %-58s %12s %12s\n", i, model::layer_kind(s.layers[i]).c_str(), dims(s.layers[i]).c_str(),
                billions(double(c.layers[i].total())).c_str(), billions(double(c.layers[i].active())).c_str());
  std::printf("  embedding %s, LM head %s\n", billions(double(c.embedding)).c_str(),
              c.head ? billions(double(c.head)).c_str() : "tied");
  std::printf("  total %s, active per token %s", billions(double(c.total())).c_str(), billions(double(c.active())).c_str());
  if (s.mtp.num_predict_layers > 0)
    std::printf("; MTP %s (total with MTP %s)", billions(double(c.mtp)).c_str(), billions(double(c.total_with_mtp())).c_str());
  std::printf("\n  FLOPs per token at %lld tokens: prefill %.2f GFLOP, decode %.2f GFLOP\n", (long long)seq,
              model::prefill_flops_per_token(s, seq) / 1e9, model::decode_flops_per_token(s, seq) / 1e9);
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "model info", "per-layer table of an architecture (ArchSpec JSON or Hugging Face config.json) with parameter counts",
    [](po::options_description& d) {
      d.add_options()("arch", po::value<std::string>()->value_name("FILE"),
                      "ArchSpec JSON or Hugging Face config.json (also the first positional argument)")(
          "seq-len", po::value<int64_t>()->default_value(4096), "sequence length for the FLOPs per token")(
          "json", po::bool_switch(), "print JSON");
    },
    run_model_info, [](po::positional_options_description& p) { p.add("arch", 1); }}));

}  // namespace
}  // namespace ac::launcher

// `autocompress generate`: text from a checkpoint, decoded with the model's KV cache
// (eval/generate.h), greedy or sampled, optionally wrapped in the ChatML chat template.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "checkpoint/checksum_policy.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "data/bpe_tokenizer.h"
#include "dist/communicator.h"
#include "dist/cpu_features.h"
#include "dist/device.h"
#include "dist/error.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "launcher/config_file.h"
#include "launcher/tokenizer_arg.h"
#include "eval/generate.h"

namespace ac::launcher {
namespace fs = std::filesystem;
namespace {


// The tokenizer that belongs to a checkpoint: --tokenizer, else tokenizer.json beside it or
// in its hf/ folder (the layout scripts/teacher_smollm2.sh writes).
std::string find_tokenizer(const std::string& model, const po::variables_map& vm) {
  if (vm.count("tokenizer")) return vm["tokenizer"].as<std::string>();
  if (std::string p = tokenizer_beside(model); !p.empty()) return p;
  throw InputError(model, "--tokenizer", "no tokenizer.json beside the checkpoint or in its hf/ folder: pass --tokenizer");
}

// The system message a ChatML template puts first when the conversation has none (SmolLM2's
// does), read from tokenizer_config.json's chat_template beside the tokenizer.
std::string default_system(const std::string& tokenizer_path) {
  std::ifstream f(fs::path(tokenizer_path).parent_path() / "tokenizer_config.json");
  if (!f) return "";
  try {
    const auto j = nlohmann::json::parse(f);
    const std::string t = j.value("chat_template", std::string());
    std::smatch m;
    if (std::regex_search(t, m, std::regex("<\\|im_start\\|>system\\n([^<']*)<\\|im_end\\|>"))) return m[1].str();
  } catch (const std::exception&) {
  }
  return "";
}

int run_generate(const po::variables_map& vm, RunContext& ctx) {
  checkpoint::set_load_checksums(!vm["skip-checksums"].as<bool>());
  const std::string model_arg = vm["model"].as<std::string>();
  if (!fs::exists(model_arg))
    throw InputError(model_arg, "--model", "no such checkpoint" + std::string(vm["model"].defaulted()
                                                                      ? " (the default teacher: make it with scripts/teacher_smollm2.sh)"
                                                                      : ""));
  const std::string tok_path = find_tokenizer(model_arg, vm);
  auto tok = data::BpeTokenizer::from_file(tok_path);

  std::string text = vm["prompt"].as<std::string>();
  for (const char* opt : {"prompt", "system"})
    if (vm.count(opt))
      if (const size_t at = data::find_invalid_utf8(vm[opt].as<std::string>()); at != std::string::npos)
        throw InputError("command line", std::string("--") + opt, "invalid UTF-8 at byte " + std::to_string(at));
  const bool chat = vm["chat"].as<bool>();
  if (chat) {
    if (!tok->token_to_id("<|im_start|>") || !tok->token_to_id("<|im_end|>"))
      throw InputError(tok_path, "added_tokens", "has no <|im_start|>/<|im_end|>: --chat needs a ChatML tokenizer");
    const std::string system = vm.count("system") ? vm["system"].as<std::string>() : default_system(tok_path);
    std::string t;
    if (!system.empty()) t += "<|im_start|>system\n" + system + "<|im_end|>\n";
    text = t + "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n";
  }
  const std::vector<int64_t> prompt = tok->encode(text);

  const std::string path = checkpoint::resolve_checkpoint(model_arg);
  checkpoint::CheckpointReader reader(path);
  const model::ArchSpec spec = checkpoint::checkpoint_arch(reader);
  if (tok->vocab_size() > spec.vocab_size)
    throw InputError(tok_path, "model.vocab", "has " + std::to_string(tok->vocab_size()) + " ids, the model " + path +
                                                  " only " + std::to_string(spec.vocab_size));
  const dist::DeviceChoice dev = dist::choose_device(vm["device"].as<std::string>(), ctx.runtime.local_rank());
  dist::apply_tf32_policy(dev);
  const dist::DtypeChoice dt = dist::choose_dtype(vm["dtype"].as<std::string>(), dev.cuda);
  // Every rank runs the whole model (generation is one sequence; TP decode is not worth it here).
  model::CausalLM m(spec, model::TpGroup{dist::make_self_communicator()},
                    model::ModelOptions{checkpoint::parse_dtype(dt.dtype)});
  checkpoint::load_model(m, reader);
  m->to(dev.torch_device());
  m->eval();

  eval::SamplingOptions o;
  o.max_new_tokens = vm["max-new-tokens"].as<int64_t>();
  o.temperature = vm["greedy"].as<bool>() ? 0.0 : vm["temperature"].as<double>();
  o.top_p = vm["top-p"].as<double>();
  o.seed = vm["seed"].as<uint64_t>();
  if (o.max_new_tokens <= 0) throw InputError("command line", "--max-new-tokens", "must be positive");
  if (auto e = tok->default_eos_id()) o.stop_ids.push_back(*e);
  if (auto e = tok->token_to_id("<|im_end|>")) o.stop_ids.push_back(*e);

  const bool root = ctx.runtime.is_root(), json_out = vm["json"].as<bool>();
  // Stream the text as it comes: decode the ids so far and print what is new (a multi-byte
  // character may need two tokens, so print only up to the last complete UTF-8 sequence).
  std::vector<int64_t> so_far;
  size_t printed = 0;
  if (root && !json_out) std::cout << text << std::flush;
  const auto r = eval::generate(m, prompt, o, [&](int64_t id) {
    if (!root || json_out) return;
    so_far.push_back(id);
    const std::string s = tok->decode(so_far);
    const size_t end = std::min(s.size(), data::find_invalid_utf8(s));  // an unfinished character waits
    if (end > printed) std::cout << s.substr(printed, end - printed) << std::flush;
    printed = std::max(printed, end);
  });
  if (!root) return kExitOk;
  const std::string out_text = tok->decode(r.ids);
  const double decode_tps = r.ids.size() > 1 ? double(r.ids.size() - 1) / r.decode_seconds : 0.0;
  nlohmann::json j = {{"model", path},
                      {"prompt", text},
                      {"prompt_ids", prompt},
                      {"ids", r.ids},
                      {"text", out_text},
                      {"stopped", r.stopped},
                      {"temperature", o.temperature},
                      {"top_p", o.top_p},
                      {"seed", o.seed},
                      {"dtype", dt.dtype},
                      {"device", dev.device},
                      {"device_reason", dev.reason},
                      {"prefill_seconds", r.prefill_seconds},
                      {"decode_tokens_per_second", decode_tps}};
  if (vm.count("out")) write_json_atomic(vm["out"].as<std::string>(), j, 1);  // the same object as a file
  if (json_out) {
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    if (printed < out_text.size()) std::cout << out_text.substr(printed);
    std::cerr << "\ngenerate: " << prompt.size() << " prompt tokens, " << r.ids.size() << " new ("
              << (r.stopped ? "stop token" : "max-new-tokens") << "), prefill " << std::fixed << std::setprecision(3)
              << r.prefill_seconds << " s, decode " << std::setprecision(1) << decode_tps << " tokens/s, " << dt.dtype
              << (o.temperature > 0 ? ", sampled" : ", greedy") << "\n";
  }
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "generate", "decode text from a checkpoint with its KV cache (greedy or temperature/top-p sampling, chat template)",
    [](po::options_description& d) {
      d.add_options()("model", po::value<std::string>()->default_value(kDefaultTeacher)->value_name("CKPT"),
                      "checkpoint (directory with `latest`, or .h5); default: the teacher from scripts/teacher_smollm2.sh")(
          "prompt", po::value<std::string>()->required()->value_name("TEXT"), "prompt text")(
          "tokenizer", po::value<std::string>()->value_name("FILE"),
          "tokenizer.json (default: beside the checkpoint or in its hf/ folder)")(
          "chat", po::bool_switch(), "wrap the prompt in the ChatML template (<|im_start|>user ... assistant)")(
          "system", po::value<std::string>(), "system message with --chat (default: the template's own, if any)")(
          "max-new-tokens", po::value<int64_t>()->default_value(64), "tokens to generate at most")(
          "greedy", po::bool_switch(), "argmax decoding (same as --temperature 0)")(
          "temperature", po::value<double>()->default_value(0.0), "sampling temperature (0: greedy)")(
          "top-p", po::value<double>()->default_value(1.0), "nucleus sampling mass")(
          "seed", po::value<uint64_t>()->default_value(0), "sampling seed")(
          "dtype", po::value<std::string>()->default_value("auto"), "compute dtype: auto | bf16 | f32")(
          "skip-checksums", po::bool_switch(), "load the checkpoint without checking its stored CRC32s (a damaged file is "
                                                "then read as it is; `checkpoint verify` lists the bad slices)")(
          "device", po::value<std::string>()->default_value("auto"), "auto | cpu | cuda (auto: cuda:<local rank> when there is one)")(
          "json", po::bool_switch(), "print one JSON object (ids, text, timings) instead of the text")(
          "out", po::value<std::string>()->value_name("FILE"), "also write that JSON object to FILE");
    },
    run_generate}));

}  // namespace
}  // namespace ac::launcher

// `autocompress data ...`: preprocess text into token files, inspect token files, and
// draw DP-sharded samples with a resumable cursor (what the trainer's data loader does).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/hdf5_store.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/sampler.h"
#include "dist/error.h"
#include "dist/file_io.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "launcher/config_file.h"

namespace ac::launcher {
namespace {

std::string mb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MB", bytes / 1e6);
  return b;
}

std::string parent_dir(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

int run_preprocess(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;  // one process tokenizes; use --workers for threads
  data::PreprocessConfig c;
  c.inputs = vm["input"].as<std::vector<std::string>>();
  c.tokenizer_path = vm["tokenizer"].as<std::string>();
  c.output_prefix = vm["output"].as<std::string>();
  refuse_checkpoint_dir(parent_dir(c.output_prefix), "--output", vm["force"].as<bool>());
  const std::string fmt = vm["format"].as<std::string>();
  if (fmt == "megatron") c.format = data::OutputFormat::Megatron;
  else if (fmt == "hdf5") c.format = data::OutputFormat::Hdf5;
  else throw InputError("--format", "value", "\"" + fmt + "\" is not megatron or hdf5");
  c.workers = vm["workers"].as<int>();
  c.json_key = vm["json-key"].as<std::string>();
  if (vm.count("eos-token")) c.eos_token = vm["eos-token"].as<std::string>();
  c.append_eos = !vm["no-eos"].as<bool>();
  if (vm.count("max-doc-tokens")) c.max_document_tokens = vm["max-doc-tokens"].as<int64_t>();
  if (vm.count("dtype")) {
    data::DType t;
    if (!data::dtype_from_name(vm["dtype"].as<std::string>(), &t))
      throw InputError("--dtype", "value", "\"" + vm["dtype"].as<std::string>() + "\" is not a numpy dtype name (uint16, int32, ...)");
    c.dtype = t;
  }
  if (!vm["quiet"].as<bool>()) {
    c.on_progress = [](const data::PreprocessProgress& p) {
      const double rate = p.seconds > 0 ? p.bytes_done / p.seconds : 0;
      const double eta = rate > 0 ? (p.bytes_total - p.bytes_done) / rate : 0;
      std::fprintf(stderr, "preprocess: %s / %s (%.1f%%), %.2f MB/s, %.0f tokens/s, %lld documents, ETA %.0f s\n",
                   mb(p.bytes_done).c_str(), mb(p.bytes_total).c_str(), p.bytes_total ? 100.0 * p.bytes_done / p.bytes_total : 100.0,
                   rate / 1e6, p.seconds > 0 ? p.tokens / p.seconds : 0, static_cast<long long>(p.documents), eta);
    };
  }
  data::PreprocessResult r = data::preprocess(c);
  std::string outs;
  for (const auto& o : r.outputs) outs += (outs.empty() ? "" : ", ") + o;
  std::cout << "wrote " << outs << ": " << r.documents << " documents, " << r.tokens << " tokens (" << data::dtype_name(r.dtype)
            << ")";
  if (r.skipped_empty) std::cout << ", " << r.skipped_empty << " empty documents skipped";
  std::printf(" from %s in %.2f s (%.2f MB/s, %.0f tokens/s, %d worker%s)\n", mb(r.bytes).c_str(), r.seconds,
              r.bytes / 1e6 / std::max(r.seconds, 1e-9), r.tokens / std::max(r.seconds, 1e-9), c.workers, c.workers > 1 ? "s" : "");
  ctx.write_manifest(parent_dir(c.output_prefix), nlohmann::json{{"world_size", ctx.runtime.world_size()}, {"workers", c.workers}});
  return kExitOk;
}

int run_data_inspect(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  const std::string path = vm["path"].as<std::string>();
  auto src = data::open_token_source(path);
  nlohmann::json j{{"path", src->describe()}, {"documents", src->num_documents()}, {"tokens", src->num_tokens()}};
  if (auto* m = dynamic_cast<const data::IndexedDataset*>(src.get())) {
    j["format"] = "megatron";
    j["dtype"] = data::dtype_name(m->dtype());
    j["sequences"] = m->num_sequences();
  } else if (auto* h = dynamic_cast<const data::Hdf5TokenStore*>(src.get())) {
    j["format"] = "hdf5";
    j["dtype"] = data::dtype_name(h->dtype());
  }
  const int64_t show = vm["show"].as<int64_t>();
  nlohmann::json docs = nlohmann::json::array();
  for (int64_t d = 0; d < std::min<int64_t>(show, src->num_documents()); ++d) {
    std::vector<int64_t> v(src->document_length(d));
    src->read(d, 0, v.size(), v.data());
    docs.push_back(v);
  }
  j["first_documents"] = docs;
  if (vm["json"].as<bool>()) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << j["path"].get<std::string>() << ": " << j["format"].get<std::string>() << ", " << j["dtype"].get<std::string>() << ", "
              << j["documents"] << " documents, " << j["tokens"] << " tokens\n";
    for (size_t d = 0; d < docs.size(); ++d) std::cout << "  document " << d << ": " << docs[d].dump() << "\n";
  }
  return kExitOk;
}

int run_sample(const po::variables_map& vm, RunContext& ctx) {
  {
    const int dp = vm["dp-size"].as<int>();
    const int64_t mbs = vm["micro-batch-size"].as<int64_t>(), steps = vm["steps"].as<int64_t>();
    if (dp < 1 || dp > 65536) throw InputError("command line", "--dp-size", std::to_string(dp) + " must be in [1, 65536]");
    if (mbs < 1) throw InputError("command line", "--micro-batch-size", std::to_string(mbs) + " must be positive");
    if (steps < 0) throw InputError("command line", "--steps", std::to_string(steps) + " must not be negative");
  }
  std::vector<data::BlendEntry> entries;
  for (const auto& s : vm["data"].as<std::vector<std::string>>()) entries.push_back(data::parse_blend_entry(s));
  auto sampler = std::make_shared<data::BlendedSampler>(entries, vm["seq-len"].as<int64_t>(), vm["seed"].as<uint64_t>(),
                                                        data::parse_split(vm["split"].as<std::string>()),
                                                        data::split_from_name(vm["which"].as<std::string>()));
  data::DataCursor cursor = data::DataCursor::start(*sampler);
  if (vm.count("cursor-in")) {
    const std::string p = vm["cursor-in"].as<std::string>();
    require_regular_file(p, "--cursor-in");
    std::ifstream f(p);
    if (!f) throw InputError(p, "file", "cannot open");
    nlohmann::json j;
    try {
      f >> j;
    } catch (const nlohmann::json::exception& e) {
      throw InputError(p, "json", e.what());
    }
    cursor = data::DataCursor::from_json(j, p);
    cursor.check_matches(*sampler, p);
  }
  const int dp = vm["dp-size"].as<int>();
  const int64_t mbs = vm["micro-batch-size"].as<int64_t>(), steps = vm["steps"].as<int64_t>();
  // Each rank of the job acts as DP rank (world rank % dp); a single process plays all of
  // them in turn, which prints the same global order.
  std::vector<int> ranks;
  if (ctx.runtime.world_size() > 1) ranks = {ctx.runtime.world_rank() % dp};
  else for (int r = 0; r < dp; ++r) ranks.push_back(r);
  std::vector<std::unique_ptr<data::DataLoader>> loaders;
  for (int r : ranks) loaders.push_back(std::make_unique<data::DataLoader>(sampler, data::LoaderConfig{mbs, r, dp}, cursor));
  const bool tokens = vm["tokens"].as<bool>();
  const int64_t row = sampler->seq_len() + 1;
  for (int64_t t = 0; t < steps; ++t) {
    for (size_t k = 0; k < loaders.size(); ++k) {
      auto idx = loaders[k]->next_indices();
      auto batch = loaders[k]->next();
      for (size_t m = 0; m < idx.size(); ++m) {
        auto [d, local] = sampler->locate(idx[m]);
        nlohmann::json line{{"step", t}, {"dp_rank", ranks[k]}, {"sample", idx[m]}, {"dataset", d}, {"dataset_sample", local}};
        if (tokens) line["tokens"] = std::vector<int64_t>(batch.begin() + m * row, batch.begin() + (m + 1) * row);
        std::cout << line.dump() << "\n";
      }
    }
  }
  if (vm.count("cursor-out") && ctx.runtime.is_root()) {
    write_file_atomic(vm["cursor-out"].as<std::string>(), loaders[0]->cursor().to_json().dump(2) + "\n", "--cursor-out");
  }
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "data preprocess", "tokenize JSONL or plain text into Megatron .idx/.bin or an HDF5 token store",
    [](po::options_description& d) {
      d.add_options()("input", po::value<std::vector<std::string>>()->multitoken()->required(),
                      "input files: *.jsonl / *.json (one JSON object per line) or plain text (documents separated by blank lines)")(
          "tokenizer", po::value<std::string>()->required(), "Hugging Face tokenizer.json (byte-level BPE)")(
          "output", po::value<std::string>()->required(), "output prefix: PREFIX.idx/.bin (megatron) or PREFIX.h5 (hdf5)")(
          "force", po::bool_switch(), "write even into a directory that holds a checkpoint (its manifest.json is replaced)")(
          "format", po::value<std::string>()->default_value("megatron"), "megatron | hdf5")(
          "workers", po::value<int>()->default_value(1), "tokenizer threads")(
          "json-key", po::value<std::string>()->default_value("text"), "JSON field holding the text")(
          "eos-token", po::value<std::string>(), "token appended to every document (default: the tokenizer's end-of-text token)")(
          "no-eos", po::bool_switch(), "do not append an end-of-document token")(
          "dtype", po::value<std::string>(), "token dtype (default: uint16 if the vocabulary fits, else int32)")(
          "max-doc-tokens", po::value<int64_t>(), "refuse documents longer than this (default: the format's int32 limit)")(
          "quiet", po::bool_switch(), "no progress lines");
    },
    run_preprocess}));

AC_REGISTER_SUBCOMMAND((Subcommand{
    "data inspect", "check a token file (Megatron prefix or .h5) and print its size and first documents",
    [](po::options_description& d) {
      d.add_options()("path", po::value<std::string>()->required(), "Megatron prefix (PREFIX.idx/.bin) or HDF5 token store (.h5)")(
          "show", po::value<int64_t>()->default_value(3), "documents to print")("json", po::bool_switch(), "print JSON");
    },
    run_data_inspect, [](po::positional_options_description& p) { p.add("path", 1); }}));

AC_REGISTER_SUBCOMMAND((Subcommand{
    "data sample", "draw GPT samples as the trainer would: blend, split, DP ranks, resumable cursor",
    [](po::options_description& d) {
      d.add_options()("data", po::value<std::vector<std::string>>()->multitoken()->required(), "datasets, each PATH or WEIGHT:PATH")(
          "seq-len", po::value<int64_t>()->default_value(2048), "tokens per sample (each sample holds seq_len + 1)")(
          "seed", po::value<uint64_t>()->default_value(1234), "shuffle seed")(
          "split", po::value<std::string>()->default_value("98,1,1"), "train,calibration,eval document fractions")(
          "which", po::value<std::string>()->default_value("train"), "train | calibration | eval")(
          "micro-batch-size", po::value<int64_t>()->default_value(1), "samples per DP rank per step")(
          "dp-size", po::value<int>()->default_value(1), "data-parallel size")(
          "steps", po::value<int64_t>()->default_value(1), "steps to draw")(
          "cursor-in", po::value<std::string>(), "resume from this cursor JSON")(
          "cursor-out", po::value<std::string>(), "write the cursor after the last step")(
          "tokens", po::bool_switch(), "print the tokens of every sample");
    },
    run_sample}));

}  // namespace
}  // namespace ac::launcher

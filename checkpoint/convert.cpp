// Hugging Face import and deployment exports (see convert.h).
#include "checkpoint/convert.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/checksums.h"
#include "checkpoint/hdf5_util.h"
#include "checkpoint/model_state.h"
#include "dist/communicator.h"
#include "dist/error.h"
#include "dist/parallel_layout.h"
#include "model/hf_config.h"
#include "model/hf_import.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace ac::checkpoint {
namespace {

model::TpGroup self_tp() { return model::TpGroup{dist::make_self_communicator()}; }

// A TP = 1 model at `dtype` holding the checkpoint's weights, and its ArchSpec (dtype set).
struct Loaded {
  model::ArchSpec spec;
  model::CausalLM model{nullptr};
  int64_t step = 0;
  std::string path;
};
// Nemotron-H's config.json has no way to say "skip this block": a skipped layer (an identity)
// is left out and later layers are renumbered (as save_hf_config writes the pattern), so
// with `drop_skipped_nemotron_layers` the model is that compacted architecture, read from
// the checkpoint's original layer numbers.
Loaded load_for_export(const std::string& checkpoint, torch::Dtype dtype, bool drop_skipped_nemotron_layers = false) {
  Loaded l;
  l.path = resolve_checkpoint(checkpoint);
  CheckpointReader reader(l.path);
  l.step = reader.step();
  l.spec = checkpoint_arch(reader);
  l.spec.dtype = dtype_name(dtype);
  std::vector<size_t> kept;  // compact index -> checkpoint index
  if (drop_skipped_nemotron_layers && l.spec.family == model::ModelFamily::NemotronH) {
    std::vector<model::LayerSpec> layers;
    for (size_t i = 0; i < l.spec.layers.size(); ++i)
      if (model::layer_kind(l.spec.layers[i]) != ".") {
        kept.push_back(i);
        layers.push_back(l.spec.layers[i]);
      }
    if (kept.size() == l.spec.layers.size()) kept.clear();
    else l.spec.layers = layers;
  }
  l.model = model::CausalLM(l.spec, self_tp(), model::ModelOptions{dtype});
  if (kept.empty()) {
    load_model(l.model, reader);
  } else {
    load_model(l.model, reader, "model/", [&](const std::string& logical) {
      if (logical.rfind("layers.", 0) != 0) return logical;
      const size_t dot = logical.find('.', 7);
      return "layers." + std::to_string(kept.at(std::stoul(logical.substr(7, dot - 7)))) + logical.substr(dot);
    });
  }
  return l;
}

void refuse_source_dir(const std::string& source_file, const std::string& out_dir) {
  std::error_code ec;
  fs::path src_dir = fs::path(source_file).parent_path();
  if (src_dir.empty()) src_dir = ".";
  if (fs::exists(out_dir) && fs::equivalent(src_dir, out_dir, ec))
    throw InputError(out_dir, "--out", "is the source checkpoint's directory; export into another directory");
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

torch::Dtype parse_dtype(const std::string& name, const std::string& what) {
  if (name == "bf16" || name == "bfloat16") return torch::kBFloat16;
  if (name == "f32" || name == "fp32" || name == "float32") return torch::kFloat32;
  if (name == "f16" || name == "fp16" || name == "float16") return torch::kFloat16;
  throw InputError(what, name, "unknown dtype (expected bf16 or f32)");
}

std::string dtype_name(torch::Dtype dtype) {
  if (dtype == torch::kBFloat16) return "bfloat16";
  if (dtype == torch::kFloat32) return "float32";
  if (dtype == torch::kFloat16) return "float16";
  throw std::runtime_error("dtype_name: not a model dtype");
}

model::ArchSpec checkpoint_arch(const CheckpointReader& reader) {
  const auto& a = reader.attributes();
  if (!a.contains(kArchSpecAttribute))
    throw InputError(reader.path(), kArchSpecAttribute, "missing: not a model checkpoint (no ArchSpec attribute)");
  const auto& j = a.at(kArchSpecAttribute);
  if (!j.is_object()) throw InputError(reader.path(), kArchSpecAttribute, "is not an ArchSpec JSON object");
  return model::arch_from_json(j, reader.path() + ": " + kArchSpecAttribute);
}

std::map<std::string, std::vector<int64_t>> model_tensor_shapes(const model::ArchSpec& spec) {
  std::map<std::string, std::vector<int64_t>> out;
  const int64_t V = spec.vocab_size, H = spec.hidden_size;
  // The same names CausalLMImpl::shard_map gives; layers are built one at a time (small dtype).
  out["embed.weight"] = {V, H};
  out["final_norm.weight"] = {H};
  if (!spec.tie_embeddings) out["lm_head.weight"] = {V, H};
  const auto tp = self_tp();
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    std::vector<model::ParamShard> shards;
    {
      model::DecoderLayer layer(spec, int(i), tp, torch::kBFloat16);
      layer->shard_map("layers." + std::to_string(i) + ".", shards);
    }
    for (const auto& s : shards)
      for (const auto& p : s.pieces) out[p.logical] = p.logical_shape;
  }
  return out;
}

std::vector<std::string> verify_model_shapes(const CheckpointReader& reader, const std::string& prefix) {
  std::vector<std::string> problems;
  if (!reader.attributes().contains(kArchSpecAttribute)) return problems;
  model::ArchSpec spec;
  try {
    spec = checkpoint_arch(reader);
  } catch (const InputError& e) {
    return {e.what()};
  }
  std::map<std::string, std::vector<int64_t>> want;
  try {
    want = model_tensor_shapes(spec);
  } catch (const InputError& e) {
    return {reader.path() + ": " + kArchSpecAttribute + ": " + e.what()};
  }
  std::set<std::string> seen;
  for (const auto& d : reader.datasets()) {
    if (d.name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string logical = d.name.substr(prefix.size());
    seen.insert(logical);
    auto it = want.find(logical);
    if (it == want.end())
      problems.push_back(reader.path() + ": " + d.name + ": not a tensor of the ArchSpec (shape " + shape_text(d.shape) + ")");
    else if (it->second != d.shape)
      problems.push_back(reader.path() + ": " + d.name + ": has shape " + shape_text(d.shape) + ", the ArchSpec wants " +
                         shape_text(it->second));
    if (d.dtype != "float32" && d.dtype != "bfloat16" && d.dtype != "float16")
      problems.push_back(reader.path() + ": " + d.name + ": has dtype " + d.dtype + ", a model weight must be float32, bfloat16 or float16");
  }
  for (const auto& [logical, shape] : want)
    if (!seen.count(logical))
      problems.push_back(reader.path() + ": " + prefix + logical + ": missing (the ArchSpec has it, shape " + shape_text(shape) + ")");
  return problems;
}

namespace {
// 64-bit FNV-1a, fed piece by piece (each piece followed by a separator byte).
struct Fnv1a {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  void text(const std::string& s) {
    bytes(s.data(), s.size());
    bytes("\0", 1);
  }
};
}  // namespace

namespace {
// The slices' offsets, shapes and whole-slice CRC32s of a crc32_slices attribute (read by the
// checkpoint's own parser), without the tile CRCs: the fingerprint names the weights, not how
// finely their checksums are kept (files written before the tile CRCs keep their fingerprints).
std::string slice_crcs_text(const std::vector<CrcSlice>& slices) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : slices) j.push_back({{"crc32", s.crc32}, {"offset", s.offset}, {"shape", s.shape}});
  return j.dump();
}
}  // namespace

std::string model_fingerprint(const CheckpointReader& reader, const std::string& prefix) {
  Fnv1a f;
  const auto& a = reader.attributes();
  f.text(a.contains(kArchSpecAttribute) ? a.at(kArchSpecAttribute).dump() : std::string());
  h5::quiet_errors();
  h5::Handle file(H5Fopen(reader.path().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw InputError(reader.path(), "file", "cannot open: " + h5::error_stack());
  for (const auto& d : reader.datasets()) {
    if (d.name.compare(0, prefix.size(), prefix) != 0) continue;
    f.text(d.name);
    f.text(shape_text(d.shape));
    f.text(d.dtype);
    h5::Handle ds(H5Dopen2(file, d.name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw InputError(reader.path(), "dataset " + d.name, "cannot open: " + h5::error_stack());
    if (h5::has_attr(ds, "crc32_slices")) {
      f.text(slice_crcs_text(parse_crc32_slices(
          h5::read_string_attr(ds, "crc32_slices", reader.path() + ": dataset " + d.name), d.shape, reader.path(), d.name)));
    } else {  // no stored checksums: hash the data itself (CRC32 of the stored bytes)
      f.text("data:" + std::to_string(crc32_of(reader.read(d.name))));
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(f.h));
  return hex;
}

std::string resolve_checkpoint(const std::string& path) {
  return fs::is_directory(path) ? resolve_latest(path) : path;
}

ImportResult import_hf(MPI_Comm world, const std::string& hf_dir, const std::string& out_dir, const ImportOptions& options) {
  if (!fs::is_directory(hf_dir))
    throw InputError(hf_dir, "--hf", fs::exists(hf_dir) ? "not a directory (give the directory with config.json)" : "no such directory");
  ImportResult r;
  r.spec = model::load_arch((fs::path(hf_dir) / "config.json").string());
  const torch::Dtype dtype = options.dtype.empty() ? parse_dtype(r.spec.dtype, "config.json dtype") : parse_dtype(options.dtype);
  r.spec.dtype = dtype_name(dtype);

  int world_size = 1;
  MPI_Comm_size(world, &world_size);
  if (options.tp < 0) throw InputError("--tp", std::to_string(options.tp), "must be positive");
  const int tp = options.tp > 0 ? options.tp : world_size;
  if (auto why = model::tp_split_problem(r.spec, tp); !why.empty())
    throw InputError((fs::path(hf_dir) / "config.json").string(), "--tp " + std::to_string(tp), why);
  dist::ParallelLayout layout(world, {tp, 0, 0});
  r.tp = layout.tp_size();
  r.dp = layout.dp_size();

  model::CausalLM m(r.spec, model::TpGroup{dist::make_mpi_communicator(layout.tp_mpi_comm())}, model::ModelOptions{dtype});
  {
    model::SafetensorsReader reader(hf_dir);
    model::load_hf_weights(m, reader);
  }
  const nlohmann::json attributes = {
      {kArchSpecAttribute, model::arch_to_json(r.spec)},
      {"layout", {{"tp", r.tp}, {"dp", r.dp}}},
      {"source", {{"format", "huggingface"}, {"path", fs::absolute(hf_dir).lexically_normal().string()}}},
  };
  r.path = save_checkpoint(world, out_dir, 0, model_tensors(m, layout.dp_rank() == 0), attributes, nullptr, options.save);
  return r;
}

std::string export_hdf5(const std::string& checkpoint, const std::string& out_dir, torch::Dtype dtype) {
  refuse_source_dir(resolve_checkpoint(checkpoint), out_dir);
  Loaded l = load_for_export(checkpoint, dtype);
  const nlohmann::json attributes = {
      {kArchSpecAttribute, model::arch_to_json(l.spec)},
      {"layout", {{"tp", 1}, {"dp", 1}}},
      {"source", {{"format", "autocompress-checkpoint"}, {"path", fs::absolute(l.path).lexically_normal().string()}}},
  };
  SaveOptions save;
  save.keep_last = 0;  // never delete anything in the output directory
  return save_checkpoint(MPI_COMM_SELF, out_dir, l.step, model_tensors(l.model, true), attributes, nullptr, save);
}

std::vector<std::string> export_safetensors(const std::string& checkpoint, const std::string& out_dir, torch::Dtype dtype,
                                            int64_t max_shard_bytes, model::HfHeterogeneity how, nlohmann::json* config) {
  refuse_source_dir(resolve_checkpoint(checkpoint), out_dir);
  Loaded l = load_for_export(checkpoint, dtype, /*drop_skipped_nemotron_layers=*/true);
  // config.json must be writable in the chosen layout before any weights are: a student the
  // layout cannot express leaves out_dir untouched.
  const nlohmann::json written = model::arch_to_hf_config(l.spec, how);
  model::SafetensorsWriteOptions opt;
  opt.max_shard_bytes = max_shard_bytes;
  std::vector<std::string> files = model::save_hf_weights(l.model, out_dir, dtype, opt);
  model::save_hf_config(l.spec, (fs::path(out_dir) / "config.json").string(), how);
  if (config) *config = written;
  // Weights of an earlier export into the same directory would confuse a reader (an index
  // beside a single file): remove the ones this export did not write.
  const std::set<std::string> mine(files.begin(), files.end());
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string n = e.path().filename().string();
    const bool ours = n == "model.safetensors" || n == "model.safetensors.index.json" ||
                      (n.rfind("model-", 0) == 0 && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors");
    if (ours && !mine.count(n)) fs::remove(e.path());
  }
  files.push_back("config.json");
  return files;
}

}  // namespace ac::checkpoint

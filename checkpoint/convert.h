// Checkpoints in and out of the pipeline: a Hugging Face checkpoint (config.json +
// safetensors) into this project's HDF5 format, read in parallel with each rank reading only
// its tensor-parallel slices; and the deployment exports of an HDF5 checkpoint (one file in
// our format at a chosen dtype, or the Hugging Face layout). Format: docs/checkpoint-format.md.
#pragma once

#include <mpi.h>
#include <torch/types.h>

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/arch_spec.h"
#include "model/hf_config.h"

namespace ac::checkpoint {

// The root attribute that holds a model checkpoint's ArchSpec (model::arch_to_json).
inline constexpr const char* kArchSpecAttribute = "arch_spec";

// "bf16"/"bfloat16" -> kBFloat16, "f32"/"float32" -> kFloat32 (also f16/float16);
// anything else throws ac::InputError naming `what` (e.g. "--dtype").
torch::Dtype parse_dtype(const std::string& name, const std::string& what = "--dtype");
std::string dtype_name(torch::Dtype dtype);  // "bfloat16", "float32", "float16"

std::string shape_text(const std::vector<int64_t>& shape);  // "[64, 128]", for messages

// The ArchSpec a checkpoint carries. Throws ac::InputError naming the file and attribute
// when it has none or it does not parse.
model::ArchSpec checkpoint_arch(const CheckpointReader& reader);

// The logical (TP = 1) model tensors an ArchSpec has, name -> global shape, without "model/".
// Built one layer at a time, so memory stays at one layer.
std::map<std::string, std::vector<int64_t>> model_tensor_shapes(const model::ArchSpec& spec);

// What differs between the checkpoint's model/ datasets and its ArchSpec: a missing dataset,
// a shape the ArchSpec does not give, a dataset the ArchSpec does not have. One message per
// problem, naming the file and dataset. Empty when the checkpoint has no ArchSpec attribute
// (not a model checkpoint) or everything matches.
std::vector<std::string> verify_model_shapes(const CheckpointReader& reader, const std::string& prefix = "model/");

// A fingerprint of the model a checkpoint holds: 16 hex digits of a 64-bit FNV-1a hash over
// its ArchSpec attribute and every model/ dataset's name, shape, dtype and stored CRC32
// checksums (crc32_slices). Only a dataset without checksums has its data read (and
// hashed), so for checkpoints written by save_checkpoint this reads metadata only. The
// same weights saved under another TP layout have other slices, hence another fingerprint.
// Throws ac::InputError naming the file when it cannot be read.
std::string model_fingerprint(const CheckpointReader& reader, const std::string& prefix = "model/");

// A checkpoint file path: a directory means the checkpoint its `latest` points to.
std::string resolve_checkpoint(const std::string& path);

struct ImportOptions {
  std::string dtype;  // "" = the dtype config.json gives (torch_dtype), else bf16|f32
  int tp = 0;         // 0 = the world size; world = tp * dp, only dp rank 0 writes
  SaveOptions save;
};
struct ImportResult {
  std::string path;  // <out_dir>/step_0.h5
  model::ArchSpec spec;
  int tp = 1, dp = 1;
};

// Collective over `world`: every rank builds the CausalLM of `hf_dir`/config.json at TP =
// options.tp, fills it from the safetensors in `hf_dir` (single file or sharded with an
// index) reading only its slices, and the ranks of DP replica 0 write `out_dir`/step_0.h5
// (+ `latest`) with the ArchSpec in the "arch_spec" attribute. Bad input throws
// ac::InputError naming the file and field or tensor.
ImportResult import_hf(MPI_Comm world, const std::string& hf_dir, const std::string& out_dir,
                       const ImportOptions& options = {});

// Deployment exports of the checkpoint at `checkpoint` (a file, or a directory: its
// `latest`), run by one process. The model is rebuilt at TP = 1 from the checkpoint's
// ArchSpec and `dtype` (routers stay fp32), so it must fit in this process's memory.
//
// HDF5: `out_dir`/step_<N>.h5 + `latest` (N = the source's step), the model tensors only,
// with the ArchSpec (dtype set to `dtype`). Returns the file's path.
std::string export_hdf5(const std::string& checkpoint, const std::string& out_dir, torch::Dtype dtype);
// Hugging Face: safetensors (sharded with an index above max_shard_bytes) + config.json in
// the layout `how` chooses (model::HfHeterogeneity: by default the plain family config for a
// uniform student, DeciLM / nemotron_h_puzzle block_configs for a heterogeneous one).
// Nemotron-H layers that are skipped (no mixer, no FFN: identities) are left out and later
// layers renumbered, as in config.json's pattern. A student the layout cannot express throws
// ac::InputError (naming the layer and field) before anything is written, so an earlier
// export in `out_dir` stays as it was. Returns the files written; `config` (when given)
// receives the config.json written.
std::vector<std::string> export_safetensors(const std::string& checkpoint, const std::string& out_dir, torch::Dtype dtype,
                                            int64_t max_shard_bytes = int64_t(5) << 30,
                                            model::HfHeterogeneity how = model::HfHeterogeneity::Auto,
                                            nlohmann::json* config = nullptr);

}  // namespace ac::checkpoint

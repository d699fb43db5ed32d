// HDF5 checkpoints: one file per checkpoint, one dataset per logical tensor at its global
// shape, written collectively as hyperslabs by the ranks that own them, committed
// atomically (temporary name, fsync, rename, then the `latest` pointer). Any layout can
// read any slice back. Format: docs/checkpoint-format.md.
#pragma once

#include <mpi.h>
#include <torch/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/attributes.h"

namespace ac::checkpoint {

constexpr int kFormatVersion = 1;
constexpr const char* kFormatName = "autocompress-checkpoint";

// One tensor as this rank holds it.
struct ShardedTensor {
  std::string name;                   // "model/layers.3.mlp.w1", "optimizer/exp_avg/0"
  std::vector<int64_t> global_shape;  // the logical tensor's shape
  std::vector<int64_t> offset;        // where `local` starts in it (empty: all zeros)
  torch::Tensor local;                // f32, f64, bf16, f16, i64, i32, u8; a CUDA tensor is staged through pinned memory
  bool write = true;                  // false on DP replicas; identical slices of several ranks are written once
};

// Where a save spent its time on this rank, in seconds (for benchmarks; see bench checkpoint).
struct SaveTimings {
  double plan = 0;       // agreeing on datasets and pieces, removing a stale temporary
  double create = 0;     // H5Fcreate, H5Dcreate2 (space allocation) and dataset attributes
  double crc = 0;        // waiting for the CRC32s (computed on a second thread during the writes)
  double write = 0;      // H5Dwrite calls and write-behind waits
  double close = 0;      // root attributes, checksum attributes, H5Fclose
  double fsync = 0;      // fsync of the complete temporary file
  double commit = 0;     // rename, directory fsync, the `latest` pointer
  double retention = 0;  // deleting checkpoints beyond keep_last
};

struct SaveOptions {
  int keep_last = 3;                  // older step_*.h5 are deleted after the pointer moves (0: keep all)
  bool checksums = true;              // CRC32 of every written slice, stored per dataset
  int64_t alignment = int64_t(16) << 20;  // H5Pset_alignment for objects of at least this size
  int64_t max_bytes_per_write = int64_t(1) << 30;  // split larger slices (MPI-IO 2 GiB limits)
  // Write-behind: H5Dwrite calls of about this many bytes, each batch's write-back started
  // as soon as it is written and its clean pages dropped after the next one, so a save
  // dirties at most ~2 batches of page cache (0: off, everything goes through the page
  // cache until the fsync).
  int64_t write_behind_bytes = int64_t(16) << 20;
  SaveTimings* timings = nullptr;     // when set, filled with this rank's phase times
};

// Collective over `comm`. Writes <dir>/step_<step>.h5 (through <dir>/step_<step>.h5.tmp),
// then points <dir>/latest at it. `attributes` (identical on every rank) become root
// attributes: integers and strings as such, anything else as a JSON string.
// `per_rank` (may differ per rank, e.g. RNG states) is gathered into the "per_rank"
// attribute, a JSON array indexed by rank. Returns the final path.
std::string save_checkpoint(MPI_Comm comm, const std::string& dir, int64_t step,
                            const std::vector<ShardedTensor>& tensors, const nlohmann::json& attributes,
                            const nlohmann::json& per_rank = nullptr, const SaveOptions& options = {});

// The host tensor that file I/O of `like` goes through: for a CUDA tensor, pinned (page-
// locked) host memory from LibTorch's caching host allocator, so device<->host copies run at
// full bus speed, need no pageable bounce buffer and can be asynchronous (the allocator does
// not reuse the block before a copy that used it has finished); for a CPU tensor, ordinary
// memory. Saves stage every device tensor through it and wait once; optimizer-state loads
// read the file into it and copy to the device without blocking.
torch::Tensor host_staging_like(const torch::Tensor& like);
// Gives the allocator's cached pinned blocks back to the OS once a save or load is done:
// page-locked RAM cannot be swapped or used by anything else, so it is held for the I/O, not
// between checkpoints. A no-op in a build without CUDA.
void release_host_staging();

// The checkpoint <dir>/latest points to. Throws ac::InputError when there is none or the
// pointer is bad.
std::string resolve_latest(const std::string& dir);

struct DatasetInfo {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  // "float32", "bfloat16", ...
  int64_t bytes = 0;
};

// Reads a checkpoint file. Each rank opens the file read-only on its own and reads only
// the slices it asks for. Opening checks the format name and version.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const nlohmann::json& attributes() const { return attributes_; }  // JSON-string attributes parsed
  int64_t step() const;
  const std::vector<DatasetInfo>& datasets() const { return datasets_; }
  bool has(const std::string& name) const;
  const DatasetInfo& info(const std::string& name) const;  // throws InputError naming file + dataset

  // The hyperslab [offset, offset + count) in the stored dtype. Empty offset/count: all.
  // Unless set_check_checksums(false), the stored CRC32s of what it reads are checked
  // (InputError naming file, dataset and block on a mismatch): the blocks of each slice's tile
  // grid that the hyperslab touches (read whole for that), and in files written before tile
  // CRCs, the slices that lie inside the hyperslab (a slice only partly read is not checked).
  torch::Tensor read(const std::string& name, std::vector<int64_t> offset = {}, std::vector<int64_t> count = {}) const;
  // Reads the slice that `out` covers at `offset`, checking that the dataset has
  // `expected_global_shape` (when given); converts to out's dtype.
  void read_into(const std::string& name, torch::Tensor& out, const std::vector<int64_t>& offset,
                 const std::vector<int64_t>& expected_global_shape = {}) const;

  // Reads every dataset; checks recorded checksums (a dataset without them is a problem).
  // Returns the problems found (empty: ok).
  std::vector<std::string> verify(bool checksums = true) const;

  // Whether read() checks CRC32s (default true; --skip-checksums turns it off).
  void set_check_checksums(bool on) { check_checksums_ = on; }

 private:
  Box region(const DatasetInfo& di, std::vector<int64_t> offset, std::vector<int64_t> count) const;  // checked
  std::vector<CrcSlice> stored_checksums(const DatasetInfo& di) const;  // empty without crc32_slices
  torch::Tensor read_unchecked(const DatasetInfo& di, const Box& box) const;
  std::optional<std::string> slice_problem(const DatasetInfo& di, const CrcSlice& s) const;  // for verify()
  bool check_checksums_ = true;
  std::string path_;
  long long file_ = -1;  // hid_t
  nlohmann::json attributes_;
  std::vector<DatasetInfo> datasets_;
};

}  // namespace ac::checkpoint

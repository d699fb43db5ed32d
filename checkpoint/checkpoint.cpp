// Collective HDF5 checkpoint writes with atomic commit, and slice-wise reads (see
// checkpoint.h and docs/checkpoint-format.md).
#include "checkpoint/checkpoint.h"

#include <sys/mman.h>

#include <cstdlib>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include <torch/cuda.h>

#include "autocompress/build_info.h"
#if AC_TORCH_HAS_CUDA
#include <ATen/cuda/CachingHostAllocator.h>
#endif
#include "checkpoint/attributes.h"
#include "checkpoint/checksum_policy.h"
#include "checkpoint/checksums.h"
#include "checkpoint/hdf5_util.h"
#include "dist/error.h"
#include "dist/file_io.h"

namespace fs = std::filesystem;

namespace ac::checkpoint {
namespace {

using h5::check;
using h5::Handle;

// The bytes a file write reads: a tensor in device memory is copied to the host here, the
// only place a save leaves the device (a CPU tensor is used as it is). A device tensor lands
// in pinned host memory with an asynchronous copy; `staged` collects the devices whose
// copies are in flight, and the caller waits for them once (wait_for_staging) before the
// bytes are read.
torch::Tensor host_copy(const torch::Tensor& t, std::set<int>* staged) {
  if (t.device().is_cpu()) return t.contiguous();
  torch::Tensor host = host_staging_like(t);
  host.copy_(t, /*non_blocking=*/t.device().is_cuda());
  if (t.device().is_cuda()) staged->insert(t.device().index());
  return host;
}

void wait_for_staging(const std::set<int>& staged) {
  for (int device : staged) torch::cuda::synchronize(device);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Everything about one dataset that all ranks must agree on before the collective writes.
struct DatasetPlan {
  std::string name;
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat;
  int64_t rounds = 0;  // collective H5Dwrite calls: the most pieces any rank writes
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// One contiguous piece this rank writes into a dataset (one crc32_slices entry), in
// collective rounds of up to `sub_rows` rows each.
struct WriteItem {
  std::vector<int64_t> offset;
  torch::Tensor data;  // contiguous
  int64_t sub_rows = 0;  // rows per H5Dwrite (dim 0); all rows when the piece is a scalar
};

// Rows per H5Dwrite for a piece of `rows` rows of `row_bytes` each: about `chunk` bytes
// (0: the whole piece in one call).
int64_t rows_per_write(int64_t rows, int64_t row_bytes, int64_t chunk) {
  if (chunk <= 0 || row_bytes <= 0) return std::max<int64_t>(rows, 1);
  return std::clamp<int64_t>(chunk / row_bytes, 1, std::max<int64_t>(rows, 1));
}

// Bounds the page cache a save dirties. After every `batch` bytes written it starts the
// write-back of those bytes and waits for the previous batch's, whose now clean pages it
// drops, so the next writes reuse that memory. Without it a 1 GB save dirties 1 GB of
// freshly allocated page cache, and on a VM whose free memory is handed back to the host
// (free page reporting) every new page costs a host page fault: writes ran at 0.2-0.3 GB/s
// into the page cache while the disk took 1.5+ GB/s (docs/benchmarks.md, Checkpoint I/O).
// Best effort: failures are ignored; the fsync before the rename is what makes it durable.
class WriteBehind {
 public:
  WriteBehind(const fs::path& path, int64_t batch) : batch_(batch) {
    if (batch > 0) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  ~WriteBehind() {
    if (fd_ >= 0) ::close(fd_);
  }
  WriteBehind(const WriteBehind&) = delete;
  WriteBehind& operator=(const WriteBehind&) = delete;

  // Records bytes [begin, begin + len) of the file as written (once the write returned).
  void wrote(int64_t begin, int64_t len) {
    if (fd_ < 0 || len <= 0) return;
    current_.emplace_back(begin, len);
    current_bytes_ += len;
  }
  void flush_if_due() {
    if (fd_ >= 0 && current_bytes_ >= batch_) flush();
  }
  // Starts the write-back of the last batch and waits for the one before.
  void finish() {
    if (fd_ >= 0) flush();
  }

 private:
  void flush() {
    for (const auto& [b, n] : current_) ::sync_file_range(fd_, b, n, SYNC_FILE_RANGE_WRITE);
    for (const auto& [b, n] : previous_) {
      ::sync_file_range(fd_, b, n, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(fd_, b, n, POSIX_FADV_DONTNEED);
    }
    previous_ = std::move(current_);
    current_.clear();
    current_bytes_ = 0;
  }
  int fd_ = -1;
  int64_t batch_ = 0, current_bytes_ = 0;
  std::vector<std::pair<int64_t, int64_t>> current_, previous_;  // (file offset, bytes)
};

// Allgathers a JSON value from every rank (as strings of varying length).
std::vector<nlohmann::json> allgather_json(MPI_Comm comm, const nlohmann::json& mine) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const std::string s = mine.dump();
  int len = static_cast<int>(s.size());
  std::vector<int> lens(size), displs(size);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::string all(static_cast<size_t>(total), '\0');
  MPI_Allgatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm);
  std::vector<nlohmann::json> out;
  for (int r = 0; r < size; ++r) out.push_back(nlohmann::json::parse(all.substr(displs[r], lens[r])));
  return out;
}

void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw std::runtime_error(p.string() + ": cannot open for fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw std::runtime_error(p.string() + ": fsync failed");
}

// Rank 0 runs `body`; every rank returns normally or throws rank 0's error.
void on_root_then_share(MPI_Comm comm, const std::function<void()>& body) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string err;
  if (rank == 0) {
    try {
      body();
    } catch (const std::exception& e) {
      err = e.what();
      if (err.empty()) err = "unknown error";
    }
  }
  int len = static_cast<int>(err.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, comm);
  err.resize(static_cast<size_t>(len));
  MPI_Bcast(err.data(), len, MPI_CHAR, 0, comm);
  if (len > 0) throw std::runtime_error(err);
}

// Every rank agrees that every rank succeeded, or all throw the first message.
void agree(MPI_Comm comm, const std::string& local_error) {
  auto errors = allgather_json(comm, local_error);
  for (size_t r = 0; r < errors.size(); ++r) {
    const std::string e = errors[r].get<std::string>();
    if (!e.empty()) throw std::runtime_error(errors.size() > 1 ? "rank " + std::to_string(r) + ": " + e : e);
  }
}

// Agrees on the datasets (sorted union of every rank's tensors, with matching shape and
// dtype) and on what each rank writes: a slice given by several ranks with the same offset
// and shape (a TP-replicated tensor) is written by the lowest of them only; slices above
// max_bytes are split along dim 0, and each piece is written in H5Dwrite rounds of about
// write_chunk bytes (0: one round per piece). Returns the plans (rounds = the most writes
// any rank makes); fills `items` with this rank's pieces.
std::vector<DatasetPlan> plan_datasets(MPI_Comm comm, const std::vector<ShardedTensor>& tensors, int64_t max_bytes,
                                       int64_t write_chunk, std::map<std::string, std::vector<WriteItem>>* items) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& t : tensors) {
    if (!t.local.defined()) throw std::invalid_argument("checkpoint: tensor " + t.name + " is undefined");
    std::vector<int64_t> off = t.offset.empty() ? std::vector<int64_t>(t.global_shape.size(), 0) : t.offset;
    mine.push_back({t.name, t.global_shape, static_cast<int>(t.local.scalar_type()), t.write, off, t.local.sizes().vec()});
  }
  std::map<std::string, DatasetPlan> plans;
  std::map<std::pair<std::string, std::string>, int> first_writer;  // (name, offset+shape) -> lowest rank
  const auto all = allgather_json(comm, mine);
  for (size_t r = 0; r < all.size(); ++r) {
    for (const auto& e : all[r]) {
      DatasetPlan p{e[0].get<std::string>(), e[1].get<std::vector<int64_t>>(),
                    static_cast<torch::ScalarType>(e[2].get<int>()), 0};
      auto it = plans.find(p.name);
      if (it == plans.end()) {
        plans.emplace(p.name, p);
      } else if (it->second.shape != p.shape || it->second.dtype != p.dtype) {
        throw InputError("checkpoint", p.name,
                         "ranks disagree on the tensor: " + shape_str(it->second.shape) + " " +
                             h5::dtype_name(it->second.dtype) + " vs " + shape_str(p.shape) + " " +
                             h5::dtype_name(p.dtype) + " on rank " + std::to_string(r));
      }
      if (e[3].get<bool>()) first_writer.emplace(std::make_pair(p.name, e[4].dump() + e[5].dump()), int(r));
    }
  }
  // Every rank computes every rank's item count (for the rounds) and its own items.
  std::map<std::string, std::vector<int64_t>> counts;
  std::set<int> staged;  // CUDA devices with host copies in flight
  for (size_t r = 0; r < all.size(); ++r) {
    for (size_t i = 0; i < all[r].size(); ++i) {
      const auto& e = all[r][i];
      const std::string name = e[0].get<std::string>();
      if (!e[3].get<bool>() || first_writer.at({name, e[4].dump() + e[5].dump()}) != int(r)) continue;
      const auto shape = e[5].get<std::vector<int64_t>>();
      const int64_t numel = numel_of(shape);
      if (numel == 0) continue;
      const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(static_cast<torch::ScalarType>(e[2].get<int>())));
      const int64_t pieces =
          shape.empty() ? 1 : std::min<int64_t>(shape[0], std::max<int64_t>(1, (bytes + max_bytes - 1) / max_bytes));
      auto& c = counts[name];
      c.resize(all.size(), 0);
      if (shape.empty()) {
        c[r] += 1;
        if (int(r) == rank) (*items)[name].push_back({e[4].get<std::vector<int64_t>>(), host_copy(tensors[i].local, &staged), 1});
        continue;
      }
      const int64_t row_bytes = bytes / shape[0];
      const int64_t rows_per = (shape[0] + pieces - 1) / pieces;
      torch::Tensor data;
      if (int(r) == rank) data = host_copy(tensors[i].local, &staged);
      for (int64_t r0 = 0; r0 < shape[0]; r0 += rows_per) {
        const int64_t rows = std::min(rows_per, shape[0] - r0);
        const int64_t sub = rows_per_write(rows, row_bytes, write_chunk);
        c[r] += (rows + sub - 1) / sub;
        if (int(r) != rank) continue;
        auto o = e[4].get<std::vector<int64_t>>();
        o[0] += r0;
        (*items)[name].push_back({o, data.narrow(0, r0, rows), sub});
      }
    }
  }
  wait_for_staging(staged);  // one wait per save, after every copy was issued
  std::vector<DatasetPlan> out;
  for (auto& [name, p] : plans) {
    if (counts.count(name)) p.rounds = *std::max_element(counts[name].begin(), counts[name].end());
    out.push_back(p);
  }
  return out;  // sorted by name: the same order on every rank
}

void check_slice(const ShardedTensor& t) {
  const auto& g = t.global_shape;
  if (static_cast<int64_t>(g.size()) != t.local.dim())
    throw InputError("checkpoint", t.name, "local tensor has " + std::to_string(t.local.dim()) +
                                               " dims, global shape " + shape_str(g));
  for (size_t d = 0; d < g.size(); ++d) {
    const int64_t off = t.offset.empty() ? 0 : t.offset[d];
    if (off < 0 || off + t.local.size(static_cast<int64_t>(d)) > g[d])
      throw InputError("checkpoint", t.name, "slice at offset " + shape_str(t.offset) + " of shape " +
                                                 c10::str(t.local.sizes()) + " exceeds " + shape_str(g));
  }
}

void write_json_attributes(hid_t obj, const nlohmann::json& attributes) {
  if (attributes.is_null()) return;
  if (!attributes.is_object()) throw std::invalid_argument("checkpoint attributes must be a JSON object");
  std::vector<std::string> json_keys;
  for (const auto& [k, v] : attributes.items()) {
    if (k == "format" || k == "format_version" || k == "step" || k == "json_attributes")
      throw std::invalid_argument("checkpoint attribute '" + k + "' is reserved");
    if (v.is_number_integer()) h5::write_int_attr(obj, k, v.get<int64_t>());
    else if (v.is_string()) h5::write_string_attr(obj, k, v.get<std::string>());
    else {
      h5::write_string_attr(obj, k, v.dump());
      json_keys.push_back(k);
    }
  }
  h5::write_string_attr(obj, "json_attributes", nlohmann::json(json_keys).dump());
}

}  // namespace

torch::Tensor host_staging_like(const torch::Tensor& like) {
  auto opts = like.options().device(torch::kCPU);
  if (like.device().is_cuda()) opts = opts.pinned_memory(true);
  return torch::empty(like.sizes(), opts);
}

void release_host_staging() {
#if AC_TORCH_HAS_CUDA
  // Deprecated in the newest LibTorch in favour of at::getHostAllocator(at::kCUDA), which
  // older 2.x releases lack; this one exists in every release the project builds against.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  at::cuda::CachingHostAllocator_emptyCache();
#pragma GCC diagnostic pop
#endif
}

namespace {

// The save's stopwatch: each lap adds the time since the last one to a SaveTimings field.
struct Laps {
  double mark = MPI_Wtime();
  void operator()(double* into) {
    const double now = MPI_Wtime();
    *into += now - mark;
    mark = now;
  }
};

// The crc32_slices entries of this rank's pieces (slice and tile CRC32s), computed on a second
// thread while the pieces are written (both only read the tensors), in the order of the plans
// and their items. `to_sum` must outlive the future.
struct ToSum {
  const WriteItem* item;
  int64_t dataset_bytes;
};
std::future<std::vector<nlohmann::json>> start_checksums(const std::vector<DatasetPlan>& plans,
                                                         const std::map<std::string, std::vector<WriteItem>>& items,
                                                         bool checksums, std::vector<ToSum>& to_sum) {
  if (checksums)
    for (const DatasetPlan& p : plans) {
      auto it = items.find(p.name);
      if (it != items.end())
        for (const WriteItem& item : it->second)
          to_sum.push_back({&item, numel_of(p.shape) * int64_t(c10::elementSize(p.dtype))});
    }
  return std::async(std::launch::async, [&to_sum] {
    std::vector<nlohmann::json> out;
    out.reserve(to_sum.size());
    for (const auto& t : to_sum) out.push_back(slice_checksums(t.item->offset, t.item->data, t.dataset_bytes));
    return out;
  });
}

// The open temporary file and the property lists every dataset write uses.
struct SaveFile {
  Handle file, lcpl, dxpl;
};

SaveFile create_save_file(MPI_Comm comm, const fs::path& tmp_path, int64_t alignment) {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  check(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL), "H5Pset_fapl_mpio");
  H5Pset_all_coll_metadata_ops(fapl, true);
  H5Pset_coll_metadata_write(fapl, true);
  H5Pset_alignment(fapl, static_cast<hsize_t>(alignment), static_cast<hsize_t>(alignment));
  SaveFile f;
  f.file = Handle(check(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), tmp_path.string() + ": create"),
                  H5Fclose);
  f.lcpl = Handle(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(f.lcpl, 1);
  f.dxpl = Handle(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(f.dxpl, H5FD_MPIO_COLLECTIVE);
  return f;
}

// One dataset: created at its global shape, then p.rounds collective writes on every rank
// (this rank's pieces, several per piece when it is large; an empty selection when it has none).
void write_dataset(const SaveFile& f, const fs::path& tmp_path, const DatasetPlan& p, const std::vector<WriteItem>& mine,
                   WriteBehind& behind, Laps& lap, SaveTimings& tm) {
  const std::string ctx = tmp_path.string() + ": dataset " + p.name;
  std::vector<hsize_t> dims(p.shape.begin(), p.shape.end());
  Handle fspace(dims.empty() ? H5Screate(H5S_SCALAR)
                             : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  Handle ftype = h5::file_type(p.dtype);
  Handle dset(check(H5Dcreate2(f.file, p.name.c_str(), ftype, fspace, f.lcpl, dcpl, H5P_DEFAULT), ctx + ": create"),
              H5Dclose);
  h5::write_string_attr(dset, "dtype", h5::dtype_name(p.dtype));
  lap(&tm.create);

  // This rank's writes: (item, first row, rows); several per item when it is large.
  std::vector<std::tuple<size_t, int64_t, int64_t>> writes;
  for (size_t k = 0; k < mine.size(); ++k) {
    const int64_t rows = dims.empty() ? 1 : mine[k].data.size(0);
    for (int64_t r0 = 0; r0 < rows; r0 += mine[k].sub_rows)
      writes.emplace_back(k, r0, std::min(mine[k].sub_rows, rows - r0));
  }
  // Bytes of one dim-0 row of the dataset, and where its data starts in the file.
  int64_t row_stride = static_cast<int64_t>(c10::elementSize(p.dtype));
  for (size_t d = 1; d < dims.size(); ++d) row_stride *= static_cast<int64_t>(dims[d]);
  const haddr_t dset_addr = H5Dget_offset(dset);
  for (int64_t round = 0; round < p.rounds; ++round) {
    Handle fsel(H5Dget_space(dset), H5Sclose);
    Handle msel;
    const void* buf = &round;  // any valid pointer when nothing is selected
    if (round < static_cast<int64_t>(writes.size())) {
      const auto [k, r0, nrows] = writes[static_cast<size_t>(round)];
      const WriteItem& item = mine[k];
      torch::Tensor part = dims.empty() ? item.data : item.data.narrow(0, r0, nrows);
      std::vector<hsize_t> start(item.offset.begin(), item.offset.end());
      std::vector<hsize_t> count(dims.size());
      for (size_t d = 0; d < dims.size(); ++d) count[d] = static_cast<hsize_t>(part.size(static_cast<int64_t>(d)));
      if (dims.empty()) {  // a scalar: the whole (one-element) space
        H5Sselect_all(fsel);
        msel = Handle(H5Screate(H5S_SCALAR), H5Sclose);
      } else {
        start[0] += static_cast<hsize_t>(r0);
        check(H5Sselect_hyperslab(fsel, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), ctx);
        msel = Handle(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
      }
      buf = part.data_ptr();
    } else {
      H5Sselect_none(fsel);
      msel = Handle(H5Scopy(fsel), H5Sclose);
      H5Sselect_none(msel);
    }
    check(H5Dwrite(dset, ftype, msel, fsel, f.dxpl, buf), ctx + ": write");
    if (round < static_cast<int64_t>(writes.size()) && !dims.empty() && dset_addr != HADDR_UNDEF) {
      const auto [k, r0, nrows] = writes[static_cast<size_t>(round)];
      const int64_t row = static_cast<int64_t>(mine[k].offset[0]) + r0;
      behind.wrote(static_cast<int64_t>(dset_addr) + row * row_stride, nrows * row_stride);
    }
    behind.flush_if_due();
    lap(&tm.write);
  }
}

// This rank's crc32_slices entries by dataset, one per piece (`sums` in plan order).
nlohmann::json checksums_json(const std::vector<DatasetPlan>& plans, const std::map<std::string, std::vector<WriteItem>>& items,
                              std::vector<nlohmann::json> sums) {
  nlohmann::json checksums = nlohmann::json::object();
  size_t next = 0;
  for (const DatasetPlan& p : plans) {
    auto it = items.find(p.name);
    if (it == items.end() || it->second.empty()) continue;
    nlohmann::json my_sums = nlohmann::json::array();
    for (size_t k = 0; k < it->second.size(); ++k) my_sums.push_back(std::move(sums.at(next++)));
    checksums[p.name] = my_sums;
  }
  return checksums;
}

// A dataset's crc32_slices text. An attribute lives in the dataset's object header, whose
// messages HDF5 limits to 64 KiB: past kMaxChecksumText (thousands of slices) the tile CRCs are
// left out, and partial reads of those slices go unchecked, as in files from before them.
constexpr size_t kMaxChecksumText = 60000;
std::string crc32_slices_text(nlohmann::json slices) {
  std::string text = slices.dump();
  if (text.size() <= kMaxChecksumText) return text;
  for (auto& s : slices) {
    s.erase("tile");
    s.erase("tile_crc32");
  }
  return slices.dump();
}

// Root attributes and each dataset's crc32_slices (collective: identical arguments on every rank).
void write_root_attributes(MPI_Comm comm, hid_t file, int64_t step, const nlohmann::json& attributes,
                           const nlohmann::json& per_rank, const std::vector<DatasetPlan>& plans,
                           const nlohmann::json* checksums) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  h5::write_string_attr(file, "format", kFormatName);
  h5::write_int_attr(file, "format_version", kFormatVersion);
  h5::write_int_attr(file, "step", step);
  write_json_attributes(file, attributes);
  const auto ranks = allgather_json(comm, per_rank);
  h5::write_string_attr(file, "per_rank", nlohmann::json(ranks).dump());
  h5::write_int_attr(file, "world_size", size);
  if (!checksums) return;
  const auto all = allgather_json(comm, *checksums);
  for (const DatasetPlan& p : plans) {
    nlohmann::json slices = nlohmann::json::array();
    for (const auto& r : all)
      if (r.contains(p.name))
        for (const auto& s : r[p.name]) slices.push_back(s);
    Handle dset(H5Dopen2(file, p.name.c_str(), H5P_DEFAULT), H5Dclose);
    h5::write_string_attr(dset, "crc32_slices", crc32_slices_text(std::move(slices)));
  }
}

// Keeps the newest `keep_last` step_N.h5 files of `dir` (and always `final_path`).
void drop_old_checkpoints(const std::string& dir, int keep_last, const fs::path& final_path) {
  std::vector<std::pair<int64_t, fs::path>> steps;
  const std::regex pat("step_([0-9]+)\\.h5");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string fname = e.path().filename().string();
    if (std::regex_match(fname, m, pat)) steps.emplace_back(std::stoll(m[1]), e.path());
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + keep_last < steps.size(); ++i)
    if (steps[i].second != final_path) fs::remove(steps[i].second);
}

// Rank 0: fsync, rename into place, then move the `latest` pointer; drop old checkpoints.
void commit_checkpoint(const std::string& dir, const fs::path& tmp_path, const fs::path& final_path, int keep_last,
                       Laps& lap, SaveTimings& tm) {
  lap(&tm.close);  // includes waiting for the slowest rank
  fsync_path(tmp_path, false);
  lap(&tm.fsync);
  fs::rename(tmp_path, final_path);
  fsync_path(fs::path(dir), true);
  const fs::path latest = fs::path(dir) / "latest";
  const fs::path latest_tmp = fs::path(dir) / "latest.tmp";
  {
    std::ofstream out(latest_tmp, std::ios::trunc);
    out << final_path.filename().string() << "\n";
    out.flush();
    if (!out) throw std::runtime_error(latest_tmp.string() + ": write failed");
  }
  fsync_path(latest_tmp, false);
  fs::rename(latest_tmp, latest);
  fsync_path(fs::path(dir), true);
  lap(&tm.commit);
  if (keep_last > 0) drop_old_checkpoints(dir, keep_last, final_path);
  lap(&tm.retention);
}

// What a failed write says; MPI-IO reports a full disk only as "file write failed": say what is likely.
std::string write_error(const std::string& what, const std::string& dir) {
  std::string error = what;
  std::error_code ec;
  const auto space = fs::space(dir, ec);
  if (!ec && space.available < (uint64_t(1) << 20))
    error += " (the disk holding " + dir + " is full: " + std::to_string(space.available) + " bytes free)";
  return error;
}

}  // namespace

std::string save_checkpoint(MPI_Comm comm, const std::string& dir, int64_t step,
                            const std::vector<ShardedTensor>& tensors, const nlohmann::json& attributes,
                            const nlohmann::json& per_rank, const SaveOptions& opt) {
  h5::quiet_errors();
  const fs::path final_path = fs::path(dir) / ("step_" + std::to_string(step) + ".h5");
  const fs::path tmp_path = fs::path(final_path.string() + ".tmp");
  SaveTimings tm;
  Laps lap;

  for (const auto& t : tensors) check_slice(t);
  // Declared before the host copies, so it runs after they are freed, also on an error path.
  struct ReleaseStaging {
    bool any_device = false;
    ~ReleaseStaging() {
      if (any_device) release_host_staging();
    }
  } release_staging;
  for (const auto& t : tensors) release_staging.any_device |= t.local.defined() && t.local.is_cuda();
  std::map<std::string, std::vector<WriteItem>> items;
  const auto plans = plan_datasets(comm, tensors, opt.max_bytes_per_write, opt.write_behind_bytes, &items);

  // A stale temporary from a crashed save is removed; the previous good files are untouched.
  on_root_then_share(comm, [&] {
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".tmp") fs::remove(e.path());
  });
  lap(&tm.plan);

  std::vector<ToSum> to_sum;
  std::future<std::vector<nlohmann::json>> sums_future = start_checksums(plans, items, opt.checksums, to_sum);
  std::string error;
  try {
    SaveFile f = create_save_file(comm, tmp_path, opt.alignment);
    WriteBehind behind(tmp_path, opt.write_behind_bytes);
    for (const DatasetPlan& p : plans) write_dataset(f, tmp_path, p, items[p.name], behind, lap, tm);
    behind.finish();
    lap(&tm.write);
    nlohmann::json checksums = nlohmann::json::object();
    if (opt.checksums) checksums = checksums_json(plans, items, sums_future.get());
    lap(&tm.crc);  // the CRC time not hidden behind the writes
    write_root_attributes(comm, f.file, step, attributes, per_rank, plans, opt.checksums ? &checksums : nullptr);
    if (f.file.close() < 0) throw std::runtime_error(tmp_path.string() + ": close: " + h5::error_stack());
    lap(&tm.close);
  } catch (const std::exception& e) {
    error = write_error(e.what(), dir);
  }
  agree(comm, error);  // every rank finished its part, or all fail together

  try {
    on_root_then_share(comm, [&] { commit_checkpoint(dir, tmp_path, final_path, opt.keep_last, lap, tm); });
  } catch (...) {
    on_root_then_share(comm, [&] { fs::remove(tmp_path); });
    throw;
  }
  if (opt.timings) *opt.timings = tm;
  return final_path.string();
}

std::string resolve_latest(const std::string& dir) {
  const fs::path latest = fs::path(dir) / "latest";
  if (fs::exists(latest)) require_regular_file(latest.string(), "latest");
  std::ifstream in(latest);
  if (!in) throw InputError(latest.string(), "latest", "no checkpoint pointer (nothing saved yet?)");
  std::string name;
  std::getline(in, name);
  if (name.empty() || name.find('/') != std::string::npos)
    throw InputError(latest.string(), "latest", "malformed pointer '" + name + "'");
  const fs::path target = fs::path(dir) / name;
  if (!fs::exists(target)) throw InputError(latest.string(), "latest", "points to missing " + target.string());
  return target.string();
}

// ---- reading -----------------------------------------------------------------------------

namespace {
std::atomic<bool> g_load_checksums{true};
}  // namespace
void set_load_checksums(bool on) { g_load_checksums = on; }
bool load_checksums() { return g_load_checksums; }

CheckpointReader::CheckpointReader(const std::string& path) : check_checksums_(load_checksums()), path_(path) {
  h5::quiet_errors();
  if (!fs::exists(path)) throw InputError(path, "file", "no such checkpoint");
  require_regular_file(path);
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw InputError(path, "file", "not an HDF5 file (truncated or corrupt)");
  }
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw InputError(path, "file", "cannot open: " + h5::error_stack() + " (truncated or corrupt?)");
  try {
    if (!h5::has_attr(file_, "format") || h5::read_string_attr(file_, "format", path) != kFormatName)
      throw InputError(path, "format", "not an autocompress checkpoint");
    const int64_t version = h5::read_int_attr(file_, "format_version", path);
    if (version > kFormatVersion)
      throw InputError(path, "format_version", "file has format version " + std::to_string(version) +
                                                   ", this build reads up to " + std::to_string(kFormatVersion) +
                                                   " (upgrade autocompress)");
    std::map<std::string, std::string> strings;
    std::map<std::string, int64_t> integers;
    Handle root(check(H5Gopen2(file_, "/", H5P_DEFAULT), path), H5Gclose);
    const hsize_t n_attrs = h5::num_attributes(root, path);
    for (hsize_t i = 0; i < n_attrs; ++i) {
      char name[256] = {0};
      Handle a(H5Aopen_by_idx(root, ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      H5Aget_name(a, sizeof(name) - 1, name);
      Handle type(H5Aget_type(a), H5Tclose);
      if (H5Tget_class(type) == H5T_STRING) strings[name] = h5::read_string_attr(file_, name, path);
      else integers[name] = h5::read_int_attr(file_, name, path);
    }
    attributes_ = parse_root_attributes(strings, integers, path);  // json_attributes' names parsed
    const std::vector<std::string> names = h5::list_datasets(file_, path);
    for (const auto& n : names) {
      Handle d(check(H5Dopen2(file_, n.c_str(), H5P_DEFAULT), path + ": dataset " + n), H5Dclose);
      Handle sp(H5Dget_space(d), H5Sclose);
      Handle ty(H5Dget_type(d), H5Tclose);
      DatasetInfo info;
      info.name = n;
      const int nd = H5Sget_simple_extent_ndims(sp);
      std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
      H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
      info.shape.assign(dims.begin(), dims.end());
      const auto t = h5::torch_type(ty, path + ": dataset " + n);
      info.dtype = h5::dtype_name(t);
      info.bytes = static_cast<int64_t>(H5Sget_simple_extent_npoints(sp)) * static_cast<int64_t>(H5Tget_size(ty));
      datasets_.push_back(info);
    }
  } catch (const std::runtime_error& e) {
    H5Fclose(file_);
    file_ = -1;
    if (dynamic_cast<const InputError*>(&e)) throw;
    throw InputError(path, "file", e.what());
  }
}

CheckpointReader::~CheckpointReader() {
  if (file_ >= 0) H5Fclose(file_);
}

int64_t CheckpointReader::step() const { return attributes_.at("step").get<int64_t>(); }

bool CheckpointReader::has(const std::string& name) const {
  return std::any_of(datasets_.begin(), datasets_.end(), [&](const auto& d) { return d.name == name; });
}

const DatasetInfo& CheckpointReader::info(const std::string& name) const {
  for (const auto& d : datasets_)
    if (d.name == name) return d;
  throw InputError(path_, name, "no such dataset in the checkpoint");
}

namespace {
// Destination of a large read: 2 MiB-aligned memory advised for transparent huge pages, so
// that the first touch by H5Dread takes one fault per 2 MiB instead of one per 4 KiB page
// (on a 1 GB load the 4 KiB faults alone cost about as much as the disk read). Small
// tensors use the normal allocator.
torch::Tensor empty_for_read(const std::vector<int64_t>& shape, torch::Dtype dtype) {
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t bytes = static_cast<size_t>(numel_of(shape)) * c10::elementSize(dtype);
  if (bytes < 4 * kHuge) return torch::empty(shape, torch::TensorOptions().dtype(dtype));
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return torch::from_blob(p, shape, [](void* q) { std::free(q); }, torch::TensorOptions().dtype(dtype));
}
}  // namespace

torch::Tensor CheckpointReader::read(const std::string& name, std::vector<int64_t> offset,
                                     std::vector<int64_t> count) const {
  const DatasetInfo& di = info(name);
  const Box want = region(di, std::move(offset), std::move(count));
  if (!check_checksums_ || numel_of(want.shape) == 0) return read_unchecked(di, want);
  const std::vector<CrcSlice> slices = stored_checksums(di);
  if (slices.empty()) return read_unchecked(di, want);  // no crc32_slices: verify() reports it; loading may go on
  // The tiled slices' blocks that `want` touches are read whole and checked, so a rank that
  // reads part of a slice (another TP size than the writer's) checks every byte it uses.
  const CheckedRead plan = plan_checked_read(slices, want);
  torch::Tensor got = read_unchecked(di, plan.span);
  if (const auto bad = first_bad_block(got, plan.span, plan.blocks))
    throw InputError(path_, name, "checksum mismatch in the block at offset " + shape_str(bad->box.offset) + " of shape " +
                                      shape_str(bad->box.shape) +
                                      ": the file is corrupt (`autocompress checkpoint verify` lists every bad slice)");
  return plan.span == want ? got : crop(got, plan.span, want).contiguous();
}

Box CheckpointReader::region(const DatasetInfo& di, std::vector<int64_t> offset, std::vector<int64_t> count) const {
  if (offset.empty()) offset.assign(di.shape.size(), 0);
  if (count.empty()) {
    count = di.shape;
    for (size_t d = 0; d < count.size() && d < offset.size(); ++d) count[d] -= offset[d];
  }
  if (offset.size() != di.shape.size() || count.size() != di.shape.size())
    throw InputError(path_, di.name, "slice rank does not match the dataset's " + shape_str(di.shape));
  for (size_t d = 0; d < di.shape.size(); ++d)
    if (offset[d] < 0 || count[d] < 0 || offset[d] > di.shape[d] || count[d] > di.shape[d] - offset[d])
      throw InputError(path_, di.name, "slice " + shape_str(offset) + " + " + shape_str(count) + " outside " +
                                           shape_str(di.shape));
  return {std::move(offset), std::move(count)};
}

std::vector<CrcSlice> CheckpointReader::stored_checksums(const DatasetInfo& di) const {
  Handle d(check(H5Dopen2(file_, di.name.c_str(), H5P_DEFAULT), path_ + ": dataset " + di.name), H5Dclose);
  if (!h5::has_attr(d, "crc32_slices")) return {};
  try {
    return parse_crc32_slices(h5::read_string_attr(d, "crc32_slices", path_), di.shape, path_, di.name);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw InputError(path_, di.name + ": crc32_slices", std::string("malformed: ") + e.what());
  }
}

torch::Tensor CheckpointReader::read_unchecked(const DatasetInfo& di, const Box& box) const {
  const std::string& name = di.name;
  const std::string ctx = path_ + ": dataset " + name;
  Handle d(check(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), ctx), H5Dclose);
  Handle ty(H5Dget_type(d), H5Tclose);
  const auto dtype = h5::torch_type(ty, ctx);
  torch::Tensor out = empty_for_read(box.shape, dtype);
  if (out.numel() == 0) return out;
  Handle fsel(H5Dget_space(d), H5Sclose);
  Handle msel;
  if (di.shape.empty()) {
    msel = Handle(H5Screate(H5S_SCALAR), H5Sclose);
  } else {
    std::vector<hsize_t> s(box.offset.begin(), box.offset.end()), c(box.shape.begin(), box.shape.end());
    H5Sselect_hyperslab(fsel, H5S_SELECT_SET, s.data(), nullptr, c.data(), nullptr);
    msel = Handle(H5Screate_simple(static_cast<int>(c.size()), c.data(), nullptr), H5Sclose);
  }
  Handle mtype = h5::file_type(dtype);
  if (H5Dread(d, mtype, msel, fsel, H5P_DEFAULT, out.data_ptr()) < 0)
    throw InputError(path_, name, "read failed: " + h5::error_stack() + " (truncated or corrupt file?)");
  return out;
}

void CheckpointReader::read_into(const std::string& name, torch::Tensor& out, const std::vector<int64_t>& offset,
                                 const std::vector<int64_t>& expected_global_shape) const {
  const DatasetInfo& di = info(name);
  if (!expected_global_shape.empty() && di.shape != expected_global_shape)
    throw InputError(path_, name, "has shape " + shape_str(di.shape) + ", expected " + shape_str(expected_global_shape));
  torch::Tensor t = read(name, offset, out.sizes().vec());
  torch::NoGradGuard ng;
  out.copy_(t);
}

std::vector<std::string> CheckpointReader::verify(bool checksums) const {
  std::vector<std::string> problems;
  for (const auto& di : datasets_) {
    try {
      const Box all = region(di, {}, {});
      Handle d(check(H5Dopen2(file_, di.name.c_str(), H5P_DEFAULT), path_ + ": dataset " + di.name), H5Dclose);
      if (checksums && !h5::has_attr(d, "crc32_slices")) {
        problems.push_back(path_ + ": dataset " + di.name + ": no crc32_slices attribute: its checksums cannot be checked");
        read_unchecked(di, all);
      } else if (checksums) {
        for (const CrcSlice& s : stored_checksums(di))
          if (auto p = slice_problem(di, s)) problems.push_back(*p);
      } else {
        read_unchecked(di, all);
      }
    } catch (const std::exception& e) {
      problems.push_back(e.what());
    }
  }
  return problems;
}

std::optional<std::string> CheckpointReader::slice_problem(const DatasetInfo& di, const CrcSlice& s) const {
  const Box box{s.offset, s.shape};
  const torch::Tensor t = read_unchecked(di, box);
  const std::string where = path_ + ": dataset " + di.name + ": ";
  std::optional<CrcBlock> bad;
  if (s.tiled) bad = first_bad_block(t, box, tile_blocks(s, box));
  if (crc32_of(t) != s.crc32)
    return where + "checksum mismatch in slice at offset " + shape_str(s.offset) +
           (bad ? " (first bad block at offset " + shape_str(bad->box.offset) + ")" : std::string());
  if (bad)  // the data match the slice's CRC, not a block's: the tile CRCs were altered
    return where + "checksum mismatch in the tile CRC32 of the block at offset " + shape_str(bad->box.offset) +
           " of slice at offset " + shape_str(s.offset);
  return std::nullopt;
}

}  // namespace ac::checkpoint

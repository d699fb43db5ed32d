// HDF5 token store (see hdf5_store.h for the layout).
#include "data/hdf5_store.h"

#include <hdf5.h>

#include <cstdio>
#include <limits>
#include <mutex>
#include <stdexcept>

#include "dist/error.h"
#include "dist/file_io.h"

namespace ac::data {
namespace {

// Debian's parallel HDF5 is not built thread-safe: serialize the calls that may race.
std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

constexpr const char* kFormat = "autocompress.tokens";
constexpr int kFormatVersion = 1;

// Silences HDF5's error-stack printing while in scope: we turn failures into our own
// messages; the previous handler is restored afterwards.
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

hid_t file_type(DType t) {
  switch (t) {
    case DType::U16: return H5T_STD_U16LE;
    case DType::I32: return H5T_STD_I32LE;
    case DType::I64: return H5T_STD_I64LE;
    default: throw std::invalid_argument(std::string("HDF5 token store: dtype ") + dtype_name(t) + " not supported (use uint16, int32, int64)");
  }
}

void check(herr_t rc, const std::string& what) {
  if (rc < 0) throw std::runtime_error(what);
}

void write_attr_string(hid_t obj, const char* name, const std::string& value) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, value.size());
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = H5Awrite(a, t, value.data());
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  check(rc, std::string("cannot write attribute ") + name);
}

void write_attr_int(hid_t obj, const char* name, int64_t value) {
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = H5Awrite(a, H5T_NATIVE_INT64, &value);
  H5Aclose(a);
  H5Sclose(sp);
  check(rc, std::string("cannot write attribute ") + name);
}

bool read_attr_string(hid_t obj, const char* name, std::string* out) {
  if (H5Aexists(obj, name) <= 0) return false;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  hid_t t = H5Aget_type(a);
  bool ok = H5Tget_class(t) == H5T_STRING && !H5Tis_variable_str(t);
  if (ok) {
    size_t n = H5Tget_size(t);
    std::string s(n, '\0');
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, n);
    ok = H5Aread(a, mt, s.data()) >= 0;
    H5Tclose(mt);
    while (!s.empty() && s.back() == '\0') s.pop_back();
    *out = s;
  }
  H5Tclose(t);
  H5Aclose(a);
  return ok;
}

bool read_attr_int(hid_t obj, const char* name, int64_t* out) {
  if (H5Aexists(obj, name) <= 0) return false;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  bool ok = H5Aread(a, H5T_NATIVE_INT64, out) >= 0;
  H5Aclose(a);
  return ok;
}

hid_t create_1d(hid_t file, const char* name, hid_t type, int64_t chunk, int level) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunks[1] = {static_cast<hsize_t>(chunk)};
  hid_t sp = H5Screate_simple(1, dims, maxdims);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, chunks);
  if (level > 0) {
    H5Pset_shuffle(dcpl);  // byte shuffle: token ids compress much better
    H5Pset_deflate(dcpl, level);
  }
  hid_t d = H5Dcreate2(file, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(sp);
  if (d < 0) throw std::runtime_error(std::string("cannot create dataset ") + name);
  return d;
}

void append_1d(hid_t ds, int64_t at, const int64_t* data, int64_t n, const std::string& what) {
  if (n == 0) return;
  hsize_t newsize[1] = {static_cast<hsize_t>(at + n)};
  check(H5Dset_extent(ds, newsize), what + ": cannot extend");
  hid_t fs = H5Dget_space(ds);
  hsize_t start[1] = {static_cast<hsize_t>(at)}, count[1] = {static_cast<hsize_t>(n)};
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, count, nullptr);
  hid_t ms = H5Screate_simple(1, count, nullptr);
  herr_t rc = H5Dwrite(ds, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, data);
  H5Sclose(ms);
  H5Sclose(fs);
  check(rc, what + ": write failed");
}

}  // namespace

bool is_hdf5_path(const std::string& p) {
  auto ends = [&](const std::string& s) { return p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0; };
  return ends(".h5") || ends(".hdf5");
}

// ---- writer --------------------------------------------------------------------------------

Hdf5TokenWriter::Hdf5TokenWriter(const std::string& path, const Hdf5StoreOptions& opts) : path_(path), opts_(opts) {
  hid_t ft = file_type(opts.dtype);
  check_output_path(path, "--output");
  const std::string tmp = path + ".tmp";
  {
    QuietHdf5 quiet;
    file_ = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  }
  if (file_ < 0) throw InputError(tmp, "file", "cannot create HDF5 file");
  try {
    tokens_ = create_1d(file_, "tokens", ft, opts.chunk_tokens, opts.deflate_level);
    write_attr_string(file_, "format", kFormat);
    write_attr_int(file_, "format_version", kFormatVersion);
  } catch (...) {
    abort();
    throw;
  }
}

Hdf5TokenWriter::~Hdf5TokenWriter() {
  if (!done_) abort();
}

void Hdf5TokenWriter::abort() {
  if (tokens_ >= 0) H5Dclose(tokens_);
  if (file_ >= 0) H5Fclose(file_);
  tokens_ = file_ = -1;
  std::remove((path_ + ".tmp").c_str());
  done_ = true;
}

void Hdf5TokenWriter::flush_tokens() {
  append_1d(tokens_, written_, pending_.data(), static_cast<int64_t>(pending_.size()), path_ + ".tmp: /tokens");
  written_ += static_cast<int64_t>(pending_.size());
  pending_.clear();
}

void Hdf5TokenWriter::add_document(const int64_t* tokens, size_t n) {
  if (done_) throw std::logic_error("Hdf5TokenWriter: add after finalize");
  for (size_t i = 0; i < n; ++i) {
    if (!dtype_holds(opts_.dtype, tokens[i]))
      throw InputError(path_, "document " + std::to_string(num_documents()),
                       "token " + std::to_string(tokens[i]) + " does not fit dtype " + dtype_name(opts_.dtype));
  }
  pending_.insert(pending_.end(), tokens, tokens + n);
  offsets_.push_back(offsets_.back() + static_cast<int64_t>(n));
  if (static_cast<int64_t>(pending_.size()) >= opts_.chunk_tokens * 4) flush_tokens();
}

void Hdf5TokenWriter::finalize() {
  if (done_) throw std::logic_error("Hdf5TokenWriter: finalize twice");
  flush_tokens();
  hid_t off = create_1d(file_, "document_offsets", H5T_STD_I64LE, std::min<int64_t>(1 << 16, std::max<size_t>(offsets_.size(), 1)),
                        opts_.deflate_level);
  append_1d(off, 0, offsets_.data(), static_cast<int64_t>(offsets_.size()), path_ + ".tmp: /document_offsets");
  H5Dclose(off);
  H5Dclose(tokens_);
  tokens_ = -1;
  herr_t rc = H5Fclose(file_);
  file_ = -1;
  if (rc < 0) throw std::runtime_error(path_ + ".tmp: close failed");
  if (std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0) throw std::runtime_error(path_ + ": rename failed");
  done_ = true;
}

// ---- reader --------------------------------------------------------------------------------

Hdf5TokenStore::Hdf5TokenStore(const std::string& path) : path_(path) {
  QuietHdf5 quiet;
  require_regular_file(path);
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    throw InputError(path, "file", "cannot open");
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) throw InputError(path, "file", "not an HDF5 file (or truncated: no readable superblock)");
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw InputError(path, "file", "cannot open as HDF5 (truncated or corrupt?)");
  auto fail = [&](const std::string& field, const std::string& problem) {
    if (tokens_ >= 0) H5Dclose(tokens_);
    H5Fclose(file_);
    tokens_ = file_ = -1;
    throw InputError(path, field, problem);
  };
  std::string fmt;
  int64_t version = 0;
  if (!read_attr_string(file_, "format", &fmt) || fmt != kFormat)
    fail("attribute format", std::string("missing or not \"") + kFormat + "\": not an autocompress token store");
  if (!read_attr_int(file_, "format_version", &version) || version != kFormatVersion)
    fail("attribute format_version", "is " + std::to_string(version) + ", this build reads version " + std::to_string(kFormatVersion));
  if (H5Lexists(file_, "tokens", H5P_DEFAULT) <= 0) fail("/tokens", "dataset missing");
  if (H5Lexists(file_, "document_offsets", H5P_DEFAULT) <= 0) fail("/document_offsets", "dataset missing");
  hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
  H5Pset_chunk_cache(dapl, 521, 64 << 20, 0.75);  // keeps recently read chunks decompressed
  tokens_ = H5Dopen2(file_, "tokens", dapl);
  H5Pclose(dapl);
  if (tokens_ < 0) fail("/tokens", "cannot open dataset");
  hid_t t = H5Dget_type(tokens_);
  bool known = true;
  if (H5Tequal(t, H5T_STD_U16LE) > 0) dtype_ = DType::U16;
  else if (H5Tequal(t, H5T_STD_I32LE) > 0) dtype_ = DType::I32;
  else if (H5Tequal(t, H5T_STD_I64LE) > 0) dtype_ = DType::I64;
  else known = false;
  H5Tclose(t);
  if (!known) fail("/tokens", "element type is not uint16, int32 or int64 little-endian");
  hid_t sp = H5Dget_space(tokens_);
  int rank = H5Sget_simple_extent_ndims(sp);
  hsize_t ntok = 0;
  if (rank == 1) H5Sget_simple_extent_dims(sp, &ntok, nullptr);
  H5Sclose(sp);
  if (rank != 1) fail("/tokens", "must be 1-D, has rank " + std::to_string(rank));

  hid_t od = H5Dopen2(file_, "document_offsets", H5P_DEFAULT);
  if (od < 0) fail("/document_offsets", "cannot open dataset");
  sp = H5Dget_space(od);
  rank = H5Sget_simple_extent_ndims(sp);
  hsize_t noff = 0;
  if (rank == 1) H5Sget_simple_extent_dims(sp, &noff, nullptr);
  H5Sclose(sp);
  if (rank != 1 || noff < 1) {
    H5Dclose(od);
    fail("/document_offsets", "must be 1-D with at least one entry");
  }
  offsets_.resize(noff);
  herr_t rc = H5Dread(od, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets_.data());
  H5Dclose(od);
  if (rc < 0) fail("/document_offsets", "read failed (truncated or corrupt file?)");
  if (offsets_[0] != 0) fail("/document_offsets[0]", "must be 0, is " + std::to_string(offsets_[0]));
  for (size_t i = 1; i < offsets_.size(); ++i) {
    if (offsets_[i] < offsets_[i - 1])
      fail("/document_offsets[" + std::to_string(i) + "]", "decreases: " + std::to_string(offsets_[i]) + " < " + std::to_string(offsets_[i - 1]));
  }
  if (static_cast<hsize_t>(offsets_.back()) != ntok)
    fail("/document_offsets", "last entry " + std::to_string(offsets_.back()) + " does not match the " + std::to_string(ntok) + " elements of /tokens");
}

Hdf5TokenStore::~Hdf5TokenStore() {
  if (tokens_ >= 0) H5Dclose(tokens_);
  if (file_ >= 0) H5Fclose(file_);
}

// Reads elements [offsets_[doc] + offset, + count) of /tokens converted by HDF5 to mem_type.
void Hdf5TokenStore::read_elements(int64_t doc, int64_t offset, int64_t count, hid_t mem_type, void* out) const {
  std::lock_guard<std::mutex> lk(hdf5_mutex());
  if (offset + count > document_length(doc)) throw std::out_of_range(path_ + ": read past the end of document " + std::to_string(doc));
  hid_t fs = H5Dget_space(tokens_);
  hsize_t start[1] = {static_cast<hsize_t>(offsets_[doc] + offset)}, cnt[1] = {static_cast<hsize_t>(count)};
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, cnt, nullptr);
  hid_t ms = H5Screate_simple(1, cnt, nullptr);
  herr_t rc;
  {
    QuietHdf5 quiet;
    rc = H5Dread(tokens_, mem_type, ms, fs, H5P_DEFAULT, out);
  }
  H5Sclose(ms);
  H5Sclose(fs);
  if (rc < 0) throw InputError(path_, "/tokens", "read of elements [" + std::to_string(start[0]) + ", " + std::to_string(start[0] + count) + ") failed (corrupt chunk?)");
}

void Hdf5TokenStore::read(int64_t doc, int64_t offset, int64_t count, int64_t* out) const {
  if (count > 0) read_elements(doc, offset, count, H5T_NATIVE_INT64, out);
}

void Hdf5TokenStore::read(int64_t doc, int64_t offset, int64_t count, int32_t* out) const {
  if (count == 0) return;
  if (dtype_ != DType::I64) {  // uint16 and int32 ids always fit
    read_elements(doc, offset, count, H5T_NATIVE_INT32, out);
    return;
  }
  // HDF5 would clip out-of-range values silently: read as int64 and narrow with a check.
  std::vector<int64_t> wide(count);
  read_elements(doc, offset, count, H5T_NATIVE_INT64, wide.data());
  for (int64_t i = 0; i < count; ++i) {
    if (wide[i] < std::numeric_limits<int32_t>::min() || wide[i] > std::numeric_limits<int32_t>::max())
      throw InputError(path_, "/tokens[" + std::to_string(offsets_[doc] + offset + i) + "]",
                       "token id " + std::to_string(wide[i]) + " does not fit int32");
    out[i] = static_cast<int32_t>(wide[i]);
  }
}

}  // namespace ac::data

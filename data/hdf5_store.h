// HDF5 token store: the alternative to Megatron's .bin/.idx. One file with
//   /tokens            1-D, the token ids of all documents back to back (chunked, shuffle +
//                      deflate compressed; uint16 / int32 / int64)
//   /document_offsets  1-D int64, documents + 1 entries: document d is
//                      tokens[offsets[d] : offsets[d + 1]]
// and root attributes format = "autocompress.tokens", format_version = 1.
// Readable with h5py and h5dump. Serial HDF5 calls (default file driver).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/token_source.h"

namespace ac::data {

struct Hdf5StoreOptions {
  DType dtype = DType::I32;       // U16, I32 or I64
  int64_t chunk_tokens = 1 << 18;  // elements per chunk of /tokens
  int deflate_level = 4;           // 0 = no compression
};

// Writes to `<path>.tmp` and renames on finalize(); an unfinalized writer removes it.
class Hdf5TokenWriter {
 public:
  Hdf5TokenWriter(const std::string& path, const Hdf5StoreOptions& opts);
  ~Hdf5TokenWriter();
  Hdf5TokenWriter(const Hdf5TokenWriter&) = delete;
  Hdf5TokenWriter& operator=(const Hdf5TokenWriter&) = delete;

  void add_document(const int64_t* tokens, size_t n);
  void finalize();
  void abort();
  int64_t num_documents() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t num_tokens() const { return offsets_.back(); }

 private:
  void flush_tokens();
  std::string path_;
  Hdf5StoreOptions opts_;
  int64_t file_ = -1, tokens_ = -1;  // hid_t
  std::vector<int64_t> pending_;
  int64_t written_ = 0;
  std::vector<int64_t> offsets_{0};
  bool done_ = false;
};

class Hdf5TokenStore : public TokenSource {
 public:
  // Validates the attributes, dataset shapes and offsets; throws ac::InputError naming the
  // file and dataset.
  explicit Hdf5TokenStore(const std::string& path);
  ~Hdf5TokenStore() override;

  DType dtype() const { return dtype_; }
  int64_t num_documents() const override { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t document_length(int64_t d) const override { return offsets_[d + 1] - offsets_[d]; }
  int64_t num_tokens() const override { return offsets_.back(); }
  void read(int64_t doc, int64_t offset, int64_t count, int64_t* out) const override;
  void read(int64_t doc, int64_t offset, int64_t count, int32_t* out) const override;
  std::string describe() const override { return path_; }

 private:
  std::string path_;
  int64_t file_ = -1, tokens_ = -1;  // hid_t
  DType dtype_ = DType::I32;
  std::vector<int64_t> offsets_;
  void read_elements(int64_t doc, int64_t offset, int64_t count, int64_t mem_type /* hid_t */, void* out) const;
};

bool is_hdf5_path(const std::string& path);  // ends in .h5 or .hdf5

}  // namespace ac::data

// Megatron indexed dataset (.idx + .bin), byte-compatible with megatron-core's
// IndexedDataset / IndexedDatasetBuilder: a memory-mapped reader that validates the index
// against the data file, and a writer that writes to temporary names and renames at the end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_source.h"

namespace ac::data {

// megatron-core's DType codes (indexed_dataset.py: class DType).
enum class DType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);          // "uint8", "int16", ... (numpy names)
bool dtype_from_code(int code, DType* out);
bool dtype_from_name(const std::string& name, DType* out);
// megatron-core's DType.optimal_dtype: uint16 when the vocabulary has < 65500 entries, else int32.
DType optimal_dtype(int64_t vocab_size);
// Whether `v` is stored exactly by `t` (integer range, or exact in the float type).
bool dtype_holds(DType t, int64_t v);

// Read-only memory map of a whole file (empty files map to nothing).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Reader for `<prefix>.idx` + `<prefix>.bin`. The constructor checks the whole index (magic,
// version, dtype code, counts, sizes, document indices, pointers against the .bin size) and
// throws ac::InputError naming the file and byte offset of the first problem.
class IndexedDataset : public TokenSource {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset() override;

  DType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  // Megatron's document_indices (sequence index where each document starts, then S) are
  // read with document_index(j); the arrays are unaligned in the file, so no raw pointers.
  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;
  int64_t document_index(int64_t j) const;  // j in [0, num_documents()]
  bool has_sequence_modes() const { return modes_ != nullptr; }  // multimodal index
  int8_t sequence_mode(int64_t i) const { return modes_[i]; }
  // Tokens of sequence i (converted to int64).
  std::vector<int64_t> sequence(int64_t i) const;
  const uint8_t* bin_data() const;
  const std::string& prefix() const { return prefix_; }

  // TokenSource: a document is the concatenation of its sequences (one per document for
  // datasets written by `preprocess`, several when a tool split sentences).
  int64_t num_documents() const override { return num_docs_; }
  int64_t document_length(int64_t d) const override { return doc_start_[d + 1] - doc_start_[d]; }
  int64_t num_tokens() const override { return total_tokens_; }
  void read(int64_t d, int64_t offset, int64_t count, int64_t* out) const override;
  void read(int64_t d, int64_t offset, int64_t count, int32_t* out) const override;
  std::string describe() const override { return prefix_ + ".{idx,bin}"; }

 private:
  std::string prefix_;
  std::unique_ptr<MappedFile> idx_, bin_;
  DType dtype_ = DType::I32;
  int64_t num_sequences_ = 0, num_docs_ = 0, total_tokens_ = 0;
  const int32_t* seq_len_ = nullptr;
  const int64_t* seq_ptr_ = nullptr;
  const int64_t* doc_idx_ = nullptr;
  const int8_t* modes_ = nullptr;
  template <typename Out>
  void read_as(int64_t d, int64_t offset, int64_t count, Out* out) const;
  std::vector<int64_t> doc_start_;  // first token of each document (+ the total), in token order
  bool contiguous_ = false;         // sequences back to back in .bin (what every writer makes)
};

// Writer for `<prefix>.idx` + `<prefix>.bin` with megatron-core's layout. Data goes to
// `<prefix>.bin.tmp` / `<prefix>.idx.tmp`; finalize() renames them. Destroying an
// unfinalized writer removes the temporary files, so a failed run leaves nothing behind.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, DType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One document made of one sequence (what `preprocess` writes). Throws ac::InputError when
  // a token does not fit the dtype or the document has more tokens than an int32 can count.
  void add_document(const int64_t* tokens, size_t n);
  // Megatron's add_item + end_document, for documents of several sequences.
  void add_item(const int64_t* tokens, size_t n);
  void end_document();
  void finalize();
  // Removes the temporary files (also done by the destructor when not finalized).
  void abort();

  int64_t num_documents() const { return static_cast<int64_t>(doc_idx_.size()) - 1; }
  int64_t num_tokens() const { return total_tokens_; }

 private:
  std::string prefix_;
  DType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> seq_len_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<uint8_t> buf_;
  int64_t total_tokens_ = 0;
  bool done_ = false;
};

}  // namespace ac::data

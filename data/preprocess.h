// Preprocessing: text (JSONL or plain) -> token ids -> Megatron .idx/.bin or HDF5 store.
// Reading and writing stay on the calling thread, in input order; tokenization runs on
// `workers` threads. Output files appear only when everything succeeded.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace ac::data {

enum class OutputFormat { Megatron, Hdf5 };

struct PreprocessProgress {
  int64_t bytes_done = 0, bytes_total = 0;  // input bytes
  int64_t documents = 0, tokens = 0;
  double seconds = 0;
};

struct PreprocessConfig {
  std::vector<std::string> inputs;  // *.jsonl / *.json: one JSON object per line; else plain text
  std::string tokenizer_path;       // Hugging Face tokenizer.json
  std::string output_prefix;        // Megatron: <prefix>.idx/.bin; HDF5: <prefix>.h5 (or the path itself when it ends in .h5)
  OutputFormat format = OutputFormat::Megatron;
  int workers = 1;
  std::string json_key = "text";
  std::optional<std::string> eos_token;  // default: the tokenizer's end-of-text token
  bool append_eos = true;
  int64_t max_document_tokens = std::numeric_limits<int32_t>::max();  // Megatron stores int32 lengths
  std::optional<DType> dtype;           // default: uint16 when the vocabulary fits, else int32
  int64_t batch_bytes = 1 << 20;        // text handed to a worker at a time
  std::function<void(const PreprocessProgress&)> on_progress;
  double progress_interval_s = 1.0;  // at most one on_progress call per interval
};

struct PreprocessResult {
  int64_t documents = 0, tokens = 0, bytes = 0, skipped_empty = 0;
  double seconds = 0;
  DType dtype = DType::I32;
  std::vector<std::string> outputs;  // files written
};

// Plain text: documents are separated by one or more blank lines. Throws ac::InputError
// naming the file and line for invalid UTF-8, bad JSON, a missing key, a document longer
// than max_document_tokens, or an input with no documents.
PreprocessResult preprocess(const PreprocessConfig& cfg);

std::string hdf5_output_path(const std::string& prefix);

}  // namespace ac::data

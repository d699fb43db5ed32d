// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2, Llama-3,
// Nemotron family): added/special tokens split out first, then the pre-tokenizer (a Split
// regex and/or ByteLevel's GPT-2 regex, run with PCRE2 in UTF + UCP mode), GPT-2's byte to
// unicode mapping, and merges applied by rank. Gives the ids that `tokenizers` gives for
// encode(text, add_special_tokens=False).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ac::data {

// Byte offset of the first invalid UTF-8 sequence in `s`, or npos when `s` is valid
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
size_t find_invalid_utf8(std::string_view s);

class BpeTokenizer {
 public:
  // Reads and checks a tokenizer.json; throws ac::InputError(path, field, problem) for
  // anything it cannot reproduce exactly (another model type, a normalizer, ...).
  static std::shared_ptr<const BpeTokenizer> from_file(const std::string& path);
  static std::shared_ptr<const BpeTokenizer> from_json_text(const std::string& json_text, const std::string& name);
  ~BpeTokenizer();

  // Per-thread scratch (regex match data, a cache of encoded words). encode() is const and
  // thread-safe when each thread uses its own Workspace.
  class Workspace;
  struct WorkspaceDeleter {
    void operator()(Workspace* w) const;
  };
  using WorkspacePtr = std::unique_ptr<Workspace, WorkspaceDeleter>;
  WorkspacePtr make_workspace() const;

  // Appends the ids of `text` (valid UTF-8) to *out; no special tokens are added.
  void encode(std::string_view text, Workspace& ws, std::vector<int64_t>* out) const;
  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t vocab_size() const { return vocab_size_; }  // largest id + 1
  std::optional<int64_t> token_to_id(const std::string& token) const;
  // The end-of-document token: "<|endoftext|>", "<|end_of_text|>", "</s>" or "<eos>",
  // whichever the added tokens hold first; nullopt when none does.
  std::optional<int64_t> default_eos_id() const;
  // An added (special) token such as "<|im_start|>": decode() writes its content, which is
  // markup rather than text of the document (bits per byte counts it as 0 bytes).
  bool is_added_token(int64_t id) const;
  const std::string& name() const { return name_; }

 private:
  BpeTokenizer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t vocab_size_ = 0;
  std::string name_;
};

}  // namespace ac::data

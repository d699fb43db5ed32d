// TokenSource: a tokenized corpus seen as a list of documents of integer token ids. The
// Megatron indexed dataset and the HDF5 token store both implement it; the sampler reads
// through it and does not know which file format is underneath. Tokens are handed out as
// int64 (what torch's index ops and losses take) or int32: half the bytes per token for the
// loader, enough for any vocabulary (megatron-core stores ids as uint16 or int32 too).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace ac::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t num_documents() const = 0;
  virtual int64_t document_length(int64_t doc) const = 0;  // tokens
  virtual int64_t num_tokens() const = 0;
  // Copies tokens [offset, offset + count) of document `doc` into out.
  virtual void read(int64_t doc, int64_t offset, int64_t count, int64_t* out) const = 0;
  // The same as int32; throws ac::InputError naming the file when a stored id does not fit.
  virtual void read(int64_t doc, int64_t offset, int64_t count, int32_t* out) const = 0;
  virtual std::string describe() const = 0;  // for messages: the file(s) it reads
};

// Opens a tokenized corpus by name: `<prefix>` (Megatron .idx/.bin) or a `.h5`/`.hdf5` file.
std::shared_ptr<TokenSource> open_token_source(const std::string& path);

}  // namespace ac::data

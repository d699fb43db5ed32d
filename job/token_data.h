// The token batches of a job: blended datasets by split, one micro-batch on the device,
// and the data cursor a checkpoint restores.
#pragma once

#include <torch/torch.h>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/sampler.h"

namespace ac::job {

// The blended token datasets of one job (`--data PATH|WEIGHT:PATH ...`, `--split`), one sampler
// per split on request.
class TokenData {
 public:
  TokenData(const std::vector<std::string>& data, const std::string& split, int64_t seq_len, uint64_t seed);
  std::shared_ptr<data::BlendedSampler> sampler(data::Split which) const;
  int64_t seq_len() const { return seq_len_; }

 private:
  std::vector<data::BlendEntry> entries_;
  data::SplitSpec split_;
  int64_t seq_len_;
  uint64_t seed_;
};

// One micro-batch on the device: input [B, T] and next-token labels [B * T], int64.
struct Batch {
  torch::Tensor input, labels;
};
// The loader's next micro-batch (int32 on the host: half the bytes; widened on the device).
Batch next_batch(data::DataLoader& loader, int64_t micro_batch, int64_t seq_len, const torch::Device& device);

// The data cursor a checkpoint's attributes hold (`data_cursor`), checked against `sampler`.
data::DataCursor restore_cursor(const nlohmann::json& attributes, const data::BlendedSampler& sampler,
                                const std::string& path);

}  // namespace ac::job

// The job's token data (job/token_data.h).
#include "job/token_data.h"

namespace ac::job {

TokenData::TokenData(const std::vector<std::string>& data, const std::string& split, int64_t seq_len, uint64_t seed)
    : split_(data::parse_split(split)), seq_len_(seq_len), seed_(seed) {
  for (const auto& d : data) entries_.push_back(data::parse_blend_entry(d));
}

std::shared_ptr<data::BlendedSampler> TokenData::sampler(data::Split which) const {
  return std::make_shared<data::BlendedSampler>(entries_, seq_len_, seed_, split_, which);
}

Batch next_batch(data::DataLoader& loader, int64_t micro_batch, int64_t seq_len, const torch::Device& device) {
  // The loader hands on int32 ids (half the bytes of int64); index ops and losses want int64.
  torch::Tensor ids = torch::empty({micro_batch, seq_len + 1}, torch::kInt);
  loader.next(ids.data_ptr<int32_t>());
  torch::Tensor all = ids.to(device, torch::kLong);
  return {all.narrow(1, 0, seq_len).contiguous(), all.narrow(1, 1, seq_len).reshape({-1}).contiguous()};
}

data::DataCursor restore_cursor(const nlohmann::json& attributes, const data::BlendedSampler& sampler,
                                const std::string& path) {
  data::DataCursor c = data::DataCursor::from_json(attributes.at("data_cursor"), path + ": data_cursor");
  c.check_matches(sampler, path + ": data_cursor");
  return c;
}

}  // namespace ac::job

// CausalLM <-> checkpoint through the model's shard map (see model_state.h).
#include "checkpoint/model_state.h"

#include "dist/error.h"

namespace ac::checkpoint {

std::vector<ShardedTensor> model_tensors(model::CausalLM& m, bool write, const std::string& prefix,
                                         std::optional<bool> write_experts) {
  auto params = m->named_parameters(/*recurse=*/true);
  std::vector<ShardedTensor> out;
  for (const auto& s : m->shard_map()) {
    const auto* p = params.find(s.param);
    if (!p) throw std::runtime_error("model_tensors: shard map names unknown parameter " + s.param);
    const torch::Tensor local = p->detach();
    int64_t at = 0;  // running offset of the next piece along the concatenation dim
    for (size_t k = 0; k < s.pieces.size(); ++k) {
      const model::ShardPiece& piece = s.pieces[k];
      torch::Tensor part = s.stack ? local.select(0, static_cast<int64_t>(k)) : local.narrow(piece.dim, at, piece.size);
      if (!s.stack) at += piece.size;
      std::vector<int64_t> offset(piece.logical_shape.size(), 0);
      if (!offset.empty()) offset[static_cast<size_t>(piece.dim)] = piece.start;
      // Per-expert pieces (stacked) are the routed experts.
      out.push_back({prefix + piece.logical, piece.logical_shape, offset, part.contiguous(),
                     s.stack ? write_experts.value_or(write) : write});
    }
  }
  return out;
}

void load_model(model::CausalLM& m, const CheckpointReader& reader, const std::string& prefix,
                const std::function<std::string(const std::string&)>& rename) {
  m->load([&](const model::ShardPiece& piece) {
    const std::string name = prefix + (rename ? rename(piece.logical) : piece.logical);
    const DatasetInfo& info = reader.info(name);
    if (info.shape != piece.logical_shape) {
      std::string want = "[", have = "[";
      for (size_t i = 0; i < piece.logical_shape.size(); ++i) want += (i ? ", " : "") + std::to_string(piece.logical_shape[i]);
      for (size_t i = 0; i < info.shape.size(); ++i) have += (i ? ", " : "") + std::to_string(info.shape[i]);
      throw InputError(reader.path(), name, "has shape " + have + "], the ArchSpec wants " + want + "]");
    }
    if (info.dtype != "float32" && info.dtype != "bfloat16" && info.dtype != "float16")
      throw InputError(reader.path(), name, "has dtype " + info.dtype + ", a model weight must be float32, bfloat16 or float16");
    std::vector<int64_t> offset(piece.logical_shape.size(), 0), count = piece.logical_shape;
    if (!offset.empty()) {
      offset[static_cast<size_t>(piece.dim)] = piece.start;
      count[static_cast<size_t>(piece.dim)] = piece.size;
    }
    return reader.read(name, offset, count);
  });
}

}  // namespace ac::checkpoint

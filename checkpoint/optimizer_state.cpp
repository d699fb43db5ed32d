// ZeRO-1 optimizer state <-> checkpoint (see optimizer_state.h).
#include "checkpoint/optimizer_state.h"

#include <torch/torch.h>

#include <map>
#include <stdexcept>

#include "dist/error.h"

namespace ac::checkpoint {

namespace {

// One hyperslab of a logical tensor and the part of a state tensor that holds it.
struct Slab {
  const model::ShardPiece* piece;
  std::vector<int64_t> offset;
  torch::Tensor view;
};

// `state` holds rows [row_start, row_start + rows) (dim 0) of the local parameter `s` describes.
std::vector<Slab> slabs(const model::ParamShard& s, const torch::Tensor& state, int64_t row_start) {
  std::vector<Slab> out;
  const int64_t rows = state.size(0);
  if (rows == 0 || s.pieces.empty()) return out;
  auto base_offset = [](const model::ShardPiece& p) {
    std::vector<int64_t> o(p.logical_shape.size(), 0);
    if (!o.empty()) o[static_cast<size_t>(p.dim)] = p.start;
    return o;
  };
  if (s.stack) {  // local row k is piece k (one expert)
    for (int64_t k = row_start; k < row_start + rows; ++k) {
      const auto& p = s.pieces.at(static_cast<size_t>(k));
      out.push_back({&p, base_offset(p), state.select(0, k - row_start)});
    }
    return out;
  }
  const int64_t d = s.pieces.front().dim;
  int64_t at = 0;
  for (const auto& p : s.pieces) {
    if (p.dim != d) throw std::runtime_error("optimizer state: pieces of " + s.param + " split along different dims");
    if (p.logical_shape.empty()) {  // a scalar, held as one row
      out.push_back({&p, {}, state.reshape({})});
      continue;
    }
    if (d == 0) {  // local rows are the pieces' rows one after another (then padding rows)
      const int64_t lo = std::max(at, row_start), hi = std::min(at + p.size, row_start + rows);
      if (hi > lo) {
        std::vector<int64_t> o = base_offset(p);
        o[0] = p.start + (lo - at);
        out.push_back({&p, o, state.narrow(0, lo - row_start, hi - lo)});
      }
    } else {  // every local row is a logical row; the pieces sit side by side along d
      std::vector<int64_t> o = base_offset(p);
      o[0] = row_start;
      out.push_back({&p, o, state.narrow(d, at, p.size)});
    }
    at += p.size;
  }
  return out;
}

const char* const kKinds[] = {"master", "exp_avg", "exp_avg_sq"};
torch::Tensor state_of(const dist::ZeroAdamW::Shard& sh, int kind) {
  return kind == 0 ? sh.master : kind == 1 ? sh.exp_avg : sh.exp_avg_sq;
}

}  // namespace

std::vector<model::ParamShard> optimizer_shard_map(const dist::ZeroAdamW& opt,
                                                   const std::vector<model::ParamShard>& model_map) {
  std::map<std::string, const model::ParamShard*> by_name;
  for (const auto& s : model_map) by_name[s.param] = &s;
  std::vector<model::ParamShard> out;
  for (const auto& p : opt.params()) {
    auto it = by_name.find(p.name);
    if (it != by_name.end()) {
      out.push_back(*it->second);
    } else {
      model::ParamShard s;
      s.param = p.name;
      s.pieces.push_back(model::whole(p.name, p.param.sizes().vec()));
      out.push_back(s);
    }
  }
  return out;
}

std::vector<ShardedTensor> optimizer_tensors(const dist::ZeroAdamW& opt, const std::vector<model::ParamShard>& map) {
  std::vector<ShardedTensor> out;
  for (size_t i = 0; i < opt.params().size(); ++i) {
    const auto sh = opt.shard(i);
    for (int kind = 0; kind < 3; ++kind) {
      for (const Slab& s : slabs(map.at(i), state_of(sh, kind), sh.row_start)) {
        out.push_back({std::string("optimizer/") + kKinds[kind] + "/" + s.piece->logical, s.piece->logical_shape,
                       s.offset, s.view.contiguous(), true});
      }
    }
  }
  return out;
}

void load_optimizer(dist::ZeroAdamW& opt, const std::vector<model::ParamShard>& map, const CheckpointReader& reader) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < opt.params().size(); ++i) {
    const auto sh = opt.shard(i);
    for (int kind = 0; kind < 3; ++kind) {
      for (const Slab& s : slabs(map.at(i), state_of(sh, kind), sh.row_start)) {
        const std::string name = std::string("optimizer/") + kKinds[kind] + "/" + s.piece->logical;
        torch::Tensor tmp = host_staging_like(s.view);  // file reads land on the host (pinned for a device)
        reader.read_into(name, tmp, s.offset, s.piece->logical_shape);
        torch::Tensor view = s.view;
        view.copy_(tmp, /*non_blocking=*/view.is_cuda());
      }
    }
  }
  opt.sync_params_from_master();
  release_host_staging();  // blocks whose copies are still in flight stay until they finish (their events)
}

}  // namespace ac::checkpoint

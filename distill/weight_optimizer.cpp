// The ZeRO-1 AdamW weight-optimizer component (see weight_optimizer.h).
#include "distill/weight_optimizer.h"

#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "checkpoint/optimizer_state.h"

namespace ac::distill {

WeightOptimizer::WeightOptimizer(model::CausalLM model, std::vector<dist::OptimParam> extra, dist::Communicator& dp,
                                 dist::Communicator* tp, int tp_size, const WeightOptimConfig& config,
                                 dist::ExpertGroups experts)
    : model_(std::move(model)),
      cfg_(config),
      sched_{config.lr, config.min_lr, config.warmup, std::max<int64_t>(1, config.steps - config.warmup)} {
  const std::vector<model::ParamShard> model_map = model_->shard_map();
  std::map<std::string, const model::ParamShard*> shard_of;
  for (const auto& s : model_map) shard_of[s.param] = &s;
  std::vector<dist::OptimParam> oparams;
  std::set<const void*> routed;  // routed experts: sharded over expert DP at EP > 1
  for (const auto& p : model_->expert_parameters()) routed.insert(p.unsafeGetTensorImpl());
  for (const auto& item : model_->named_parameters(true)) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    bool replicated = true;  // every piece is the whole logical tensor: identical on all TP ranks
    if (auto it = shard_of.find(item.key()); it != shard_of.end()) {
      for (const auto& piece : it->second->pieces) {
        const int64_t full = piece.logical_shape.empty() ? 1 : piece.logical_shape[static_cast<size_t>(piece.dim)];
        if (it->second->stack || piece.size != full) replicated = false;
      }
    }
    oparams.push_back({item.key(), p, p.dim() >= 2, replicated || tp_size == 1, routed.count(p.unsafeGetTensorImpl()) > 0});
  }
  for (auto& e : extra) oparams.push_back(std::move(e));
  dist::AdamWOptions aopts;
  aopts.beta1 = cfg_.beta1;
  aopts.beta2 = cfg_.beta2;
  aopts.eps = cfg_.eps;
  aopts.weight_decay = cfg_.weight_decay;
  opt_ = std::make_unique<dist::ZeroAdamW>(oparams, dp, tp, aopts, experts);
  opt_map_ = checkpoint::optimizer_shard_map(*opt_, model_map);
}

WeightOptimizer::Step WeightOptimizer::step(int64_t step, const std::string& last_good) {
  // TP-replicated parameters (routers, q/k norms, replicated KV heads): TP = 1 gradients.
  model_->reduce_tp_partial_grads();
  Step s;
  s.lr = sched_.at(step);
  const dist::StepResult r = opt_->step(s.lr, cfg_.clip_grad);
  s.grad_norm = r.grad_norm;
  s.applied = r.applied;
  if (!r.applied) {
    ++skipped_total_;
    if (++consecutive_skipped_ >= cfg_.max_skipped) {
      throw std::runtime_error("step " + std::to_string(step + 1) + ": " + std::to_string(consecutive_skipped_) +
                               " consecutive steps with a non-finite loss or gradient (grad norm " +
                               std::to_string(r.grad_norm) + "); stopping. The last good checkpoint is in " + last_good +
                               "; lower --lr or check the data.");
    }
  } else {
    consecutive_skipped_ = 0;
  }
  return s;
}

std::vector<checkpoint::ShardedTensor> WeightOptimizer::tensors() const { return checkpoint::optimizer_tensors(*opt_, opt_map_); }

nlohmann::json WeightOptimizer::attributes() const {
  return {{"type", "zero1_adamw"}, {"adam_steps", opt_->num_steps()}, {"skipped_steps", skipped_total_}};
}

nlohmann::json WeightOptimizer::schedule_attributes() const {
  return {{"max_lr", cfg_.lr}, {"min_lr", cfg_.min_lr}, {"warmup", cfg_.warmup}, {"steps", cfg_.steps}};
}

void WeightOptimizer::load(const checkpoint::CheckpointReader& r) {
  checkpoint::load_optimizer(*opt_, opt_map_, r);
  const nlohmann::json& a = r.attributes();
  opt_->set_num_steps(a.at("optimizer").at("adam_steps").get<int64_t>());
  skipped_total_ = a.at("optimizer").value("skipped_steps", int64_t(0));
}

std::string WeightOptimizer::describe(int dp) const {
  // ZeRO-1 memory per rank against replicated AdamW (fp32 master + 2 moments = 12 B/param).
  int64_t numel = 0, param_bytes = 0;
  for (const auto& op : opt_->params()) {
    numel += op.param.numel();
    param_bytes += op.param.numel() * static_cast<int64_t>(op.param.element_size());
  }
  if (numel == 0) return "";
  const double mib = 1024.0 * 1024.0, n = double(numel);
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << "optimizer state: " << double(opt_->state_bytes()) / mib
    << " MiB on rank 0 (ZeRO-1 over DP " << dp << "; replicated AdamW: " << 12.0 * n / mib
    << " MiB); bytes per parameter: " << std::setprecision(2)
    << (2.0 * double(param_bytes) + double(opt_->state_bytes())) / n << " (params + grads + state) vs "
    << (2.0 * double(param_bytes)) / n + 12.0 << " replicated";
  return o.str();
}

}  // namespace ac::distill

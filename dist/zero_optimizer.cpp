// ZeRO-1 AdamW (see zero_optimizer.h for the layout).
#include "dist/zero_optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <stdexcept>

namespace ac::dist {

namespace {
int64_t rows_of(const torch::Tensor& p) { return p.dim() == 0 ? 1 : p.size(0); }
torch::Tensor as_rows(const torch::Tensor& p) { return p.view({rows_of(p), -1}); }
}  // namespace

ZeroAdamW::ZeroAdamW(std::vector<OptimParam> params, Communicator& dp, Communicator* tp, AdamWOptions options,
                     ExpertGroups experts)
    : params_(std::move(params)), dp_(dp), tp_(tp), opt_(options), experts_(experts) {
  if (experts_.edp && !experts_.ep) throw std::invalid_argument("ZeroAdamW: an expert-DP group needs its EP group");
  where_.resize(params_.size());
  // Group consecutive parameters of one dtype into buckets of ~bucket_bytes (fp32, all ranks).
  Bucket cur;
  auto close = [&] {
    if (cur.slots.empty()) return;
    buckets_.push_back(std::move(cur));
    cur = Bucket{};
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i].param;
    if (!p.defined()) throw std::invalid_argument("ZeroAdamW: parameter " + params_[i].name + " is undefined");
    if (!p.is_contiguous()) throw std::invalid_argument("ZeroAdamW: parameter " + params_[i].name + " is not contiguous");
    Communicator& group = comm_of(i);
    const int dp_size = group.size();
    if (!cur.slots.empty() && (cur.dtype != p.scalar_type() || cur.comm != &group ||
                               (cur.segment * dp_size * 4) >= static_cast<int64_t>(opt_.bucket_bytes)))
      close();
    if (cur.slots.empty()) {
      cur.dtype = p.scalar_type();
      cur.comm = &group;
      cur.expert = &group != &dp_;
    }
    Slot s;
    s.param = i;
    const int64_t rows = rows_of(p);
    s.row_numel = rows == 0 ? 0 : p.numel() / rows;
    s.rows_per_rank = (rows + dp_size - 1) / dp_size;
    s.offset = cur.segment;
    cur.segment += s.rows_per_rank * s.row_numel;
    where_[i] = {buckets_.size(), cur.slots.size()};
    cur.slots.push_back(s);
  }
  close();

  torch::NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    const int me = b.comm->rank();
    const auto f32 = params_[b.slots.front().param].param.options().dtype(torch::kFloat);
    b.master = torch::zeros({b.segment}, f32);
    b.exp_avg = torch::zeros({b.segment}, f32);
    b.exp_avg_sq = torch::zeros({b.segment}, f32);
    for (const Slot& s : b.slots) {
      const OptimParam& op = params_[s.param];
      const int64_t n = owned_rows(s, me) * s.row_numel;
      if (n == 0) continue;
      b.master.narrow(0, s.offset, n)
          .copy_(as_rows(op.param).narrow(0, me * s.rows_per_rank, owned_rows(s, me)).reshape(-1));
    }
  }
}

Communicator& ZeroAdamW::comm_of(size_t i) const {
  return params_[i].expert && experts_.edp ? *experts_.edp : dp_;
}

int64_t ZeroAdamW::owned_rows(const Slot& s, int rank) const {
  const int64_t rows = rows_of(params_[s.param].param);
  const int64_t start = rank * s.rows_per_rank;
  return std::max<int64_t>(0, std::min(rows, start + s.rows_per_rank) - start);
}

ZeroAdamW::Shard ZeroAdamW::shard(size_t i) const {
  const auto [bi, si] = where_.at(i);
  const Bucket& b = buckets_[bi];
  const Slot& s = b.slots[si];
  const torch::Tensor& p = params_[i].param;
  Shard out;
  out.row_start = b.comm->rank() * s.rows_per_rank;
  out.rows = owned_rows(s, b.comm->rank());
  std::vector<int64_t> shape = p.sizes().vec();
  if (shape.empty()) shape = {1};
  shape[0] = out.rows;
  const int64_t n = out.rows * s.row_numel;
  out.master = b.master.narrow(0, s.offset, n).view(shape);
  out.exp_avg = b.exp_avg.narrow(0, s.offset, n).view(shape);
  out.exp_avg_sq = b.exp_avg_sq.narrow(0, s.offset, n).view(shape);
  return out;
}

void ZeroAdamW::zero_grad() {
  for (OptimParam& op : params_) {
    if (op.param.grad().defined()) op.param.mutable_grad() = torch::Tensor();
  }
}

ZeroAdamW::Gather ZeroAdamW::start_gather(Bucket& b) {
  torch::NoGradGuard no_grad;
  const int dp_size = b.comm->size();
  Gather g;
  g.bucket = &b;
  torch::Tensor mine = b.master.to(b.dtype);
  g.all = mine;
  if (dp_size > 1) {
    g.all = torch::empty({b.segment * dp_size}, mine.options());
    g.work = b.comm->all_gather_async(g.all, mine);
  }
  return g;
}

void ZeroAdamW::finish_gather(Gather& g) {
  torch::NoGradGuard no_grad;
  if (g.work) g.work->wait();
  const Bucket& b = *g.bucket;
  for (int r = 0; r < b.comm->size(); ++r) {
    for (const Slot& s : b.slots) {
      const int64_t rows = owned_rows(s, r);
      if (rows == 0) continue;
      torch::Tensor dst = as_rows(params_[s.param].param).narrow(0, r * s.rows_per_rank, rows);
      dst.copy_(g.all.narrow(0, r * b.segment + s.offset, rows * s.row_numel).view({rows, s.row_numel}));
    }
  }
  g = Gather{};
}

void ZeroAdamW::gather_params(Bucket& b) {
  Gather g = start_gather(b);
  finish_gather(g);
}

void ZeroAdamW::sync_params_from_master() {
  for (Bucket& b : buckets_) gather_params(b);
}

StepResult ZeroAdamW::step(double lr, double max_grad_norm) {
  torch::NoGradGuard no_grad;
  // 1. Average gradients over DP; each rank keeps the fp32 rows it owns. One bucket's
  // staging buffer lives at a time, and the bucket's gradients are freed as soon as they are
  // staged: the step's peak is the gradients plus one bucket, not two full copies.
  std::vector<torch::Tensor> grads;
  grads.reserve(buckets_.size());
  // Reduce-scatters in flight (NCCL: on the communication stream), at most two: bucket k's
  // runs while bucket k+1 is staged; waiting for it before bucket k+2 frees its buffer.
  std::deque<std::shared_ptr<Work>> in_flight;
  for (Bucket& b : buckets_) {
    if (in_flight.size() == 2) {
      in_flight.front()->wait();
      in_flight.pop_front();
    }
    const int dp_size = b.comm->size();
    torch::Tensor flat = torch::empty({b.segment * dp_size}, b.master.options());
    for (int r = 0; r < dp_size; ++r) {
      for (const Slot& s : b.slots) {
        const int64_t rows = owned_rows(s, r);
        torch::Tensor dst = flat.narrow(0, r * b.segment + s.offset, s.rows_per_rank * s.row_numel);
        const torch::Tensor& g = params_[s.param].param.grad();
        if (rows < s.rows_per_rank) dst.narrow(0, rows * s.row_numel, (s.rows_per_rank - rows) * s.row_numel).zero_();
        if (rows == 0) continue;
        torch::Tensor mine = dst.narrow(0, 0, rows * s.row_numel).view({rows, s.row_numel});
        if (g.defined()) mine.copy_(as_rows(g).narrow(0, r * s.rows_per_rank, rows));
        else mine.zero_();  // e.g. an expert no token reached on this rank
      }
    }
    for (const Slot& s : b.slots) {
      torch::Tensor& g = params_[s.param].param.mutable_grad();
      if (g.defined()) g = torch::Tensor();
    }
    if (dp_size > 1) {
      torch::Tensor mine = torch::empty({b.segment}, flat.options());
      in_flight.push_back(b.comm->reduce_scatter_async(mine, flat, ReduceOp::Avg));
      grads.push_back(mine);
    } else {
      grads.push_back(flat);
    }
  }
  for (auto& w : in_flight) w->wait();
  in_flight.clear();
  // Expert gradients hold the EP group's tokens summed: / EP makes the mean over all of DP
  // (after the waits: an async reduce-scatter may still be writing them before).
  for (size_t k = 0; k < buckets_.size(); ++k)
    if (buckets_[k].expert) grads[k].div_(double(experts_.ep->size()));
  zero_grad();

  // 2. Global norm: TP-sharded parts summed over TP and DP, TP-replicated parts over DP only
  // (per parameter, fp32 dot products accumulated in double); with expert groups, expert parts
  // over EDP and EP, then over TP with the sharded part.
  // The sums stay on the device (one host read for the norm, not one per parameter).
  const torch::Device dev = buckets_.empty() ? torch::Device(torch::kCPU) : buckets_.front().master.device();
  torch::Tensor sums = torch::zeros({experts_.edp ? 3 : 2}, torch::TensorOptions().dtype(torch::kDouble).device(dev));
  torch::Tensor sharded = sums.narrow(0, 0, 1), replicated = sums.narrow(0, 1, 1);
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const int me = buckets_[k].comm->rank();
    for (const Slot& s : buckets_[k].slots) {
      const int64_t n = owned_rows(s, me) * s.row_numel;
      if (n == 0) continue;
      const torch::Tensor g = grads[k].narrow(0, s.offset, n);
      (buckets_[k].expert ? sums.narrow(0, 2, 1) : params_[s.param].tp_replicated ? replicated : sharded)
          .add_(torch::dot(g, g).to(torch::kDouble));
    }
  }
  torch::Tensor dense = experts_.edp ? sums.narrow(0, 0, 2) : sums;
  if (dp_.size() > 1) dp_.all_reduce(dense, ReduceOp::Sum);
  torch::Tensor tp_part = sums.narrow(0, 0, 1).clone();
  if (experts_.edp) {
    torch::Tensor ex = sums.narrow(0, 2, 1).clone();
    if (experts_.edp->size() > 1) experts_.edp->all_reduce(ex, ReduceOp::Sum);
    if (experts_.ep->size() > 1) experts_.ep->all_reduce(ex, ReduceOp::Sum);
    tp_part.add_(ex);
  }
  if (tp_ && tp_->size() > 1) tp_->all_reduce(tp_part, ReduceOp::Sum);
  const torch::Tensor host = torch::cat({tp_part, sums.narrow(0, 1, 1)}).to(torch::kCPU);
  StepResult result;
  result.grad_norm = std::sqrt(host[0].item<double>() + host[1].item<double>());
  if (!std::isfinite(result.grad_norm)) return result;  // every rank sees the same norm

  // 3. Clip and update the local shard (as torch.optim.AdamW: decoupled weight decay, then
  // bias-corrected moments).
  const double coef = (max_grad_norm > 0 && result.grad_norm > max_grad_norm)
                          ? max_grad_norm / (result.grad_norm + 1e-6) : 1.0;
  ++steps_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, double(steps_));
  const double bc2 = 1.0 - std::pow(opt_.beta2, double(steps_));
  Gather gathering;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    const int me = b.comm->rank();
    torch::Tensor& g = grads[k];
    if (coef != 1.0) g.mul_(coef);
    b.exp_avg.mul_(opt_.beta1).add_(g, 1.0 - opt_.beta1);
    b.exp_avg_sq.mul_(opt_.beta2).addcmul_(g, g, 1.0 - opt_.beta2);
    if (opt_.weight_decay != 0.0) {
      for (const Slot& s : b.slots) {
        const int64_t n = owned_rows(s, me) * s.row_numel;
        if (n > 0 && params_[s.param].decay) b.master.narrow(0, s.offset, n).mul_(1.0 - lr * opt_.weight_decay);
      }
    }
    torch::Tensor denom = (b.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(opt_.eps);
    b.master.addcdiv_(b.exp_avg, denom, -lr / bc1);
    // Bucket k's all-gather runs while bucket k+1 is updated; k-1's rows go into the parameters.
    Gather next = start_gather(b);
    if (gathering.bucket != nullptr) finish_gather(gathering);
    gathering = std::move(next);
  }
  if (gathering.bucket != nullptr) finish_gather(gathering);
  result.applied = true;
  return result;
}

int64_t ZeroAdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const Bucket& b : buckets_) bytes += 3 * b.segment * 4;
  return bytes;
}

}  // namespace ac::dist

// evaluate_lm: the trainer's eval pass as a stand-alone measurement of a checkpoint.
#include "distill/evaluate.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "data/sampler.h"
#include "dist/communicator.h"
#include "dist/cpu_features.h"
#include "dist/error.h"
#include "dist/parallel_layout.h"
#include "dist/tensor_parallel.h"
#include "model/model.h"

namespace ac::distill {

EvalResult evaluate_lm(const EvalConfig& cfg, MPI_Comm world, const std::function<void(int64_t, int64_t)>& progress) {
  if (cfg.data.empty()) throw InputError("command line", "--data", "at least one dataset is needed");
  if (cfg.seq_len <= 0) throw InputError("command line", "--seq-len", "must be positive");
  if (cfg.micro_batch <= 0) throw InputError("command line", "--micro-batch", "must be positive");
  if (cfg.samples < 0) throw InputError("command line", "--samples", "must be >= 0");
  const auto t0 = std::chrono::steady_clock::now();

  // ---- model ------------------------------------------------------------------------------
  const std::string path = checkpoint::resolve_checkpoint(cfg.model);
  checkpoint::CheckpointReader reader(path);
  const model::ArchSpec spec = checkpoint::checkpoint_arch(reader);
  dist::ParallelLayout layout(world, {cfg.tp, 0, 0});
  if (const std::string why = model::tp_split_problem(spec, layout.tp_size()); !why.empty())
    throw InputError(path, "arch_spec (--tp " + std::to_string(layout.tp_size()) + ")", why);
  const dist::DtypeChoice dt = dist::choose_dtype(cfg.dtype);
  model::TpGroup tp{dist::make_mpi_communicator(layout.tp_mpi_comm())};
  model::CausalLM m(spec, tp, model::ModelOptions{checkpoint::parse_dtype(dt.dtype)});
  checkpoint::load_model(m, reader);
  m->eval();

  // ---- data: the trainer's split and sample order -------------------------------------------
  std::vector<data::BlendEntry> entries;
  for (const auto& d : cfg.data) entries.push_back(data::parse_blend_entry(d));
  auto sampler = std::make_shared<data::BlendedSampler>(entries, cfg.seq_len, cfg.seed, data::parse_split(cfg.split),
                                                        data::split_from_name(cfg.which));
  int64_t split_samples = 0;
  for (size_t d = 0; d < sampler->num_datasets(); ++d) split_samples += sampler->dataset(d).samples_per_epoch();
  if (split_samples == 0)
    throw InputError(cfg.data[0], "--seq-len " + std::to_string(cfg.seq_len),
                     "the " + cfg.which + " split has fewer than seq_len + 1 tokens: no sample to score");
  const int64_t total = cfg.samples > 0 ? cfg.samples : split_samples;
  const int dp = layout.dp_size();
  data::DataLoader loader(sampler, {cfg.micro_batch, layout.dp_rank(), dp}, data::DataCursor::start(*sampler));

  // ---- the pass: every rank scores its rows, samples past `total` weigh 0 ------------------
  const int64_t vocab = spec.vocab_size;
  const int64_t per_step = cfg.micro_batch * dp;
  const int64_t steps = (total + per_step - 1) / per_step;
  double loss_sum = 0, correct = 0, count = 0;
  torch::NoGradGuard ng;
  for (int64_t s = 0; s < steps; ++s) {
    const std::vector<int64_t> idx = loader.next_indices();
    torch::Tensor ids = torch::empty({cfg.micro_batch, cfg.seq_len + 1}, torch::kLong);
    loader.next(ids.data_ptr<int64_t>());
    if (const int64_t hi = ids.max().item<int64_t>(); hi >= vocab || ids.min().item<int64_t>() < 0)
      throw InputError(cfg.data[0], "token ids", "id " + std::to_string(hi) + " is outside the model's vocabulary of " +
                                                      std::to_string(vocab) + " (" + path + "): another tokenizer?");
    torch::Tensor weight = torch::zeros({cfg.micro_batch, 1}, torch::kDouble);
    for (int64_t r = 0; r < cfg.micro_batch; ++r) weight[r] = idx[static_cast<size_t>(r)] < total ? 1.0 : 0.0;
    torch::Tensor input = ids.narrow(1, 0, cfg.seq_len).contiguous();
    torch::Tensor labels = ids.narrow(1, 1, cfg.seq_len).contiguous();
    torch::Tensor local = m->logits_local(m->hidden_states(input));
    torch::Tensor ce = dist::vocab_parallel_cross_entropy(local.reshape({-1, local.size(2)}), labels.reshape({-1}),
                                                          *tp.comm, vocab)
                           .to(torch::kDouble)
                           .view({cfg.micro_batch, cfg.seq_len});
    torch::Tensor hit = (m->gather_logits(local).argmax(-1) == labels).to(torch::kDouble);
    loss_sum += (ce * weight).sum().item<double>();
    correct += (hit * weight).sum().item<double>();
    count += weight.sum().item<double>() * double(cfg.seq_len);
    if (progress && layout.world_rank() == 0) progress(std::min(total, (s + 1) * per_step), total);
  }
  torch::Tensor sums = torch::tensor({loss_sum, correct, count}, torch::kDouble);
  if (dp > 1) layout.dp().all_reduce(sums, dist::ReduceOp::Sum);

  EvalResult r;
  r.loss = sums[0].item<double>() / sums[2].item<double>();
  r.perplexity = std::exp(r.loss);
  r.accuracy = sums[1].item<double>() / sums[2].item<double>();
  r.samples = total;
  r.tokens = int64_t(sums[2].item<double>());
  r.split_samples = split_samples;
  r.parameters = m->logical_parameter_count();
  r.dtype = dt.dtype;
  r.dtype_reason = dt.reason;
  r.tp = layout.tp_size();
  r.dp = dp;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.tokens_per_second = double(r.tokens) / r.seconds;
  return r;
}

}  // namespace ac::distill

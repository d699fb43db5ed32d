// The distillation / pretraining trainer (see trainer.h).
#include "distill/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "checkpoint/optimizer_state.h"
#include "data/sampler.h"
#include "data/token_source.h"
#include "dist/error.h"
#include "dist/progress.h"
#include "dist/parallel_layout.h"
#include "dist/tensor_memory.h"
#include "dist/tensor_parallel.h"
#include "dist/zero_optimizer.h"
#include "distill/kd_loss.h"
#include "distill/lr_schedule.h"
#include "distill/run_parts.h"
#include "model/arch_spec.h"
#include "model/model.h"
#include "dist/cpu_features.h"
#include "dist/device.h"

namespace fs = std::filesystem;

namespace ac::distill {

namespace {

using dist::format_duration;

std::string si(double v) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  if (v >= 1e9) o << v / 1e9 << "G";
  else if (v >= 1e6) o << v / 1e6 << "M";
  else if (v >= 1e3) o << v / 1e3 << "k";
  else o << v;
  return o.str();
}

// Sum of losses over a batch, reported as a mean.
struct LossParts {
  double total = 0, kd = 0, ce = 0, inter = 0;
};

}  // namespace

int run_trainer(const TrainerConfig& cfg, MPI_Comm world, const nlohmann::json& run_config,
                const std::function<void(const nlohmann::json&)>& on_layout) {
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  if (cfg.out.empty()) throw InputError("--out", "value", "an output directory is required");
  if (cfg.student.empty()) throw InputError(cfg.distill ? "--student" : "--arch", "value", "an ArchSpec or config.json is required");
  if (cfg.distill && cfg.teacher.empty()) throw InputError("--teacher", "value", "distill needs a teacher checkpoint");
  if (cfg.data.empty()) throw InputError("--data", "value", "at least one dataset is required");
  if (cfg.steps <= 0) throw InputError("--steps", "value", "must be positive");
  if (cfg.seq_len <= 0 || cfg.micro_batch <= 0 || cfg.grad_accum <= 0)
    throw InputError("--seq-len/--micro-batch/--grad-accum", "value", "must be positive");
  if (cfg.intermediate != "none" && cfg.intermediate != "cosine" && cfg.intermediate != "mse")
    throw InputError("--intermediate", "value", "\"" + cfg.intermediate + "\" is not none, cosine or mse");
  if (cfg.dtype == "f16" || cfg.dtype == "float16")
    throw InputError("--dtype", cfg.dtype, "float16 training needs loss scaling, which the trainer does not do: use bf16 or f32");
  // The device first: `--device cuda` where there is none stops every rank before any model.
  const dist::DeviceChoice device_choice = dist::choose_device(cfg.device, cfg.local_rank);
  const torch::Device device = device_choice.torch_device();
  const bool tf32 = dist::apply_tf32_policy(device_choice);
  const dist::DtypeChoice dtype_choice = dist::choose_dtype(cfg.dtype, device_choice.cuda);
  const torch::Dtype dtype = checkpoint::parse_dtype(dtype_choice.dtype);
  const double peak_flops = cfg.peak_flops;
  const int profile_threads = cfg.peak_threads;

  // ---- layout and models --------------------------------------------------------------
  model::ArchSpec spec = model::load_arch(cfg.student);
  // Collectives on CUDA tensors go through NCCL, on CPU tensors through MPI.
  dist::ParallelLayout layout(world, {cfg.tp, 0, 0}, device_choice.backend(), std::max(0, device_choice.index));
  if (const std::string why = model::tp_split_problem(spec, layout.tp_size()); !why.empty())
    throw InputError(cfg.student, "--tp " + std::to_string(layout.tp_size()), why);
  const bool root = layout.world_rank() == 0;
  const int dp_rank = layout.dp_rank(), dp = layout.dp_size();
  model::TpGroup tp{dist::make_device_communicator(layout.tp_mpi_comm(), device_choice)};
  nlohmann::json layout_json = {{"world", layout.world_size()}, {"tp", layout.tp_size()}, {"dp", dp},
                                {"dtype", dtype_choice.dtype}, {"dtype_reason", dtype_choice.reason},
                                {"device", device_choice.device}, {"device_reason", device_choice.reason},
                                {"backend", device_choice.backend()}, {"tf32", tf32}};
  if (on_layout) on_layout(layout_json);

  // Count live CPU tensor bytes from here on: each metrics line carries the largest rank's peak
  // in its interval (steps, and any eval or checkpoint save since the line before), which
  // `autocompress plan` predicts for the steps (tests/distill/test_memory_vs_plan.sh). On a
  // CUDA device the CPU count says nothing about the device's memory: not reported there.
  const bool count_memory = !device_choice.cuda;
  if (count_memory) dist::tensor_memory::install();
  std::optional<model::CausalLM> teacher;
  model::ArchSpec teacher_spec;
  std::string teacher_path;
  if (cfg.distill) {
    teacher_path = checkpoint::resolve_checkpoint(cfg.teacher);
    checkpoint::CheckpointReader tr(teacher_path);
    teacher_spec = checkpoint::checkpoint_arch(tr);
    if (const std::string why = model::tp_split_problem(teacher_spec, layout.tp_size()); !why.empty())
      throw InputError(teacher_path, "arch_spec (--tp " + std::to_string(layout.tp_size()) + ")", why);
    if (teacher_spec.vocab_size != spec.vocab_size)
      throw InputError(cfg.student, "vocab_size",
                       std::to_string(spec.vocab_size) + " differs from the teacher's " +
                           std::to_string(teacher_spec.vocab_size) + " (" + teacher_path + ")");
    teacher.emplace(load_frozen_teacher(teacher_path, tp, dtype));
    (*teacher)->to(device);
  }

  const std::string ckpt_dir = cfg.out + "/checkpoints";
  const std::string metrics_path = cfg.out + "/metrics.jsonl";
  if (root) fs::create_directories(ckpt_dir);
  MPI_Barrier(world);
  const bool resuming = fs::exists(ckpt_dir + "/latest");

  model::CausalLM student(spec, tp, model::ModelOptions{dtype});
  if (!resuming && !cfg.student_init.empty()) {  // before the optimizer takes its fp32 masters
    const std::string path = checkpoint::resolve_checkpoint(cfg.student_init);
    checkpoint::CheckpointReader r(path);
    checkpoint::load_model(student, r);
  } else {
    student->init_weights(cfg.seed);
  }
  // Built and initialised on the host (the same values on every device), then placed.
  student->to(device);
  IntermediateLoss inter{nullptr};
  const bool use_inter = cfg.distill && cfg.intermediate != "none" && cfg.intermediate_weight > 0;
  if (use_inter) {
    torch::manual_seed(static_cast<uint64_t>(cfg.seed) + 17);  // same on every rank: replicated
    inter = IntermediateLoss(spec.hidden_size, teacher_spec.hidden_size,
                             cfg.intermediate == "mse" ? IntermediateLossImpl::Kind::Mse : IntermediateLossImpl::Kind::Cosine);
    inter->to(device, torch::kFloat32);
  }

  // ---- optimizer ----------------------------------------------------------------------
  std::vector<model::ParamShard> model_map = student->shard_map();
  std::map<std::string, const model::ParamShard*> shard_of;
  for (const auto& s : model_map) shard_of[s.param] = &s;
  std::vector<dist::OptimParam> oparams;
  for (const auto& item : student->named_parameters(true)) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    bool replicated = true;  // every piece is the whole logical tensor: identical on all TP ranks
    if (auto it = shard_of.find(item.key()); it != shard_of.end()) {
      for (const auto& piece : it->second->pieces) {
        const int64_t full = piece.logical_shape.empty() ? 1 : piece.logical_shape[static_cast<size_t>(piece.dim)];
        if (it->second->stack || piece.size != full) replicated = false;
      }
    }
    oparams.push_back({item.key(), p, p.dim() >= 2, replicated || layout.tp_size() == 1});
  }
  if (use_inter) {
    for (const auto& item : inter->named_parameters(true))
      oparams.push_back({"distill.intermediate." + item.key(), item.value(), item.value().dim() >= 2, true});
  }
  dist::AdamWOptions aopts;
  aopts.beta1 = cfg.beta1;
  aopts.beta2 = cfg.beta2;
  aopts.eps = cfg.eps;
  aopts.weight_decay = cfg.weight_decay;
  dist::ZeroAdamW opt(oparams, layout.dp(), &layout.tp(), aopts);
  const std::vector<model::ParamShard> opt_map = checkpoint::optimizer_shard_map(opt, model_map);
  LrSchedule sched{cfg.lr, cfg.min_lr, cfg.warmup, std::max<int64_t>(1, cfg.steps - cfg.warmup)};

  // ---- data ---------------------------------------------------------------------------
  std::vector<data::BlendEntry> entries;
  for (const auto& d : cfg.data) entries.push_back(data::parse_blend_entry(d));
  const data::SplitSpec split = data::parse_split(cfg.split);
  auto train_sampler = std::make_shared<data::BlendedSampler>(entries, cfg.seq_len, cfg.seed, split, data::Split::Train);
  std::shared_ptr<data::BlendedSampler> eval_sampler;
  if (cfg.eval_interval > 0 && cfg.eval_iters > 0)
    eval_sampler = std::make_shared<data::BlendedSampler>(entries, cfg.seq_len, cfg.seed, split, data::Split::Eval);
  data::DataCursor cursor = data::DataCursor::start(*train_sampler);

  // ---- resume -------------------------------------------------------------------------
  int64_t step = 0, tokens_seen = 0, skipped_total = 0;
  const nlohmann::json arch_json = model::arch_to_json(spec);
  if (resuming) {
    const std::string path = checkpoint::resolve_latest(ckpt_dir);
    checkpoint::CheckpointReader r(path);
    if (r.attributes().value(checkpoint::kArchSpecAttribute, nlohmann::json()) != arch_json)
      throw InputError(path, checkpoint::kArchSpecAttribute, "the checkpoint's student differs from " + cfg.student +
                                              " (a different run in the same --out?)");
    checkpoint::load_model(student, r);
    checkpoint::load_optimizer(opt, opt_map, r);
    step = r.step();
    const nlohmann::json& a = r.attributes();
    tokens_seen = a.value("tokens_seen", int64_t(0));
    opt.set_num_steps(a.at("optimizer").at("adam_steps").get<int64_t>());
    skipped_total = a.at("optimizer").value("skipped_steps", int64_t(0));
    cursor = data::DataCursor::from_json(a.at("data_cursor"), path + ": data_cursor");
    cursor.check_matches(*train_sampler, path + ": data_cursor");
    const nlohmann::json& per_rank = a.contains("per_rank") ? a.at("per_rank") : nlohmann::json();
    if (per_rank.is_array() && per_rank.size() == static_cast<size_t>(layout.world_size()) &&
        per_rank[static_cast<size_t>(layout.world_rank())].contains("torch_rng"))
      set_rng_state_hex(per_rank[static_cast<size_t>(layout.world_rank())]["torch_rng"].get<std::string>());
    if (root) {
      truncate_metrics(metrics_path, step);  // later lines belong to the lost timeline
      std::cout << "resumed from " << path << " at step " << step << " (" << tokens_seen << " tokens)" << std::endl;
    }
  }
  data::DataLoader loader(train_sampler, {cfg.micro_batch, dp_rank, dp}, cursor);

  // ---- one forward pass and its loss -------------------------------------------------
  const int64_t vocab = spec.vocab_size;
  KdOptions kd_opts;
  kd_opts.temperature = cfg.temperature;
  kd_opts.top_k = cfg.top_k;
  const double ce_w = cfg.distill ? cfg.ce_weight : 1.0;
  const double kd_w = cfg.distill ? cfg.kd_weight : 0.0;
  auto batch_loss = [&](data::DataLoader& batches, LossParts& parts) {
    // The loader hands on int32 ids (half the bytes of int64); index ops and losses want int64.
    torch::Tensor ids = torch::empty({cfg.micro_batch, cfg.seq_len + 1}, torch::kInt);
    batches.next(ids.data_ptr<int32_t>());
    torch::Tensor all = ids.to(device, torch::kLong);
    torch::Tensor input = all.narrow(1, 0, cfg.seq_len).contiguous();
    torch::Tensor labels = all.narrow(1, 1, cfg.seq_len).reshape({-1}).contiguous();
    torch::Tensor hidden = student->hidden_states(input);
    torch::Tensor s_local = student->logits_local(hidden);
    const int64_t n = s_local.size(0) * s_local.size(1);
    s_local = s_local.reshape({n, s_local.size(2)});
    torch::Tensor loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    if (kd_w > 0) {
      torch::Tensor t_hidden, t_local;
      {
        torch::NoGradGuard ng;
        t_hidden = (*teacher)->hidden_states(input);
        t_local = (*teacher)->logits_local(t_hidden).reshape({n, -1});
      }
      torch::Tensor kd = vocab_parallel_kl(s_local, t_local, *tp.comm, vocab, kd_opts);
      parts.kd += kd.item<double>();
      loss = loss + kd_w * kd;
      if (use_inter) {
        torch::Tensor li = inter->forward(hidden.to(torch::kFloat32), t_hidden.to(torch::kFloat32));
        parts.inter += li.item<double>();
        loss = loss + cfg.intermediate_weight * scale_to(li, kd);
      }
    }
    if (ce_w > 0) {
      torch::Tensor ce = dist::vocab_parallel_cross_entropy(s_local, labels, *tp.comm, vocab).mean();
      parts.ce += ce.item<double>();
      loss = loss + ce_w * ce;
    }
    parts.total += loss.item<double>();
    return loss;
  };

  // A fault injector for the tests of the non-finite path: AC_FAULT_NAN_STEPS=FIRST:COUNT
  // makes the loss NaN at steps [FIRST, FIRST + COUNT). Documented in docs/training.md.
  int64_t nan_first = -1, nan_count = 0;
  if (const char* f = std::getenv("AC_FAULT_NAN_STEPS")) {
    if (std::sscanf(f, "%ld:%ld", &nan_first, &nan_count) != 2) nan_first = -1;
  }

  // ---- checkpoint -----------------------------------------------------------------------
  auto save = [&](const char* why) {
    const auto t0 = clock::now();
    std::vector<checkpoint::ShardedTensor> tensors = checkpoint::model_tensors(student, dp_rank == 0);
    for (auto& t : checkpoint::optimizer_tensors(opt, opt_map)) tensors.push_back(std::move(t));
    if (use_inter) {
      for (const auto& item : inter->named_parameters(true))
        tensors.push_back({"distill/intermediate." + item.key(), item.value().sizes().vec(), {},
                           item.value().detach().contiguous(), dp_rank == 0 && layout.tp_rank() == 0});
    }
    nlohmann::json attrs = {
        {checkpoint::kArchSpecAttribute, arch_json},
        {"kind", cfg.distill ? "distill" : "pretrain"},
        {"tokens_seen", tokens_seen},
        {"data_cursor", loader.cursor().to_json()},
        {"optimizer", {{"type", "zero1_adamw"}, {"adam_steps", opt.num_steps()}, {"skipped_steps", skipped_total}}},
        {"lr_schedule", {{"max_lr", cfg.lr}, {"min_lr", cfg.min_lr}, {"warmup", cfg.warmup}, {"steps", cfg.steps}}},
        {"layout", layout_json},
        {"config", run_config},
        {"teacher", teacher_path},
    };
    nlohmann::json me = {{"torch_rng", rng_state_hex()}};
    checkpoint::SaveOptions so;
    so.keep_last = cfg.keep_last;
    const std::string path = checkpoint::save_checkpoint(world, ckpt_dir, step, tensors, attrs, me, so);
    if (root)
      std::cout << "checkpoint " << path << " (" << why << ", "
                << std::fixed << std::setprecision(1)
                << std::chrono::duration<double>(clock::now() - t0).count() << " s)" << std::endl;
  };

  auto dp_mean = [&](std::vector<double> v) {
    torch::Tensor t = torch::tensor(v, torch::kDouble).to(device);
    if (dp > 1) layout.dp().all_reduce(t, dist::ReduceOp::Avg);
    t = t.to(torch::kCPU);
    for (size_t i = 0; i < v.size(); ++i) v[i] = t[static_cast<int64_t>(i)].item<double>();
    return v;
  };

  auto evaluate = [&]() {
    torch::NoGradGuard ng;
    data::DataLoader eval_loader(eval_sampler, {cfg.micro_batch, dp_rank, dp}, data::DataCursor::start(*eval_sampler));
    // eval_iters global batches (as Megatron): the same samples under any TP x DP x accumulation.
    LossParts parts;
    const int64_t n = cfg.eval_iters * cfg.grad_accum;
    for (int64_t i = 0; i < n; ++i) batch_loss(eval_loader, parts);
    const auto m = dp_mean({parts.total / n, parts.kd / n, parts.ce / n});
    return m;
  };

  // ---- the loop -------------------------------------------------------------------------
  // The peak of training: from the models and optimizer as they stand (load temporaries excluded).
  dist::tensor_memory::reset_peak();
  auto peak_over_ranks = [&]() {  // and starts the next interval
    int64_t p = dist::tensor_memory::peak();
    dist::tensor_memory::reset_peak();
    MPI_Allreduce(MPI_IN_PLACE, &p, 1, MPI_INT64_T, MPI_MAX, world);
    return p;
  };
  std::ofstream metrics;
  if (root) metrics.open(metrics_path, std::ios::app);
  const int64_t tokens_per_step = cfg.micro_batch * cfg.seq_len * cfg.grad_accum * dp;
  const double flops_per_token = 3.0 * model::prefill_flops_per_token(spec, cfg.seq_len) +
                                 (cfg.distill ? model::prefill_flops_per_token(teacher_spec, cfg.seq_len) : 0.0);
  if (root) {
    std::cout << (cfg.distill ? "distill" : "pretrain") << ": " << student->logical_parameter_count()
              << " student parameters, TP " << layout.tp_size() << " x DP " << dp << ", " << tokens_per_step
              << " tokens per step, steps " << step << " -> " << cfg.steps << "\n"
              << "device: " << device_choice.device << " (" << device_choice.reason << "), collectives "
              << device_choice.backend() << (device_choice.cuda ? (tf32 ? ", TF32 allowed" : ", TF32 off") : "") << "\n"
              << "dtype: " << dtype_choice.dtype << " (" << dtype_choice.reason << ")" << std::endl;
    if (!cfg.peak_note.empty()) std::cout << "MFU: " << cfg.peak_note << std::endl;
  }
  {
    // ZeRO-1 memory per rank against replicated AdamW (fp32 master + 2 moments = 12 B/param).
    int64_t numel = 0, param_bytes = 0;
    for (const auto& op : opt.params()) {
      numel += op.param.numel();
      param_bytes += op.param.numel() * static_cast<int64_t>(op.param.element_size());
    }
    if (root && numel > 0) {
      const double mib = 1024.0 * 1024.0, n = double(numel);
      std::cout << std::fixed << std::setprecision(1) << "optimizer state: " << double(opt.state_bytes()) / mib
                << " MiB on rank 0 (ZeRO-1 over DP " << dp << "; replicated AdamW: " << 12.0 * n / mib
                << " MiB); bytes per parameter: " << std::setprecision(2)
                << (2.0 * double(param_bytes) + double(opt.state_bytes())) / n << " (params + grads + state) vs "
                << (2.0 * double(param_bytes)) / n + 12.0 << " replicated" << std::endl;
    }
  }
  // MFU's denominator: one profile peak per device. On GPUs a rank is a device. On CPUs a
  // profile measured with N threads (cost calibrate records them) counts once per N threads
  // in use over all ranks; one without a thread count is a whole node, shared by its ranks.
  double devices = layout.world_size();
  if (!device_choice.cuda && profile_threads > 0) {
    int threads = at::get_num_threads();
    MPI_Allreduce(MPI_IN_PLACE, &threads, 1, MPI_INT, MPI_SUM, world);
    devices = double(threads) / double(profile_threads);
  } else if (!device_choice.cuda) {
    MPI_Comm node;
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    devices = double(layout.world_size()) / double(std::max(1, local));
  }
  StopSignals signals;
  int consecutive_skipped = 0;
  const int64_t first_step = step;
  auto t_interval = clock::now();
  int64_t interval_steps = 0;
  LossParts interval;
  double last_norm = 0;
  bool saved_at_step = false;
  while (step < cfg.steps) {
    // Every rank agrees on a pending stop signal before starting a step.
    // (SIGTERM outranks SIGUSR1: MAX of the signal numbers.)
    const int stop = signals.agree(world);
    if (stop) {
      if (root) std::cout << "stop signal received (" << signal_name(stop) << ") at step " << step << ": saving" << std::endl;
      if (!saved_at_step) save("signal");
      // Requeue only on SIGUSR1 (Slurm's advance warning): `scontrol requeue` would also
      // requeue a job the user cancelled (scancel sends SIGTERM). Exit 75 either way.
      if (root) requeue_after_signal(stop);
      return kExitRequeue;
    }

    LossParts parts;
    for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
      torch::Tensor loss = batch_loss(loader, parts);
      if (step >= nan_first && step < nan_first + nan_count) loss = loss * std::numeric_limits<float>::quiet_NaN();
      (loss / double(cfg.grad_accum)).backward();
    }
    // TP-replicated parameters (routers, q/k norms, replicated KV heads): TP = 1 gradients.
    student->reduce_tp_partial_grads();
    const double lr = sched.at(step);
    const dist::StepResult r = opt.step(lr, cfg.clip_grad);
    ++step;
    saved_at_step = false;
    tokens_seen += tokens_per_step;
    last_norm = r.grad_norm;
    if (!r.applied) {
      ++skipped_total;
      if (++consecutive_skipped >= cfg.max_skipped) {
        throw std::runtime_error("step " + std::to_string(step) + ": " + std::to_string(consecutive_skipped) +
                                 " consecutive steps with a non-finite loss or gradient (grad norm " +
                                 std::to_string(r.grad_norm) + "); stopping. The last good checkpoint is in " +
                                 ckpt_dir + "; lower --lr or check the data.");
      }
    } else {
      consecutive_skipped = 0;
    }
    const auto m = dp_mean({parts.total / cfg.grad_accum, parts.kd / cfg.grad_accum, parts.ce / cfg.grad_accum,
                            parts.inter / cfg.grad_accum});
    interval.total += m[0];
    interval.kd += m[1];
    interval.ce += m[2];
    interval.inter += m[3];
    ++interval_steps;

    if (step % cfg.log_interval == 0 || step == cfg.steps) {
      const double dt = std::chrono::duration<double>(clock::now() - t_interval).count();
      const double tok_s = double(tokens_per_step * interval_steps) / std::max(dt, 1e-9);
      const double elapsed = std::chrono::duration<double>(clock::now() - t_start).count();
      const double eta = dt / double(interval_steps) * double(cfg.steps - step);
      const double mfu = peak_flops > 0 ? tok_s * flops_per_token / (peak_flops * devices) : 0.0;
      const double n = double(interval_steps);
      const int64_t peak_bytes = count_memory ? peak_over_ranks() : 0;  // every rank: a collective
      if (root) {
        nlohmann::json line = {{"step", step},        {"loss", interval.total / n}, {"lr", lr},
                               {"grad_norm", last_norm}, {"tokens", tokens_seen},   {"tokens_per_s", tok_s},
                               {"skipped_steps", skipped_total}, {"elapsed_s", elapsed}};
        if (kd_w > 0) line["kd_loss"] = interval.kd / n;
        if (ce_w > 0) line["ce_loss"] = interval.ce / n;
        if (use_inter) line["intermediate_loss"] = interval.inter / n;
        if (peak_flops > 0) line["mfu"] = mfu;
        if (count_memory) line["peak_tensor_bytes"] = peak_bytes;  // the largest rank's peak in this interval
        metrics << line.dump() << "\n" << std::flush;
        std::ostringstream o;
        o << "step " << step << "/" << cfg.steps << " | loss " << std::fixed << std::setprecision(4)
          << interval.total / n;
        if (kd_w > 0 && ce_w > 0) o << " (kd " << interval.kd / n << ", ce " << interval.ce / n << ")";
        o << " | lr " << std::scientific << std::setprecision(2) << lr << std::fixed << " | grad "
          << std::setprecision(3) << last_norm << " | " << si(tok_s) << " tok/s";
        if (peak_flops > 0) o << " | MFU " << std::setprecision(1) << 100.0 * mfu << "%";
        if (skipped_total) o << " | skipped " << skipped_total;
        if (count_memory) o << " | mem " << std::setprecision(0) << double(peak_bytes) / (1 << 20) << " MiB";
        o << " | ETA " << format_duration(eta);
        std::cout << o.str() << std::endl;
      }
      interval = LossParts{};
      interval_steps = 0;
      t_interval = clock::now();
    }
    if (eval_sampler && (step % cfg.eval_interval == 0 || step == cfg.steps)) {
      const auto e = evaluate();
      if (root) {
        nlohmann::json line = {{"step", step}, {"eval_loss", e[0]}};
        if (kd_w > 0) line["eval_kd_loss"] = e[1];
        if (ce_w > 0) line["eval_ce_loss"] = e[2];
        metrics << line.dump() << "\n" << std::flush;
        std::cout << "eval at step " << step << ": loss " << std::fixed << std::setprecision(4) << e[0] << std::endl;
      }
      t_interval = clock::now();  // eval time is not training throughput
    }
    if ((cfg.save_interval > 0 && step % cfg.save_interval == 0) || step == cfg.steps) {
      save(step == cfg.steps ? "final" : "interval");
      saved_at_step = true;
      t_interval = clock::now();
    }
  }
  if (root) {
    const double elapsed = std::chrono::duration<double>(clock::now() - t_start).count();
    std::cout << "done: " << cfg.steps << " steps (" << cfg.steps - first_step << " this run) in "
              << format_duration(elapsed) << ", " << skipped_total << " skipped" << std::endl;
  }
  return 0;
}

}  // namespace ac::distill

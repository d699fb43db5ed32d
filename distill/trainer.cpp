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
#include <set>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "checkpoint/optimizer_state.h"
#include "data/sampler.h"
#include "data/token_source.h"
#include "dist/cpu_features.h"
#include "dist/device.h"
#include "dist/error.h"
#include "dist/parallel_layout.h"
#include "dist/progress.h"
#include "dist/tensor_memory.h"
#include "dist/tensor_parallel.h"
#include "distill/kd_loss.h"
#include "distill/objective.h"
#include "distill/weight_optimizer.h"
#include "job/device.h"
#include "job/metrics.h"
#include "job/run_checkpoints.h"
#include "job/step_loop.h"
#include "job/teacher.h"
#include "job/token_data.h"
#include "model/arch_spec.h"
#include "model/model.h"
#include "model/recompute.h"

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

// MFU's denominator: one profile peak per device. On GPUs a rank is a device. On CPUs a
// profile measured with N threads (cost calibrate records them) counts once per N threads
// in use over all ranks; one without a thread count is a whole node, shared by its ranks.
double mfu_devices(const dist::ParallelLayout& layout, const dist::DeviceChoice& device, int profile_threads, MPI_Comm world) {
  double devices = layout.world_size();
  if (!device.cuda && profile_threads > 0) {
    int threads = at::get_num_threads();
    MPI_Allreduce(MPI_IN_PLACE, &threads, 1, MPI_INT, MPI_SUM, world);
    devices = double(threads) / double(profile_threads);
  } else if (!device.cuda) {
    MPI_Comm node;
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    devices = double(layout.world_size()) / double(std::max(1, local));
  }
  return devices;
}

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
  if (cfg.recompute != "none" && cfg.recompute != "full")
    throw InputError("--recompute", cfg.recompute, "expected none or full");
  if (cfg.intermediate != "none" && cfg.intermediate != "cosine" && cfg.intermediate != "mse")
    throw InputError("--intermediate", "value", "\"" + cfg.intermediate + "\" is not none, cosine or mse");
  if (cfg.dtype == "f16" || cfg.dtype == "float16")
    throw InputError("--dtype", cfg.dtype, "float16 training needs loss scaling, which the trainer does not do: use bf16 or f32");
  const job::RunDevice rd = job::choose_run_device(cfg.device, cfg.local_rank, cfg.dtype);
  const torch::Device device = rd.device;
  const torch::Dtype dtype = rd.dtype;

  // ---- layout and models --------------------------------------------------------------
  model::ArchSpec spec = model::load_arch(cfg.student);
  // Collectives on CUDA tensors go through NCCL, on CPU tensors through MPI.
  dist::ParallelLayout layout(world, {cfg.tp, 0, 0, cfg.ep}, rd.choice.backend(), std::max(0, rd.choice.index));
  if (cfg.etp != 1 && cfg.etp != cfg.tp)
    throw InputError("--etp", std::to_string(cfg.etp),
                     "must be 1 (whole experts over the TP ranks) or the TP size " + std::to_string(cfg.tp) +
                         " (each expert's FFN width over the TP ranks)");
  const bool expert_tp = cfg.etp > 1;
  const std::string layout_opts = "--tp " + std::to_string(cfg.tp) + (cfg.ep > 1 ? " --ep " + std::to_string(cfg.ep) : "") +
                                  (expert_tp ? " --etp " + std::to_string(cfg.etp) : "");
  if (const std::string why = model::tp_split_problem(spec, layout.tp_size(), cfg.ep, expert_tp); !why.empty())
    throw InputError(cfg.student, layout_opts, why);
  auto has_moe = [](const model::ArchSpec& a) {
    return std::any_of(a.layers.begin(), a.layers.end(), [](const model::LayerSpec& l) { return bool(l.moe); });
  };
  auto refuse_ep_without_experts = [&](bool any_moe) {
    if (cfg.ep > 1 && !any_moe)
      throw InputError("--ep", std::to_string(cfg.ep),
                       cfg.distill ? "neither the student nor the teacher has MoE layers to spread over EP ranks"
                                   : "the model has no MoE layers to spread over EP ranks");
  };
  if (!cfg.distill) refuse_ep_without_experts(has_moe(spec));
  const bool root = layout.world_rank() == 0;
  const int dp_rank = layout.dp_rank(), dp = layout.dp_size();
  model::TpGroup tp{dist::make_device_communicator(layout.tp_mpi_comm(), rd.choice)};
  model::EpGroup ep;
  if (cfg.ep > 1) ep.comm = dist::make_device_communicator(layout.ep_mpi_comm(), rd.choice);
  ep.expert_tp = expert_tp;
  const nlohmann::json layout_j = job::layout_json(layout, rd, cfg.etp);
  if (on_layout) on_layout(layout_j);

  // Count live CPU tensor bytes from here on: each metrics line carries the largest rank's peak
  // in its interval (steps, and any eval or checkpoint save since the line before), which
  // `autocompress plan` predicts for the steps (tests/distill/test_memory_vs_plan.sh). On a
  // CUDA device the CPU count says nothing about the device's memory: not reported there.
  const bool count_memory = !rd.choice.cuda;
  if (count_memory) dist::tensor_memory::install();
  std::optional<model::CausalLM> teacher;
  model::ArchSpec teacher_spec;
  std::string teacher_path;
  if (cfg.distill) {
    teacher_path = checkpoint::resolve_checkpoint(cfg.teacher);
    checkpoint::CheckpointReader tr(teacher_path);
    teacher_spec = checkpoint::checkpoint_arch(tr);
    if (const std::string why = model::tp_split_problem(teacher_spec, layout.tp_size(), cfg.ep, expert_tp); !why.empty())
      throw InputError(teacher_path, "arch_spec (" + layout_opts + ")", why);
    if (teacher_spec.vocab_size != spec.vocab_size)
      throw InputError(cfg.student, "vocab_size",
                       std::to_string(spec.vocab_size) + " differs from the teacher's " +
                           std::to_string(teacher_spec.vocab_size) + " (" + teacher_path + ")");
    refuse_ep_without_experts(has_moe(spec) || has_moe(teacher_spec));
    teacher.emplace(job::load_frozen_teacher(teacher_path, tp, dtype, ep));
    (*teacher)->to(device);
  }

  const job::RunCheckpoints checkpoints(world, cfg.out + "/checkpoints", cfg.keep_last, "checkpoint");
  const std::string metrics_path = cfg.out + "/metrics.jsonl";
  const bool resuming = checkpoints.resuming();

  model::CausalLM student(spec, tp, model::ModelOptions{dtype, ep});
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
  std::vector<dist::OptimParam> extra;
  if (use_inter) {
    for (const auto& item : inter->named_parameters(true))
      extra.push_back({"distill.intermediate." + item.key(), item.value(), item.value().dim() >= 2, true});
  }
  WeightOptimConfig ocfg;
  ocfg.lr = cfg.lr, ocfg.min_lr = cfg.min_lr, ocfg.warmup = cfg.warmup, ocfg.steps = cfg.steps;
  ocfg.weight_decay = cfg.weight_decay, ocfg.beta1 = cfg.beta1, ocfg.beta2 = cfg.beta2, ocfg.eps = cfg.eps;
  ocfg.clip_grad = cfg.clip_grad, ocfg.max_skipped = cfg.max_skipped;
  dist::ExpertGroups expert_groups;
  if (cfg.ep > 1) expert_groups = {&layout.edp(), &layout.ep()};
  WeightOptimizer opt(student, std::move(extra), layout.dp(), &layout.tp(), layout.tp_size(), ocfg, expert_groups);

  // ---- data ---------------------------------------------------------------------------
  const job::TokenData token_data(cfg.data, cfg.split, cfg.seq_len, cfg.seed);
  auto train_sampler = token_data.sampler(data::Split::Train);
  std::shared_ptr<data::BlendedSampler> eval_sampler;
  if (cfg.eval_interval > 0 && cfg.eval_iters > 0) eval_sampler = token_data.sampler(data::Split::Eval);
  data::DataCursor cursor = data::DataCursor::start(*train_sampler);

  // ---- resume -------------------------------------------------------------------------
  int64_t step = 0, tokens_seen = 0;
  const nlohmann::json arch_json = model::arch_to_json(spec);
  if (resuming) {
    const std::string path = checkpoints.latest();
    checkpoint::CheckpointReader r(path);
    if (r.attributes().value(checkpoint::kArchSpecAttribute, nlohmann::json()) != arch_json)
      throw InputError(path, checkpoint::kArchSpecAttribute, "the checkpoint's student differs from " + cfg.student +
                                              " (a different run in the same --out?)");
    checkpoint::load_model(student, r);
    opt.load(r);
    step = r.step();
    const nlohmann::json& a = r.attributes();
    tokens_seen = a.value("tokens_seen", int64_t(0));
    cursor = job::restore_cursor(a, *train_sampler, path);
    const nlohmann::json& per_rank = a.contains("per_rank") ? a.at("per_rank") : nlohmann::json();
    if (per_rank.is_array() && per_rank.size() == static_cast<size_t>(layout.world_size()) &&
        per_rank[static_cast<size_t>(layout.world_rank())].contains("torch_rng"))
      job::set_rng_state_hex(per_rank[static_cast<size_t>(layout.world_rank())]["torch_rng"].get<std::string>());
    if (root) {
      job::truncate_metrics(metrics_path, step);  // later lines belong to the lost timeline
      std::cout << "resumed from " << path << " at step " << step << " (" << tokens_seen << " tokens)" << std::endl;
    }
  }
  data::DataLoader loader(train_sampler, {cfg.micro_batch, dp_rank, dp}, cursor);

  // ---- one forward pass and its loss -------------------------------------------------
  ObjectiveConfig lcfg;
  lcfg.kd.temperature = cfg.temperature;
  lcfg.kd.top_k = cfg.top_k;
  lcfg.ce_weight = cfg.distill ? cfg.ce_weight : 1.0;
  lcfg.kd_weight = cfg.distill ? cfg.kd_weight : 0.0;
  lcfg.intermediate_weight = cfg.intermediate_weight;
  DistillObjective objective(*tp.comm, spec.vocab_size, lcfg, inter);
  auto batch_loss = [&](data::DataLoader& batches, LossParts& parts) {
    const job::Batch b = job::next_batch(batches, cfg.micro_batch, cfg.seq_len, device);
    const Forward s = forward_logits(student, b.input, cfg.recompute == "full");
    Forward t;
    if (objective.kd()) {
      torch::NoGradGuard ng;
      t = forward_logits(*teacher, b.input);
    }
    return objective(s, t, b.labels, parts);
  };

  // A fault injector for the tests of the non-finite path: AC_FAULT_NAN_STEPS=FIRST:COUNT
  // makes the loss NaN at steps [FIRST, FIRST + COUNT). Documented in docs/training.md.
  int64_t nan_first = -1, nan_count = 0;
  if (const char* f = std::getenv("AC_FAULT_NAN_STEPS")) {
    if (std::sscanf(f, "%ld:%ld", &nan_first, &nan_count) != 2) nan_first = -1;
  }

  // ---- checkpoint -----------------------------------------------------------------------
  auto save = [&](const char* why) {
    std::vector<checkpoint::ShardedTensor> tensors =
        checkpoint::model_tensors(student, dp_rank == 0, "model/", layout.edp_rank() == 0);
    for (auto& t : opt.tensors()) tensors.push_back(std::move(t));
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
        {"optimizer", opt.attributes()},
        {"lr_schedule", opt.schedule_attributes()},
        {"layout", layout_j},
        {"config", run_config},
        {"teacher", teacher_path},
    };
    checkpoints.save(step, tensors, attrs, {{"torch_rng", job::rng_state_hex()}}, why);
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

  // ---- metrics and progress -------------------------------------------------------------
  // The peak of training: from the models and optimizer as they stand (load temporaries excluded).
  dist::tensor_memory::reset_peak();
  auto peak_over_ranks = [&]() {  // and starts the next interval
    int64_t p = dist::tensor_memory::peak();
    dist::tensor_memory::reset_peak();
    MPI_Allreduce(MPI_IN_PLACE, &p, 1, MPI_INT64_T, MPI_MAX, world);
    return p;
  };
  job::MetricsLog metrics(metrics_path, root);
  const int64_t tokens_per_step = cfg.micro_batch * cfg.seq_len * cfg.grad_accum * dp;
  const double flops_per_token = 3.0 * model::prefill_flops_per_token(spec, cfg.seq_len) +
                                 (cfg.distill ? model::prefill_flops_per_token(teacher_spec, cfg.seq_len) : 0.0);
  if (root) {
    std::cout << (cfg.distill ? "distill" : "pretrain") << ": " << student->logical_parameter_count()
              << " student parameters, TP " << layout.tp_size() << " x DP " << dp
              << (cfg.ep > 1 ? ", experts over EP " + std::to_string(cfg.ep) : "")
              << (expert_tp ? ", expert FFN over ETP " + std::to_string(cfg.etp) : "")
              << (cfg.recompute == "full" ? ", recompute full" : "") << ", " << tokens_per_step
              << " tokens per step, steps " << step << " -> " << cfg.steps << "\n"
              << "device: " << rd.choice.device << " (" << rd.choice.reason << "), collectives "
              << rd.choice.backend() << (rd.choice.cuda ? (rd.tf32 ? ", TF32 allowed" : ", TF32 off") : "") << "\n"
              << "dtype: " << rd.dtype_choice.dtype << " (" << rd.dtype_choice.reason << ")" << std::endl;
    if (!cfg.peak_note.empty()) std::cout << "MFU: " << cfg.peak_note << std::endl;
    if (const std::string d = opt.describe(dp); !d.empty()) std::cout << d << std::endl;
  }
  const double devices = mfu_devices(layout, rd.choice, cfg.peak_threads, world);

  // ---- the loop -------------------------------------------------------------------------
  const int64_t first_step = step;
  LossParts interval;
  double last_norm = 0, last_lr = 0;
  job::StepLoop loop;
  loop.steps = cfg.steps;
  loop.log_interval = cfg.log_interval;
  loop.eval_interval = eval_sampler ? cfg.eval_interval : 0;
  loop.save_interval = cfg.save_interval;
  loop.step = [&](int64_t at) {
    LossParts parts;
    for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
      torch::Tensor loss = batch_loss(loader, parts);
      if (at >= nan_first && at < nan_first + nan_count) loss = loss * std::numeric_limits<float>::quiet_NaN();
      (loss / double(cfg.grad_accum)).backward();
    }
    const WeightOptimizer::Step r = opt.step(at, checkpoints.dir());
    tokens_seen += tokens_per_step;
    last_norm = r.grad_norm;
    last_lr = r.lr;
    const auto m = dp_mean({parts.total / cfg.grad_accum, parts.kd / cfg.grad_accum, parts.ce / cfg.grad_accum,
                            parts.inter / cfg.grad_accum});
    interval.total += m[0];
    interval.kd += m[1];
    interval.ce += m[2];
    interval.inter += m[3];
  };
  loop.log = [&](int64_t at, double dt, int64_t interval_steps) {
    const double tok_s = double(tokens_per_step * interval_steps) / std::max(dt, 1e-9);
    const double elapsed = std::chrono::duration<double>(clock::now() - t_start).count();
    const double eta = dt / double(interval_steps) * double(cfg.steps - at);
    const double mfu = cfg.peak_flops > 0 ? tok_s * flops_per_token / (cfg.peak_flops * devices) : 0.0;
    const double n = double(interval_steps);
    const int64_t peak_bytes = count_memory ? peak_over_ranks() : 0;  // every rank: a collective
    if (root) {
      nlohmann::json line = {{"step", at},        {"loss", interval.total / n}, {"lr", last_lr},
                             {"grad_norm", last_norm}, {"tokens", tokens_seen},  {"tokens_per_s", tok_s},
                             {"skipped_steps", opt.skipped_total()}, {"elapsed_s", elapsed}};
      if (objective.kd()) line["kd_loss"] = interval.kd / n;
      if (objective.ce()) line["ce_loss"] = interval.ce / n;
      if (use_inter) line["intermediate_loss"] = interval.inter / n;
      if (cfg.peak_flops > 0) line["mfu"] = mfu;
      if (count_memory) line["peak_tensor_bytes"] = peak_bytes;  // the largest rank's peak in this interval
      metrics.write(line);
      std::ostringstream o;
      o << "step " << at << "/" << cfg.steps << " | loss " << std::fixed << std::setprecision(4) << interval.total / n;
      if (objective.kd() && objective.ce()) o << " (kd " << interval.kd / n << ", ce " << interval.ce / n << ")";
      o << " | lr " << std::scientific << std::setprecision(2) << last_lr << std::fixed << " | grad "
        << std::setprecision(3) << last_norm << " | " << si(tok_s) << " tok/s";
      if (cfg.peak_flops > 0) o << " | MFU " << std::setprecision(1) << 100.0 * mfu << "%";
      if (opt.skipped_total()) o << " | skipped " << opt.skipped_total();
      if (count_memory) o << " | mem " << std::setprecision(0) << double(peak_bytes) / (1 << 20) << " MiB";
      o << " | ETA " << format_duration(eta);
      std::cout << o.str() << std::endl;
    }
    interval = LossParts{};
  };
  if (eval_sampler) {
    loop.eval = [&](int64_t at) {
      const auto e = evaluate();
      if (root) {
        nlohmann::json line = {{"step", at}, {"eval_loss", e[0]}};
        if (objective.kd()) line["eval_kd_loss"] = e[1];
        if (objective.ce()) line["eval_ce_loss"] = e[2];
        metrics.write(line);
        std::cout << "eval at step " << at << ": loss " << std::fixed << std::setprecision(4) << e[0] << std::endl;
      }
    };
  }
  loop.save = save;
  if (const int rc = job::run_steps(loop, step, world); rc != 0) return rc;
  if (root) {
    const double elapsed = std::chrono::duration<double>(clock::now() - t_start).count();
    std::cout << "done: " << cfg.steps << " steps (" << cfg.steps - first_step << " this run) in "
              << format_duration(elapsed) << ", " << opt.skipped_total() << " skipped" << std::endl;
  }
  return 0;
}

}  // namespace ac::distill

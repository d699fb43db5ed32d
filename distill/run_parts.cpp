// The shared components of resumable jobs (see run_parts.h).
#include "distill/run_parts.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/error.h"
#include "distill/trainer.h"

namespace fs = std::filesystem;

namespace ac::distill {

// ---- device, dtype and rank grid --------------------------------------------------------------

RunDevice choose_run_device(const std::string& device, int local_rank, const std::string& dtype) {
  RunDevice d;
  d.choice = dist::choose_device(device, local_rank);
  d.device = d.choice.torch_device();
  d.tf32 = dist::apply_tf32_policy(d.choice);
  d.dtype_choice = dist::choose_dtype(dtype, d.choice.cuda);
  d.dtype = checkpoint::parse_dtype(d.dtype_choice.dtype);
  return d;
}

nlohmann::json layout_json(const dist::ParallelLayout& layout, const RunDevice& d, int etp) {
  return {{"world", layout.world_size()},       {"tp", layout.tp_size()},
          {"dp", layout.dp_size()},             {"ep", layout.ep_size()},
          {"etp", etp},                         {"dtype", d.dtype_choice.dtype},
          {"dtype_reason", d.dtype_choice.reason}, {"device", d.choice.device},
          {"device_reason", d.choice.reason},   {"backend", d.choice.backend()},
          {"tf32", d.tf32}};
}

// ---- data and cursor ---------------------------------------------------------------------------

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

// ---- models ---------------------------------------------------------------------------------------

model::CausalLM load_frozen_teacher(const std::string& path, const model::TpGroup& tp, torch::Dtype dtype,
                                    const model::EpGroup& ep) {
  checkpoint::CheckpointReader r(path);
  const model::ArchSpec spec = checkpoint::checkpoint_arch(r);
  if (const std::string why = model::tp_split_problem(spec, tp.size(), ep.size(), ep.expert_tp); !why.empty())
    throw InputError(path, "arch_spec (--tp " + std::to_string(tp.size()) + (ep.size() > 1 ? " --ep " + std::to_string(ep.size()) : "") +
                               (ep.expert_tp ? " --etp " + std::to_string(tp.size()) : "") + ")", why);
  model::CausalLM m(spec, tp, model::ModelOptions{dtype, ep});
  checkpoint::load_model(m, r);
  m->eval();
  for (auto& p : m->parameters()) p.requires_grad_(false);
  return m;
}

// ---- checkpoint and resume ---------------------------------------------------------------------

RunCheckpoints::RunCheckpoints(MPI_Comm world, std::string dir, int keep_last, std::string label)
    : world_(world), dir_(std::move(dir)), label_(std::move(label)), keep_last_(keep_last) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  root_ = rank == 0;
  if (root_) fs::create_directories(dir_);
  MPI_Barrier(world);
  resuming_ = fs::exists(dir_ + "/latest");
}

std::string RunCheckpoints::latest() const { return checkpoint::resolve_latest(dir_); }

std::string RunCheckpoints::save(int64_t step, const std::vector<checkpoint::ShardedTensor>& tensors,
                                 const nlohmann::json& attributes, const nlohmann::json& per_rank, const char* why) const {
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::SaveOptions so;
  so.keep_last = keep_last_;
  const std::string path = checkpoint::save_checkpoint(world_, dir_, step, tensors, attributes, per_rank, so);
  if (root_)
    std::cout << label_ << " " << path << " (" << why << ", " << std::fixed << std::setprecision(1)
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s)" << std::endl;
  return path;
}

// ---- stop signals ------------------------------------------------------------------------------

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int signo) {
  if (signo > g_signal) g_signal = signo;
}
}  // namespace

StopSignals::StopSignals() {
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, &old_usr1_);
  sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGUSR1, &old_usr1_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

int StopSignals::agree(MPI_Comm world) const {
  int stop = static_cast<int>(g_signal);
  MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, world);
  return stop;
}

const char* signal_name(int signo) { return signo == SIGUSR1 ? "SIGUSR1" : signo == SIGTERM ? "SIGTERM" : "signal"; }

void requeue_after_signal(int signo) {
  if (signo != SIGUSR1) return;
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* no = std::getenv("AC_NO_REQUEUE");
  if (!job || (no && std::string(no) == "1")) return;
  const std::string cmd = "scontrol requeue " + std::string(job);
  std::cout << "requeueing: " << cmd << std::endl;
  if (std::system(cmd.c_str()) != 0) std::cerr << "warning: '" << cmd << "' failed" << std::endl;
}

// ---- metrics and progress ---------------------------------------------------------------------

void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  std::ostringstream kept;
  for (std::string line; std::getline(in, line);) {
    try {
      const auto j = nlohmann::json::parse(line);
      if (j.value("step", int64_t(0)) <= step) kept << line << "\n";
    } catch (const std::exception&) {
    }
  }
  std::ofstream out(path + ".tmp", std::ios::trunc);
  out << kept.str();
  out.close();
  fs::rename(path + ".tmp", path);
}

void MetricsLog::write(const nlohmann::json& line) {
  if (!root_) return;
  if (!out_) out_ = std::make_unique<std::ofstream>(path_, std::ios::app);
  *out_ << line.dump() << "\n" << std::flush;
}

std::string hex_encode(const torch::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  const auto t = bytes.contiguous();
  const auto* p = t.data_ptr<uint8_t>();
  std::string s;
  s.reserve(size_t(t.numel()) * 2);
  for (int64_t i = 0; i < t.numel(); ++i) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}

torch::Tensor hex_decode(const std::string& s) {
  torch::Tensor t = torch::empty({int64_t(s.size() / 2)}, torch::kUInt8);
  auto* p = t.data_ptr<uint8_t>();
  auto nib = [](char c) { return uint8_t(c <= '9' ? c - '0' : c - 'a' + 10); };
  for (size_t i = 0; i + 1 < s.size(); i += 2) p[i / 2] = uint8_t(nib(s[i]) << 4 | nib(s[i + 1]));
  return t;
}

std::string rng_state_hex() { return hex_encode(at::detail::getDefaultCPUGenerator().get_state()); }
void set_rng_state_hex(const std::string& hex) {
  at::Generator(at::detail::getDefaultCPUGenerator()).set_state(hex_decode(hex));
}

// ---- the step loop ---------------------------------------------------------------------------

int run_steps(const StepLoop& loop, int64_t& step, MPI_Comm world) {
  using clock = std::chrono::steady_clock;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  StopSignals signals;
  auto t_interval = clock::now();
  int64_t interval_steps = 0;
  bool saved_at_step = false;
  while (step < loop.steps) {
    // Every rank agrees on a pending stop signal before starting a step (SIGTERM outranks
    // SIGUSR1: MAX of the signal numbers).
    if (const int stop = signals.agree(world)) {
      if (rank == 0) std::cout << "stop signal received (" << signal_name(stop) << ") at step " << step << ": saving" << std::endl;
      if (!saved_at_step) loop.save("signal");
      // Requeue only on SIGUSR1 (Slurm's advance warning): `scontrol requeue` would also
      // requeue a job the user cancelled (scancel sends SIGTERM). Exit 75 either way.
      if (rank == 0) requeue_after_signal(stop);
      return kExitRequeue;
    }
    loop.step(step);
    ++step;
    ++interval_steps;
    saved_at_step = false;
    const bool last = step == loop.steps;
    if (loop.log && (step % loop.log_interval == 0 || last)) {
      loop.log(step, std::chrono::duration<double>(clock::now() - t_interval).count(), interval_steps);
      interval_steps = 0;
      t_interval = clock::now();
    }
    if (loop.eval && loop.eval_interval > 0 && (step % loop.eval_interval == 0 || last)) {
      loop.eval(step);
      t_interval = clock::now();  // eval time is not training throughput
    }
    if ((loop.save_interval > 0 && step % loop.save_interval == 0) || last) {
      loop.save(last ? "final" : "interval");
      saved_at_step = true;
      t_interval = clock::now();
    }
  }
  return 0;
}

}  // namespace ac::distill

// Shared parts of resumable jobs (see run_parts.h).
#include "distill/run_parts.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/error.h"

namespace fs = std::filesystem;

namespace ac::distill {

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

model::CausalLM load_frozen_teacher(const std::string& path, const model::TpGroup& tp, torch::Dtype dtype) {
  checkpoint::CheckpointReader r(path);
  const model::ArchSpec spec = checkpoint::checkpoint_arch(r);
  if (const std::string why = model::tp_split_problem(spec, tp.size()); !why.empty())
    throw InputError(path, "arch_spec (--tp " + std::to_string(tp.size()) + ")", why);
  model::CausalLM m(spec, tp, model::ModelOptions{dtype});
  checkpoint::load_model(m, r);
  m->eval();
  for (auto& p : m->parameters()) p.requires_grad_(false);
  return m;
}

}  // namespace ac::distill

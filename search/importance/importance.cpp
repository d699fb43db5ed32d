// Minitron-style importance (see importance.h and docs/importance.md): the calibration
// forward with a model::ActivationObserver accumulating per-unit statistics in float64, the
// reduction over DP and assembly over TP, and the HDF5 file.
#include "search/importance/importance.h"

#include <hdf5.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/hdf5_util.h"
#include "checkpoint/model_state.h"
#include "data/sampler.h"
#include "dist/cpu_features.h"
#include "dist/error.h"
#include "dist/file_io.h"
#include "dist/device.h"
#include "dist/parallel_layout.h"
#include "dist/tensor_parallel.h"
#include "job/setup.h"
#include "job/token_data.h"
#include "model/model.h"

namespace fs = std::filesystem;
namespace h5 = ac::checkpoint::h5;

namespace ac::search {
namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// ---- the file's datasets ---------------------------------------------------------------

// One dataset of the file: its name, the shape the ArchSpec gives, and the vector it holds.
struct ScoreAxis {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double>* values;
};

// Every dataset an importance file of `spec` has, bound to the fields of `s` (which must
// have spec.layers.size() layers). Depth scores are gathered into `cosine`/`loss`.
std::vector<ScoreAxis> axes_of(const model::ArchSpec& spec, ImportanceScores& s, std::vector<double>& cosine,
                               std::vector<double>& loss) {
  std::vector<ScoreAxis> out;
  out.push_back({"hidden", {spec.hidden_size}, &s.hidden});
  const int64_t L = int64_t(spec.layers.size());
  out.push_back({"depth/cosine", {L}, &cosine});
  out.push_back({"depth/loss_increase", {L}, &loss});
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const auto& l = spec.layers[i];
    auto& li = s.layers[i];
    const std::string p = "layers/" + std::to_string(i) + "/";
    if (l.attention) {
      out.push_back({p + "attn_heads", {l.attention->num_heads}, &li.attn_heads});
      out.push_back({p + "attn_kv_groups", {l.attention->num_kv_heads}, &li.attn_kv_groups});
    }
    if (l.mamba) {
      out.push_back({p + "mamba_heads", {l.mamba->num_heads}, &li.mamba_heads});
      out.push_back({p + "mamba_head_dim", {l.mamba->head_dim}, &li.mamba_head_dim});
    }
    if (l.mlp) out.push_back({p + "mlp_neurons", {l.mlp->ffn_size}, &li.mlp_neurons});
    if (l.moe) {
      const int64_t E = l.moe->num_experts;
      out.push_back({p + "moe_experts", {E}, &li.moe_experts});
      out.push_back({p + "moe_expert_tokens", {E}, &li.moe_expert_tokens});
      out.push_back({p + "moe_expert_neurons", {E, l.moe->expert_ffn}, &li.moe_expert_neurons});
      if (l.moe->shared_ffn > 0) out.push_back({p + "moe_shared_neurons", {l.moe->shared_ffn}, &li.moe_shared_neurons});
      if (l.moe->latent_size > 0) out.push_back({p + "moe_latent", {l.moe->latent_size}, &li.moe_latent});
    }
  }
  return out;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

using h5::read_double_attr;
using h5::read_u64_attr;
using h5::write_double_attr;
using h5::write_u64_attr;
using checkpoint::shape_text;

}  // namespace

// ---- save / load ------------------------------------------------------------------------

ImportanceScores neutral_importance(const model::ArchSpec& spec) {
  ImportanceScores s;
  s.teacher_arch = spec;
  s.layers.resize(spec.layers.size());
  std::vector<double> cosine, loss;
  for (const auto& a : axes_of(spec, s, cosine, loss)) a.values->assign(size_t(numel_of(a.shape)), 0.0);
  s.teacher_checkpoint = "(neutral scores)";
  return s;
}

void save_importance(const ImportanceScores& scores_in, const std::string& path) {
  ImportanceScores s = scores_in;  // axes_of binds mutable vectors; the scores are small
  const model::ArchSpec& spec = s.teacher_arch;
  if (s.layers.size() != spec.layers.size())
    throw std::invalid_argument("save_importance: " + std::to_string(s.layers.size()) + " layer scores for a teacher of " +
                                std::to_string(spec.layers.size()) + " layers");
  std::vector<double> cosine, loss;
  for (const auto& l : s.layers) {
    cosine.push_back(l.depth_cosine);
    loss.push_back(l.depth_loss_increase);
  }
  const auto axes = axes_of(spec, s, cosine, loss);
  for (const auto& a : axes)
    if (int64_t(a.values->size()) != numel_of(a.shape))
      throw std::invalid_argument("save_importance: " + a.name + " has " + std::to_string(a.values->size()) +
                                  " values, the teacher's ArchSpec gives " + shape_text(a.shape));

  h5::quiet_errors();
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  check_output_path(path, "--out");
  const std::string tmp = path + ".tmp";
  try {
    {
      h5::Handle file(h5::check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), tmp), H5Fclose);
      h5::write_string_attr(file, "format", kImportanceFormat);
      h5::write_int_attr(file, "version", kImportanceVersion);
      h5::write_string_attr(file, "teacher_checkpoint", s.teacher_checkpoint);
      h5::write_string_attr(file, "teacher_fingerprint", s.teacher_fingerprint);
      h5::write_string_attr(file, "arch_spec", model::arch_to_json(spec).dump());
      h5::write_string_attr(file, "data", s.data);
      h5::write_string_attr(file, "split", s.split);
      h5::write_string_attr(file, "dtype", s.dtype);
      h5::write_int_attr(file, "calib_samples", s.calib_samples);
      h5::write_int_attr(file, "seq_len", s.seq_len);
      write_u64_attr(file, "seed", s.seed);
      write_double_attr(file, "base_loss", s.base_loss);
      h5::write_int_attr(file, "depth_loss_samples", s.depth_loss_samples);
      h5::Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
      H5Pset_create_intermediate_group(lcpl, 1);
      for (const auto& a : axes) {
        std::vector<hsize_t> dims(a.shape.begin(), a.shape.end());
        h5::Handle space(h5::check(H5Screate_simple(int(dims.size()), dims.data(), nullptr), tmp + ": " + a.name), H5Sclose);
        h5::Handle d(h5::check(H5Dcreate2(file, a.name.c_str(), H5T_IEEE_F64LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT),
                               tmp + ": dataset " + a.name),
                     H5Dclose);
        if (!a.values->empty())
          h5::check(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.values->data()), tmp + ": dataset " + a.name);
      }
      if (file.close() < 0) throw std::runtime_error(tmp + ": closing: " + h5::error_stack());
    }
    // Durable before it takes the final name: a crash leaves the old file or the new one.
    if (FILE* f = std::fopen(tmp.c_str(), "rb")) {
      fsync(fileno(f));
      std::fclose(f);
    }
    fs::rename(tmp, path);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

ImportanceScores load_importance(const std::string& path, const std::string& expected_fingerprint) {
  h5::quiet_errors();
  if (!fs::exists(path)) throw InputError(path, "file", "no such importance file");
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw InputError(path, "file", "not an HDF5 file (truncated or corrupt)");
  }
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw InputError(path, "file", "cannot open: " + h5::error_stack() + " (truncated or corrupt?)");
  ImportanceScores s;
  // HDF5 failures while reading metadata or data of an opened file mean a damaged file.
  auto damaged = [&](const std::string& what, const std::exception& e) {
    return InputError(path, what, std::string(e.what()) + " (truncated or corrupt?)");
  };
  auto string_attr = [&](const char* name) {
    if (!h5::has_attr(file, name)) throw InputError(path, name, "missing attribute: not an importance file?");
    try {
      return h5::read_string_attr(file, name, path);
    } catch (const std::exception& e) {
      throw damaged(std::string("attribute ") + name, e);
    }
  };
  auto need = [&](const char* name) {
    if (!h5::has_attr(file, name)) throw InputError(path, name, "missing attribute");
  };
  if (!h5::has_attr(file, "format") || string_attr("format") != kImportanceFormat)
    throw InputError(path, "format", std::string("not an importance file (want format \"") + kImportanceFormat + "\")");
  need("version");
  int64_t version = 0;
  try {
    version = h5::read_int_attr(file, "version", path);
  } catch (const std::exception& e) {
    throw damaged("attribute version", e);
  }
  if (version != kImportanceVersion)
    throw InputError(path, "version", "file has version " + std::to_string(version) + ", this build reads version " +
                                          std::to_string(kImportanceVersion));
  const std::string arch_text = string_attr("arch_spec");
  nlohmann::json arch_json;
  try {
    arch_json = nlohmann::json::parse(arch_text);
  } catch (const std::exception& e) {
    throw InputError(path, "arch_spec", std::string("not JSON: ") + e.what());
  }
  s.teacher_arch = model::arch_from_json(arch_json, path + ": arch_spec");
  s.teacher_checkpoint = string_attr("teacher_checkpoint");
  s.teacher_fingerprint = string_attr("teacher_fingerprint");
  if (!expected_fingerprint.empty() && s.teacher_fingerprint != expected_fingerprint)
    throw InputError(path, "teacher_fingerprint",
                     "importance file " + path + " was computed for teacher " + s.teacher_checkpoint + " (fingerprint " +
                         s.teacher_fingerprint + "), not for this teacher (fingerprint " + expected_fingerprint +
                         "): recompute it with `autocompress importance`");
  s.data = string_attr("data");
  if (h5::has_attr(file, "split")) s.split = string_attr("split");
  if (h5::has_attr(file, "dtype")) s.dtype = string_attr("dtype");
  try {
    for (const char* n : {"calib_samples", "seq_len", "seed", "base_loss"}) need(n);
    s.calib_samples = h5::read_int_attr(file, "calib_samples", path);
    s.seq_len = h5::read_int_attr(file, "seq_len", path);
    s.seed = read_u64_attr(file, "seed", path);
    s.base_loss = read_double_attr(file, "base_loss", path);
    if (h5::has_attr(file, "depth_loss_samples")) s.depth_loss_samples = h5::read_int_attr(file, "depth_loss_samples", path);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw damaged("attributes", e);
  }

  s.layers.resize(s.teacher_arch.layers.size());
  std::vector<double> cosine, loss;
  const auto axes = axes_of(s.teacher_arch, s, cosine, loss);
  std::set<std::string> expected;
  for (const auto& a : axes) expected.insert(a.name);
  std::vector<std::string> stored;
  try {
    stored = h5::list_datasets(file, path);
  } catch (const std::exception& e) {
    throw damaged("datasets", e);
  }
  const std::set<std::string> present(stored.begin(), stored.end());
  for (const auto& n : stored)
    if (!expected.count(n))
      throw InputError(path, "dataset " + n, "not a score the teacher's ArchSpec has (another architecture?)");
  for (const auto& a : axes) {
    const std::string what = "dataset " + a.name;
    if (!present.count(a.name))
      throw InputError(path, what, "missing (the teacher's ArchSpec gives shape " + shape_text(a.shape) + ")");
    try {
      h5::Handle d(h5::check(H5Dopen2(file, a.name.c_str(), H5P_DEFAULT), path + ": " + what), H5Dclose);
      h5::Handle space(H5Dget_space(d), H5Sclose);
      const int rank = H5Sget_simple_extent_ndims(space);
      std::vector<hsize_t> dims(size_t(std::max(rank, 0)));
      if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
      const std::vector<int64_t> shape(dims.begin(), dims.end());
      if (shape != a.shape)
        throw InputError(path, what, "has shape " + shape_text(shape) + ", the teacher's ArchSpec gives " + shape_text(a.shape));
      a.values->assign(size_t(numel_of(a.shape)), 0.0);
      if (!a.values->empty())
        h5::check(H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.values->data()), path + ": " + what);
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      throw damaged(what, e);
    }
    // Every score is finite and >= 0, except a loss increase (skipping a layer may help).
    const bool signed_score = a.name == "depth/loss_increase";
    for (double v : *a.values)
      if (!std::isfinite(v) || (v < 0 && !signed_score))
        throw InputError(path, what, "holds " + std::to_string(v) + ": scores are finite" +
                                         (signed_score ? "" : " and >= 0") + " (corrupt?)");
  }
  for (size_t i = 0; i < s.layers.size(); ++i) {
    s.layers[i].depth_cosine = cosine[i];
    s.layers[i].depth_loss_increase = loss[i];
  }
  return s;
}

// ---- the calibration forward ------------------------------------------------------------

namespace {

// Accumulates, per layer, the Minitron statistics in float64 at their full logical size;
// this rank fills only the slices it holds (its TP shard), so one SUM over the world
// assembles TP shards and reduces DP. Replicated statistics (norm outputs, latent) are
// counted by TP rank 0 only.
class Collector : public model::ActivationObserver {
 public:
  struct Layer {
    torch::Tensor mixer_norm, ffn_norm;  // [hidden]: sum over samples of (mean_s |x|)^2
    torch::Tensor attn;                  // [heads * head_dim]
    torch::Tensor mlp;                   // [ffn]
    torch::Tensor mamba;                 // [heads * head_dim]
    torch::Tensor expert_norm, expert_tokens;  // [E]: sum of output L2 norms, routed tokens
    torch::Tensor expert_neurons;        // [E, expert_ffn]
    torch::Tensor shared, latent;        // [shared_ffn], [latent]
    int64_t attn_off = 0, mlp_off = 0, mamba_off = 0, shared_off = 0;  // this rank's slice starts
  };

  // The sums live on the model's device; they come to the host once, for the world reduction.
  Collector(const model::ArchSpec& spec, int tp_rank, int tp_size, torch::Device device)
      : spec_(spec), replicated_(tp_rank == 0) {
    auto zeros = [device](std::vector<int64_t> shape) {
      return torch::zeros(shape, torch::TensorOptions().dtype(torch::kDouble).device(device));
    };
    const int64_t H = spec.hidden_size;
    for (const auto& l : spec.layers) {
      Layer a;
      if (l.attention || l.mamba) a.mixer_norm = zeros({H});
      if (l.mlp || l.moe) a.ffn_norm = zeros({H});
      if (l.attention) {
        const int64_t n = int64_t(l.attention->num_heads) * l.attention->head_dim;
        a.attn = zeros({n});
        a.attn_off = tp_rank * (n / tp_size);
      }
      if (l.mamba) {
        const int64_t n = l.mamba->d_inner();
        a.mamba = zeros({n});
        a.mamba_off = tp_rank * (n / tp_size);
      }
      if (l.mlp) {
        a.mlp = zeros({l.mlp->ffn_size});
        a.mlp_off = tp_rank * (l.mlp->ffn_size / tp_size);
      }
      if (l.moe) {
        const int64_t E = l.moe->num_experts;
        a.expert_norm = zeros({E});
        a.expert_tokens = zeros({E});
        a.expert_neurons = zeros({E, l.moe->expert_ffn});
        if (l.moe->shared_ffn > 0) {
          a.shared = zeros({l.moe->shared_ffn});
          a.shared_off = tp_rank * (l.moe->shared_ffn / tp_size);
        }
        if (l.moe->latent_size > 0) a.latent = zeros({l.moe->latent_size});
      }
      layers_.push_back(a);
    }
  }

  // The shape of the micro-batch the next forward runs.
  void begin_batch(int64_t batch, int64_t seq) {
    batch_ = batch;
    seq_ = seq;
  }

  void activation(int layer, model::ObservePoint point, const at::Tensor& act) override {
    Layer& l = layers_[size_t(layer)];
    using P = model::ObservePoint;
    switch (point) {
      case P::MixerNormOut: if (replicated_) add_mean_sq(l.mixer_norm, 0, act); break;
      case P::FfnNormOut: if (replicated_) add_mean_sq(l.ffn_norm, 0, act); break;
      case P::AttnOProjInput: add_mean_sq(l.attn, l.attn_off, act); break;
      case P::MlpDownInput: add_mean_sq(l.mlp, l.mlp_off, act); break;
      case P::MambaX: add_mean_sq(l.mamba, l.mamba_off, act); break;
      case P::SharedDownInput: add_mean_sq(l.shared, l.shared_off, act); break;
      case P::MoeLatent: if (replicated_) add_mean_sq(l.latent, 0, act); break;
      default: break;  // the search's modify-only points
    }
  }

  void expert(int layer, int64_t e, const at::Tensor& rows, const at::Tensor& down_input,
              const at::Tensor& weighted_output) override {
    Layer& l = layers_[size_t(layer)];
    const int64_t n = rows.size(0);
    l.expert_tokens[e] += double(n);
    l.expert_norm[e] += weighted_output.to(torch::kFloat).square().sum(-1).sqrt().to(torch::kDouble).sum().item<double>();
    // Per sample, the mean over the tokens of that sample routed to this expert (samples
    // with none add nothing): the dense estimator restricted to the expert's tokens.
    const auto sample = rows.div(seq_, "floor");
    auto sums = torch::zeros({batch_, down_input.size(1)}, down_input.options().dtype(torch::kDouble));
    sums.index_add_(0, sample, down_input.to(torch::kFloat).abs().to(torch::kDouble));
    const auto counts = torch::bincount(sample, {}, batch_).to(torch::kDouble).clamp_min(1.0).unsqueeze(1);
    l.expert_neurons[e] += (sums / counts).square().sum(0);
  }

  std::vector<Layer>& layers() { return layers_; }

 private:
  // acc[offset : offset + C] += sum over samples of (mean over the sequence of |x|)^2.
  void add_mean_sq(torch::Tensor& acc, int64_t offset, const at::Tensor& x) {
    const auto m = x.reshape({batch_, seq_, -1}).to(torch::kFloat).abs().mean(1);  // [B, C]
    acc.narrow(0, offset, m.size(1)).add_(m.to(torch::kDouble).square().sum(0));
  }

  model::ArchSpec spec_;
  bool replicated_;
  std::vector<Layer> layers_;
  int64_t batch_ = 0, seq_ = 0;
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + v[i];
  return s;
}

// The teacher at TP x DP and the calibration samples, shared by compute_importance and the bench.
struct Calibration {
  ImportanceOptions opt;
  std::string path;  // resolved checkpoint file
  model::ArchSpec spec;
  job::JobSetup setup;  // device, dtype, layout (host collectives), TP group
  model::CausalLM teacher{nullptr};
  std::shared_ptr<data::BlendedSampler> sampler;
  std::string fingerprint;

  Calibration(const ImportanceOptions& o, MPI_Comm world) : opt(o) {
    if (o.teacher.empty()) throw InputError("--teacher", "value", "a teacher checkpoint is required");
    if (o.data.empty()) throw InputError("--data", "value", "at least one dataset is required");
    if (o.calib_samples <= 0) throw InputError("--calib-samples", "value", "must be positive");
    if (o.seq_len <= 0) throw InputError("--seq-len", "value", "must be positive");
    if (o.micro_batch <= 0) throw InputError("--micro-batch", "value", "must be positive");
    if (o.depth_loss_samples < 0) throw InputError("--depth-loss-samples", "value", "must be >= 0");
    const job::RunDevice rd = job::choose_run_device(o.device, o.local_rank, o.dtype);
    path = checkpoint::resolve_checkpoint(o.teacher);
    checkpoint::CheckpointReader reader(path);
    spec = checkpoint::checkpoint_arch(reader);
    job::SetupOptions so;
    so.tp = o.tp;
    so.host_collectives = true;  // the statistics are reduced as host doubles
    setup = job::make_job_setup(world, so, rd);
    if (const std::string why = model::tp_split_problem(spec, layout().tp_size()); !why.empty())
      throw InputError(path, "arch_spec (--tp " + std::to_string(layout().tp_size()) + ")", why);
    sampler = job::TokenData(o.data, o.split, o.seq_len, o.seed).sampler(data::Split::Calibration);
    teacher = setup.frozen_teacher(path);
    // Metadata only for checkpoints with checksums; rank 0 reads, everyone gets the same text.
    std::string fp = layout().world_rank() == 0 ? checkpoint::model_fingerprint(reader) : std::string(16, ' ');
    fp.resize(16, ' ');
    MPI_Bcast(fp.data(), 16, MPI_CHAR, 0, world);
    fingerprint = fp;
  }

  const dist::ParallelLayout& layout() const { return *setup.layout; }
  torch::Dtype dtype() const { return setup.rd.dtype; }
  torch::Device device() const { return setup.rd.device; }
  int64_t global_batch() const { return opt.micro_batch * layout().dp_size(); }
  int64_t steps() const { return (opt.calib_samples + global_batch() - 1) / global_batch(); }
  // This rank's samples of step s: global indices [first, first + count) (count may be 0).
  std::pair<int64_t, int64_t> rows(int64_t s) const {
    const int64_t first = s * global_batch() + layout().dp_rank() * opt.micro_batch;
    const int64_t count = std::clamp<int64_t>(opt.calib_samples - first, 0, opt.micro_batch);
    return {first, count};
  }
  // Token ids [count, seq_len + 1] of step s for this rank.
  torch::Tensor batch(int64_t s) const {
    const auto [first, count] = rows(s);
    torch::Tensor ids = torch::empty({count, opt.seq_len + 1}, torch::kInt);
    for (int64_t i = 0; i < count; ++i) sampler->sample(first + i, ids[i].data_ptr<int32_t>());
    if (count > 0) {
      const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
      if (lo < 0 || hi >= spec.vocab_size)
        throw InputError(join(opt.data), "token ids",
                         "calibration samples " + std::to_string(first) + ".." + std::to_string(first + count - 1) +
                             " hold token id " + std::to_string(lo < 0 ? lo : hi) + ", outside the teacher's vocabulary of " +
                             std::to_string(spec.vocab_size) + " (" + path + "): data tokenized for another model?");
    }
    return ids.to(device(), torch::kLong);
  }

  // Summed next-token loss of the final hidden stream x [B, T, hidden].
  double loss_sum(const torch::Tensor& x, const torch::Tensor& labels) {
    auto local = teacher->logits_local(teacher->final_norm(x));
    local = local.reshape({-1, local.size(-1)});
    return dist::vocab_parallel_cross_entropy(local, labels, *setup.tp.comm, spec.vocab_size).to(torch::kDouble).sum().item<double>();
  }
  // The plain teacher forward (the bench's baseline).
  double plain_forward(const torch::Tensor& ids) {
    const int64_t T = opt.seq_len;
    const auto input = ids.narrow(1, 0, T).contiguous();
    const auto labels = ids.narrow(1, 1, T).reshape({-1}).contiguous();
    auto local = teacher->logits_local(teacher->hidden_states(input));
    local = local.reshape({-1, local.size(-1)});
    return dist::vocab_parallel_cross_entropy(local, labels, *setup.tp.comm, spec.vocab_size).to(torch::kDouble).sum().item<double>();
  }
};

// Sum over tokens of 1 - cos(x, y) along the last dim. For layers close to the identity
// 1 - cos is small and `1 - dot / (|x| |y|)` keeps only a few digits of it in float32, so it
// is computed from d = y - x (exact or nearly: y is x plus the layer's update) as
//   1 - cos = (a c - b^2) / (S (S + a + b)),  a = |x|^2, b = x.d, c = |d|^2, S = |x| |y|,
// with the three per-token reductions in the activation dtype (float32 here) and the rest in
// float64: relative precision ~1e-7 unless d is nearly parallel to x.
double one_minus_cos_sum(const torch::Tensor& x_in, const torch::Tensor& y_in) {
  const auto x = x_in.to(torch::kFloat), y = y_in.to(torch::kFloat);
  const auto d = y - x;
  const auto a = x.square().sum(-1).to(torch::kDouble), b = (x * d).sum(-1).to(torch::kDouble),
             c = d.square().sum(-1).to(torch::kDouble);
  const auto S = (a * (a + 2 * b + c)).clamp_min(0.0).sqrt();
  const auto num = (a * c - b.square()).clamp_min(0.0);
  return (num / (S * (S + a + b)).clamp_min(1e-300)).sum().item<double>();
}

// Sums over the batches of this rank, before the world reduction.
struct Totals {
  std::vector<double> one_minus_cos, skip_loss_sum;  // per layer
  double base_loss_sum = 0, base_loss_depth_sum = 0;
};

// One micro-batch: the observed forward (statistics, layer in/out cosines, base loss) and,
// for its first `depth_rows` samples, the loss with each single layer skipped (the layers
// before the skipped one are the base forward's: their output is reused).
void collect_batch(Calibration& c, Collector& col, const torch::Tensor& ids, int64_t depth_rows, Totals& t) {
  const int64_t B = ids.size(0), T = c.opt.seq_len, L = int64_t(c.spec.layers.size());
  if (B == 0) return;
  const auto input = ids.narrow(1, 0, T).contiguous();
  const auto labels = ids.narrow(1, 1, T).contiguous();
  col.begin_batch(B, T);
  // The statistics at the residual stream's points want whole sequences (model.cpp set_observer).
  if (c.teacher->tp().sp()) throw std::logic_error("importance: build the teacher without sequence parallelism");
  c.teacher->set_observer(&col);
  std::vector<torch::Tensor> inputs;  // layer inputs, kept for the skipped-layer forwards
  auto x = c.teacher->embed_tokens(input);
  for (int64_t i = 0; i < L; ++i) {
    if (depth_rows > 0) inputs.push_back(x.narrow(0, 0, depth_rows));
    auto y = c.teacher->layer(size_t(i))->forward(x, 0, nullptr);
    t.one_minus_cos[size_t(i)] += one_minus_cos_sum(x, y);
    x = y;
  }
  c.teacher->set_observer(nullptr);
  const double base = c.loss_sum(x, labels.reshape({-1}));
  t.base_loss_sum += base;
  if (depth_rows <= 0) return;
  const auto depth_labels = labels.narrow(0, 0, depth_rows).reshape({-1});
  t.base_loss_depth_sum += depth_rows == B ? base : c.loss_sum(x.narrow(0, 0, depth_rows), depth_labels);
  for (int64_t j = 0; j < L; ++j) {
    auto y = inputs[size_t(j)];  // the input of layer j, which is skipped
    for (int64_t k = j + 1; k < L; ++k) y = c.teacher->layer(size_t(k))->forward(y, 0, nullptr);
    t.skip_loss_sum[size_t(j)] += c.loss_sum(y, depth_labels);
  }
}

std::vector<double> to_vector(const torch::Tensor& t) {
  const auto c = t.to(torch::kCPU, torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

}  // namespace

ImportanceScores compute_importance(const ImportanceOptions& options, MPI_Comm world) {
  torch::NoGradGuard no_grad;
  Calibration c(options, world);
  const int64_t N = options.calib_samples, T = options.seq_len, L = int64_t(c.spec.layers.size());
  const int64_t depth_n = !options.depth_loss ? 0
                          : options.depth_loss_samples > 0 ? std::min(options.depth_loss_samples, N)
                                                           : N;
  Collector col(c.spec, c.layout().tp_rank(), c.layout().tp_size(), c.device());
  Totals tot;
  tot.one_minus_cos.assign(size_t(L), 0.0);
  tot.skip_loss_sum.assign(size_t(L), 0.0);
  const auto t0 = clock_type::now();
  const int64_t steps = c.steps();
  for (int64_t s = 0; s < steps; ++s) {
    const auto [first, count] = c.rows(s);
    const int64_t depth_rows = std::clamp<int64_t>(depth_n - first, 0, count);
    collect_batch(c, col, c.batch(s), depth_rows, tot);
    if (options.on_progress) options.on_progress(std::min(N, (s + 1) * c.global_batch()), N, seconds_since(t0));
  }

  // One SUM over the world: TP shards land in their slices, DP partial sums add up.
  // Replicated quantities (cosines, losses; the collector's own) count on TP rank 0 only.
  const bool rep = c.layout().tp_rank() == 0;
  std::vector<torch::Tensor> parts;
  for (auto& l : col.layers())
    for (torch::Tensor* t : {&l.mixer_norm, &l.ffn_norm, &l.attn, &l.mlp, &l.mamba, &l.expert_norm, &l.expert_tokens,
                             &l.expert_neurons, &l.shared, &l.latent})
      if (t->defined()) parts.push_back(*t);
  std::vector<double> scalars = tot.one_minus_cos;
  scalars.insert(scalars.end(), tot.skip_loss_sum.begin(), tot.skip_loss_sum.end());
  scalars.push_back(tot.base_loss_sum);
  scalars.push_back(tot.base_loss_depth_sum);
  if (!rep) std::fill(scalars.begin(), scalars.end(), 0.0);
  parts.push_back(torch::tensor(scalars, torch::kDouble));
  std::vector<torch::Tensor> flat_parts;
  for (auto& p : parts) flat_parts.push_back(p.reshape({-1}).to(torch::kCPU));  // host doubles over MPI
  torch::Tensor flat = torch::cat(flat_parts).contiguous();
  MPI_Allreduce(MPI_IN_PLACE, flat.data_ptr<double>(), int(flat.numel()), MPI_DOUBLE, MPI_SUM, world);
  {
    int64_t off = 0;
    for (auto& p : parts) {
      p.copy_(flat.narrow(0, off, p.numel()).view(p.sizes()));
      off += p.numel();
    }
  }
  const std::vector<double> sc = to_vector(parts.back());

  ImportanceScores out;
  out.teacher_checkpoint = options.teacher;
  out.teacher_fingerprint = c.fingerprint;
  out.teacher_arch = c.spec;
  out.data = join(options.data);
  out.calib_samples = N;
  out.seq_len = T;
  out.seed = options.seed;
  out.split = options.split;
  out.dtype = checkpoint::dtype_name(c.dtype());
  out.depth_loss_samples = depth_n;
  const double tokens = double(N) * double(T);
  out.base_loss = sc[size_t(2 * L)] / tokens;
  const double base_depth = depth_n > 0 ? sc[size_t(2 * L + 1)] / (double(depth_n) * double(T)) : 0.0;
  torch::Tensor hidden = torch::zeros({c.spec.hidden_size}, torch::TensorOptions().dtype(torch::kDouble).device(c.device()));
  out.layers.resize(size_t(L));
  for (int64_t i = 0; i < L; ++i) {
    const auto& ls = c.spec.layers[size_t(i)];
    auto& acc = col.layers()[size_t(i)];
    auto& li = out.layers[size_t(i)];
    // Hidden channels: per norm sqrt(accumulated), summed over the norms of all layers.
    if (acc.mixer_norm.defined()) hidden += acc.mixer_norm.sqrt();
    if (acc.ffn_norm.defined()) hidden += acc.ffn_norm.sqrt();
    if (ls.attention) {
      const int64_t H = ls.attention->num_heads, KV = ls.attention->num_kv_heads;
      const auto heads = acc.attn.view({H, -1}).sum(1).sqrt();  // = L2 over head_dim of sqrt(acc)
      li.attn_heads = to_vector(heads);
      li.attn_kv_groups = to_vector(heads.square().view({KV, H / KV}).sum(1).sqrt());
    }
    if (ls.mamba) {
      const auto x = acc.mamba.view({ls.mamba->num_heads, ls.mamba->head_dim});
      li.mamba_heads = to_vector(x.sum(1).sqrt());
      li.mamba_head_dim = to_vector(x.sum(0).sqrt());
    }
    if (ls.mlp) li.mlp_neurons = to_vector(acc.mlp.sqrt());
    if (ls.moe) {
      li.moe_experts = to_vector(acc.expert_norm / acc.expert_tokens.clamp_min(1.0));
      li.moe_expert_tokens = to_vector(acc.expert_tokens);
      li.moe_expert_neurons = to_vector(acc.expert_neurons.sqrt());
      if (acc.shared.defined()) li.moe_shared_neurons = to_vector(acc.shared.sqrt());
      if (acc.latent.defined()) li.moe_latent = to_vector(acc.latent.sqrt());
    }
    li.depth_cosine = sc[size_t(i)] / tokens;
    li.depth_loss_increase = depth_n > 0 ? sc[size_t(L + i)] / (double(depth_n) * double(T)) - base_depth : 0.0;
  }
  out.hidden = to_vector(hidden);
  return out;
}

ImportanceBench bench_importance(const ImportanceOptions& options, MPI_Comm world, int repeats) {
  torch::NoGradGuard no_grad;
  Calibration c(options, world);
  const int64_t L = int64_t(c.spec.layers.size());
  const int64_t steps = c.steps();
  std::vector<torch::Tensor> batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(c.batch(s));
  // Tokens of the whole (global) calibration set per pass; passes are timed on every rank
  // between barriers, so the slowest rank decides.
  const double tokens = double(options.calib_samples) * double(options.seq_len);
  auto timed = [&](const std::function<void()>& f) {
    MPI_Barrier(world);
    const auto t0 = clock_type::now();
    f();
    MPI_Barrier(world);
    return seconds_since(t0);
  };
  auto plain = [&] {
    for (const auto& b : batches)
      if (b.size(0) > 0) c.plain_forward(b);
  };
  auto collect = [&](bool depth) {
    Collector col(c.spec, c.layout().tp_rank(), c.layout().tp_size(), c.device());
    Totals t;
    t.one_minus_cos.assign(size_t(L), 0.0);
    t.skip_loss_sum.assign(size_t(L), 0.0);
    for (const auto& b : batches) collect_batch(c, col, b, depth ? b.size(0) : 0, t);
  };
  plain();  // warm-up (allocator, OpenMP pool)
  collect(false);
  std::vector<double> ratios, plain_s, collect_s;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const double a = timed(plain);
    const double b = timed([&] { collect(false); });
    plain_s.push_back(a);
    collect_s.push_back(b);
    ratios.push_back(a / b);
  }
  const double depth_s = timed([&] { collect(true); });
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  ImportanceBench out;
  out.plain_tokens_per_s = tokens / median(plain_s);
  out.collect_tokens_per_s = tokens / median(collect_s);
  out.depth_tokens_per_s = tokens / depth_s;
  out.ratio = median(ratios);
  out.tp = c.layout().tp_size();
  out.dp = c.layout().dp_size();
  out.dtype = checkpoint::dtype_name(c.dtype());
  return out;
}

}  // namespace ac::search

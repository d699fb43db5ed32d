// Prune time for a 131.7M-parameter Llama-style teacher (bf16) against reading and writing the
// same teacher checkpoint in the same run (issue 14: pruning is bounded by the I/O; goal:
// read+write time / prune time >= 0.5). The student keeps 75% of the hidden width, 2/3 of
// the FFN and half the heads per KV group (every tensor is sliced). Run under mpirun for
// TP x DP: `mpirun -n 2 build/bench/bench_prune DIR [tp]`.
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/communicator.h"
#include "dist/parallel_layout.h"
#include "model/model.h"
#include "search/prune/prune.h"

using namespace ac;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

model::ArchSpec teacher_spec() {
  model::ArchSpec s;
  s.name = "bench-prune-124m";
  s.family = model::ModelFamily::Llama;
  s.hidden_size = 768;
  s.vocab_size = 32000;
  s.dtype = "bfloat16";
  model::LayerSpec l;
  l.attention = model::AttentionSpec{12, 4, 64};
  l.mlp = model::MlpSpec{2304, model::MlpActivation::SwiGLU};
  s.layers.assign(12, l);
  return s;
}

std::vector<double> rnd(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto t = torch::rand({n}, gen, torch::kFloat64).contiguous();
  return {t.data_ptr<double>(), t.data_ptr<double>() + n};
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = argc > 1 ? argv[1] : "/tmp/ac-bench-prune";
  const int tp = argc > 2 ? std::atoi(argv[2]) : world;
  if (rank == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const model::ArchSpec spec = teacher_spec();
  {
    // The teacher: made at TP = world (each rank inits its shard), saved once.
    auto t0 = Clock::now();
    dist::ParallelLayout layout(MPI_COMM_WORLD, {world, 0, 0});
    model::CausalLM m(spec, model::TpGroup{dist::make_mpi_communicator(layout.tp_mpi_comm())},
                      model::ModelOptions{torch::kBFloat16});
    m->init_weights(1);
    checkpoint::save_checkpoint(MPI_COMM_WORLD, dir + "/teacher", 0, checkpoint::model_tensors(m, true),
                                {{checkpoint::kArchSpecAttribute, model::arch_to_json(spec)}});
    if (rank == 0)
      std::printf("teacher: %.1f M params, bf16, made and saved in %.1f s\n", double(model::count_params(spec).total()) / 1e6,
                  since(t0));
  }
  const std::string tpath = checkpoint::resolve_latest(dir + "/teacher");
  const double file_mb = double(fs::file_size(tpath)) / 1e6;

  model::ArchSpec student = spec;
  student.hidden_size = 576;
  for (auto& l : student.layers) {
    l.attention->num_heads = 8;
    l.mlp->ffn_size = 1536;
  }
  search::ImportanceScores scores;
  scores.hidden = rnd(spec.hidden_size, 1);
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    search::LayerImportance li;
    li.attn_heads = rnd(12, 10 + i);
    li.attn_kv_groups = rnd(4, 30 + i);
    li.mlp_neurons = rnd(2304, 50 + i);
    scores.layers.push_back(li);
  }

  const int repeats = 3;
  double best_rw = 1e30, best_prune = 1e30, best_read = 1e30, best_io = 1e30;
  for (int r = 0; r < repeats; ++r) {
    // Baseline: read every dataset (this rank's TP share of rows) and write it back as a checkpoint.
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    {
      checkpoint::CheckpointReader reader(tpath);
      std::vector<checkpoint::ShardedTensor> ts;
      for (const auto& d : reader.datasets()) {
        const int64_t rows = d.shape[0], per = (rows + world - 1) / world;
        const int64_t start = std::min(rows, per * rank), n = std::min(per, rows - start);
        std::vector<int64_t> off(d.shape.size(), 0), cnt = d.shape;
        off[0] = start;
        cnt[0] = n;
        checkpoint::ShardedTensor s{d.name, d.shape, off, n > 0 ? reader.read(d.name, off, cnt) : torch::empty({0}), n > 0};
        if (n == 0) {
          std::vector<int64_t> z = d.shape;
          z[0] = 0;
          s.local = torch::empty(z, torch::kBFloat16);
        }
        ts.push_back(std::move(s));
      }
      const double rd = since(t0);
      checkpoint::SaveOptions so;
      so.keep_last = 1;
      checkpoint::save_checkpoint(MPI_COMM_WORLD, dir + "/copy", r, ts,
                                  {{checkpoint::kArchSpecAttribute, reader.attributes().at(checkpoint::kArchSpecAttribute)}},
                                  nullptr, so);
      best_read = std::min(best_read, rd);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    best_rw = std::min(best_rw, since(t0));
    fs::path out = fs::path(dir) / ("student" + std::to_string(r));
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = Clock::now();
    search::PruneOptions po;
    po.tp = tp;
    const auto res = search::prune_checkpoint(MPI_COMM_WORLD, dir + "/teacher", scores, student, out.string(), po);
    MPI_Barrier(MPI_COMM_WORLD);
    const double pt = since(t0);
    best_prune = std::min(best_prune, pt);
    best_io = std::min(best_io, pt - res.build_s);
    if (rank == 0)
      std::printf("repeat %d: read+write %.2f s; prune %.2f s (plan %.2f, build student %.2f, read+slice %.2f, write %.2f; "
                  "student %.1f MB)\n", r, best_rw, pt, res.plan_s, res.build_s, res.load_s, res.save_s, double(res.bytes) / 1e6);
    if (rank == 0) fs::remove_all(out);
  }
  if (rank == 0)
    std::printf("teacher file %.0f MB, world %d, prune at TP %d: best read+write %.2f s (read %.2f s), best prune %.2f s, "
                "ratio read+write / prune = %.2f (goal >= 0.5); without the student's random init in its constructor %.2f s, "
                "ratio %.2f\n",
                file_mb, world, tp, best_rw, best_read, best_prune, best_rw / best_prune, best_io, best_rw / best_io);
  MPI_Finalize();
  return 0;
}

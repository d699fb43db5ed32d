// Test program: saves checkpoints of a sharded state, step after step.
//   ac_checkpoint_probe DIR MIB STEPS [FIRST_STEP]
// Each rank owns MIB/world MiB of rows of "model/w" (f32) and a bf16 copy; "model/bias" is
// replicated and written by rank 0 only. Values encode the step, so a reader can tell
// which step a file holds. STEPS < 0: loop until killed. Prints "committed N" after each.
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "dist/error.h"
#include "dist/runtime.h"

int main(int argc, char** argv) {
  ac::dist::Runtime rt(&argc, &argv);
  return rt.run_guarded([&]() -> int {
    if (argc < 4) throw ac::InputError("usage: ac_checkpoint_probe DIR MIB STEPS [FIRST_STEP]");
    const std::string dir = argv[1];
    const double mib = std::stod(argv[2]);
    const long steps = std::stol(argv[3]);
    const long first = argc > 4 ? std::stol(argv[4]) : 1;
    const int64_t cols = 1024;
    const int64_t rows_per_rank = std::max<int64_t>(1, int64_t(mib * (1 << 20) / 4 / cols / rt.world_size()));
    const int64_t rows = rows_per_rank * rt.world_size();
    std::fprintf(stderr, "probe rank %d pid %d\n", rt.world_rank(), int(getpid()));
    for (long step = first; steps < 0 || step < first + steps; ++step) {
      torch::Tensor w = torch::arange(rows_per_rank * cols, torch::kFloat).view({rows_per_rank, cols}) +
                        float(step * 1000 + rt.world_rank());
      std::vector<ac::checkpoint::ShardedTensor> ts;
      ts.push_back({"model/w", {rows, cols}, {rows_per_rank * rt.world_rank(), 0}, w, true});
      ts.push_back({"model/w_bf16", {rows, cols}, {rows_per_rank * rt.world_rank(), 0}, w.to(torch::kBFloat16), true});
      ts.push_back({"model/bias", {cols}, {0}, torch::full({cols}, float(step)), rt.world_rank() == 0});
      ac::checkpoint::save_checkpoint(rt.world(), dir, step, ts, {{"tokens_seen", step * 4096}, {"note", "probe"}},
                                      {{"rank", rt.world_rank()}}, {2, true});
      if (rt.is_root()) {
        std::printf("committed %ld\n", step);
        std::fflush(stdout);
      }
    }
    return 0;
  });
}

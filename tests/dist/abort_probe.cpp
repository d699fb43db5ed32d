// Test program: rank 1 throws (runtime or input error) while every other rank blocks in a
// barrier that rank 1 never reaches. Runtime::run_guarded must end the whole job.
#include <mpi.h>

#include <stdexcept>
#include <string>

#include "dist/error.h"
#include "dist/runtime.h"

int main(int argc, char** argv) {
  ac::dist::Runtime rt(&argc, &argv);
  const std::string kind = argc > 1 ? argv[1] : "runtime";
  return rt.run_guarded([&]() -> int {
    if (rt.world_rank() == 1) {
      if (kind == "input") throw ac::InputError("probe.cfg", "tp", "probe input error on rank 1");
      throw std::runtime_error("probe failure on rank 1");
    }
    MPI_Barrier(rt.world());  // never completes: rank 1 is gone
    return 0;
  });
}

// The calling process's rank and size in MPI_COMM_WORLD, for MPI test suites.
#pragma once

#include <mpi.h>

namespace ac::testing {

struct World {
  int rank = 0, size = 1;
  World() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
};

}  // namespace ac::testing

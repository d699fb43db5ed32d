// MPI singletons without a daemon.
#pragma once

namespace ac::dist {

// Call before MPI_Init (Runtime's constructor and the tests' MPI gtest main do). A process
// started on its own, not by mpirun / srun, is an MPI singleton; Open MPI 4 then forks an
// `orted` daemon for it: ~0.4 s of every such launch (a third of `autocompress env`), spent on
// something that serves only dynamic process management (MPI_Comm_spawn, ports), used
// nowhere here. Sets OMPI_MCA_ess_singleton_isolated=1 unless the environment already has a
// value: a singleton then runs without the daemon. Processes started by a launcher do not use
// the singleton component, so the setting changes nothing for them; other MPI libraries
// ignore the variable.
void prefer_isolated_singleton();

}  // namespace ac::dist

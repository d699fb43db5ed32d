// MPI singletons without a daemon, each in a session directory of its own.
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
//
// Every Open MPI 4 singleton on a host keeps its session files in the same job-family
// directory (`$TMPDIR/ompi.<host>.<uid>/jf.0/`), and the last one to finish removes it: two
// singletons started and finished at the same moment race, and the loser's MPI_Init fails
// ("mkdir .../jf.0/1: No such file or directory"; seen under `ctest -j`). So a singleton whose
// environment names no session base (OMPI_MCA_orte_tmpdir_base) gets one of its own,
// `$TMPDIR/ompi-singleton.<pid>` (TMPDIR defaults to /tmp); a base set by the user is kept,
// one inherited from a parent singleton is replaced.
void prefer_isolated_singleton();

// Call after MPI_Finalize: removes the session base prefer_isolated_singleton() made, if it
// made one (Open MPI has emptied it by then); a no-op otherwise.
void remove_singleton_session_base();

}  // namespace ac::dist

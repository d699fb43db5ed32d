// Test program: prints the Open MPI session base it runs under (OMPI_MCA_orte_tmpdir_base, "-"
// when unset) and whether that directory exists while MPI is up; `--child CMD` runs CMD (a
// second probe, started from this one) before finishing. dist/mpi_singleton.h says why.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "dist/runtime.h"

int main(int argc, char** argv) {
  ac::dist::Runtime rt(&argc, &argv);
  const char* base = std::getenv("OMPI_MCA_orte_tmpdir_base");
  std::printf("rank %d pid %d base %s exists %d\n", rt.world_rank(), static_cast<int>(getpid()), base ? base : "-",
              base && std::filesystem::is_directory(base) ? 1 : 0);
  std::fflush(stdout);
  if (argc > 2 && std::string(argv[1]) == "--child") return std::system(argv[2]) == 0 ? 0 : 1;
  return 0;
}

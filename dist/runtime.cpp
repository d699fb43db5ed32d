// MPI runtime: init, rank discovery, guarded execution and job-wide abort.
#include "dist/runtime.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <system_error>

#include "dist/device.h"
#include "dist/error.h"
#include "dist/mpi_singleton.h"

namespace ac::dist {
namespace {

// Launchers publish the node-local rank in the environment; MPI's shared-memory split is the
// portable fallback (and gives the local size, which launchers do not always publish).
bool local_rank_from_env(int* rank, std::string* source) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                           "MV2_COMM_WORLD_LOCAL_RANK"}) {
    if (const char* v = std::getenv(name)) {
      char* end = nullptr;
      long r = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && r >= 0) {
        *rank = static_cast<int>(r);
        *source = name;
        return true;
      }
    }
  }
  return false;
}

// Set by a process started by mpirun / srun / Hydra (Open MPI's own, PMIx's, PMI's names).
bool started_by_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(name)) return true;
  return false;
}

// The session base this process made for itself (empty when it made none), and the variable
// that tells a child which base its parent made.
std::string& own_session_base() {
  static std::string base;
  return base;
}
constexpr const char* kSessionBaseVar = "OMPI_MCA_orte_tmpdir_base";
constexpr const char* kMadeBaseVar = "AC_SINGLETON_SESSION_BASE";

}  // namespace

void prefer_isolated_singleton() {
  setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
  if (started_by_launcher()) return;
  const char* set = std::getenv(kSessionBaseVar);
  const char* made = std::getenv(kMadeBaseVar);
  if (set && !(made && std::string(set) == made)) return;  // the user's choice
  const char* tmp = std::getenv("TMPDIR");
  own_session_base() = std::string(tmp && *tmp ? tmp : "/tmp") + "/ompi-singleton." + std::to_string(getpid());
  setenv(kSessionBaseVar, own_session_base().c_str(), 1);
  setenv(kMadeBaseVar, own_session_base().c_str(), 1);
}

void remove_singleton_session_base() {
  if (own_session_base().empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(own_session_base(), ignored);
  own_session_base().clear();
}

Runtime::Runtime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    prefer_isolated_singleton();
    MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &thread_level_);
    owns_mpi_ = true;
  } else {
    MPI_Query_thread(&thread_level_);
  }
  // Errors from MPI calls come back as codes that the communicators turn into exceptions.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  job_size_ = world_size_;

  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node);
  int node_rank = 0;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
  if (!local_rank_from_env(&local_rank_, &local_rank_source_)) {
    local_rank_ = node_rank;
    local_rank_source_ = "MPI_COMM_TYPE_SHARED";
  }
}

Runtime::Runtime(SelfView, const Runtime& job)
    : world_size_(1),
      local_rank_(job.local_rank_),
      local_size_(job.local_size_),
      thread_level_(job.thread_level_),
      world_(MPI_COMM_SELF),
      job_size_(job.job_size_),
      local_rank_source_(job.local_rank_source_) {}

Runtime::~Runtime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) {
    MPI_Finalize();
    remove_singleton_session_base();
  }
}

std::string Runtime::device() const { return choose_device("auto", local_rank_).device; }

void Runtime::abort(int code, const std::string& message) const {
  if (job_size_ > 1) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "[rank %d/%d] autocompress: error: %s\n", rank, job_size_,
                 message.c_str());
  } else {
    std::fprintf(stderr, "autocompress: error: %s\n", message.c_str());
  }
  std::fflush(stderr);
  std::fflush(stdout);
  if (job_size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  if (owns_mpi_) {
    MPI_Finalize();
    remove_singleton_session_base();
  }
  std::exit(code);
}

int Runtime::run_guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const InputError& e) {
    abort(kExitUsage, e.what());
  } catch (const std::exception& e) {
    abort(kExitRuntime, e.what());
  } catch (...) {
    abort(kExitRuntime, "unknown exception");
  }
}

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, static_cast<size_t>(len));
  auto nl = s.find_first_of("\n,");
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace ac::dist

// MPI runtime: init, rank discovery, guarded execution and job-wide abort.
#include "dist/runtime.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

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

}  // namespace

void prefer_isolated_singleton() { setenv("OMPI_MCA_ess_singleton_isolated", "1", 0); }

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
  if (owns_mpi_ && !finalized) MPI_Finalize();
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
  if (owns_mpi_) MPI_Finalize();
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

// The MPI runtime of one autocompress process: init/finalize, world and local ranks, the
// device this rank uses, and the rule that an error on any rank stops the whole job.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

namespace ac::dist {

class Runtime {
 public:
  // Initializes MPI (MPI_THREAD_SERIALIZED: collectives may come from autograd's threads,
  // never from two at once). Safe when MPI is already initialized (then it does not finalize).
  Runtime(int* argc, char*** argv);
  // This process on its own, inside a job that already runs (MPI_COMM_SELF as its world: size
  // 1, rank 0; the same local rank and device). For the one-process steps of a multi-rank job
  // (`autocompress run`'s scorecard). It neither initializes nor finalizes MPI, and abort()
  // still stops the whole job.
  struct SelfView {};
  Runtime(SelfView, const Runtime& job);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  MPI_Comm world() const { return world_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }    // rank among the processes on this node
  int local_size() const { return local_size_; }
  const std::string& local_rank_source() const { return local_rank_source_; }
  int thread_level() const { return thread_level_; }  // MPI_THREAD_* provided
  bool is_root() const { return world_rank_ == 0; }

  // What `--device auto` resolves to for this rank (dist::choose_device): "cuda:<local rank>"
  // when this build has CUDA and the node a GPU for this local rank, else "cpu".
  std::string device() const;

  // Runs `body`. An exception ends the job: the message goes to stderr with the rank, and
  // with more than one rank MPI_Abort stops every rank (nothing waits forever in a
  // collective). ac::InputError exits 2, anything else 1. Returns body's exit code.
  int run_guarded(const std::function<int()>& body);

  // Prints the message and stops every rank with `code`.
  [[noreturn]] void abort(int code, const std::string& message) const;

 private:
  int world_rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1;
  int thread_level_ = 0;
  bool owns_mpi_ = false;
  MPI_Comm world_ = MPI_COMM_WORLD;
  int job_size_ = 1;  // MPI_COMM_WORLD's size, which abort() stops
  std::string local_rank_source_;
};

// The MPI library's own version string (MPI_Get_library_version), first line.
std::string mpi_library_version();

}  // namespace ac::dist

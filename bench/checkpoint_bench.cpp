// Checkpoint benchmark (see checkpoint_bench.h). Per repeat: (1) each rank writes its share
// with plain write() in 64 MiB blocks to its own file and fsyncs (the disk's sequential
// write bandwidth with this many writers); (2) save_checkpoint of the same bytes as
// bf16/f32 tensors sharded over the ranks; then reads of both, after dropping the page
// cache when allowed. Throughput = total bytes / slowest rank's time.
#include "bench/checkpoint_bench.h"

#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iomanip>

#include "checkpoint/checkpoint.h"

namespace fs = std::filesystem;

namespace ac::bench {
namespace {

double timed(MPI_Comm comm, const std::function<void()>& f) {
  MPI_Barrier(comm);
  const double t0 = MPI_Wtime();
  f();
  double dt = MPI_Wtime() - t0, worst = 0;
  MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, comm);
  return worst;
}

bool drop_page_cache(MPI_Comm comm, bool enabled) {
  int rank = 0, ok = 0;
  MPI_Comm_rank(comm, &rank);
  if (enabled && rank == 0) {
    ::sync();
    std::ofstream f("/proc/sys/vm/drop_caches");
    f << "3\n";
    f.flush();
    ok = f.good() ? 1 : 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
  MPI_Barrier(comm);
  return ok == 1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::string run_checkpoint_bench(MPI_Comm comm, const CheckpointBenchOptions& opt) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (rank == 0) fs::create_directories(opt.dir);
  MPI_Barrier(comm);

  // The state: tensors of ~tensor_bytes, rows split over ranks, alternating f32 and bf16.
  const int64_t cols = 4096;
  std::vector<checkpoint::ShardedTensor> state;
  int64_t my_bytes = 0;
  for (int64_t done = 0, i = 0; done < opt.total_bytes; ++i) {
    const auto dt = (i % 2 == 0) ? torch::kBFloat16 : torch::kFloat;
    const int64_t esize = dt == torch::kFloat ? 4 : 2;
    const int64_t rows = std::max<int64_t>(size, opt.tensor_bytes / esize / cols / size * size);
    const int64_t mine = rows / size;
    torch::Tensor local = torch::rand({mine, cols}).to(dt);
    state.push_back({"model/t" + std::to_string(i), {rows, cols}, {mine * rank, 0}, local, true});
    done += rows * cols * esize;
    my_bytes += mine * cols * esize;
  }
  int64_t total = 0;
  MPI_Allreduce(&my_bytes, &total, 1, MPI_INT64_T, MPI_SUM, comm);

  const fs::path raw = fs::path(opt.dir) / ("raw_rank" + std::to_string(rank) + ".bin");
  const std::string ckdir = (fs::path(opt.dir) / "ckpt").string();
  std::vector<double> w_raw, w_ck, r_raw, r_ck;
  bool dropped = true;
  for (int rep = 0; rep < opt.repeats; ++rep) {
    // Like a checkpoint (a new file per step), the baseline writes a new file each time:
    // rewriting one in place skips the block allocation and ran up to 2.5x faster here.
    fs::remove(raw);
    MPI_Barrier(comm);
    w_raw.push_back(timed(comm, [&] {
      int fd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (const auto& t : state) {
        const char* p = static_cast<const char*>(t.local.data_ptr());
        int64_t left = t.local.numel() * t.local.element_size();
        while (left > 0) {
          const ssize_t n = ::write(fd, p, static_cast<size_t>(std::min<int64_t>(left, int64_t(64) << 20)));
          if (n <= 0) throw std::runtime_error(raw.string() + ": write failed");
          p += n;
          left -= n;
        }
      }
      ::fsync(fd);
      ::close(fd);
    }));
    std::string path;
    w_ck.push_back(timed(comm, [&] {
      checkpoint::SaveOptions so;
      so.keep_last = 1;
      path = checkpoint::save_checkpoint(comm, ckdir, rep + 1, state, {{"bench", "checkpoint"}}, nullptr, so);
    }));
    dropped = drop_page_cache(comm, opt.drop_caches) && dropped;
    r_raw.push_back(timed(comm, [&] {
      int fd = ::open(raw.c_str(), O_RDONLY);
      std::vector<char> buf(size_t(64) << 20);
      while (::read(fd, buf.data(), buf.size()) > 0) {
      }
      ::close(fd);
    }));
    dropped = drop_page_cache(comm, opt.drop_caches) && dropped;
    r_ck.push_back(timed(comm, [&] {
      checkpoint::CheckpointReader reader(path);
      for (auto& t : state) {
        torch::Tensor back = reader.read(t.name, t.offset, t.local.sizes().vec());
        if (back.numel() != t.local.numel()) throw std::runtime_error("bench: short read");
      }
    }));
  }
  fs::remove(raw);
  std::ostringstream os;
  const double gb = double(total) / 1e9;
  auto row = [&](const char* what, const std::vector<double>& ours, const std::vector<double>& base) {
    os << std::left << std::setw(8) << what << std::right << std::fixed << std::setprecision(3) << std::setw(12)
       << gb / median(ours) << std::setw(14) << gb / median(base) << std::setprecision(2) << std::setw(8)
       << median(base) / median(ours) << "\n";
  };
  os << "checkpoint of " << std::setprecision(2) << std::fixed << gb << " GB (" << state.size() << " tensors, bf16+f32), "
     << size << " rank(s), median of " << opt.repeats << "; GB/s; ratio = checkpoint / plain I/O\n"
     << (dropped ? "page cache dropped before each read\n" : "page cache NOT dropped (not root?): reads may come from memory\n")
     << std::left << std::setw(8) << "" << std::right << std::setw(12) << "checkpoint" << std::setw(14) << "plain I/O"
     << std::setw(8) << "ratio" << "\n";
  row("write", w_ck, w_raw);
  row("read", r_ck, r_raw);
  return rank == 0 ? os.str() : std::string();
}

}  // namespace ac::bench

// Checkpoint benchmark (see checkpoint_bench.h). Each repeat writes the same sharded state
// four ways, in an order that reverses between repeats (plain, checkpoint, plain
// write-behind, safetensors; then the other way round):
//  - plain: each rank write()s its bytes in 64 MiB blocks to a new file of its own, fsyncs,
//    and deletes its previous file (the disk's sequential write bandwidth with this many
//    writers, doing the same file-system work as a checkpoint that keeps the last one);
//  - plain write-behind: the same, but in blocks of --write-behind bytes, each block's
//    write-back started right after its write() and the previous block waited for and
//    dropped from the page cache (what save_checkpoint does, SaveOptions::write_behind_bytes);
//  - checkpoint: save_checkpoint (checksums, fsync, rename, `latest`, keep_last = 1, so it
//    also deletes its predecessor);
//  - safetensors: each rank writes its slices with model::write_safetensors_file to a new
//    file, fsyncs it and deletes its previous one.
// Then reads of the plain file and of the checkpoint, page cache dropped before each (root),
// in alternating order. Time = slowest rank; throughput = total bytes / time. The disk of a
// shared VM swings by 2-3x between runs, so every ratio is the median over repeats of the
// ratio of the two runs of one repeat (adjacent in time), not a ratio of medians.
#include "bench/checkpoint_bench.h"

#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "model/safetensors.h"

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
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return in ? a + " " + b + " " + c : "unknown";
}

void fsync_file(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) throw std::runtime_error(p.string() + ": fsync failed");
  ::close(fd);
}

// Rank-0 phase times of the plain write (seconds).
struct PlainPhases {
  double write = 0, fsync = 0, unlink = 0;
};

// Writes `state`'s local bytes to a new file `p` in 64 MiB write() calls and fsyncs it,
// then deletes `previous` (if not empty). With write_behind > 0, in blocks of that size,
// each block's write-back started after its write() and the block before waited for and
// dropped from the page cache.
PlainPhases plain_write(const std::vector<checkpoint::ShardedTensor>& state, const fs::path& p,
                        const fs::path& previous, int64_t write_behind) {
  PlainPhases ph;
  double t = MPI_Wtime();
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(p.string() + ": cannot create");
  int64_t at = 0, prev_at = -1, prev_n = 0;
  for (const auto& s : state) {
    const char* q = static_cast<const char*>(s.local.data_ptr());
    int64_t left = s.local.numel() * s.local.element_size();
    while (left > 0) {
      const int64_t block = write_behind > 0 ? write_behind : int64_t(64) << 20;
      const ssize_t n = ::write(fd, q, static_cast<size_t>(std::min<int64_t>(left, block)));
      if (n <= 0) throw std::runtime_error(p.string() + ": write failed");
      if (write_behind > 0) {
        ::sync_file_range(fd, at, n, SYNC_FILE_RANGE_WRITE);
        if (prev_at >= 0) {
          ::sync_file_range(fd, prev_at, prev_n,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
          ::posix_fadvise(fd, prev_at, prev_n, POSIX_FADV_DONTNEED);
        }
        prev_at = at;
        prev_n = n;
      }
      at += n;
      q += n;
      left -= n;
    }
  }
  ph.write = MPI_Wtime() - t;
  t = MPI_Wtime();
  if (::fsync(fd) != 0) throw std::runtime_error(p.string() + ": fsync failed");
  ::close(fd);
  ph.fsync = MPI_Wtime() - t;
  t = MPI_Wtime();
  if (!previous.empty()) fs::remove(previous);
  ph.unlink = MPI_Wtime() - t;
  return ph;
}

// The state: tensors of ~tensor_bytes, rows split over ranks, alternating f32 and bf16; the
// same slices by name for safetensors.
struct BenchState {
  std::vector<checkpoint::ShardedTensor> state;
  std::vector<std::pair<std::string, torch::Tensor>> named;
  int64_t total = 0;  // bytes over all ranks
};

BenchState make_state(MPI_Comm comm, const CheckpointBenchOptions& opt, int rank, int size) {
  const int64_t cols = 4096;
  BenchState b;
  int64_t my_bytes = 0;
  for (int64_t done = 0, i = 0; done < opt.total_bytes; ++i) {
    const auto dt = (i % 2 == 0) ? torch::kBFloat16 : torch::kFloat;
    const int64_t esize = dt == torch::kFloat ? 4 : 2;
    const int64_t rows = std::max<int64_t>(size, opt.tensor_bytes / esize / cols / size * size);
    const int64_t mine = rows / size;
    torch::Tensor local = torch::rand({mine, cols}).to(dt);
    b.state.push_back({"model/t" + std::to_string(i), {rows, cols}, {mine * rank, 0}, local, true});
    b.named.emplace_back(b.state.back().name, local);
    done += rows * cols * esize;
    my_bytes += mine * cols * esize;
  }
  MPI_Allreduce(&my_bytes, &b.total, 1, MPI_INT64_T, MPI_SUM, comm);
  return b;
}

// This rank's files of repeat `rep` in the scratch directory.
struct BenchPaths {
  std::string dir, tag;
  fs::path plain(int rep) const { return fs::path(dir) / ("plain_" + tag + "_" + std::to_string(rep) + ".bin"); }
  fs::path wb(int rep) const { return fs::path(dir) / ("plainwb_" + tag + "_" + std::to_string(rep) + ".bin"); }
  fs::path st(int rep) const { return fs::path(dir) / ("st_" + tag + "_" + std::to_string(rep) + ".safetensors"); }
  std::string ckdir() const { return (fs::path(dir) / "ckpt").string(); }
};

// Leftovers of an earlier (interrupted) run would change what the deletes cost.
void remove_leftovers(MPI_Comm comm, const std::string& dir, int rank) {
  if (rank == 0) {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string f = e.path().filename().string();
      if (f.rfind("plain", 0) == 0 || f.rfind("st_", 0) == 0 || f == "ckpt") fs::remove_all(e.path());
    }
  }
  MPI_Barrier(comm);
}

// Seconds per repeat of each kind of write and read, and where the writes spent them.
struct Measured {
  std::vector<double> w_plain, w_wb, w_ck, w_st, r_plain, r_ck;
  std::vector<checkpoint::SaveTimings> phases;
  std::vector<PlainPhases> plain_phases, wb_phases;
  bool dropped = true;
  std::string ck_path;
};

// The four writes of repeat `rep`, in alternating order (even repeats forward, odd backward).
void write_round(MPI_Comm comm, const CheckpointBenchOptions& opt, int rep, const BenchState& b, const BenchPaths& paths,
                 Measured& m) {
  auto plain = [&] {
    PlainPhases ph;
    m.w_plain.push_back(timed(comm, [&] { ph = plain_write(b.state, paths.plain(rep), rep ? paths.plain(rep - 1) : "", 0); }));
    m.plain_phases.push_back(ph);
  };
  auto plain_wb = [&] {
    PlainPhases ph;
    m.w_wb.push_back(timed(comm, [&] { ph = plain_write(b.state, paths.wb(rep), rep ? paths.wb(rep - 1) : "", opt.write_behind_bytes); }));
    m.wb_phases.push_back(ph);
  };
  auto ckpt = [&] {
    checkpoint::SaveTimings tm;
    m.w_ck.push_back(timed(comm, [&] {
      checkpoint::SaveOptions so;
      so.keep_last = 1;
      so.write_behind_bytes = opt.write_behind_bytes;
      so.timings = &tm;
      m.ck_path = checkpoint::save_checkpoint(comm, paths.ckdir(), rep + 1, b.state, {{"bench", "checkpoint"}}, nullptr, so);
    }));
    m.phases.push_back(tm);
  };
  auto safetensors = [&] {
    m.w_st.push_back(timed(comm, [&] {
      model::write_safetensors_file(paths.st(rep).string(), b.named);
      fsync_file(paths.st(rep));
      if (rep > 0) fs::remove(paths.st(rep - 1));
    }));
  };
  if (rep % 2 == 0) {
    plain();
    ckpt();
    plain_wb();
    safetensors();
  } else {
    safetensors();
    plain_wb();
    ckpt();
    plain();
  }
}

// The two reads of repeat `rep` (the plain file, the checkpoint), page cache dropped before each.
void read_round(MPI_Comm comm, const CheckpointBenchOptions& opt, int rep, const BenchState& b, const BenchPaths& paths,
                Measured& m) {
  auto read_plain = [&] {
    m.dropped = drop_page_cache(comm, opt.drop_caches) && m.dropped;
    m.r_plain.push_back(timed(comm, [&] {
      const int fd = ::open(paths.plain(rep).c_str(), O_RDONLY);
      std::vector<char> buf(size_t(64) << 20);
      while (::read(fd, buf.data(), buf.size()) > 0) {
      }
      ::close(fd);
    }));
  };
  auto read_ckpt = [&] {
    m.dropped = drop_page_cache(comm, opt.drop_caches) && m.dropped;
    m.r_ck.push_back(timed(comm, [&] {
      checkpoint::CheckpointReader reader(m.ck_path);
      for (auto& t : b.state) {
        torch::Tensor back = reader.read(t.name, t.offset, t.local.sizes().vec());
        if (back.numel() != t.local.numel()) throw std::runtime_error("bench: short read");
      }
    }));
  };
  if (rep % 2 == 0) {
    read_plain();
    read_ckpt();
  } else {
    read_ckpt();
    read_plain();
  }
}

// Per-repeat ratios (ours / baseline as throughput = baseline time / our time).
std::vector<double> ratios(const std::vector<double>& ours, const std::vector<double>& base) {
  std::vector<double> r;
  for (size_t i = 0; i < ours.size(); ++i) r.push_back(base[i] / ours[i]);
  return r;
}

std::string list_text(const std::vector<double>& v) {
  std::ostringstream l;
  l << std::fixed << std::setprecision(2);
  for (double x : v) l << " " << x;
  return l.str();
}

// Throughputs and ratios of the writes and reads.
void report_throughput(std::ostringstream& os, const CheckpointBenchOptions& opt, const BenchState& b, int size,
                       const Measured& m, const std::string& load_before, const std::string& load_after) {
  const auto wr = ratios(m.w_ck, m.w_plain), wb = ratios(m.w_ck, m.w_wb), ws = ratios(m.w_ck, m.w_st),
             rr = ratios(m.r_ck, m.r_plain);
  const double gb = double(b.total) / 1e9;
  auto gbs = [&](const std::vector<double>& t) { return gb / median(t); };
  os << "checkpoint of " << std::setprecision(2) << gb << " GB (" << b.state.size() << " tensors, bf16+f32), " << size
     << " rank(s), " << opt.repeats << " repeats, write-behind " << (opt.write_behind_bytes >> 20)
     << " MiB; load average before: " << load_before << ", after: " << load_after
     << "\n"
     << (m.dropped ? "page cache dropped before each read\n"
                   : "page cache NOT dropped (not root?): reads may come from memory\n")
     << "GB/s = median over repeats; ratio = median over repeats of (checkpoint / other) in the same repeat\n"
     << std::setprecision(3) << "write: checkpoint " << gbs(m.w_ck) << ", plain " << gbs(m.w_plain)
     << ", plain write-behind " << gbs(m.w_wb) << ", safetensors " << gbs(m.w_st) << "\n"
     << "  ratio to plain " << std::setprecision(2) << median(wr) << " (per repeat:" << list_text(wr) << ")\n"
     << "  ratio to plain write-behind " << median(wb) << " (per repeat:" << list_text(wb) << ")\n"
     << "  ratio to safetensors " << median(ws) << " (per repeat:" << list_text(ws) << ")\n"
     << std::setprecision(3) << "read: checkpoint " << gbs(m.r_ck) << ", plain " << gbs(m.r_plain) << "\n"
     << "  ratio to plain " << std::setprecision(2) << median(rr) << " (per repeat:" << list_text(rr) << ")\n";
}

// Where the checkpoint save and the plain writes spent their time (rank 0, medians).
void report_phases(std::ostringstream& os, const Measured& m) {
  auto med = [&](auto field) {
    std::vector<double> v;
    for (const auto& p : m.phases) v.push_back(field(p));
    return median(v);
  };
  auto pmed = [&](auto field, const std::vector<PlainPhases>& from) {
    std::vector<double> v;
    for (const auto& p : from) v.push_back(field(p));
    return median(v);
  };
  auto plain_line = [&](const char* what, const std::vector<PlainPhases>& from) {
    os << what << " write phases, rank 0, median s: write " << pmed([](const PlainPhases& p) { return p.write; }, from)
       << ", fsync " << pmed([](const PlainPhases& p) { return p.fsync; }, from) << ", unlink "
       << pmed([](const PlainPhases& p) { return p.unlink; }, from) << "\n";
  };
  using T = checkpoint::SaveTimings;
  os << std::setprecision(3) << "checkpoint save phases, rank 0, median s: plan " << med([](const T& p) { return p.plan; })
     << ", create " << med([](const T& p) { return p.create; }) << ", crc " << med([](const T& p) { return p.crc; })
     << ", H5Dwrite " << med([](const T& p) { return p.write; }) << ", close "
     << med([](const T& p) { return p.close; }) << ", fsync " << med([](const T& p) { return p.fsync; })
     << ", commit " << med([](const T& p) { return p.commit; }) << ", retention "
     << med([](const T& p) { return p.retention; }) << "\n";
  plain_line("plain", m.plain_phases);
  plain_line("plain write-behind", m.wb_phases);
}

}  // namespace

std::string run_checkpoint_bench(MPI_Comm comm, const CheckpointBenchOptions& opt) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::string load_before = load_average();
  if (rank == 0) fs::create_directories(opt.dir);
  MPI_Barrier(comm);

  const BenchState b = make_state(comm, opt, rank, size);
  const BenchPaths paths{opt.dir, "rank" + std::to_string(rank)};
  remove_leftovers(comm, opt.dir, rank);
  Measured m;
  for (int rep = 0; rep < opt.repeats; ++rep) {
    write_round(comm, opt, rep, b, paths, m);
    read_round(comm, opt, rep, b, paths, m);
  }
  MPI_Barrier(comm);
  if (rank == 0) fs::remove_all(paths.ckdir());
  fs::remove(paths.plain(opt.repeats - 1));
  fs::remove(paths.wb(opt.repeats - 1));
  fs::remove(paths.st(opt.repeats - 1));
  const std::string load_after = load_average();

  std::ostringstream os;
  os << std::fixed;
  report_throughput(os, opt, b, size, m, load_before, load_after);
  report_phases(os, m);
  return rank == 0 ? os.str() : std::string();
}

}  // namespace ac::bench

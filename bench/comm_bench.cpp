// Communicator benchmark (see comm_bench.h). The two implementations alternate on the same
// buffers (ours, raw, ours, raw, ...) so that machine noise hits both alike; bus bandwidth
// follows nccl-tests: all_reduce bytes * 2(n-1)/n / t, all_gather bytes * (n-1)/n / t.
#include "bench/comm_bench.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "dist/communicator.h"

namespace ac::bench {
namespace {

// The hand-written baseline for bf16 sums: a user-defined MPI op over 16-bit words that
// adds in fp32 and rounds back per hop (what one writes without a fp32 staging buffer).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    uint32_t x = uint32_t(a[i]) << 16, y = uint32_t(b[i]) << 16;
    float fx, fy;
    std::memcpy(&fx, &x, 4);
    std::memcpy(&fy, &y, 4);
    float s = fx + fy;
    uint32_t u;
    std::memcpy(&u, &s, 4);
    u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
    b[i] = static_cast<uint16_t>(u >> 16);
  }
}

double upper_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

nlohmann::json CommBenchRow::to_json() const {
  return {{"op", op}, {"dtype", dtype}, {"bytes", bytes}, {"ours_busbw_GBps", ours_busbw},
          {"mpi_busbw_GBps", mpi_busbw}, {"ratio", ratio()}};
}

std::vector<CommBenchRow> run_comm_bench(MPI_Comm comm, const CommBenchOptions& opt) {
  int n = 1, rank = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &rank);
  auto ours = dist::make_mpi_communicator(comm);
  MPI_Datatype u16;
  MPI_Type_contiguous(2, MPI_BYTE, &u16);
  MPI_Type_commit(&u16);
  MPI_Op bf16_op;
  MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_op);

  std::vector<CommBenchRow> rows;
  for (const std::string& op : opt.ops) {
    for (const std::string& dt : opt.dtypes) {
      const auto dtype = dt == "bf16" ? at::kBFloat16 : at::kFloat;
      const int64_t esize = dt == "bf16" ? 2 : 4;
      for (int64_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= 2) {
        const int64_t numel = bytes / esize;
        const bool gather = op == "all_gather";
        at::Tensor buf = at::ones({gather ? numel : numel}, at::TensorOptions().dtype(dtype));
        at::Tensor shard = at::ones({numel / n}, at::TensorOptions().dtype(dtype));
        auto run_ours = [&] {
          if (gather) ours->all_gather(buf, shard);
          else ours->all_reduce(buf, dist::ReduceOp::Sum);
        };
        auto run_mpi = [&] {
          if (gather) {
            MPI_Allgather(shard.data_ptr(), static_cast<int>(shard.numel() * esize), MPI_BYTE, buf.data_ptr(),
                          static_cast<int>(shard.numel() * esize), MPI_BYTE, comm);
          } else if (dtype == at::kFloat) {
            MPI_Allreduce(MPI_IN_PLACE, buf.data_ptr(), static_cast<int>(numel), MPI_FLOAT, MPI_SUM, comm);
          } else {
            MPI_Allreduce(MPI_IN_PLACE, buf.data_ptr(), static_cast<int>(numel), u16, bf16_op, comm);
          }
        };
        auto timed = [&](auto&& f) {
          MPI_Barrier(comm);
          const double t0 = MPI_Wtime();
          f();
          double dt_local = MPI_Wtime() - t0, dt_max = 0;
          MPI_Allreduce(&dt_local, &dt_max, 1, MPI_DOUBLE, MPI_MAX, comm);  // the slowest rank's time
          return dt_max;
        };
        timed(run_ours);  // warm-up: first-touch pages, MPI connections
        timed(run_mpi);
        std::vector<double> t_ours, t_mpi;
        double spent = 0;
        int go = 1;
        while (go) {
          t_ours.push_back(timed(run_ours));
          t_mpi.push_back(timed(run_mpi));
          spent += t_ours.back() + t_mpi.back();
          go = (int(t_ours.size()) < opt.min_iters || spent < 2 * opt.seconds_per_point) ? 1 : 0;
          MPI_Bcast(&go, 1, MPI_INT, 0, comm);
        }
        const double factor = gather ? double(n - 1) / n : 2.0 * (n - 1) / n;
        const double moved = double(numel * esize) * (n > 1 ? factor : 1.0);
        CommBenchRow r{op, dt, numel * esize, moved / upper_median(t_ours) / 1e9, moved / upper_median(t_mpi) / 1e9};
        rows.push_back(r);
      }
    }
  }
  MPI_Op_free(&bf16_op);
  MPI_Type_free(&u16);
  return rows;
}

std::string format_comm_table(const std::vector<CommBenchRow>& rows, int world_size) {
  std::ostringstream os;
  os << "bus bandwidth, " << world_size << " ranks (median; GB/s); ratio = ours / raw MPI\n";
  os << std::left << std::setw(11) << "op" << std::setw(6) << "dtype" << std::right << std::setw(10) << "size"
     << std::setw(12) << "ours" << std::setw(12) << "raw MPI" << std::setw(8) << "ratio" << "\n";
  for (const auto& r : rows) {
    std::ostringstream size;
    if (r.bytes >= (int64_t(1) << 20)) size << (r.bytes >> 20) << " MiB";
    else size << (r.bytes >> 10) << " KiB";
    os << std::left << std::setw(11) << r.op << std::setw(6) << r.dtype << std::right << std::setw(10) << size.str()
       << std::fixed << std::setprecision(3) << std::setw(12) << r.ours_busbw << std::setw(12) << r.mpi_busbw
       << std::setprecision(2) << std::setw(8) << r.ratio() << "\n";
  }
  // One number per (op, dtype): the geometric mean of the ratios over sizes.
  std::vector<std::pair<std::string, std::pair<double, int>>> means;
  for (const auto& r : rows) {
    const std::string key = r.op + " " + r.dtype;
    auto it = std::find_if(means.begin(), means.end(), [&](const auto& m) { return m.first == key; });
    if (it == means.end()) it = means.insert(means.end(), {key, {0.0, 0}});
    it->second.first += std::log(std::max(r.ratio(), 1e-9));
    it->second.second += 1;
  }
  for (const auto& [key, acc] : means)
    os << "geomean ratio " << key << ": " << std::setprecision(2) << std::exp(acc.first / acc.second) << "\n";
  return os.str();
}

}  // namespace ac::bench

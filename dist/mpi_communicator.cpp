// MpiCommunicator: collectives on CPU tensors through MPI. Float/int tensors go straight to
// MPI on their own memory; bf16/f16 sums and maxima are computed in fp32 (MPI has no 16-bit
// float type, and summing in 16 bits per hop loses precision), which doubles the bytes.
#include <ATen/ATen.h>

#include <climits>
#include <stdexcept>

#include "autocompress/build_info.h"
#include "dist/communicator.h"
#include "dist/error.h"

namespace ac::dist {
namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBool: return MPI_C_BOOL;
    default: return MPI_DATATYPE_NULL;
  }
}

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

// Elements per MPI call: counts are int.
constexpr int64_t kMaxCount = int64_t(1) << 30;

void check_cpu(const at::Tensor& t, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + ": undefined tensor");
  if (!t.device().is_cpu())
    throw std::invalid_argument(std::string(what) + ": the MPI communicator takes CPU tensors, got " +
                                t.device().str() + " (use the NCCL backend for CUDA tensors)");
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) {
    check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    check_cpu(t, "all_reduce");
    if (is_half(t.scalar_type())) {
      at::Tensor f = t.to(at::kFloat);
      all_reduce_native(f, op);
      t.copy_(f);
      return;
    }
    at::Tensor c = t.contiguous();
    all_reduce_native(c, op);
    if (!c.is_same(t)) t.copy_(c);
  }

  void all_gather(at::Tensor& out, const at::Tensor& in) override {
    check_cpu(in, "all_gather");
    check_cpu(out, "all_gather");
    check_blocks(out, in, "all_gather", "out", "in");
    at::Tensor src = in.contiguous();
    at::Tensor dst = out.is_contiguous() ? out : out.contiguous();
    const int64_t bytes = src.numel() * src.element_size();
    // Gather bytes in a block type so that large shards do not overflow the int count.
    MPI_Datatype block = byte_block_type(bytes);
    check_mpi(MPI_Allgather(src.data_ptr(), bytes == 0 ? 0 : 1, block, dst.data_ptr(), bytes == 0 ? 0 : 1,
                            block, comm_),
              "MPI_Allgather");
    MPI_Type_free(&block);
    if (!dst.is_same(out)) out.copy_(dst);
  }

  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    check_cpu(in, "reduce_scatter");
    check_cpu(out, "reduce_scatter");
    check_blocks(in, out, "reduce_scatter", "in", "out");
    const bool half = is_half(in.scalar_type());
    at::Tensor src = half ? in.to(at::kFloat) : in.contiguous();
    at::Tensor dst = half ? at::empty(out.sizes(), out.options().dtype(at::kFloat))
                          : (out.is_contiguous() ? out : out.contiguous());
    MPI_Datatype type = mpi_type(src.scalar_type());
    if (type == MPI_DATATYPE_NULL) throw std::invalid_argument("reduce_scatter: unsupported dtype");
    if (dst.numel() > kMaxCount) throw std::invalid_argument("reduce_scatter: block larger than 2^30 elements");
    check_mpi(MPI_Reduce_scatter_block(src.data_ptr(), dst.data_ptr(), static_cast<int>(dst.numel()), type,
                                       mpi_op(op), comm_),
              "MPI_Reduce_scatter_block");
    if (op == ReduceOp::Avg) divide(dst);
    if (!dst.is_same(out)) out.copy_(dst);
  }

  void broadcast(at::Tensor& t, int root) override {
    check_cpu(t, "broadcast");
    at::Tensor c = t.contiguous();
    const int64_t bytes = c.numel() * c.element_size();
    auto* p = static_cast<char*>(c.data_ptr());
    for (int64_t off = 0; off < bytes; off += kMaxCount)
      check_mpi(MPI_Bcast(p + off, static_cast<int>(std::min(kMaxCount, bytes - off)), MPI_BYTE, root, comm_),
                "MPI_Bcast");
    if (!c.is_same(t)) t.copy_(c);
  }

  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

  void all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& recv_counts,
                  const std::vector<int64_t>& send_counts) override {
    check_cpu(in, "all_to_all");
    check_cpu(out, "all_to_all");
    const int64_t row_bytes = check_all_to_all(out, in, recv_counts, send_counts, size_);
    at::Tensor src = in.contiguous();
    at::Tensor dst = out.is_contiguous() ? out : out.contiguous();
    // Counts and displacements in rows of one derived type: int counts reach 2^31 rows.
    const size_t n = static_cast<size_t>(size_);
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    int64_t so = 0, ro = 0;
    for (size_t r = 0; r < n; ++r) {
      if (so + send_counts[r] > INT_MAX || ro + recv_counts[r] > INT_MAX)
        throw std::invalid_argument("all_to_all: more than 2^31 rows");
      sc[r] = int(send_counts[r]), sd[r] = int(so), rc[r] = int(recv_counts[r]), rd[r] = int(ro);
      so += send_counts[r], ro += recv_counts[r];
    }
    MPI_Datatype row = byte_block_type(row_bytes);
    const int rc_ = MPI_Alltoallv(src.data_ptr(), sc.data(), sd.data(), row, dst.data_ptr(), rc.data(), rd.data(), row,
                                  comm_);
    MPI_Type_free(&row);
    check_mpi(rc_, "MPI_Alltoallv");
    if (!dst.is_same(out)) out.copy_(dst);
  }

 private:
  void all_reduce_native(at::Tensor& c, ReduceOp op) {
    MPI_Datatype type = mpi_type(c.scalar_type());
    if (type == MPI_DATATYPE_NULL)
      throw std::invalid_argument(std::string("all_reduce: unsupported dtype ") + c10::toString(c.scalar_type()));
    const int64_t n = c.numel();
    auto* p = static_cast<char*>(c.data_ptr());
    for (int64_t off = 0; off < n; off += kMaxCount)
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, p + off * c.element_size(), static_cast<int>(std::min(kMaxCount, n - off)),
                              type, mpi_op(op), comm_),
                "MPI_Allreduce");
    if (op == ReduceOp::Avg) divide(c);
  }

  void divide(at::Tensor& t) const {
    if (at::isFloatingType(t.scalar_type())) t.div_(size_);
    else t.div_(size_, "trunc");
  }

  // big.size(0) == size() * small.size(0) and the same trailing shape and dtype.
  void check_blocks(const at::Tensor& big, const at::Tensor& small, const char* what, const char* big_name,
                    const char* small_name) const {
    if (big.scalar_type() != small.scalar_type())
      throw std::invalid_argument(std::string(what) + ": dtypes differ");
    if (big.numel() != small.numel() * size_)
      throw std::invalid_argument(std::string(what) + ": " + big_name + " has " + std::to_string(big.numel()) +
                                  " elements, expected " + std::to_string(size_) + " x " + small_name + " (" +
                                  std::to_string(small.numel()) + ")");
  }

  static MPI_Datatype byte_block_type(int64_t bytes) {
    MPI_Datatype t;
    if (bytes <= INT_MAX) {
      MPI_Type_contiguous(static_cast<int>(std::max<int64_t>(bytes, 1)), MPI_BYTE, &t);
    } else {
      // bytes = q * 2^30 + r: a struct of q blocks of 2^30 bytes followed by r bytes.
      const int64_t unit = int64_t(1) << 30;
      MPI_Datatype chunk;
      MPI_Type_contiguous(static_cast<int>(unit), MPI_BYTE, &chunk);
      int lens[2] = {static_cast<int>(bytes / unit), static_cast<int>(bytes % unit)};
      MPI_Aint disps[2] = {0, static_cast<MPI_Aint>((bytes / unit) * unit)};
      MPI_Datatype types[2] = {chunk, MPI_BYTE};
      MPI_Type_create_struct(2, lens, disps, types, &t);
      MPI_Type_free(&chunk);
    }
    MPI_Type_commit(&t);
    return t;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) { return std::make_shared<MpiCommunicator>(comm); }

namespace {
// A group of one needs no MPI at all: reductions are the identity, gathers copy.
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "self"; }
  void all_reduce(at::Tensor&, ReduceOp) override {}
  void all_gather(at::Tensor& out, const at::Tensor& in) override { out.copy_(in.reshape(out.sizes())); }
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp) override { out.copy_(in.reshape(out.sizes())); }
  void broadcast(at::Tensor&, int root) override {
    if (root != 0) throw std::invalid_argument("broadcast: root " + std::to_string(root) + " outside a group of 1");
  }
  void barrier() override {}
  void all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& recv_counts,
                  const std::vector<int64_t>& send_counts) override {
    check_all_to_all(out, in, recv_counts, send_counts, 1);
    out.copy_(in);
  }
};
}  // namespace

std::shared_ptr<Communicator> make_self_communicator() { return std::make_shared<SelfCommunicator>(); }

int64_t check_all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& send_counts, int size) {
  if (out.scalar_type() != in.scalar_type()) throw std::invalid_argument("all_to_all: dtypes differ");
  if (in.dim() < 1 || out.dim() != in.dim() || out.sizes().slice(1) != in.sizes().slice(1))
    throw std::invalid_argument("all_to_all: in and out must be [rows, ...] with the same trailing shape");
  if (recv_counts.size() != size_t(size) || send_counts.size() != size_t(size))
    throw std::invalid_argument("all_to_all: one count per rank of the group of " + std::to_string(size));
  int64_t s = 0, r = 0;
  for (int i = 0; i < size; ++i) s += send_counts[size_t(i)], r += recv_counts[size_t(i)];
  if (s != in.size(0) || r != out.size(0))
    throw std::invalid_argument("all_to_all: counts sum to " + std::to_string(s) + " sent / " + std::to_string(r) +
                                " received rows, tensors have " + std::to_string(in.size(0)) + " / " +
                                std::to_string(out.size(0)));
  int64_t row = in.element_size();
  for (int64_t d = 1; d < in.dim(); ++d) row *= in.size(d);
  return row;
}


#if !AC_HAVE_NCCL
bool nccl_available() { return false; }
std::optional<std::string> nccl_version() { return std::nullopt; }
std::shared_ptr<Communicator> make_nccl_communicator(MPI_Comm, int) {
  throw InputError("backend", "nccl", "this build has no NCCL (CUDA and NCCL were not found at configure time)");
}
#else
std::shared_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device_index);
#endif

std::shared_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm comm, int device_index) {
  if (backend == "mpi") return make_mpi_communicator(comm);
  if (backend == "nccl") return make_nccl_communicator(comm, device_index);
  throw InputError("backend", "backend", "unknown communicator backend '" + backend + "' (mpi, nccl)");
}

}  // namespace ac::dist

// Small RAII and error helpers over the HDF5 C API, private to checkpoint/.
#pragma once

#include <hdf5.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace ac::checkpoint::h5 {

// Owns one hid_t and closes it with the right H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  // Closes now and reports failure (closing a file flushes: disk-full shows up here).
  herr_t close() {
    herr_t rc = 0;
    if (id_ >= 0 && close_) rc = close_(id_);
    id_ = -1;
    return rc;
  }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Silences HDF5's own error printing once; errors are reported through exceptions.
void quiet_errors();
// The innermost messages of the current HDF5 error stack, e.g. "No space left on device".
std::string error_stack();
// Throws std::runtime_error("<context>: <HDF5 error stack>") when id/rc < 0.
hid_t check(hid_t id, const std::string& context);

// HDF5 file types for torch dtypes; bf16 is a 16-bit IEEE-style float with 8 exponent
// bits and 7 mantissa bits (bias 127). The returned handle must be closed (it may be a copy).
Handle file_type(torch::ScalarType t);
// torch dtype for a stored HDF5 type; throws for types autocompress does not write.
torch::ScalarType torch_type(hid_t type, const std::string& context);
std::string dtype_name(torch::ScalarType t);

// Portable over HDF5 1.10 / 1.12+ (whose H5O info structs and visit calls changed).
hsize_t num_attributes(hid_t obj, const std::string& context);
std::vector<std::string> list_datasets(hid_t file, const std::string& context);  // full paths, sorted

void write_string_attr(hid_t obj, const std::string& name, const std::string& value);
void write_int_attr(hid_t obj, const std::string& name, int64_t value);
void write_double_attr(hid_t obj, const std::string& name, double value);
void write_u64_attr(hid_t obj, const std::string& name, uint64_t value);
bool has_attr(hid_t obj, const std::string& name);
std::string read_string_attr(hid_t obj, const std::string& name, const std::string& context);
int64_t read_int_attr(hid_t obj, const std::string& name, const std::string& context);
double read_double_attr(hid_t obj, const std::string& name, const std::string& context);
uint64_t read_u64_attr(hid_t obj, const std::string& name, const std::string& context);

}  // namespace ac::checkpoint::h5

// HDF5 helpers for checkpoint/ (see hdf5_util.h).
#include "checkpoint/hdf5_util.h"

#include <algorithm>
#include <stdexcept>

namespace ac::checkpoint::h5 {

void quiet_errors() {
  static bool done = false;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    done = true;
  }
}

namespace {
herr_t collect(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (err->desc && *err->desc) out->push_back(err->desc);
  (void)n;
  return 0;
}
}  // namespace

std::string error_stack() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &msgs);
  H5Eclear2(H5E_DEFAULT);
  // Innermost (most specific) messages last; keep up to three, innermost first.
  std::string out;
  int kept = 0;
  for (auto it = msgs.rbegin(); it != msgs.rend() && kept < 3; ++it, ++kept) out += (kept ? "; " : "") + *it;
  return out.empty() ? "unknown HDF5 error" : out;
}

hid_t check(hid_t id, const std::string& context) {
  if (id < 0) throw std::runtime_error(context + ": " + error_stack());
  return id;
}

Handle file_type(torch::ScalarType t) {
  auto copy = [](hid_t base) { return Handle(H5Tcopy(base), H5Tclose); };
  switch (t) {
    case torch::kFloat: return copy(H5T_IEEE_F32LE);
    case torch::kDouble: return copy(H5T_IEEE_F64LE);
    case torch::kHalf: {
      // IEEE binary16: sign 15, exponent 10..14 (5 bits), mantissa 0..9, bias 15.
      Handle h = copy(H5T_IEEE_F32LE);
      H5Tset_fields(h, 15, 10, 5, 0, 10);
      H5Tset_size(h, 2);
      H5Tset_ebias(h, 15);
      return h;
    }
    case torch::kBFloat16: {
      // bfloat16: the top half of an IEEE binary32 (sign 15, exponent 7..14, mantissa 0..6, bias 127).
      Handle h = copy(H5T_IEEE_F32LE);
      H5Tset_fields(h, 15, 7, 8, 0, 7);
      H5Tset_size(h, 2);
      H5Tset_ebias(h, 127);
      return h;
    }
    case torch::kLong: return copy(H5T_STD_I64LE);
    case torch::kInt: return copy(H5T_STD_I32LE);
    case torch::kShort: return copy(H5T_STD_I16LE);
    case torch::kChar: return copy(H5T_STD_I8LE);
    case torch::kByte: return copy(H5T_STD_U8LE);
    case torch::kBool: return copy(H5T_STD_U8LE);
    default: throw std::invalid_argument(std::string("checkpoint: unsupported dtype ") + c10::toString(t));
  }
}

torch::ScalarType torch_type(hid_t type, const std::string& context) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 4) return torch::kFloat;
    if (size == 8) return torch::kDouble;
    if (size == 2) {
      size_t spos, epos, esize, mpos, msize;
      H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
      if (esize == 8 && msize == 7) return torch::kBFloat16;
      if (esize == 5 && msize == 10) return torch::kHalf;
    }
  } else if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (size == 8 && is_signed) return torch::kLong;
    if (size == 4 && is_signed) return torch::kInt;
    if (size == 2 && is_signed) return torch::kShort;
    if (size == 1) return is_signed ? torch::kChar : torch::kByte;
  }
  throw std::runtime_error(context + ": unsupported stored type (class " + std::to_string(int(cls)) + ", " +
                           std::to_string(size) + " bytes)");
}

std::string dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kLong: return "int64";
    case torch::kInt: return "int32";
    case torch::kShort: return "int16";
    case torch::kChar: return "int8";
    case torch::kByte: return "uint8";
    case torch::kBool: return "bool";
    default: return c10::toString(t);
  }
}

#if H5_VERSION_GE(1, 12, 0)
using ObjectInfo = H5O_info2_t;
#define AC_H5O_GET_INFO(obj, info) H5Oget_info3(obj, info, H5O_INFO_BASIC | H5O_INFO_NUM_ATTRS)
#define AC_H5O_VISIT(obj, cb, data) H5Ovisit3(obj, H5_INDEX_NAME, H5_ITER_INC, cb, data, H5O_INFO_BASIC)
#else
using ObjectInfo = H5O_info_t;
#define AC_H5O_GET_INFO(obj, info) H5Oget_info2(obj, info, H5O_INFO_BASIC | H5O_INFO_NUM_ATTRS)
#define AC_H5O_VISIT(obj, cb, data) H5Ovisit2(obj, H5_INDEX_NAME, H5_ITER_INC, cb, data, H5O_INFO_BASIC)
#endif

hsize_t num_attributes(hid_t obj, const std::string& context) {
  ObjectInfo info;
  check(AC_H5O_GET_INFO(obj, &info), context + ": attributes");
  return info.num_attrs;
}

namespace {
herr_t collect_dataset(hid_t, const char* name, const ObjectInfo* info, void* data) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> list_datasets(hid_t file, const std::string& context) {
  std::vector<std::string> names;
  check(AC_H5O_VISIT(file, collect_dataset, &names), context + ": listing datasets");
  std::sort(names.begin(), names.end());
  return names;
}

void write_string_attr(hid_t obj, const std::string& name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, value.empty() ? 1 : value.size());
  H5Tset_cset(type, H5T_CSET_UTF8);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(check(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), "attribute " + name),
              H5Aclose);
  check(H5Awrite(attr, type, value.empty() ? "" : value.data()), "attribute " + name);
}

namespace {
// One scalar attribute of a fixed-size type: stored as `file_type`, passed as `mem_type`.
void write_scalar_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type, const void* value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(check(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT), "attribute " + name),
              H5Aclose);
  check(H5Awrite(attr, mem_type, value), "attribute " + name);
}
void read_scalar_attr(hid_t obj, const std::string& name, const std::string& context, hid_t mem_type, void* value) {
  Handle attr(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), context + ": attribute " + name), H5Aclose);
  check(H5Aread(attr, mem_type, value), context + ": attribute " + name);
}
}  // namespace

void write_int_attr(hid_t obj, const std::string& name, int64_t value) {
  write_scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
void write_double_attr(hid_t obj, const std::string& name, double value) {
  write_scalar_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}
void write_u64_attr(hid_t obj, const std::string& name, uint64_t value) {
  write_scalar_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

std::string read_string_attr(hid_t obj, const std::string& name, const std::string& context) {
  Handle attr(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), context + ": attribute " + name), H5Aclose);
  Handle type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) throw std::runtime_error(context + ": attribute " + name + " is not a string");
  if (H5Tis_variable_str(type) > 0) {
    char* s = nullptr;
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5Tget_cset(type));  // h5py writes str attributes as variable-length UTF-8
    check(H5Aread(attr, mem, &s), context + ": attribute " + name);
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  std::string out(H5Tget_size(type), '\0');
  check(H5Aread(attr, type, out.data()), context + ": attribute " + name);
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

int64_t read_int_attr(hid_t obj, const std::string& name, const std::string& context) {
  int64_t v = 0;
  read_scalar_attr(obj, name, context, H5T_NATIVE_INT64, &v);
  return v;
}
double read_double_attr(hid_t obj, const std::string& name, const std::string& context) {
  double v = 0;
  read_scalar_attr(obj, name, context, H5T_NATIVE_DOUBLE, &v);
  return v;
}
uint64_t read_u64_attr(hid_t obj, const std::string& name, const std::string& context) {
  uint64_t v = 0;
  read_scalar_attr(obj, name, context, H5T_NATIVE_UINT64, &v);
  return v;
}

}  // namespace ac::checkpoint::h5

// Checkpoint attributes as JSON (attributes.h).
#include "checkpoint/attributes.h"

#include <algorithm>
#include <set>

#include "dist/error.h"

namespace ac::checkpoint {
namespace {

nlohmann::json parse_json(const std::string& text, const std::string& path, const std::string& name) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path, name, std::string("attribute is not valid JSON: ") + e.what());
  }
}

std::vector<int64_t> int_list(const nlohmann::json& s, const char* key) {
  const auto it = s.find(key);
  if (it == s.end() || !it->is_array()) throw std::runtime_error(std::string(key) + " is not an array");
  std::vector<int64_t> out;
  for (const auto& v : *it) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
      throw std::runtime_error(std::string(key) + ": " + v.dump() + " is not an integer in range");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

bool is_crc32(const nlohmann::json& v) { return v.is_number_unsigned() && v.get<uint64_t>() <= UINT32_MAX; }

// A slice's optional "tile" and "tile_crc32": a block shape in [1, max(slice dim, 1)] per
// dimension and one CRC per block of the grid it makes (c->offset and c->shape already read).
void parse_tiles(const nlohmann::json& s, CrcSlice* c) {
  const auto crcs = s.find("tile_crc32");
  if (s.contains("tile") != (crcs != s.end())) throw std::runtime_error("tile and tile_crc32 come together");
  if (crcs == s.end()) return;
  c->tiled = true;
  c->tile = int_list(s, "tile");
  if (c->tile.size() != c->shape.size()) throw std::runtime_error("tile: rank differs from the dataset's");
  if (!crcs->is_array()) throw std::runtime_error("tile_crc32 is not an array");
  const uint64_t have = crcs->size();
  uint64_t blocks = 1;  // saturates at have + 1: no overflow
  for (size_t k = 0; k < c->tile.size(); ++k) {
    if (c->tile[k] < 1 || c->tile[k] > std::max<int64_t>(c->shape[k], 1))
      throw std::runtime_error("tile: " + std::to_string(c->tile[k]) + " is not in [1, " +
                               std::to_string(std::max<int64_t>(c->shape[k], 1)) + "]");
    const uint64_t n = c->shape[k] == 0 ? 0 : uint64_t((c->shape[k] - 1) / c->tile[k] + 1);
    blocks = n == 0 ? 0 : blocks > have / n ? have + 1 : blocks * n;
  }
  if (blocks != have) throw std::runtime_error("tile_crc32 has " + std::to_string(have) + " values, not one per block of the tile grid");
  for (const auto& v : *crcs) {
    if (!is_crc32(v)) throw std::runtime_error("tile_crc32: " + v.dump() + " is not a 32-bit value");
    c->tile_crc32.push_back(uint32_t(v.get<uint64_t>()));
  }
}

bool inside(const Box& b, const Box& region) {
  for (size_t k = 0; k < b.offset.size(); ++k)
    if (b.offset[k] < region.offset[k] || b.offset[k] + b.shape[k] > region.offset[k] + region.shape[k]) return false;
  return true;
}

void grow(Box* span, const Box& b) {
  for (size_t k = 0; k < b.offset.size(); ++k) {
    const int64_t end = std::max(span->offset[k] + span->shape[k], b.offset[k] + b.shape[k]);
    span->offset[k] = std::min(span->offset[k], b.offset[k]);
    span->shape[k] = end - span->offset[k];
  }
}

}  // namespace

std::vector<CrcBlock> tile_blocks(const CrcSlice& s, const Box& region) {
  if (!s.tiled) return {};
  const size_t nd = s.shape.size();
  std::vector<int64_t> first(nd), last(nd), count(nd);
  for (size_t k = 0; k < nd; ++k) {
    const int64_t lo = std::max(s.offset[k], region.offset[k]);
    const int64_t hi = std::min(s.offset[k] + s.shape[k], region.offset[k] + region.shape[k]);
    if (lo >= hi) return {};
    first[k] = (lo - s.offset[k]) / s.tile[k];
    last[k] = (hi - 1 - s.offset[k]) / s.tile[k];
    count[k] = (s.shape[k] - 1) / s.tile[k] + 1;
  }
  std::vector<CrcBlock> out;
  for (std::vector<int64_t> i = first;;) {  // every block index in [first, last], row-major
    CrcBlock b{{std::vector<int64_t>(nd), std::vector<int64_t>(nd)}, 0};
    size_t flat = 0;
    for (size_t k = 0; k < nd; ++k) {
      flat = flat * size_t(count[k]) + size_t(i[k]);
      b.box.offset[k] = s.offset[k] + i[k] * s.tile[k];
      b.box.shape[k] = std::min(s.tile[k], s.shape[k] - i[k] * s.tile[k]);
    }
    b.crc32 = s.tile_crc32.at(flat);
    out.push_back(std::move(b));
    size_t k = nd;
    while (k > 0 && i[k - 1] == last[k - 1]) i[k - 1] = first[k - 1], --k;
    if (k == 0) return out;
    ++i[k - 1];
  }
}

CheckedRead plan_checked_read(const std::vector<CrcSlice>& slices, const Box& want) {
  CheckedRead r{want, {}};
  for (const CrcSlice& s : slices) {
    if (inside({s.offset, s.shape}, want)) r.blocks.push_back({{s.offset, s.shape}, s.crc32});  // one pass
    else if (s.tiled)
      for (CrcBlock& b : tile_blocks(s, want)) {
        grow(&r.span, b.box);
        r.blocks.push_back(std::move(b));
      }
  }
  return r;
}

nlohmann::json parse_root_attributes(const std::map<std::string, std::string>& strings,
                                     const std::map<std::string, int64_t>& integers, const std::string& path) {
  std::set<std::string> json_keys = {"per_rank"};
  if (const auto it = strings.find("json_attributes"); it != strings.end()) {
    const nlohmann::json keys = parse_json(it->second, path, "json_attributes");
    if (!keys.is_array()) throw InputError(path, "json_attributes", "is not a JSON array of attribute names");
    for (const auto& k : keys) {
      if (!k.is_string()) throw InputError(path, "json_attributes", k.dump() + " is not an attribute name");
      json_keys.insert(k.get<std::string>());
    }
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : integers) out[name] = value;
  for (const auto& [name, text] : strings) out[name] = json_keys.count(name) ? parse_json(text, path, name) : nlohmann::json(text);
  return out;
}

std::vector<CrcSlice> parse_crc32_slices(const std::string& text, const std::vector<int64_t>& dataset_shape,
                                         const std::string& path, const std::string& dataset) {
  const std::string field = dataset + ": crc32_slices";
  const nlohmann::json j = parse_json(text, path, field);
  if (!j.is_array()) throw InputError(path, field, "is not a JSON array of slices");
  std::vector<CrcSlice> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& s = j[i];
    try {
      if (!s.is_object()) throw std::runtime_error("not an object");
      CrcSlice c;
      c.offset = int_list(s, "offset");
      c.shape = int_list(s, "shape");
      if (c.offset.size() != dataset_shape.size() || c.shape.size() != dataset_shape.size())
        throw std::runtime_error("rank differs from the dataset's");
      for (size_t k = 0; k < c.shape.size(); ++k)  // written so that nothing can overflow
        if (c.offset[k] < 0 || c.shape[k] < 0 || c.offset[k] > dataset_shape[k] || c.shape[k] > dataset_shape[k] - c.offset[k])
          throw std::runtime_error("slice outside the dataset");
      const auto crc = s.find("crc32");
      if (crc == s.end() || !is_crc32(*crc)) throw std::runtime_error("crc32 is not a 32-bit value");
      c.crc32 = uint32_t(crc->get<uint64_t>());
      parse_tiles(s, &c);
      out.push_back(std::move(c));
    } catch (const std::runtime_error& e) {
      throw InputError(path, field + "[" + std::to_string(i) + "]", e.what());
    }
  }
  return out;
}

}  // namespace ac::checkpoint

// The JSON a checkpoint file carries in HDF5 attributes, read without LibTorch or HDF5 so
// that tests/fuzz/ can give it arbitrary text: the root attributes (those json_attributes
// names, and per_rank, hold JSON) and a dataset's crc32_slices, and which of its CRC32s a
// read of part of the dataset checks. Bad text throws ac::InputError naming the file and
// attribute, never a raw JSON error.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ac::checkpoint {

// The root attributes as one JSON object: integers as such, strings as strings except those
// `json_attributes` lists (a JSON array of names) and `per_rank`, which are parsed.
nlohmann::json parse_root_attributes(const std::map<std::string, std::string>& strings,
                                     const std::map<std::string, int64_t>& integers, const std::string& path);

// A box of a dataset: where it starts and its extent, per dimension.
struct Box {
  std::vector<int64_t> offset, shape;
  bool operator==(const Box& o) const { return offset == o.offset && shape == o.shape; }
};

// The stored CRC32s of one slice a rank wrote: of the whole slice, and (files written since
// issue 35's partial-read checks) of each block of a grid that cuts the slice into `tile`-
// shaped blocks (the last ones in a dimension smaller), in the grid's row-major order, so that
// a rank that reads part of the slice checks the blocks it reads. Older files: not tiled.
struct CrcSlice {
  std::vector<int64_t> offset, shape;
  uint32_t crc32 = 0;
  bool tiled = false;
  std::vector<int64_t> tile;
  std::vector<uint32_t> tile_crc32;
};
// `text`, a crc32_slices attribute: [{"offset": [..], "shape": [..], "crc32": n}, ...] and
// optionally "tile": [..], "tile_crc32": [n, ...] in each; each slice of the dataset's rank and
// inside `dataset_shape`, each tile dimension in [1, max(slice dimension, 1)], one 32-bit CRC
// per block of the grid.
std::vector<CrcSlice> parse_crc32_slices(const std::string& text, const std::vector<int64_t>& dataset_shape,
                                         const std::string& path, const std::string& dataset);

// One stored CRC32 and the box of the dataset it covers.
struct CrcBlock {
  Box box;
  uint32_t crc32 = 0;
};
// The blocks of tiled slice `s` that intersect `region`, in the grid's row-major order.
std::vector<CrcBlock> tile_blocks(const CrcSlice& s, const Box& region);

// What a read of `want` checks: every slice that lies inside `want` (its whole-slice CRC32),
// and of every tiled slice only partly inside, the blocks of its grid that `want` touches;
// `span` is `want` grown to hold those blocks whole (the box to read). An untiled slice (an
// older file's) only partly inside `want` is not checked: reading it whole would cost up to
// TP times the I/O of the load.
struct CheckedRead {
  Box span;
  std::vector<CrcBlock> blocks;
};
CheckedRead plan_checked_read(const std::vector<CrcSlice>& slices, const Box& want);

}  // namespace ac::checkpoint

// Slice and tile CRC32s of checkpoint data (checksums.h).
#include "checkpoint/checksums.h"

#include <zlib.h>

#include <algorithm>

namespace ac::checkpoint {
namespace {

constexpr int64_t kMinTileBytes = int64_t(16) << 10;
constexpr int64_t kTilesPerDataset = 512;

uLong crc32_bytes(uLong crc, const char* p, int64_t n) {
  for (; n > 0;) {  // zlib takes at most 4 GiB - 1 per call
    const uInt len = static_cast<uInt>(std::min<int64_t>(n, int64_t(1) << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p), len);
    p += len;
    n -= len;
  }
  return crc;
}

// Row-major over dims [d, ndim) of a strided tensor at `p`; a trailing contiguous run is one call.
uLong crc32_strided(uLong crc, const char* p, const torch::Tensor& t, int64_t d) {
  const int64_t es = t.element_size();
  int64_t run = 1;  // elements of dims [d, ndim) when they are contiguous
  for (int64_t k = t.dim() - 1; k >= d; --k) {
    if (t.size(k) != 1 && t.stride(k) != run) {
      run = -1;
      break;
    }
    run *= t.size(k);
  }
  if (run >= 0) return crc32_bytes(crc, p, run * es);
  for (int64_t i = 0; i < t.size(d); ++i) crc = crc32_strided(crc, p + i * t.stride(d) * es, t, d + 1);
  return crc;
}

}  // namespace

uint32_t crc32_of(const torch::Tensor& t) {
  const uLong crc = crc32(0L, Z_NULL, 0);
  if (t.numel() == 0) return uint32_t(crc);
  return uint32_t(crc32_strided(crc, static_cast<const char*>(t.data_ptr()), t, 0));
}

std::vector<int64_t> crc_tile_shape(const std::vector<int64_t>& shape, int64_t element_size, int64_t dataset_bytes) {
  const int64_t limit = std::max(kMinTileBytes, dataset_bytes / kTilesPerDataset);
  std::vector<int64_t> tile = shape;
  for (;;) {
    int64_t bytes = element_size;
    for (int64_t s : tile) bytes *= s;
    const auto largest = std::max_element(tile.begin(), tile.end());
    if (bytes <= limit || largest == tile.end() || *largest <= 1) return tile;
    *largest = (*largest + 1) / 2;
  }
}

nlohmann::json slice_checksums(const std::vector<int64_t>& offset, const torch::Tensor& piece, int64_t dataset_bytes) {
  nlohmann::json out = {{"offset", offset}, {"shape", piece.sizes().vec()}, {"crc32", crc32_of(piece)}};
  if (piece.dim() == 0 || piece.numel() == 0) return out;
  const std::vector<int64_t> tile = crc_tile_shape(piece.sizes().vec(), piece.element_size(), dataset_bytes);
  const Box whole{std::vector<int64_t>(size_t(piece.dim()), 0), piece.sizes().vec()};
  CrcSlice grid{whole.offset, whole.shape, 0, true, tile, {}};
  size_t blocks = 1;
  for (int64_t k = 0; k < piece.dim(); ++k) blocks *= size_t((piece.size(k) - 1) / tile[size_t(k)] + 1);
  grid.tile_crc32.assign(blocks, 0);
  nlohmann::json crcs = nlohmann::json::array();
  for (const CrcBlock& b : tile_blocks(grid, whole)) crcs.push_back(crc32_of(crop(piece, whole, b.box)));
  out["tile"] = tile;
  out["tile_crc32"] = std::move(crcs);
  return out;
}

torch::Tensor crop(const torch::Tensor& data, const Box& span, const Box& box) {
  torch::Tensor v = data;
  for (size_t k = 0; k < box.offset.size(); ++k) v = v.narrow(int64_t(k), box.offset[k] - span.offset[k], box.shape[k]);
  return v;
}

std::optional<CrcBlock> first_bad_block(const torch::Tensor& data, const Box& span, const std::vector<CrcBlock>& blocks) {
  for (const CrcBlock& b : blocks)
    if (crc32_of(crop(data, span, b.box)) != b.crc32) return b;
  return std::nullopt;
}

}  // namespace ac::checkpoint

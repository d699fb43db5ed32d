// The CRC32s a checkpoint stores (zlib's CRC32 of bytes in row-major order): of each slice a
// rank writes and of each block of the tile grid that cuts it, so that a rank that reads part
// of a slice (a load at another TP size) checks what it reads. Format: docs/checkpoint-format.md.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "checkpoint/attributes.h"

namespace ac::checkpoint {

// CRC32 of a tensor's elements in row-major order (any strides).
uint32_t crc32_of(const torch::Tensor& t);

// The block shape of the tile grid of a slice of `shape`: the slice with its largest dimension
// halved (rounding up) until a block holds at most max(16 KiB, dataset_bytes / 512) bytes. So
// a dataset has about 512 to 1024 blocks at most (plus one per slice), and a rank reading part
// of a slice reads at most one extra block along each edge of its part.
std::vector<int64_t> crc_tile_shape(const std::vector<int64_t>& shape, int64_t element_size, int64_t dataset_bytes);

// The crc32_slices entry of `piece` (contiguous), written at `offset` of a dataset of
// `dataset_bytes`: offset, shape, crc32, and for a piece of rank >= 1 its tile and tile_crc32.
nlohmann::json slice_checksums(const std::vector<int64_t>& offset, const torch::Tensor& piece, int64_t dataset_bytes);

// `box` of a dataset as a view of `data`, which holds the dataset's box `span` (box inside span).
torch::Tensor crop(const torch::Tensor& data, const Box& span, const Box& box);

// The first of `blocks` whose CRC32 differs from the data, in `data` read at `span`.
std::optional<CrcBlock> first_bad_block(const torch::Tensor& data, const Box& span, const std::vector<CrcBlock>& blocks);

}  // namespace ac::checkpoint

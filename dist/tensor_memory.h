// Bytes of live CPU tensors, counted by a wrapper around LibTorch's CPU allocator that
// `install` puts in place (process-wide, idempotent; storages allocated before it keep their
// own deleter and are not counted). `reset_peak` sets the high-water mark to the current
// count. Used by `cost validate` and `scorecard` (serving memory) and by the trainer (the
// peak a training step reaches, which `autocompress plan` predicts).
#pragma once

#include <cstdint>

namespace ac::dist::tensor_memory {
void install();
bool installed();
int64_t current();
int64_t peak();
void reset_peak();
}  // namespace ac::dist::tensor_memory

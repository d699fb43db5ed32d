// The CPU tensor allocator: LibTorch's CPU allocator wrapped to count live tensor bytes and to
// keep freed large blocks for reuse, as PyTorch's CUDA caching allocator does on a GPU.
//
// Counting: live bytes and their high-water mark (`current`, `peak`, `reset_peak`), used by
// `cost validate` and `scorecard` (serving memory) and by the trainer (the peak a training step
// reaches, which `autocompress plan` predicts). Cached free blocks are not live bytes (PyTorch's
// memory_allocated vs memory_reserved); `cached` reports them.
//
// Caching: glibc serves a large request by a fresh mmap (above its dynamic threshold, at most
// 32 MiB) and returns it at free, so every prefill's attention scores, every KD step's logits
// are faulted in and zeroed page by page again (~2 us per 4 KiB page on a VM: a 2K-token prefill
// took 2x its compute). Blocks of >= 1 MiB are rounded up to 512 KiB and kept on free, up to a
// cap (AC_CPU_CACHE_MB per process; default min(4 GiB, RAM / 8) shared by the ranks on the
// node; 0 turns caching off); a request of the same rounded size takes one back. Over the cap
// the least recently freed blocks are released.
//
// `install` puts the allocator in place (process-wide, idempotent; the CLI installs it first
// thing, telling it how many ranks share the node). Storages allocated before keep their own
// deleter and are not counted.
#pragma once

#include <cstdint>

namespace ac::dist::tensor_memory {
void install(int ranks_on_node = 1);
bool installed();
int64_t current();
int64_t peak();
void reset_peak();
int64_t cached();                  // bytes of freed blocks kept for reuse
int64_t cache_limit();             // the most it keeps (0: caching off)
void set_cache_limit(int64_t bytes);  // releases the oldest beyond it
void empty_cache();                // release them all (torch.cuda.empty_cache's CPU twin)
}  // namespace ac::dist::tensor_memory

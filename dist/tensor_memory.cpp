// A counting wrapper around LibTorch's CPU allocator (dist/tensor_memory.h).
#include "dist/tensor_memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/version.h>

#include <atomic>
#include <cstring>

namespace ac::dist {

// ---- peak tensor memory: a counting wrapper around the CPU allocator ------------------------
// Every CPU tensor's storage comes from c10::GetCPUAllocator(). The wrapper allocates with the
// same c10::alloc_cpu as LibTorch's default allocator (64-byte aligned), keeps the size in a
// 64-byte header in front of the data, and counts live bytes and their high-water mark.
namespace tensor_memory {
namespace {
constexpr size_t kHeader = 64;
std::atomic<int64_t> g_current{0}, g_peak{0};
std::atomic<bool> g_installed{false};

void count_free(void* data) {
  if (!data) return;
  char* base = static_cast<char*>(data) - kHeader;
  const auto n = *reinterpret_cast<size_t*>(base);
  g_current.fetch_sub(int64_t(n));
  c10::free_cpu(base);
}

// LibTorch >= 2.3: allocate() is non-const and copy_data() pure virtual.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define AC_ALLOCATE_CONST
#define AC_COPY_DATA_OVERRIDE override
#else
#define AC_ALLOCATE_CONST const
#define AC_COPY_DATA_OVERRIDE
#endif

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) AC_ALLOCATE_CONST override {
    char* base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    *reinterpret_cast<size_t*>(base) = n;
    const int64_t now = g_current.fetch_add(int64_t(n)) + int64_t(n);
    int64_t p = g_peak.load();
    while (now > p && !g_peak.compare_exchange_weak(p, now)) {
    }
    void* data = base + kHeader;
    return {data, data, &count_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &count_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const AC_COPY_DATA_OVERRIDE {
    if (count) std::memcpy(dest, src, count);
  }
};
CountingCpuAllocator g_allocator;
}  // namespace

void install() {
  if (g_installed.exchange(true)) return;
  // Priority 1 beats LibTorch's default registration (0). Storages allocated before keep
  // their own deleter, so they are freed correctly and simply not counted.
  c10::SetCPUAllocator(&g_allocator, /*priority=*/1);
}
bool installed() { return g_installed.load(); }
int64_t current() { return g_current.load(); }
int64_t peak() { return g_peak.load(); }
void reset_peak() { g_peak.store(g_current.load()); }
}  // namespace tensor_memory

}  // namespace ac::dist

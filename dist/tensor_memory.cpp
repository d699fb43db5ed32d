// The CPU tensor allocator: counting and caching of large blocks (dist/tensor_memory.h).
#include "dist/tensor_memory.h"

#include "dist/error.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace ac::dist {

namespace tensor_memory {
namespace {
// Every CPU tensor's storage comes from c10::GetCPUAllocator(). The wrapper allocates with the
// same c10::alloc_cpu as LibTorch's default allocator (64-byte aligned) and keeps, in a 64-byte
// header in front of the data, the bytes asked for and the block's size class (0: not cached).
constexpr size_t kHeader = 64;
constexpr size_t kMinCached = size_t(1) << 20;   // blocks below this: glibc's heap reuses them
constexpr size_t kRound = size_t(512) << 10;     // size classes of cached blocks
std::atomic<int64_t> g_current{0}, g_peak{0};
std::atomic<bool> g_installed{false};

size_t cache_limit_from_env(int ranks_on_node) {
  const char* env = std::getenv("AC_CPU_CACHE_MB");
  if (env == nullptr) {
    const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    return size_t(std::min(4.0 * (1 << 30), std::max(0.0, ram / 8)) / std::max(1, ranks_on_node));
  }
  char* end = nullptr;
  const long long mb = std::strtoll(env, &end, 10);
  if (*env == '\0' || *end != '\0' || mb < 0 || mb > (1LL << 30))
    throw InputError("AC_CPU_CACHE_MB", env, "expected MiB of freed CPU blocks to keep, an integer >= 0 (0: none)");
  return size_t(mb) << 20;
}

// Freed blocks by size class; over the limit the least recently freed go back to the system.
class BlockCache {
 public:
  void set_limit(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
    shrink_to(bytes);
  }
  bool enabled() const { return limit_.load(std::memory_order_relaxed) > 0; }
  void* take(size_t cls) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cls);
    if (it == free_.end()) return nullptr;
    void* p = it->second.block;
    free_.erase(it);
    bytes_ -= cls;
    return p;
  }
  void put(void* block, size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const size_t limit = limit_.load();
      if (cls <= limit) {
        shrink_to(limit - cls);
        free_.emplace(cls, Entry{block, ++tick_});
        bytes_ += cls;
        return;
      }
    }
    c10::free_cpu(block);
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    shrink_to(0);
  }
  int64_t bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return int64_t(bytes_);
  }
  int64_t limit() const { return int64_t(limit_.load()); }

 private:
  struct Entry {
    void* block;
    uint64_t freed_at;
  };
  void shrink_to(size_t target) {  // mu_ held
    while (bytes_ > target) {
      auto oldest = std::min_element(free_.begin(), free_.end(), [](const auto& a, const auto& b) {
        return a.second.freed_at < b.second.freed_at;
      });
      c10::free_cpu(oldest->second.block);
      bytes_ -= oldest->first;
      free_.erase(oldest);
    }
  }
  std::mutex mu_;
  std::multimap<size_t, Entry> free_;
  size_t bytes_ = 0;
  std::atomic<size_t> limit_{0};
  uint64_t tick_ = 0;
};
// Never destroyed: storages freed during static destruction still return their blocks here.
BlockCache& g_cache = *new BlockCache;

void* alloc_block(size_t bytes) {
  try {
    return c10::alloc_cpu(bytes);
  } catch (const c10::Error&) {
    g_cache.clear();  // out of memory: give the cached blocks back and try once more
    return c10::alloc_cpu(bytes);
  }
}

void count_free(void* data) {
  if (!data) return;
  char* base = static_cast<char*>(data) - kHeader;
  const auto* header = reinterpret_cast<const size_t*>(base);
  g_current.fetch_sub(int64_t(header[0]));
  if (header[1] != 0) g_cache.put(base, header[1]);
  else c10::free_cpu(base);
}

// LibTorch >= 2.3: allocate() is non-const and copy_data() pure virtual.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define AC_ALLOCATE_CONST
#define AC_COPY_DATA_OVERRIDE override
#else
#define AC_ALLOCATE_CONST const
#define AC_COPY_DATA_OVERRIDE
#endif

class CpuTensorAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) AC_ALLOCATE_CONST override {
    size_t cls = 0;
    char* base = nullptr;
    if (g_cache.enabled() && n + kHeader >= kMinCached) {
      cls = (n + kHeader + kRound - 1) / kRound * kRound;
      base = static_cast<char*>(g_cache.take(cls));
    }
    if (!base) base = static_cast<char*>(alloc_block(cls != 0 ? cls : n + kHeader));
    auto* header = reinterpret_cast<size_t*>(base);
    header[0] = n;
    header[1] = cls;
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
CpuTensorAllocator g_allocator;
}  // namespace

void install(int ranks_on_node) {
  if (g_installed.exchange(true)) return;
  g_cache.set_limit(cache_limit_from_env(ranks_on_node));
  // Priority 1 beats LibTorch's default registration (0). Storages allocated before keep
  // their own deleter, so they are freed correctly and simply not counted.
  c10::SetCPUAllocator(&g_allocator, /*priority=*/1);
}
bool installed() { return g_installed.load(); }
int64_t current() { return g_current.load(); }
int64_t peak() { return g_peak.load(); }
void reset_peak() { g_peak.store(g_current.load()); }
int64_t cached() { return g_cache.bytes(); }
int64_t cache_limit() { return g_cache.limit(); }
void set_cache_limit(int64_t bytes) { g_cache.set_limit(size_t(std::max<int64_t>(0, bytes))); }
void empty_cache() { g_cache.clear(); }
}  // namespace tensor_memory

}  // namespace ac::dist

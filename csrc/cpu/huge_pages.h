// Large outputs of the CPU kernels are advised as transparent huge pages before their first write. A fresh
// multi-megabyte tensor is new memory from the OS, and faulting it in 4 KB pages is a sizeable share of a
// memory-bound op's time; with Linux's THP in `madvise` mode (a common default) 2 MB pages cut those faults
// 512-fold. Advice only: the bits written do not change, and any error (no THP, another OS) is ignored.
// GPUOPT_CPU_HUGE_PAGES=0 turns it off (read once per process), as PyTorch's THP_MEM_ALLOC_ENABLE turns it on
// for its own allocator.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "torch_stable.h"

namespace gpuopt {
namespace cpu {

inline bool huge_pages_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("GPUOPT_CPU_HUGE_PAGES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

// Advises the whole 2 MB pages inside t's storage (tensors of at least 8 MB; smaller ones are left alone).
inline void advise_huge_pages(const Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  const int64_t bytes = nbytes(t);
  if (bytes < static_cast<int64_t>(4 * kHuge) || !huge_pages_enabled()) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t lo = (p + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (p + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

}  // namespace cpu
}  // namespace gpuopt

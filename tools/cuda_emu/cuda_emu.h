// Emulator of CUDA's execution model for the host C++ compiler (g++ -std=c++17 or later).
//
// CUDA kernel source written against the portability layer compiles unchanged on the CPU with this header
// and runs with CUDA semantics, strictly: every block's threads are cooperatively scheduled fibers, barriers
// and warp primitives synchronise exactly the threads CUDA synchronises, and what CUDA leaves undefined is an
// error here (a barrier not reached by every thread, divergent barriers, warp ops whose mask names a lane
// that exited or waits elsewhere, misaligned or out-of-bounds 16-byte accesses, writes into the guard bytes
// around a device buffer, launch configurations CUDA rejects, > 48 KiB of static shared memory).
//
// The implementation is tools/cuda_emu/cuda_emu.cpp; tools/cuda_emu/build.py's load_extension() compiles it
// into every emulated extension. Everything here has hidden visibility, so two extensions built with it keep
// separate emulator state.
//
// Kernel-side surface (global namespace, as in CUDA):
//   __global__ __device__ __host__ (empty)   __forceinline__ (inline)   __launch_bounds__(...) (empty)
//   dim3, uint2, uint4; threadIdx blockIdx blockDim gridDim (thread_local dim3); warpSize
//   __syncthreads() __syncthreads_count/_and/_or(pred) __syncwarp(mask)
//   __shfl_sync __shfl_up_sync __shfl_down_sync __shfl_xor_sync (T trivially copyable, sizeof(T) <= 8)
//   __ballot_sync __all_sync __any_sync; __ldg; __threadfence(_block) (no-ops); atomicAdd/Max/Min/Exch/CAS
//   GPUOPT_SHARED_ARRAY(T, name, count)        declares T* name: the block's static shared array
//   GPUOPT_DYNAMIC_SHARED(T, name)             declares T* name: the launch's dynamic shared memory
//   gpuopt_emu_load16 / gpuopt_emu_store16     checked 16-byte vector access (uint4)
//   gpuopt_emu_load8 / gpuopt_emu_store8       checked 8-byte vector access (uint2)
// Host-side surface (namespace gpuopt_emu): DeviceBuffer, launch(), launch_kernel(), launch_log(), fail().
#pragma once

#if defined(__CUDACC__) || defined(__CUDA_ARCH__)
#error "cuda_emu.h is the host-compiler emulation of CUDA; it must not be included by nvcc builds"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#pragma GCC visibility push(hidden)

// ---------------------------------------------------------------------------------------------------------------
// 1. Keywords. __shared__ is deliberately left undefined: kernels declare shared memory with GPUOPT_SHARED_ARRAY.

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

// ---------------------------------------------------------------------------------------------------------------
// 2. Types.

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

struct alignas(8) uint2 {
  unsigned x, y;
};

// ---------------------------------------------------------------------------------------------------------------
// 3. Built-in indices. The scheduler sets them before it resumes an emulated thread. All fibers of a launch run
// on the launching OS thread, so the thread_local's address never changes under a kernel, and its value is
// reloaded after every barrier / warp op because those are opaque calls (runtime_selftest checks both).

extern thread_local dim3 threadIdx;
extern thread_local dim3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------------------------
// Internal interface between the header's templates and cuda_emu.cpp.

namespace gpuopt_emu {
namespace detail {

enum class WarpOp : unsigned char { shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, all, any, syncwarp };
enum class BarrierOp : unsigned char { sync, count, all, any };

// Posts this lane's (value, arg) at a warp op and blocks until every lane of `mask` has arrived; the
// scheduler computes each lane's result at release time.
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, unsigned value_size, int arg, int width,
                 unsigned line, const char* file);
int barrier(BarrierOp op, int pred, unsigned line, const char* file);

// One GPUOPT_SHARED_ARRAY declaration (a function-local static, so one per function / template instance,
// which is exactly the identity of a __shared__ variable in CUDA).
struct SharedSite {
  const char* name;
  const char* type;
  const char* file;
  int line;
};
void* shared_array(const SharedSite* site, size_t bytes, size_t align);
void* dynamic_shared(const char* name, size_t align, unsigned line, const char* file);

// Checks a `bytes`-wide access at p (alignment and bounds, see gpuopt_emu_load16); fails the launch if bad.
void check_vector_access(const void* p, size_t bytes, bool is_store);

template <typename T>
inline uint64_t to_bits(const T& v) {
  static_assert(std::is_trivially_copyable<T>::value, "warp shuffles need a trivially copyable type");
  static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes per lane");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

template <typename T>
inline T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

}  // namespace detail
}  // namespace gpuopt_emu

// ---------------------------------------------------------------------------------------------------------------
// 4. Barriers and warp primitives. The trailing (line, file) parameters default to the call site; kernels never
// pass them.

// Releases when every thread of the block waits at a __syncthreads of the same (file, line); a thread that
// exited while others wait, waits at a different call site, or a warp op that can never complete is an error.
void __syncthreads(unsigned line = __builtin_LINE(), const char* file = __builtin_FILE());
inline int __syncthreads_count(int pred, unsigned line = __builtin_LINE(), const char* file = __builtin_FILE()) {
  return gpuopt_emu::detail::barrier(gpuopt_emu::detail::BarrierOp::count, pred, line, file);
}
inline int __syncthreads_and(int pred, unsigned line = __builtin_LINE(), const char* file = __builtin_FILE()) {
  return gpuopt_emu::detail::barrier(gpuopt_emu::detail::BarrierOp::all, pred, line, file);
}
inline int __syncthreads_or(int pred, unsigned line = __builtin_LINE(), const char* file = __builtin_FILE()) {
  return gpuopt_emu::detail::barrier(gpuopt_emu::detail::BarrierOp::any, pred, line, file);
}

// Every lane named in a warp op's mask must arrive at a warp op of the same kind with the same mask and width
// (and value size), and the caller must be in its own mask; width is a power of two <= 32; a shuffle that reads
// a lane outside the mask is an error. Semantics are PTX shfl.sync's (width segments; up / down / xor out of
// the caller's segment return the caller's own value; the lane operand uses its low 5 bits).
inline void __syncwarp(unsigned mask = 0xffffffffu, unsigned line = __builtin_LINE(),
                       const char* file = __builtin_FILE()) {
  gpuopt_emu::detail::warp_op(gpuopt_emu::detail::WarpOp::syncwarp, mask, 0, 0, 0, 32, line, file);
}

namespace gpuopt_emu {
namespace detail {

// The four shuffles: one warp op each (shfl_idx, shfl_up, shfl_down, shfl_xor) whose lane operand is the source
// lane, the delta or the lane mask, of the CUDA parameter type Lane; T is any trivially copyable type of at most
// 8 bytes. Called as the CUDA functions are: __shfl_xor_sync(mask, v, lane_mask[, width]).
template <WarpOp kOp, typename Lane>
struct ShuffleSync {
  template <typename T>
  T operator()(unsigned mask, T v, Lane lane, int width = 32, unsigned line = __builtin_LINE(),
               const char* file = __builtin_FILE()) const {
    return from_bits<T>(warp_op(kOp, mask, to_bits(v), sizeof(T), static_cast<int>(lane), width, line, file));
  }
};

}  // namespace detail
}  // namespace gpuopt_emu

inline constexpr gpuopt_emu::detail::ShuffleSync<gpuopt_emu::detail::WarpOp::shfl_idx, int> __shfl_sync{};
inline constexpr gpuopt_emu::detail::ShuffleSync<gpuopt_emu::detail::WarpOp::shfl_up, unsigned> __shfl_up_sync{};
inline constexpr gpuopt_emu::detail::ShuffleSync<gpuopt_emu::detail::WarpOp::shfl_down, unsigned> __shfl_down_sync{};
inline constexpr gpuopt_emu::detail::ShuffleSync<gpuopt_emu::detail::WarpOp::shfl_xor, int> __shfl_xor_sync{};

inline unsigned __ballot_sync(unsigned mask, int pred, unsigned line = __builtin_LINE(),
                              const char* file = __builtin_FILE()) {
  using namespace gpuopt_emu::detail;
  return static_cast<unsigned>(warp_op(WarpOp::ballot, mask, pred != 0, 4, 0, 32, line, file));
}

inline int __all_sync(unsigned mask, int pred, unsigned line = __builtin_LINE(), const char* file = __builtin_FILE()) {
  using namespace gpuopt_emu::detail;
  return static_cast<int>(warp_op(WarpOp::all, mask, pred != 0, 4, 0, 32, line, file));
}

inline int __any_sync(unsigned mask, int pred, unsigned line = __builtin_LINE(), const char* file = __builtin_FILE()) {
  using namespace gpuopt_emu::detail;
  return static_cast<int>(warp_op(WarpOp::any, mask, pred != 0, 4, 0, 32, line, file));
}

// Memory-model helpers. Emulated threads of a launch never run concurrently, so these are plain operations.
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline void __threadfence() {}
inline void __threadfence_block() {}
// Each atomic is one read-modify-write: *p = f(old), returning old.
template <typename T, typename F>
inline T atomic_update(T* p, const F& f) {
  const T old = *p;
  *p = f(old);
  return old;
}
template <typename T>
inline T atomicAdd(T* p, T v) {
  return atomic_update(p, [&](T old) { return old + v; });
}
template <typename T>
inline T atomicMax(T* p, T v) {
  return atomic_update(p, [&](T old) { return old < v ? v : old; });
}
template <typename T>
inline T atomicMin(T* p, T v) {
  return atomic_update(p, [&](T old) { return v < old ? v : old; });
}
template <typename T>
inline T atomicExch(T* p, T v) {
  return atomic_update(p, [&](T) { return v; });
}
template <typename T>
inline T atomicCAS(T* p, T compare, T v) {
  return atomic_update(p, [&](T old) { return old == compare ? v : old; });
}

// ---------------------------------------------------------------------------------------------------------------
// 5. Shared memory. GPUOPT_SHARED_ARRAY(T, name, count) declares `T* name` (CUDA: `__shared__ T name[count]`)
// pointing into the block's shared-memory arena. Each declaration (per function / template instance, like a
// __shared__ variable) gets one address per block, the same for every thread and every time it is executed;
// it is aligned to max(alignof(T), 16). Every thread must ask for the same size (error otherwise). Before each
// block the arena is filled with 0xFF bytes (a NaN in every float format). A block's static shared memory
// beyond 48 KiB is an error naming the kernel. Only usable inside a function body; sizeof(name) is a pointer's.

#if defined(GPUOPT_SHARED_ARRAY)
#error "GPUOPT_SHARED_ARRAY is already defined: under GPUOPT_CUDA_EMULATOR it must come from cuda_emu.h"
#endif
#define GPUOPT_SHARED_ARRAY(T, name, count)                                                                  \
  static const ::gpuopt_emu::detail::SharedSite gpuopt_emu_shared_site_##name{#name, #T, __FILE__, __LINE__}; \
  T* name = static_cast<T*>(::gpuopt_emu::detail::shared_array(                                              \
      &gpuopt_emu_shared_site_##name, sizeof(T) * static_cast<size_t>(count), alignof(T)))

// GPUOPT_DYNAMIC_SHARED(T, name) declares `T* name` (CUDA: the block's `extern __shared__` array) pointing at the
// launch's dynamic shared memory (launch()'s dynamic_shared_bytes; none is an error), 16-byte aligned, filled with
// 0xFF before each block like the static arrays. Static + dynamic shared memory beyond 227 KiB a block is an error.
#define GPUOPT_DYNAMIC_SHARED(T, name) \
  T* name = static_cast<T*>(::gpuopt_emu::detail::dynamic_shared(#name, alignof(T), __LINE__, __FILE__))

// ---------------------------------------------------------------------------------------------------------------
// 6. Checked vector access. Inside a launch, the address must be a multiple of the width, and the whole access
// must lie inside one registered DeviceBuffer's data, inside one GPUOPT_SHARED_ARRAY of the current block or its
// dynamic shared memory, or
// on the calling emulated thread's own stack (local memory); otherwise the launch fails with e.g.
//   "misaligned 16-byte load at 0x7f12... = buffer 'x' + 6 bytes in kernel K, block (0,0,0), thread (5,0,0)".
// Outside a launch the same checks (device buffers only) throw std::runtime_error.

namespace gpuopt_emu {
namespace detail {

// A checked load / store of one vector V (its size is the access's width).
template <typename V>
inline V checked_load(const void* p) {
  check_vector_access(p, sizeof(V), false);
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V>
inline void checked_store(void* p, const V& v) {
  check_vector_access(p, sizeof(V), true);
  std::memcpy(p, &v, sizeof(V));
}

}  // namespace detail
}  // namespace gpuopt_emu

inline uint4 gpuopt_emu_load16(const void* p) { return gpuopt_emu::detail::checked_load<uint4>(p); }
inline void gpuopt_emu_store16(void* p, const uint4& v) { gpuopt_emu::detail::checked_store(p, v); }
inline uint2 gpuopt_emu_load8(const void* p) { return gpuopt_emu::detail::checked_load<uint2>(p); }
inline void gpuopt_emu_store8(void* p, const uint2& v) { gpuopt_emu::detail::checked_store(p, v); }

namespace gpuopt_emu {

// ---------------------------------------------------------------------------------------------------------------
// 7. Device buffers: "device memory" with >= 256 guard bytes each side holding a canary pattern. The data
// pointer is congruent to `misalignment` modulo 256 (mirror a host pointer with `host_ptr % 256`). The data is
// poisoned with 0xFF unless filled from the host. While alive a buffer is registered: vector accesses are
// checked against it and its guards are checked after every launch ("kernel K wrote 4 bytes past the end of
// buffer 'out' (first bad byte at end+0, last at end+3)"); a reported guard is restored to the canary.
// Not copyable or movable (the registry holds its address); allocate with std::make_unique to pass around.

class DeviceBuffer {
 public:
  static constexpr size_t kGuardBytes = 512;  // before the data (plus the misalignment) and after it

  DeviceBuffer(std::string name, size_t bytes, size_t misalignment = 0);
  // bytes copied from `host`, the data pointer mirrors host % 256.
  DeviceBuffer(std::string name, const void* host, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* data_as() {
    return reinterpret_cast<T*>(data_);
  }
  template <typename T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  size_t misalignment() const { return misalignment_; }
  const std::string& name() const { return name_; }

  void copy_from_host(const void* src, size_t bytes, size_t offset = 0);  // bounds-checked (throws)
  void copy_to_host(void* dst, size_t bytes, size_t offset = 0) const;    // bounds-checked (throws)
  template <typename T>
  std::vector<T> to_vector() const {
    std::vector<T> out(bytes_ / sizeof(T));
    copy_to_host(out.data(), out.size() * sizeof(T));
    return out;
  }
  void fill(unsigned char byte);

  // "" when both guards hold the canary; else one line per corrupted guard (the wording of the launch error,
  // without the kernel). restore: rewrite the canary.
  std::string check_guards(bool restore);

 private:
  std::string name_;
  size_t bytes_;
  size_t misalignment_;
  unsigned char* raw_ = nullptr;   // allocation start (256-aligned)
  unsigned char* data_ = nullptr;  // raw_ + kGuardBytes + misalignment_
};

// ---------------------------------------------------------------------------------------------------------------
// 8. Launch. body() is executed once per emulated thread (it calls the kernel with its arguments). Before
// running it checks the configuration (any dim 0; > 1024 threads or > max_threads_per_block, the kernel's
// __launch_bounds__, <= 0 meaning none; block.x/y > 1024, block.z > 64; grid.x > 2^31-1, grid.y/z > 65535).
// Blocks run one at a time in linear order (x fastest), or reversed when GPUOPT_EMU_BLOCK_ORDER=reverse
// (read at every launch; "forward" or unset is the default, anything else is an error). The first error stops
// the launch; after the blocks all registered buffers' guards are checked; then launch throws
// std::runtime_error("gpuopt_emu: ..."). A C++ exception escaping the kernel is such an error too. Each emulated
// thread has a 256 KiB stack above 64 KiB of PROT_NONE; a fault the emulator cannot catch (a wild pointer, a
// stack overflow) prints "gpuopt_emu: fatal SIGSEGV ... in kernel K, block (b), thread (t)" to stderr before the
// previous handler (e.g. faulthandler) runs. Launches may run concurrently on different OS threads; a launch
// from inside a kernel is an error.

void launch(const char* kernel_name, dim3 grid, dim3 block, int max_threads_per_block,
            const std::function<void()>& body);
// The same with `dynamic_shared_bytes` of dynamic shared memory a block (the third <<<>>> parameter).
void launch(const char* kernel_name, dim3 grid, dim3 block, int max_threads_per_block, size_t dynamic_shared_bytes,
            const std::function<void()>& body);
// The same with the kernel's entry point recorded in the log (LaunchRecord::entry).
void launch(const char* kernel_name, dim3 grid, dim3 block, int max_threads_per_block, size_t dynamic_shared_bytes,
            const void* entry, const std::function<void()>& body);

// Plan-only mode (off by default; process-wide): launch() checks the configuration and records the launch in the
// log as always, and runs no thread. The host code that plans a launch runs unchanged, so its launches can be read
// for shapes no emulated run could afford (the performance model's 64M-element cases).
void set_plan_only(bool on);
bool plan_only();

// Copies args once (CUDA passes kernel arguments by value) and calls kernel(args...) in every thread.
template <typename Kernel, typename... Args>
void launch_kernel(const char* kernel_name, dim3 grid, dim3 block, int max_threads_per_block, Kernel&& kernel,
                   Args... args) {
  launch(kernel_name, grid, block, max_threads_per_block, [&]() { kernel(args...); });
}

// launch_kernel with dynamic shared memory.
template <typename Kernel, typename... Args>
void launch_kernel_shared(const char* kernel_name, dim3 grid, dim3 block, int max_threads_per_block,
                          size_t dynamic_shared_bytes, Kernel&& kernel, Args... args) {
  const void* entry = nullptr;
  if constexpr (std::is_pointer_v<std::decay_t<Kernel>>) entry = reinterpret_cast<const void*>(kernel);
  launch(kernel_name, grid, block, max_threads_per_block, dynamic_shared_bytes, entry, [&]() { kernel(args...); });
}

// GPUOPT_EMU_LAUNCH(kernel, grid, block, max_threads_per_block, args...): launch_kernel named after the kernel
// expression (wrap a template-id with commas in parentheses; launch() drops one enclosing pair from the name).
#define GPUOPT_EMU_LAUNCH(kernel, grid, block, max_threads_per_block, ...) \
  ::gpuopt_emu::launch_kernel(#kernel, grid, block, max_threads_per_block, kernel, ##__VA_ARGS__)

struct LaunchRecord {
  std::string kernel;
  dim3 grid;
  dim3 block;
  bool ok;                      // false: rejected or failed
  std::string error;            // the exception message when !ok
  size_t dynamic_shared = 0;    // dynamic shared memory a block, bytes
  const void* entry = nullptr;  // the kernel function launched (launch_kernel_shared of a function pointer)
};
std::vector<LaunchRecord> launch_log();  // every launch() call since the last clear, oldest first
uint64_t launch_count();                 // launch_log().size() without the copy
void clear_launch_log();

// ---------------------------------------------------------------------------------------------------------------
// 9. Errors. Inside an emulated thread: records the launch's first error as "<what> in kernel K, block (b),
// thread (t)", abandons the thread (its stack is not unwound) and returns to the scheduler; never returns.
// Outside a launch it throws std::runtime_error("gpuopt_emu: <what>").
[[noreturn]] void fail(const std::string& what);

bool in_emulated_thread();  // true inside a launch's kernel body
std::string describe_address(const void* p);  // "buffer 'x' + 6 bytes", "shared array 's' + 4 bytes", ...

}  // namespace gpuopt_emu

#pragma GCC visibility pop

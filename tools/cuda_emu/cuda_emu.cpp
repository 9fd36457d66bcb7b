// Implementation of tools/cuda_emu/cuda_emu.h: fibers, the per-block scheduler (barriers and warp ops resolved
// at quiescence), the shared-memory arena, device buffers with guard bytes, checked vector access, launches.
//
// Scheduling: a block's threads are fibers on the launching OS thread. The scheduler resumes every runnable
// fiber in linear order; each runs until it blocks (a barrier, a warp op), exits or fails. When none is
// runnable, complete warp-op groups are released (results computed from the posted values); when no warp op
// can complete, either every live thread waits at one __syncthreads (released) or the block is stuck (error).
// Nothing runs concurrently inside a launch, so results are deterministic.
//
// Context switch: a small x86-64 routine saving the callee-saved registers, MXCSR and the x87 control word
// (~10 ns); elsewhere, or with -DGPUOPT_EMU_UCONTEXT, ucontext's swapcontext. Exceptions never cross a switch:
// the fiber's entry function catches everything the kernel throws and turns it into a launch error.
#include "cuda_emu.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#if !defined(__x86_64__) && !defined(GPUOPT_EMU_UCONTEXT)
#define GPUOPT_EMU_UCONTEXT 1
#endif
#if defined(GPUOPT_EMU_UCONTEXT)
#include <ucontext.h>
#endif

#pragma GCC visibility push(hidden)

thread_local dim3 threadIdx{0, 0, 0};
thread_local dim3 blockIdx{0, 0, 0};
thread_local dim3 blockDim{0, 0, 0};
thread_local dim3 gridDim{0, 0, 0};

#if !defined(GPUOPT_EMU_UCONTEXT)
// void gpuopt_emu_switch(void** save_sp, void* load_sp): saves the callee-saved state on the current stack,
// stores the stack pointer in *save_sp, and resumes the context whose stack pointer is load_sp.
// gpuopt_emu_trampoline: first code of a fiber; calls r13(r12) (the entry never returns).
extern "C" void gpuopt_emu_switch(void** save_sp, void* load_sp);
extern "C" void gpuopt_emu_trampoline();
asm(R"(
  .text
  .p2align 4
  .globl gpuopt_emu_switch
  .hidden gpuopt_emu_switch
  .type gpuopt_emu_switch,@function
gpuopt_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gpuopt_emu_switch,.-gpuopt_emu_switch

  .p2align 4
  .globl gpuopt_emu_trampoline
  .hidden gpuopt_emu_trampoline
  .type gpuopt_emu_trampoline,@function
gpuopt_emu_trampoline:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size gpuopt_emu_trampoline,.-gpuopt_emu_trampoline
)");
#endif

namespace gpuopt_emu {
namespace detail {
namespace {

constexpr size_t kStackBytes = 256 * 1024;       // per fiber
constexpr size_t kStackGuardBytes = 64 * 1024;   // PROT_NONE below each fiber stack
constexpr size_t kSharedLimit = 48 * 1024;             // static shared memory of a block
constexpr size_t kBlockSharedLimit = 227 * 1024;       // static + dynamic of a block (sm_90's opt-in maximum)
constexpr size_t kArenaBytes = kSharedLimit + kBlockSharedLimit;  // static arrays, then the dynamic region
constexpr unsigned kMaxThreads = 1024;

enum class FState : unsigned char { runnable, at_barrier, at_warp, exited, failed };

struct Fiber {
#if defined(GPUOPT_EMU_UCONTEXT)
  ucontext_t ctx;
#else
  void* sp = nullptr;
#endif
  unsigned char* stack_lo = nullptr;
  unsigned char* stack_hi = nullptr;
  dim3 tid;
  unsigned linear = 0;
  FState state = FState::runnable;
  // posted at a barrier
  BarrierOp bop = BarrierOp::sync;
  int bpred = 0;
  int bresult = 0;
  unsigned bline = 0;
  const char* bfile = "";
  // posted at a warp op
  WarpOp wop = WarpOp::syncwarp;
  unsigned wmask = 0;
  int warg = 0;
  int wwidth = 32;
  unsigned wsize = 0;
  unsigned wline = 0;
  const char* wfile = "";
  uint64_t wvalue = 0;
  uint64_t wresult = 0;
};

struct SharedAlloc {
  const SharedSite* site;
  size_t offset;
  size_t bytes;
};

struct BufferRange {
  uintptr_t start, end;
};

struct LaunchState {
  const char* kernel = "";
  dim3 grid, block, cur_block;
  unsigned nthreads = 0;
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
#if defined(GPUOPT_EMU_UCONTEXT)
  ucontext_t sched_ctx;
#else
  void* sched_sp = nullptr;
#endif
  bool failed = false;
  std::string error;
  unsigned at_warp = 0;
  unsigned char* arena = nullptr;  // kArenaBytes, 256-aligned: static arrays from 0, dynamic memory from kSharedLimit
  size_t arena_used = 0;
  size_t dynamic_bytes = 0;  // the launch's dynamic shared memory
  std::vector<SharedAlloc> allocs;
  std::vector<BufferRange> buffers;  // registered device buffers' data ranges at launch start, sorted
};

thread_local LaunchState* t_active = nullptr;

// ---------------------------------------------------------------------------------------------------------------
// Formatting.

std::string fmt_dim(const dim3& d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", d.x, d.y, d.z);
  return buf;
}

std::string fmt_ptr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(p));
  return buf;
}

std::string fmt_mask(unsigned m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", m);
  return buf;
}

std::string fmt_site(const char* file, unsigned line) { return std::string(file) + ":" + std::to_string(line); }

// "3", "96..127", "0..3, 8, 10..12" (at most 8 ranges, then ", ...").
std::string fmt_ranges(const std::vector<unsigned>& ids) {
  std::string out;
  size_t i = 0, ranges = 0;
  while (i < ids.size()) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (ranges == 8) {
      out += ", ...";
      break;
    }
    if (!out.empty()) out += ", ";
    out += std::to_string(ids[i]);
    if (j > i) out += ".." + std::to_string(ids[j]);
    ++ranges;
    i = j + 1;
  }
  return out;
}

const char* warp_op_name(WarpOp op) {
  switch (op) {
    case WarpOp::shfl_idx: return "__shfl_sync";
    case WarpOp::shfl_up: return "__shfl_up_sync";
    case WarpOp::shfl_down: return "__shfl_down_sync";
    case WarpOp::shfl_xor: return "__shfl_xor_sync";
    case WarpOp::ballot: return "__ballot_sync";
    case WarpOp::all: return "__all_sync";
    case WarpOp::any: return "__any_sync";
    case WarpOp::syncwarp: return "__syncwarp";
  }
  return "?";
}

const char* barrier_name(BarrierOp op) {
  switch (op) {
    case BarrierOp::sync: return "__syncthreads";
    case BarrierOp::count: return "__syncthreads_count";
    case BarrierOp::all: return "__syncthreads_and";
    case BarrierOp::any: return "__syncthreads_or";
  }
  return "?";
}

std::string describe_warp_wait(const Fiber& f) {
  std::string s = std::string(warp_op_name(f.wop)) + "(mask " + fmt_mask(f.wmask);
  if (f.wop != WarpOp::syncwarp && f.wop != WarpOp::ballot && f.wop != WarpOp::all && f.wop != WarpOp::any) {
    s += ", width " + std::to_string(f.wwidth) + ", " + std::to_string(f.wsize) + "-byte value";
  }
  return s + ") at " + fmt_site(f.wfile, f.wline);
}

std::string describe_barrier_wait(const Fiber& f) {
  return std::string(barrier_name(f.bop)) + " at " + fmt_site(f.bfile, f.bline);
}

std::string thread_label(const LaunchState& ls, const Fiber& f) {
  (void)ls;
  return "thread " + std::to_string(f.linear) + " " + fmt_dim(f.tid);
}

// ---------------------------------------------------------------------------------------------------------------
// Device-buffer registry (global: buffers may be created on one OS thread and used by launches on another).

struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, DeviceBuffer*> by_start;  // keyed by data start (unique: each has its own allocation)
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: buffers may outlive static destruction order
  return *r;
}

struct LogState {
  std::mutex mutex;
  std::vector<LaunchRecord> records;
};

LogState& log_state() {
  static LogState* s = new LogState();
  return *s;
}

void append_log(LaunchRecord rec) {
  LogState& s = log_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.records.push_back(std::move(rec));
}

// ---------------------------------------------------------------------------------------------------------------
// Fiber stacks: a per-OS-thread pool, grown on demand and reused by every launch of that thread.

struct StackPool {
  std::vector<unsigned char*> maps;  // each: kStackGuardBytes PROT_NONE + kStackBytes
  ~StackPool() {
    for (unsigned char* m : maps) munmap(m, kStackGuardBytes + kStackBytes);
  }
  void ensure(size_t n) {
    while (maps.size() < n) {
      void* m = mmap(nullptr, kStackGuardBytes + kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
      if (m == MAP_FAILED) throw std::runtime_error("gpuopt_emu: cannot allocate a fiber stack");
      // a stack overflow (even by a frame with large local arrays) faults instead of corrupting a neighbour
      mprotect(m, kStackGuardBytes, PROT_NONE);
      maps.push_back(static_cast<unsigned char*>(m));
    }
  }
  unsigned char* lo(size_t i) const { return maps[i] + kStackGuardBytes; }
  unsigned char* hi(size_t i) const { return maps[i] + kStackGuardBytes + kStackBytes; }
};

thread_local StackPool t_stacks;

struct ArenaHolder {
  unsigned char* p = static_cast<unsigned char*>(std::aligned_alloc(256, kArenaBytes));
  ~ArenaHolder() { std::free(p); }
};
thread_local ArenaHolder t_arena;

// ---------------------------------------------------------------------------------------------------------------
// Fatal signals. A wild access far outside every guard, or a fiber stack overflow (the PROT_NONE page below each
// stack), cannot be turned into a launch error; the handler prints the kernel / block / thread of the faulting
// emulated thread to stderr, reinstalls the previous handler (e.g. Python's faulthandler) and lets the fault
// happen again under it. It runs on an alternate signal stack, which a launching thread gets if it has none.

struct sigaction g_old_segv, g_old_bus;
std::once_flag g_signal_once;

void fatal_signal_handler(int sig, siginfo_t* info, void*) {
  LaunchState* ls = t_active;
  const Fiber* f = ls ? ls->current : nullptr;
  if (f) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(f->stack_lo);
    const bool overflow = a < lo && a + kStackGuardBytes >= lo;
    char buf[768];
    const int n = std::snprintf(buf, sizeof buf,
                                "gpuopt_emu: fatal %s at address %p in kernel %s, block (%u,%u,%u), "
                                "thread (%u,%u,%u)%s\n",
                                sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", info->si_addr, ls->kernel, ls->cur_block.x,
                                ls->cur_block.y, ls->cur_block.z, f->tid.x, f->tid.y, f->tid.z,
                                overflow ? ": stack overflow (an emulated thread has 256 KiB of stack)" : "");
    if (n > 0) {
      ssize_t ignored = write(2, buf, static_cast<size_t>(std::min<int>(n, sizeof buf - 1)));
      (void)ignored;
    }
  }
  sigaction(sig, sig == SIGSEGV ? &g_old_segv : &g_old_bus, nullptr);
  if (info->si_code <= 0) raise(sig);  // sent by kill(): returning would not fault again
}

void install_fatal_signal_handlers() {
  std::call_once(g_signal_once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fatal_signal_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
  });
  thread_local bool has_alt_stack = false;
  if (!has_alt_stack) {
    stack_t cur;
    if (sigaltstack(nullptr, &cur) == 0 && (cur.ss_flags & SS_DISABLE)) {
      stack_t ss;
      ss.ss_size = 64 * 1024;
      ss.ss_sp = std::malloc(ss.ss_size);  // never freed: it must outlive the thread's last signal
      ss.ss_flags = 0;
      if (ss.ss_sp) sigaltstack(&ss, nullptr);
    }
    has_alt_stack = true;
  }
}
thread_local LaunchState t_state;

// ---------------------------------------------------------------------------------------------------------------
// Context switching.

void fiber_main(Fiber* f);

#if defined(GPUOPT_EMU_UCONTEXT)
void fiber_main_uc() { fiber_main(t_active->current); }

void init_context(LaunchState& ls, Fiber& f) {
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack_lo;
  f.ctx.uc_stack.ss_size = static_cast<size_t>(f.stack_hi - f.stack_lo);
  f.ctx.uc_link = &ls.sched_ctx;
  makecontext(&f.ctx, fiber_main_uc, 0);
}

inline void switch_to_fiber(LaunchState& ls, Fiber& f) { swapcontext(&ls.sched_ctx, &f.ctx); }
inline void switch_to_scheduler(LaunchState& ls, Fiber& f) { swapcontext(&f.ctx, &ls.sched_ctx); }
#else
void fiber_entry(void* arg) { fiber_main(static_cast<Fiber*>(arg)); }

void init_context(LaunchState&, Fiber& f) {
  const uintptr_t top = reinterpret_cast<uintptr_t>(f.stack_hi) & ~uintptr_t(15);
  const uintptr_t x = top - 16;  // rsp after the first `ret` (16-aligned, so the trampoline's call is ABI-correct)
  uint64_t* sp = reinterpret_cast<uint64_t*>(x - 72);
  uint32_t mxcsr = __builtin_ia32_stmxcsr();
  uint16_t fcw = 0;
  asm volatile("fnstcw %0" : "=m"(fcw));
  std::memset(sp, 0, 80);
  std::memcpy(sp, &mxcsr, 4);
  std::memcpy(reinterpret_cast<unsigned char*>(sp) + 4, &fcw, 2);
  sp[4] = reinterpret_cast<uint64_t>(&fiber_entry);  // r13
  sp[5] = reinterpret_cast<uint64_t>(&f);            // r12
  sp[8] = reinterpret_cast<uint64_t>(&gpuopt_emu_trampoline);
  f.sp = sp;
}

inline void switch_to_fiber(LaunchState& ls, Fiber& f) { gpuopt_emu_switch(&ls.sched_sp, f.sp); }
inline void switch_to_scheduler(LaunchState& ls, Fiber& f) { gpuopt_emu_switch(&f.sp, ls.sched_sp); }
#endif

// The current emulated thread, or nullptr on the host.
inline Fiber* current_fiber() {
  LaunchState* ls = t_active;
  return ls ? ls->current : nullptr;
}

void record_error(LaunchState& ls, const std::string& message) {
  if (!ls.failed) {
    ls.failed = true;
    ls.error = message;
  }
}

// Blocks the calling fiber (its state already set) until the scheduler resumes it.
inline void yield(LaunchState& ls, Fiber& f) {
  switch_to_scheduler(ls, f);
  // threadIdx was set by the scheduler before this resume
}

void fiber_main(Fiber* f) {
  LaunchState& ls = *t_active;
  std::string thrown;
  bool threw = false;
  try {
    (*ls.body)();
  } catch (const std::exception& e) {
    thrown = e.what();
    threw = true;
  } catch (...) {
    thrown = "(not a std::exception)";
    threw = true;
  }
  // outside the handler: fail() switches away for good, so no exception may be in flight or being handled
  if (threw) fail("uncaught C++ exception: " + thrown);
  f->state = FState::exited;
  switch_to_scheduler(ls, *f);
  std::abort();  // an exited fiber is never resumed
}

// ---------------------------------------------------------------------------------------------------------------
// Resolution at quiescence.

// PTX shfl.sync source lane: segmask = (32 - width) selects the segment; out-of-segment up/down/xor read own.
unsigned shuffle_source(WarpOp op, unsigned lane, int arg, int width) {
  const unsigned segmask = static_cast<unsigned>(32 - width) & 31u;
  const unsigned b = static_cast<unsigned>(arg) & 31u;
  const int seg_start = static_cast<int>(lane & segmask);
  const int seg_end = static_cast<int>((lane & segmask) | (31u & ~segmask));
  int j = static_cast<int>(lane);
  bool ok = true;
  switch (op) {
    case WarpOp::shfl_idx:
      j = seg_start | static_cast<int>(b & ~segmask);
      break;
    case WarpOp::shfl_up:
      j = static_cast<int>(lane) - static_cast<int>(b);
      ok = j >= seg_start;
      break;
    case WarpOp::shfl_down:
      j = static_cast<int>(lane + b);
      ok = j <= seg_end;
      break;
    case WarpOp::shfl_xor:
      j = static_cast<int>(lane ^ b);
      ok = j <= seg_end;
      break;
    default:
      break;
  }
  return ok ? static_cast<unsigned>(j) : lane;
}

bool same_warp_op(const Fiber& a, const Fiber& b) {
  return a.wop == b.wop && a.wmask == b.wmask && a.wwidth == b.wwidth && a.wsize == b.wsize;
}

// Releases every complete warp-op group; returns whether any was released. Sets ls.failed on a bad shuffle.
bool resolve_warps(LaunchState& ls) {
  bool progress = false;
  const unsigned n = ls.nthreads;
  for (unsigned base = 0; base < n; base += 32) {
    Fiber* w = &ls.fibers[base];
    const unsigned lanes = std::min(32u, n - base);
    for (unsigned l = 0; l < lanes; ++l) {
      Fiber& f = w[l];
      if (f.state != FState::at_warp) continue;
      const unsigned mask = f.wmask;
      bool complete = true;
      for (unsigned m = mask; m; m &= m - 1) {
        const Fiber& g = w[__builtin_ctz(m)];
        if (g.state != FState::at_warp || !same_warp_op(f, g)) {
          complete = false;
          break;
        }
      }
      if (!complete) continue;
      switch (f.wop) {
        case WarpOp::shfl_idx:
        case WarpOp::shfl_up:
        case WarpOp::shfl_down:
        case WarpOp::shfl_xor:
          for (unsigned m = mask; m; m &= m - 1) {
            const unsigned lane = static_cast<unsigned>(__builtin_ctz(m));
            Fiber& g = w[lane];
            const unsigned src = shuffle_source(g.wop, lane, g.warg, g.wwidth);
            if (!((mask >> src) & 1u)) {
              record_error(ls, std::string(warp_op_name(g.wop)) + " at " + fmt_site(g.wfile, g.wline) +
                                   " in block " + fmt_dim(ls.cur_block) + ": lane " + std::to_string(lane) +
                                   " (" + thread_label(ls, g) + ") reads lane " + std::to_string(src) +
                                   ", which is not in the mask " + fmt_mask(mask) + " in kernel " + ls.kernel);
              return false;
            }
            g.wresult = w[src].wvalue;
          }
          break;
        case WarpOp::ballot:
        case WarpOp::all:
        case WarpOp::any: {
          unsigned bits = 0;
          for (unsigned m = mask; m; m &= m - 1) {
            const unsigned lane = static_cast<unsigned>(__builtin_ctz(m));
            if (w[lane].wvalue) bits |= 1u << lane;
          }
          const uint64_t r = f.wop == WarpOp::ballot ? bits : f.wop == WarpOp::all ? (bits == mask) : (bits != 0);
          for (unsigned m = mask; m; m &= m - 1) w[__builtin_ctz(m)].wresult = r;
          break;
        }
        case WarpOp::syncwarp:
          break;
      }
      for (unsigned m = mask; m; m &= m - 1) w[__builtin_ctz(m)].state = FState::runnable;
      ls.at_warp -= static_cast<unsigned>(__builtin_popcount(mask));
      progress = true;
    }
  }
  return progress;
}

// No warp op can complete: explain the first stuck one.
void diagnose_warps(LaunchState& ls) {
  const unsigned n = ls.nthreads;
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = ls.fibers[i];
    if (f.state != FState::at_warp) continue;
    const unsigned base = i & ~31u;
    Fiber* w = &ls.fibers[base];
    const std::string where = " in block " + fmt_dim(ls.cur_block) + ", warp " + std::to_string(base / 32);
    const std::string who = "lane " + std::to_string(i - base) + " (" + thread_label(ls, f) + ") waits at " +
                            describe_warp_wait(f);
    std::vector<unsigned> exited;
    for (unsigned m = f.wmask; m; m &= m - 1) {
      const unsigned lane = static_cast<unsigned>(__builtin_ctz(m));
      if (w[lane].state == FState::exited || w[lane].state == FState::failed) exited.push_back(lane);
    }
    if (!exited.empty()) {
      std::vector<unsigned> tids;
      for (unsigned lane : exited) tids.push_back(base + lane);
      record_error(ls, describe_warp_wait(f) + " never completes" + where + ": lane" +
                           (exited.size() > 1 ? "s " : " ") + fmt_ranges(exited) + " (thread" +
                           (exited.size() > 1 ? "s " : " ") + fmt_ranges(tids) +
                           ") named in the mask exited without arriving in kernel " + ls.kernel);
      return;
    }
    for (unsigned m = f.wmask; m; m &= m - 1) {
      const unsigned lane = static_cast<unsigned>(__builtin_ctz(m));
      const Fiber& g = w[lane];
      if (g.state == FState::at_barrier) {
        record_error(ls, "deadlock" + where + ": " + who + ", but lane " + std::to_string(lane) + " (" +
                             thread_label(ls, g) + ") named in its mask waits at " + describe_barrier_wait(g) +
                             " in kernel " + ls.kernel);
        return;
      }
    }
    for (unsigned m = f.wmask; m; m &= m - 1) {
      const unsigned lane = static_cast<unsigned>(__builtin_ctz(m));
      const Fiber& g = w[lane];
      if (g.state == FState::at_warp && !same_warp_op(f, g)) {
        record_error(ls, "mismatched warp operations" + where + ": " + who + ", but lane " +
                             std::to_string(lane) + " (" + thread_label(ls, g) + ") named in its mask waits at " +
                             describe_warp_wait(g) + " in kernel " + ls.kernel);
        return;
      }
    }
  }
  record_error(ls, std::string("internal error: stuck warp operations in block ") + fmt_dim(ls.cur_block) +
                       " in kernel " + ls.kernel);
}

bool same_site(const Fiber& a, const Fiber& b) {
  return a.bline == b.bline && a.bop == b.bop && (a.bfile == b.bfile || std::strcmp(a.bfile, b.bfile) == 0);
}

// Every live fiber waits at a barrier or has exited (none at a warp op). Returns false when the block is done.
bool resolve_barrier(LaunchState& ls) {
  const unsigned n = ls.nthreads;
  std::vector<unsigned> exited;
  const Fiber* first = nullptr;
  unsigned waiting = 0;
  bool divergent = false;
  for (unsigned i = 0; i < n; ++i) {
    const Fiber& f = ls.fibers[i];
    if (f.state == FState::at_barrier) {
      ++waiting;
      if (!first) first = &f;
      else if (!same_site(*first, f)) divergent = true;
    } else {
      exited.push_back(i);
    }
  }
  if (waiting == 0) return false;
  if (!exited.empty()) {
    record_error(ls, describe_barrier_wait(*first) + " reached by " + std::to_string(waiting) + " of " +
                         std::to_string(n) + " threads of block " + fmt_dim(ls.cur_block) + "; thread" +
                         (exited.size() > 1 ? "s " : " ") + fmt_ranges(exited) + " exited" +
                         (divergent ? " (and the waiting threads wait at different barriers)" : "") +
                         " in kernel " + ls.kernel);
    return false;
  }
  if (divergent) {
    // group the waiting threads by call site, in order of first appearance
    std::vector<std::pair<const Fiber*, std::vector<unsigned>>> groups;
    for (unsigned i = 0; i < n; ++i) {
      const Fiber& f = ls.fibers[i];
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return same_site(*g.first, f); });
      if (it == groups.end()) groups.push_back({&f, {i}});
      else it->second.push_back(i);
    }
    std::string msg = "divergent barrier in block " + fmt_dim(ls.cur_block) + ": ";
    for (size_t g = 0; g < groups.size(); ++g) {
      if (g) msg += ", ";
      msg += std::string("thread") + (groups[g].second.size() > 1 ? "s " : " ") + fmt_ranges(groups[g].second) +
             " wait at " + describe_barrier_wait(*groups[g].first);
    }
    record_error(ls, msg + " in kernel " + ls.kernel);
    return false;
  }
  int count = 0;
  for (unsigned i = 0; i < n; ++i) count += ls.fibers[i].bpred != 0;
  const int result = first->bop == BarrierOp::count ? count
                     : first->bop == BarrierOp::all ? (count == static_cast<int>(n))
                     : first->bop == BarrierOp::any ? (count != 0)
                                                    : 0;
  for (unsigned i = 0; i < n; ++i) {
    ls.fibers[i].bresult = result;
    ls.fibers[i].state = FState::runnable;
  }
  return true;
}

// Runs one block to completion; false on error (ls.error set).
bool run_block(LaunchState& ls) {
  const unsigned n = ls.nthreads;
  std::memset(ls.arena, 0xFF, kSharedLimit + ls.dynamic_bytes);
  ls.arena_used = 0;
  ls.allocs.clear();
  ls.at_warp = 0;
  const dim3 b = ls.block;
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = ls.fibers[i];
    f.linear = i;
    f.tid = dim3(i % b.x, (i / b.x) % b.y, i / (b.x * b.y));
    f.state = FState::runnable;
    init_context(ls, f);
  }
  for (;;) {
    for (unsigned i = 0; i < n; ++i) {
      Fiber& f = ls.fibers[i];
      if (f.state != FState::runnable) continue;
      threadIdx = f.tid;
      ls.current = &f;
      switch_to_fiber(ls, f);
      ls.current = nullptr;
      if (ls.failed) return false;
    }
    if (ls.at_warp) {
      if (resolve_warps(ls)) continue;
      if (!ls.failed) diagnose_warps(ls);
      return false;
    }
    if (!resolve_barrier(ls)) return !ls.failed;
  }
}

std::string check_config(dim3 grid, dim3 block, int max_threads) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return "grid " + fmt_dim(grid) + " has a zero dimension";
  if (block.x == 0 || block.y == 0 || block.z == 0) return "block " + fmt_dim(block) + " has a zero dimension";
  if (block.x > 1024) return "block.x = " + std::to_string(block.x) + " > 1024";
  if (block.y > 1024) return "block.y = " + std::to_string(block.y) + " > 1024";
  if (block.z > 64) return "block.z = " + std::to_string(block.z) + " > 64";
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads > kMaxThreads) {
    return "block " + fmt_dim(block) + " has " + std::to_string(threads) + " threads > 1024 per block";
  }
  if (max_threads > 0 && threads > static_cast<uint64_t>(max_threads)) {
    return "block " + fmt_dim(block) + " has " + std::to_string(threads) +
           " threads > the kernel's __launch_bounds__ maximum of " + std::to_string(max_threads);
  }
  if (grid.x > 2147483647u) return "grid.x = " + std::to_string(grid.x) + " > 2147483647";
  if (grid.y > 65535) return "grid.y = " + std::to_string(grid.y) + " > 65535";
  if (grid.z > 65535) return "grid.z = " + std::to_string(grid.z) + " > 65535";
  return "";
}

// Guard check of every registered buffer (restoring the canary); "" when intact.
std::string check_all_guards(const std::string& kernel) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string out;
  for (auto& kv : r.by_start) {
    const std::string g = kv.second->check_guards(true);
    size_t pos = 0;
    while (pos < g.size()) {
      size_t nl = g.find('\n', pos);
      if (nl == std::string::npos) nl = g.size();
      if (!out.empty()) out += "; ";
      out += "kernel " + kernel + " " + g.substr(pos, nl - pos);
      pos = nl + 1;
    }
  }
  return out;
}

unsigned char canary(size_t k) {
  const unsigned char c = static_cast<unsigned char>((k * 0x9Du + 0x5Bu) ^ (k >> 8));
  return (c == 0x00 || c == 0xFF) ? 0xA5 : c;
}

// Describes p relative to registered buffers (lock held by the caller); "" when none is near.
std::string describe_in_buffers(uintptr_t a) {
  Registry& r = registry();
  auto it = r.by_start.upper_bound(a);
  // the candidate whose data starts at or below a, and the one starting after a (a may sit in its front guard)
  if (it != r.by_start.begin()) {
    const DeviceBuffer* b = std::prev(it)->second;
    const uintptr_t s = reinterpret_cast<uintptr_t>(b->data());
    const uintptr_t e = s + b->bytes();
    if (a < e) return "buffer '" + b->name() + "' + " + std::to_string(a - s) + " bytes";
    if (a < e + DeviceBuffer::kGuardBytes) {
      return std::to_string(a - e) + " bytes past the end of buffer '" + b->name() + "' (it has " +
             std::to_string(b->bytes()) + " bytes)";
    }
  }
  if (it != r.by_start.end()) {
    const DeviceBuffer* b = it->second;
    const uintptr_t s = reinterpret_cast<uintptr_t>(b->data());
    if (s - a <= DeviceBuffer::kGuardBytes + b->misalignment()) {
      return std::to_string(s - a) + " bytes before the start of buffer '" + b->name() + "'";
    }
  }
  return "";
}

std::string describe_impl(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return "a null pointer";
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    std::string s = describe_in_buffers(a);
    if (!s.empty()) return s;
  }
  LaunchState* ls = t_active;
  if (ls) {
    const uintptr_t arena = reinterpret_cast<uintptr_t>(ls->arena);
    if (a >= arena && a < arena + kSharedLimit) {
      for (const SharedAlloc& al : ls->allocs) {
        if (a >= arena + al.offset && a < arena + al.offset + al.bytes) {
          return std::string("shared array '") + al.site->name + "' + " + std::to_string(a - arena - al.offset) +
                 " bytes";
        }
      }
      return "shared memory + " + std::to_string(a - arena) + " bytes (outside every shared array)";
    }
    if (a >= arena + kSharedLimit && a < arena + kArenaBytes) {
      const size_t off = a - arena - kSharedLimit;
      return "dynamic shared memory + " + std::to_string(off) + " bytes" +
             (off < ls->dynamic_bytes ? "" : " (the launch gave " + std::to_string(ls->dynamic_bytes) + " bytes)");
    }
    for (const Fiber& f : ls->fibers) {
      if (a >= reinterpret_cast<uintptr_t>(f.stack_lo) && a < reinterpret_cast<uintptr_t>(f.stack_hi)) {
        return &f == ls->current ? std::string("the thread's own stack (local memory)")
                                 : "the stack of another thread (" + thread_label(*ls, f) + ")";
      }
    }
  }
  return "no device buffer, shared array or local memory";
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Kernel-side entry points.

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, unsigned value_size, int arg, int width, unsigned line,
                 const char* file) {
  LaunchState* ls = t_active;
  Fiber* f = ls ? ls->current : nullptr;
  if (!f) fail(std::string(warp_op_name(op)) + " at " + fmt_site(file, line) + " called outside a kernel");
  const unsigned lane = f->linear & 31u;
  const unsigned base = f->linear - lane;
  const unsigned lanes = std::min(32u, ls->nthreads - base);
  const unsigned existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
  const bool bad_width = width < 1 || width > 32 || (width & (width - 1)) != 0;
  if (!((mask >> lane) & 1u) || (mask & ~existing) || bad_width) {  // error paths only build strings
    const std::string call =
        std::string(warp_op_name(op)) + "(mask " + fmt_mask(mask) + ") at " + fmt_site(file, line);
    if (!((mask >> lane) & 1u)) fail(call + ": the calling lane " + std::to_string(lane) + " is not in its mask");
    if (mask & ~existing) {
      std::vector<unsigned> missing;
      for (unsigned l = lanes; l < 32; ++l) {
        if ((mask >> l) & 1u) missing.push_back(l);
      }
      fail(call + ": the mask names lanes " + fmt_ranges(missing) + ", which do not exist (warp " +
           std::to_string(base / 32) + " of a " + std::to_string(ls->nthreads) + "-thread block has " +
           std::to_string(lanes) + " lanes)");
    }
    fail(call + ": width " + std::to_string(width) + " is not a power of two in 1..32");
  }
  f->wop = op;
  f->wmask = mask;
  f->wvalue = value;
  f->wsize = value_size;
  f->warg = arg;
  f->wwidth = width;
  f->wline = line;
  f->wfile = file;
  f->state = FState::at_warp;
  ++ls->at_warp;
  yield(*ls, *f);
  return f->wresult;
}

int barrier(BarrierOp op, int pred, unsigned line, const char* file) {
  LaunchState* ls = t_active;
  Fiber* f = ls ? ls->current : nullptr;
  if (!f) fail(std::string(barrier_name(op)) + " at " + fmt_site(file, line) + " called outside a kernel");
  f->bop = op;
  f->bpred = pred;
  f->bline = line;
  f->bfile = file;
  f->state = FState::at_barrier;
  yield(*ls, *f);
  return f->bresult;
}

void* shared_array(const SharedSite* site, size_t bytes, size_t align) {
  LaunchState* ls = t_active;
  Fiber* f = ls ? ls->current : nullptr;
  auto decl = [site]() {
    return std::string("GPUOPT_SHARED_ARRAY(") + site->type + ", " + site->name + ", ...) at " +
           fmt_site(site->file, static_cast<unsigned>(site->line));
  };
  if (!f) fail(decl() + " executed outside a kernel");
  for (const SharedAlloc& a : ls->allocs) {
    if (a.site == site) {
      if (a.bytes != bytes) {
        fail(decl() + ": this thread declares " + std::to_string(bytes) + " bytes, but the block's array has " +
             std::to_string(a.bytes) + " bytes (every thread must declare the same size)");
      }
      return ls->arena + a.offset;
    }
  }
  const size_t al = std::max<size_t>(align, 16);
  if (al > 256) fail(decl() + ": alignment " + std::to_string(align) + " > 256 is not supported");
  const size_t offset = (ls->arena_used + al - 1) / al * al;
  if (offset + bytes > kSharedLimit || bytes > kSharedLimit) {
    fail("static shared memory of a block would be " + std::to_string(offset + bytes) +
         " bytes > 48 KiB (49152 bytes) at " + decl() + " (" + std::to_string(bytes) + " bytes)");
  }
  if (offset + bytes + ls->dynamic_bytes > kBlockSharedLimit) {
    fail("shared memory of a block would be " + std::to_string(offset + bytes) + " static + " +
         std::to_string(ls->dynamic_bytes) + " dynamic bytes > 227 KiB (232448 bytes) at " + decl());
  }
  ls->allocs.push_back(SharedAlloc{site, offset, bytes});
  ls->arena_used = offset + bytes;
  return ls->arena + offset;
}

void* dynamic_shared(const char* name, size_t align, unsigned line, const char* file) {
  LaunchState* ls = t_active;
  Fiber* f = ls ? ls->current : nullptr;
  auto decl = [&]() { return std::string("GPUOPT_DYNAMIC_SHARED(..., ") + name + ") at " + fmt_site(file, line); };
  if (!f) fail(decl() + " executed outside a kernel");
  if (ls->dynamic_bytes == 0) fail(decl() + ": the launch gave no dynamic shared memory");
  if (align > 16) fail(decl() + ": alignment " + std::to_string(align) + " > 16 is not supported");
  return ls->arena + kSharedLimit;
}

void check_vector_access(const void* p, size_t bytes, bool is_store) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  LaunchState* ls = t_active;
  Fiber* f = ls ? ls->current : nullptr;
  const bool aligned = a % bytes == 0;
  if (aligned && a != 0) {
    if (f) {
      // fast path: the launch's snapshot of device buffers, the block's shared arrays, the thread's stack
      const auto& v = ls->buffers;
      auto it = std::upper_bound(v.begin(), v.end(), a, [](uintptr_t x, const BufferRange& r) { return x < r.start; });
      if (it != v.begin() && a + bytes <= std::prev(it)->end) return;
      const uintptr_t arena = reinterpret_cast<uintptr_t>(ls->arena);
      if (a >= arena && a < arena + kSharedLimit) {
        for (const SharedAlloc& al : ls->allocs) {
          if (a >= arena + al.offset && a + bytes <= arena + al.offset + al.bytes) return;
        }
      } else if (a >= arena + kSharedLimit && a < arena + kArenaBytes) {
        if (a + bytes <= arena + kSharedLimit + ls->dynamic_bytes) return;
      } else if (a >= reinterpret_cast<uintptr_t>(f->stack_lo) &&
                 a + bytes <= reinterpret_cast<uintptr_t>(f->stack_hi)) {
        return;
      }
    }
    // slow path: buffers registered since the launch started (or a host-side call)
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.by_start.upper_bound(a);
    if (it != r.by_start.begin()) {
      const DeviceBuffer* b = std::prev(it)->second;
      if (a + bytes <= reinterpret_cast<uintptr_t>(b->data()) + b->bytes()) return;
    }
  }
  std::string what = std::to_string(bytes) + "-byte " + (is_store ? "store" : "load") + " at " + fmt_ptr(p) +
                     " = " + describe_impl(p);
  if (aligned && a != 0) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.by_start.upper_bound(a);
    if (it != r.by_start.begin()) {
      const DeviceBuffer* b = std::prev(it)->second;
      if (a < reinterpret_cast<uintptr_t>(b->data()) + b->bytes()) {
        what += " (the buffer has " + std::to_string(b->bytes()) + " bytes)";
      }
    }
  }
  fail((aligned ? "out-of-bounds " : "misaligned ") + what);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------------
// Public API.

using detail::FState;
using detail::LaunchState;

[[noreturn]] void fail(const std::string& what) {
  LaunchState* ls = detail::t_active;
  detail::Fiber* f = ls ? ls->current : nullptr;
  if (!f) throw std::runtime_error("gpuopt_emu: " + what);
  detail::record_error(*ls, what + " in kernel " + ls->kernel + ", block " + detail::fmt_dim(ls->cur_block) +
                                ", thread " + detail::fmt_dim(f->tid));
  f->state = FState::failed;
  detail::switch_to_scheduler(*ls, *f);
  std::abort();  // a failed fiber is never resumed
}

bool in_emulated_thread() { return detail::current_fiber() != nullptr; }

std::string describe_address(const void* p) { return detail::describe_impl(p); }

void launch(const char* kernel_name, dim3 grid, dim3 block, int max_threads_per_block,
            const std::function<void()>& body) {
  launch(kernel_name, grid, block, max_threads_per_block, 0, body);
}

void launch(const char* kernel_name, dim3 grid, dim3 block, int max_threads_per_block, size_t dynamic_shared_bytes,
            const std::function<void()>& body) {
  launch(kernel_name, grid, block, max_threads_per_block, dynamic_shared_bytes, nullptr, body);
}

namespace {
std::atomic<bool> g_plan_only{false};

// What makes a launch fail before any thread runs ("" if nothing); `reverse`: the blocks run last to first.
std::string launch_error(dim3 grid, dim3 block, int max_threads_per_block, size_t dynamic_shared_bytes,
                         const std::function<void()>& body, bool& reverse) {
  std::string err = detail::check_config(grid, block, max_threads_per_block);
  if (err.empty()) {
    const char* order = std::getenv("GPUOPT_EMU_BLOCK_ORDER");
    if (order && *order && std::strcmp(order, "forward") != 0) {
      if (std::strcmp(order, "reverse") == 0) reverse = true;
      else err = "GPUOPT_EMU_BLOCK_ORDER='" + std::string(order) + "' is neither 'forward' nor 'reverse'";
    }
  }
  if (err.empty() && dynamic_shared_bytes > detail::kBlockSharedLimit) {
    err = std::to_string(dynamic_shared_bytes) + " bytes of dynamic shared memory > 227 KiB (232448 bytes) a block";
  }
  if (err.empty() && !body) err = "empty kernel body";
  return err;
}
}  // namespace

void set_plan_only(bool on) { g_plan_only = on; }

bool plan_only() { return g_plan_only; }

void launch(const char* kernel_name, dim3 grid, dim3 block, int max_threads_per_block, size_t dynamic_shared_bytes,
            const void* entry, const std::function<void()>& body) {
  std::string name = kernel_name ? kernel_name : "<unnamed>";
  if (name.size() > 2 && name.front() == '(' && name.back() == ')') name = name.substr(1, name.size() - 2);
  if (detail::current_fiber()) {
    fail("launch of kernel " + name + " from inside a kernel (dynamic parallelism) is not supported");
  }
  LaunchRecord rec{name, grid, block, false, "", dynamic_shared_bytes, entry};
  bool reverse = false;
  const std::string err = launch_error(grid, block, max_threads_per_block, dynamic_shared_bytes, body, reverse);
  if (!err.empty()) {
    rec.error = "gpuopt_emu: launch of kernel " + name + ": " + err;
    detail::append_log(rec);
    throw std::runtime_error(rec.error);
  }
  if (plan_only()) {
    rec.ok = true;
    detail::append_log(rec);
    return;
  }

  LaunchState& ls = detail::t_state;
  ls.kernel = name.c_str();
  ls.grid = grid;
  ls.block = block;
  ls.nthreads = block.x * block.y * block.z;
  ls.body = &body;
  ls.failed = false;
  ls.error.clear();
  ls.current = nullptr;
  ls.arena = detail::t_arena.p;
  ls.dynamic_bytes = dynamic_shared_bytes;
  detail::t_stacks.ensure(ls.nthreads);
  ls.fibers.resize(ls.nthreads);
  for (unsigned i = 0; i < ls.nthreads; ++i) {
    ls.fibers[i].stack_lo = detail::t_stacks.lo(i);
    ls.fibers[i].stack_hi = detail::t_stacks.hi(i);
  }
  {
    detail::Registry& r = detail::registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    ls.buffers.clear();
    for (auto& kv : r.by_start) ls.buffers.push_back({kv.first, kv.first + kv.second->bytes()});
  }

  detail::install_fatal_signal_handlers();
  gridDim = grid;
  blockDim = block;
  detail::t_active = &ls;
  const uint64_t gx = grid.x, gy = grid.y, total = gx * gy * grid.z;
  for (uint64_t k = 0; k < total; ++k) {
    const uint64_t id = reverse ? total - 1 - k : k;
    ls.cur_block = dim3(static_cast<unsigned>(id % gx), static_cast<unsigned>((id / gx) % gy),
                        static_cast<unsigned>(id / (gx * gy)));
    blockIdx = ls.cur_block;
    if (!detail::run_block(ls)) break;
  }
  detail::t_active = nullptr;
  ls.body = nullptr;
  ls.allocs.clear();

  const std::string guards = detail::check_all_guards(name);
  std::string msg;
  if (ls.failed) msg = ls.error + (guards.empty() ? "" : "; also " + guards);
  else msg = guards;
  rec.ok = msg.empty();
  if (!rec.ok) rec.error = "gpuopt_emu: " + msg;
  detail::append_log(rec);
  if (!rec.ok) throw std::runtime_error(rec.error);
}

std::vector<LaunchRecord> launch_log() {
  detail::LogState& s = detail::log_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.records;
}

uint64_t launch_count() {
  detail::LogState& s = detail::log_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.records.size();
}

void clear_launch_log() {
  detail::LogState& s = detail::log_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.records.clear();
}

// ---------------------------------------------------------------------------------------------------------------
// DeviceBuffer.

DeviceBuffer::DeviceBuffer(std::string name, size_t bytes, size_t misalignment)
    : name_(std::move(name)), bytes_(bytes), misalignment_(misalignment % 256) {
  const size_t total = (kGuardBytes + misalignment_ + bytes_ + kGuardBytes + 255) / 256 * 256;
  raw_ = static_cast<unsigned char*>(std::aligned_alloc(256, total));
  if (!raw_) throw std::runtime_error("gpuopt_emu: cannot allocate device buffer '" + name_ + "'");
  data_ = raw_ + kGuardBytes + misalignment_;
  std::memset(data_, 0xFF, bytes_);
  for (size_t k = 0; k < kGuardBytes + misalignment_; ++k) raw_[k] = detail::canary(k);
  for (size_t k = kGuardBytes + misalignment_ + bytes_; k < kGuardBytes + misalignment_ + bytes_ + kGuardBytes; ++k) {
    raw_[k] = detail::canary(k);
  }
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.by_start[reinterpret_cast<uintptr_t>(data_)] = this;
}

DeviceBuffer::DeviceBuffer(std::string name, const void* host, size_t bytes)
    : DeviceBuffer(std::move(name), bytes, reinterpret_cast<uintptr_t>(host) % 256) {
  copy_from_host(host, bytes);
}

DeviceBuffer::~DeviceBuffer() {
  {
    detail::Registry& r = detail::registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.by_start.erase(reinterpret_cast<uintptr_t>(data_));
  }
  std::free(raw_);
}

void DeviceBuffer::copy_from_host(const void* src, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    throw std::runtime_error("gpuopt_emu: copy of " + std::to_string(bytes) + " bytes into buffer '" + name_ +
                             "' at offset " + std::to_string(offset) + " overruns its " + std::to_string(bytes_) +
                             " bytes");
  }
  if (bytes) std::memcpy(data_ + offset, src, bytes);
}

void DeviceBuffer::copy_to_host(void* dst, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    throw std::runtime_error("gpuopt_emu: copy of " + std::to_string(bytes) + " bytes out of buffer '" + name_ +
                             "' at offset " + std::to_string(offset) + " overruns its " + std::to_string(bytes_) +
                             " bytes");
  }
  if (bytes) std::memcpy(dst, data_ + offset, bytes);
}

void DeviceBuffer::fill(unsigned char byte) { std::memset(data_, byte, bytes_); }

std::string DeviceBuffer::check_guards(bool restore) {
  const size_t front = kGuardBytes + misalignment_;
  const size_t back_start = front + bytes_;
  std::string out;
  // front guard [0, front): report relative to the data start
  size_t lo = front, hi = 0;
  for (size_t k = 0; k < front; ++k) {
    if (raw_[k] != detail::canary(k)) {
      lo = std::min(lo, k);
      hi = k;
    }
  }
  if (lo < front) {
    out += "wrote " + std::to_string(hi - lo + 1) + " bytes before the start of buffer '" + name_ +
           "' (first bad byte at start-" + std::to_string(front - lo) + ", last at start-" +
           std::to_string(front - hi) + ")";
  }
  lo = SIZE_MAX;
  hi = 0;
  for (size_t k = back_start; k < back_start + kGuardBytes; ++k) {
    if (raw_[k] != detail::canary(k)) {
      lo = std::min(lo, k);
      hi = k;
    }
  }
  if (lo != SIZE_MAX) {
    if (!out.empty()) out += "\n";
    out += "wrote " + std::to_string(hi - lo + 1) + " bytes past the end of buffer '" + name_ +
           "' (first bad byte at end+" + std::to_string(lo - back_start) + ", last at end+" +
           std::to_string(hi - back_start) + ")";
  }
  if (restore) {
    for (size_t k = 0; k < front; ++k) raw_[k] = detail::canary(k);
    for (size_t k = back_start; k < back_start + kGuardBytes; ++k) raw_[k] = detail::canary(k);
  }
  return out;
}

}  // namespace gpuopt_emu

void __syncthreads(unsigned line, const char* file) {
  gpuopt_emu::detail::barrier(gpuopt_emu::detail::BarrierOp::sync, 0, line, file);
}

#pragma GCC visibility pop

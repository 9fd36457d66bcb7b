// Launch configuration of every CUDA kernel: a pure host function of (shape, element size, device facts), used
// by the real launcher (csrc/cuda/*.cu) and by the CPU emulation of the CUDA execution model
// (tools/cuda_emu), so the emulated tests run the very grids and block shapes a GPU gets. No CUDA, no ATen.
//
// Work unit: a group of 8 consecutive elements of a row (one Philox call when N % 8 == 0; one or more 16-byte
// vectors). Paths:
//   rows    a row lives in registers as VPT groups per thread: one warp per row (blockDim (32, 4): four rows a
//           block, no barrier) while 32 lanes x max VPT groups cover it (N <= 1024 forward, 512 backward), else
//           one row a block of ceil(groups / VPT) threads (forward: 4 groups a thread (3, or 2 for fp32 x or
//           parameters, see plan_norm_rows), N <= 16384; backward: 4 (or 2), N <= 8192; fp64 less). The forward
//           reads x once; the backward reads x and grad_out once and keeps its columns' dgamma / dbeta in
//           registers across the rows of a persistent, one-wave grid.
//   wide    the backward at 8192 < N <= 18432 (16-bit and fp32 x, the 16-byte path): a row a block of up to 384
//           threads, 6, 4 or 3 groups a thread; the dgamma / dbeta sums and the row's dxhat live in dynamic
//           shared memory (12 bytes a column slot and 16 a thread: 203.5 KiB at N = 16384), where the device
//           allows that much a block (else looped). It reads x and grad_out once, as the rows path.
//           Rows and wide: a row's loads all issue before its math. Weight and bias are loaded once a thread where
//           its registers hold them (hold_params, norm_common.cuh).
//   looped  longer rows: the forward reads x three times (sum, centred squares, output; the re-reads come
//           mostly from L2); the backward runs a row kernel (the two row means of the grad_x formula) and a
//           tiled kernel (grad_x and dgamma / dbeta partials).
//   tiled   2-D blocks (TX groups across, TY rows down, 256 threads) sweeping rows with a grid stride: the
//           bias-ReLU kernels and the looped backward.
// Column sums (dgamma, dbeta, dbias) are deterministic: G partial rows (one per block), then one 32 x 32-thread
// stage-2 launch that adds them in a fixed order. G depends only on (M, N, dtypes, device), never on timing.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace gpuopt {
namespace cuda {

// The one definition of these, for the host and (constexpr, nvcc's --expt-relaxed-constexpr) the kernels.
constexpr int kGroup = 8;  // elements per group: one Philox call, one or more 16-byte vectors
constexpr int kWarpSize = 32;
constexpr int kMaxGridY = 65535;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// ------------------------------------------------------------------------------------------- per-kernel bounds
// Max threads per block of each kernel: its __launch_bounds__, so ptxas keeps it within registers / thread =
// 65536 / max threads (no spills: the static CUDA gate, tools/cuda_resources.py, checks the built binary), and
// the launcher never asks for more. elem = sizeof(x's dtype). The rows kernels are compiled separately for one
// warp a row (blockDim (32, 4): 128 threads, so up to 255 registers) and one block a row.
constexpr int norm_rows_forward_max_threads(bool warp_row, int elem) { return warp_row || elem > 4 ? 128 : 512; }
// Rows of x a forward rows kernel of layer_norm_dropout_relu keeps in flight ahead of the row it reduces: the row
// loop is a software pipeline, a row's loads issue that many rows before its math (norm_rows_forward.cuh,
// norm_forward_rows). One warp a row with 16-bit x: 2 (at VPT 4: 12 warps an SM, 4 KB of x in flight a warp, 48 KB
// an SM); 16-bit block rows and fp32: 1, within their register budgets (a block row at most 128 registers at 512
// threads, no spills); fp64: 0, the loads start each row (a row ahead spills at VPT 4).
constexpr int nd_rows_ahead(bool warp_row, int elem) { return elem == 8 ? 0 : (warp_row && elem == 2 ? 2 : 1); }
// The backward holds its groups' xhat, dxhat (fp32) and dgamma / dbeta sums, 32 registers a group, plus the
// weight, bias and the dropout key schedule: more than 128 registers a thread (512 threads) at two groups, so
// one block a row has at most 256 threads (255 registers a thread).
constexpr int norm_rows_backward_max_threads(bool warp_row, int elem) { return warp_row || elem == 8 ? 128 : 256; }
constexpr int kLoopedThreads = 512;  // nd_forward_looped_kernel, nd_backward_row_stats_kernel
// nd_backward_wide_kernel, dan_backward_wide_kernel: 12 warps, 3 on each of an SM's 4 schedulers, so 168
// registers a thread (13 to 16 warps would leave 128)
constexpr int kWideThreads = 384;
// Static shared memory the wide kernels may use next to their dynamic memory (their row-sum scratch: 512 bytes).
constexpr int64_t kWideStaticShared = 1024;
// Dynamic shared memory of a wide backward block: dgamma and dbeta (fp32) of each thread's VPT groups, the row's
// dxhat, and 16 bytes of padding a thread (norm_rows_backward.cuh, wide_slot): 6 VPT + 1 slots of 16 bytes a thread.
constexpr int wide_slots(int vpt) { return 6 * vpt + 1; }
constexpr int64_t wide_backward_shared(int vpt, int threads) { return int64_t(threads) * wide_slots(vpt) * 16; }
constexpr int kTiledThreads = 256;  // tiled kernels
constexpr int kColumnSumTile = 32;  // column_sum_kernel: 32 x 32 threads

// dropout_add_norm's rows kernels take layer_norm_dropout_relu's bounds and plans at the element size of the
// wider of x and the stored sum (fp32 with residual_in_fp32): its rows hold both.
constexpr int dan_elem(int x_elem, int sum_elem) { return x_elem > sum_elem ? x_elem : sum_elem; }
// Except the wide backward at 6 groups a thread with 16-bit x, an fp32 sum and fp32 parameters: its registers
// hold neither the row's sum across the row sum nor more than one group of it read again after, which leaves
// too few bytes in flight (the performance model: 0.57 of copy speed at N = 16384, the looped kernels 0.69), so
// those rows take the looped path. The other wide plans at 6 groups with an fp32 sum read the whole row's sum
// again at once.
constexpr bool dan_wide_allowed(int vpt, int x_elem, int sum_elem, int param_elem) {
  return !(vpt == 6 && x_elem == 2 && sum_elem == 4 && param_elem == 4);
}

// Largest VPT (groups a thread) of one warp a row.
constexpr int norm_rows_max_vpt(bool backward) { return backward ? 2 : 4; }

// Device facts the plans need; the launcher caches them per device.
struct DeviceFacts {
  int sm_count = 1;
};

// A grid-stride split of `steps` work units over at most `max_blocks` blocks that is even: every block takes
// ceil(steps / blocks) or one unit fewer, and no block count above the fewest that need that many rounds.
inline int64_t balanced_grid(int64_t steps, int64_t max_blocks) {
  steps = std::max<int64_t>(steps, 1);
  max_blocks = std::max<int64_t>(max_blocks, 1);
  if (steps <= max_blocks) return steps;
  return ceil_div(steps, ceil_div(steps, max_blocks));
}

// One wave of a persistent grid: at most the blocks that fit on the device at once, evened out (balanced_grid).
inline int64_t persistent_grid(int64_t blocks_needed, int blocks_per_sm, int sm_count) {
  const int64_t resident = int64_t(std::max(blocks_per_sm, 1)) * std::max(sm_count, 1);
  return balanced_grid(blocks_needed, resident);
}

// ------------------------------------------------------------------------------------ layer_norm_dropout_relu
struct RowsPlan {
  bool rows = false;      // false: looped path
  bool warp_row = false;  // one warp a row (blockDim (32, 4)), else one block a row
  bool wide = false;      // the wide backward (a block a row, sums in dynamic shared memory)
  int64_t shared = 0;     // its dynamic shared memory a block
  int vpt = 0;            // groups per thread: 1 .. 4 (one warp a row: 1 or 2 in the backward)
  int threads_x = 0;      // threads per row (32 .. the kernel's bound)
  int rows_per_block = 1;
  int max_threads = 0;        // the kernel's launch bound
  int64_t blocks_needed = 0;  // blocks covering every row once
};

// groups = ceil(N / 8); thread t of a row takes groups t + k * T, k < VPT. One warp a row while its 32 lanes x
// max VPT groups cover it, VPT = ceil(groups / 32) (so exactly 3 groups a lane at N = 768). Longer rows take one
// block a row of T = ceil(groups / VPT) threads rounded to warps, up to the kernel's bound, with the first VPT of
// a list that fits the bound and keeps (VPT - 1) x T <= groups:
//   forward   4, else 3 (which always satisfies it there); with fp32 x or parameters (not fp64) 2 first, so a
//             thread's fp32 weight and bias fit its 128 registers next to its row (hold_params).
//   backward  of 4, 3 and 2 the one that leaves the fewest idle group slots (t x VPT - groups; ties: the
//             earlier), e.g. 3 at N = 768 (32 threads x 3 groups, none idle); a 256-thread bound: 255 registers
//             hold 4 groups' xhat, dxhat and dgamma / dbeta; fp64 and the scalar path (whose registers do not
//             hold 4 groups): 2 only.
// A backward row too long for 256 threads takes the wide kernel when vec, elem != 8 and its shared memory fits
// max_shared (the device's shared memory a block, less kWideStaticShared; 0: never): of VPT 3, 4 and 6 at up to
// 384 threads the one that leaves the fewest idle group slots (ties: the fewer groups a thread, so more warps),
// e.g. 3 x 352 threads at N = 8200, 4 x 384 at 12288, 6 x 352 at 16384.
// Every plan keeps (VPT - 1) x T <= groups, so only a thread's last group can lie past the row (the kernels test
// no other). elem / param_elem: sizeof of x's / the parameters' dtype; vec: the 16-byte vector path.
inline RowsPlan plan_norm_rows(int64_t M, int64_t N, int elem, int param_elem, bool backward, bool vec,
                               int64_t max_shared = 0) {
  RowsPlan p;
  const int64_t groups = ceil_div(N, kGroup);
  const int max_vpt = norm_rows_max_vpt(backward);
  if (groups <= int64_t(kWarpSize) * max_vpt) {
    p.vpt = static_cast<int>(ceil_div(groups, kWarpSize));
    p.threads_x = kWarpSize;
    p.rows_per_block = 4;
    p.warp_row = true;
  } else {
    const int bound =
        backward ? norm_rows_backward_max_threads(false, elem) : norm_rows_forward_max_threads(false, elem);
    static constexpr int kVpts[][3] = {{4, 3, 0}, {2, 4, 3}, {4, 3, 2}, {2, 0, 0}};
    const int* vpts = kVpts[0];
    if (!backward && elem != 8 && (elem == 4 || param_elem == 4)) vpts = kVpts[1];
    if (backward) vpts = elem == 8 || !vec ? kVpts[3] : kVpts[2];
    p.rows_per_block = 1;
    int64_t idle = 0;  // the backward takes the VPT that leaves the fewest idle group slots (t x VPT - groups)
    // Takes v groups a thread at t = ceil(groups / v) threads rounded to warps where t <= max_t, (v - 1) t <= groups
    // and `fits` holds, if it is the first such VPT or (fewest_idle) leaves fewer idle group slots.
    auto consider = [&](int v, int64_t max_t, bool fewest_idle, auto fits) {
      const int64_t t = round_up(ceil_div(groups, v), kWarpSize);
      if (t <= max_t && (v - 1) * t <= groups && fits(v, t) && (p.vpt == 0 || (fewest_idle && t * v - groups < idle))) {
        p.vpt = v;
        p.threads_x = static_cast<int>(t);
        idle = t * v - groups;
      }
    };
    for (int i = 0; i < 3 && vpts[i] != 0; ++i) consider(vpts[i], bound, backward, [](int, int64_t) { return true; });
    if (p.vpt == 0 && backward && vec && elem != 8) {
      for (int v : {3, 4, 6})
        consider(v, kWideThreads, true,
                 [&](int vv, int64_t t) { return wide_backward_shared(vv, int(t)) <= max_shared; });
      if (p.vpt != 0) {
        p.wide = true;
        p.shared = wide_backward_shared(p.vpt, p.threads_x);
        p.rows = true;
        p.max_threads = kWideThreads;
        p.blocks_needed = M;
        return p;
      }
    }
    if (p.vpt == 0) return RowsPlan{};  // looped
  }
  p.rows = true;
  p.max_threads =
      backward ? norm_rows_backward_max_threads(p.warp_row, elem) : norm_rows_forward_max_threads(p.warp_row, elem);
  p.blocks_needed = ceil_div(M, p.rows_per_block);
  return p;
}

// dropout_add_norm's backward plan: plan_norm_rows at dan_elem, except the wide plans dan_wide_allowed sends to
// the looped kernels (which dan_backward_rows therefore never instantiates).
inline RowsPlan plan_dan_backward(int64_t M, int64_t N, int x_elem, int sum_elem, int param_elem, int64_t max_shared) {
  const RowsPlan plan =
      plan_norm_rows(M, N, dan_elem(x_elem, sum_elem), param_elem, /*backward=*/true, true, max_shared);
  return plan.wide && !dan_wide_allowed(plan.vpt, x_elem, sum_elem, param_elem) ? RowsPlan{} : plan;
}

// Row stride of the (G, N) partial-sum buffers: a multiple of 8, so every group of partials is 16-byte aligned.
inline int64_t partial_stride(int64_t N) { return round_up(N, kGroup); }

// --------------------------------------------------------------------------------------------------- tiled
struct TilePlan {
  int tx = 0, ty = 0;      // blockDim: tx threads across (each one group of 8 columns), ty rows down
  int64_t col_tiles = 0;   // gridDim.x
  int64_t row_blocks = 0;  // gridDim.y: blocks down the rows (grid stride); also G of the column sums
};

// tx: a power of two <= 32 covering the row's groups; ty = 256 / tx. col_tiles x row_blocks <= one wave of
// `resident` blocks: row_blocks = resident / col_tiles rounded down (at least 1; rounding up would start a
// second, nearly empty wave), <= 65535, evened out over the row steps (balanced_grid). Where that grid is held
// by the residency and leaves more than 3 % of the wave idle, the fewest row blocks up to two waves whose
// (evened-out) grid fills its waves to >= 97 %, if any (N = 12288 on 264 slots: 48 tiles x 5 = 240 blocks leave
// 24 idle; 48 x 11 = 528 fill two waves).
inline TilePlan plan_tiled(int64_t M, int64_t N, int64_t resident) {
  TilePlan t;
  const int64_t groups = ceil_div(N, kGroup);
  t.tx = 1;
  while (t.tx < kWarpSize && t.tx < groups) t.tx *= 2;
  t.ty = kTiledThreads / t.tx;
  t.col_tiles = ceil_div(groups, t.tx);
  if (t.col_tiles > 2147483647LL)
    throw std::runtime_error("gpuopt: N = " + std::to_string(N) + " is too large for the CUDA grid");
  const int64_t steps = std::max<int64_t>(1, ceil_div(M, t.ty));
  resident = std::max<int64_t>(resident, 1);
  const int64_t per_wave = std::max<int64_t>(1, std::min<int64_t>(resident / t.col_tiles, int64_t(kMaxGridY)));
  t.row_blocks = balanced_grid(steps, per_wave);
  if (t.row_blocks == per_wave && t.col_tiles * per_wave * 100 < resident * 97) {
    const int64_t last = std::min<int64_t>(2 * resident / t.col_tiles, int64_t(kMaxGridY));
    for (int64_t rb = per_wave + 1; rb <= last; ++rb) {
      const int64_t rows = balanced_grid(steps, rb), blocks = t.col_tiles * rows;
      if (blocks * 100 >= ceil_div(blocks, resident) * resident * 97) {
        t.row_blocks = rows;
        break;
      }
    }
  }
  return t;
}

// Stage 2: ceil(N / (32 V)) x (number of sums) blocks of 32 x min(G, 32) threads, V columns a thread: one 16-byte
// vector of them (V = 4 in fp32, 2 in fp64) where that still gives every SM a block, else one column (V = 1),
// so that short rows keep their blocks (N = 768: 24 blocks a sum, not 6).
constexpr int column_sum_vec(int acc_elem) { return 16 / acc_elem; }
inline int column_sum_cols(int64_t N, int sums, int acc_elem, int sm_count) {
  const int v = column_sum_vec(acc_elem);
  return ceil_div(N, int64_t(kColumnSumTile) * v) * sums >= sm_count ? v : 1;
}
inline int64_t column_sum_blocks(int64_t N, int cols) { return ceil_div(N, int64_t(kColumnSumTile) * cols); }
inline unsigned column_sum_rows(int64_t G) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(G, kColumnSumTile)));
}

}  // namespace cuda
}  // namespace gpuopt

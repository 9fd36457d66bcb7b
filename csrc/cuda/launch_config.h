// Launch configuration of every CUDA kernel: a pure host function of (shape, element size, device facts), used
// by the real launcher (csrc/cuda/*.cu) and by the CPU emulation of the CUDA execution model
// (tools/cuda_emu), so the emulated tests run the very grids and block shapes a GPU gets. No CUDA, no ATen.
//
// Work unit: a group of 8 consecutive elements of a row (one Philox call when N % 8 == 0; one or more 16-byte
// vectors). Paths:
//   rows    a row lives in registers as VPT groups per thread: one warp per row (blockDim (32, 4): four rows a
//           block, no barrier) while 32 lanes x max VPT groups cover it (N <= 1024 forward, 512 backward), else
//           one row a block of ceil(groups / max VPT) threads (forward: 4 groups a thread, N <= 16384;
//           backward: 2, N <= 8192; fp64 less). The forward reads x once; the backward reads x and grad_out once
//           and keeps its columns' dgamma / dbeta in registers across the rows of a persistent, one-wave grid.
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

constexpr int kGroupSize = 8;
constexpr int kWarp = 32;
constexpr int kMaxGridY = 65535;

inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up64(int64_t a, int64_t b) { return ceil_div64(a, b) * b; }

// ------------------------------------------------------------------------------------------- per-kernel bounds
// Max threads per block of each kernel: its __launch_bounds__, so ptxas keeps it within registers / thread =
// 65536 / max threads (no spills: the static CUDA gate, tools/cuda_resources.py, checks the built binary), and
// the launcher never asks for more. elem = sizeof(x's dtype).
constexpr int ldr_rows_forward_max_threads(int vpt, int elem) { return vpt < 4 ? 128 : (elem <= 4 ? 512 : 128); }
// The backward holds x, grad_out and its columns' dgamma / dbeta: two groups a thread at <= 128 registers (512
// threads) is the most that fits without spilling; four groups need ~215 registers, one 8-warp block an SM.
constexpr int ldr_rows_backward_max_threads(int vpt, int elem) { return vpt < 2 || elem == 8 ? 128 : 512; }
constexpr int kLoopedThreads = 512;  // ldr_forward_looped_kernel, ldr_backward_row_stats_kernel
constexpr int kTiledThreads = 256;   // tiled kernels
constexpr int kColumnSumTile = 32;   // column_sum_kernel: 32 x 32 threads

// Largest VPT (groups a thread) of the rows path.
constexpr int ldr_rows_max_vpt(bool backward) { return backward ? 2 : 4; }

// Device facts the plans need; the launcher caches them per device.
struct DeviceFacts {
  int sm_count = 1;
};

// One wave of a persistent grid: at most the blocks that fit on the device at once.
inline int64_t persistent_grid(int64_t blocks_needed, int blocks_per_sm, int sm_count) {
  const int64_t resident = int64_t(std::max(blocks_per_sm, 1)) * std::max(sm_count, 1);
  return std::max<int64_t>(1, std::min(blocks_needed, resident));
}

// ------------------------------------------------------------------------------------ layer_norm_dropout_relu
struct RowsPlan {
  bool rows = false;  // false: looped path
  int vpt = 0;        // groups per thread (1, 2 or 4)
  int threads_x = 0;  // threads per row (32 .. max threads of vpt)
  int rows_per_block = 1;
  int max_threads = 0;        // the kernel's launch bound
  int64_t blocks_needed = 0;  // blocks covering every row once
};

// groups = ceil(N / 8). One warp a row while its 32 lanes x max VPT groups cover it; longer rows take max VPT
// groups a thread and ceil(groups / max VPT) threads (rounded to warps), up to the kernel's bound.
inline RowsPlan plan_ldr_rows(int64_t M, int64_t N, int elem, bool backward) {
  RowsPlan p;
  const int64_t groups = ceil_div64(N, kGroupSize);
  const int max_vpt = ldr_rows_max_vpt(backward);
  auto bound = [&](int vpt) {
    return backward ? ldr_rows_backward_max_threads(vpt, elem) : ldr_rows_forward_max_threads(vpt, elem);
  };
  if (groups <= int64_t(kWarp) * max_vpt) {
    const int64_t need = ceil_div64(groups, kWarp);
    p.vpt = need <= 1 ? 1 : (need <= 2 ? 2 : 4);
    p.threads_x = kWarp;
    p.rows_per_block = 4;
  } else {
    p.vpt = max_vpt;
    p.threads_x = static_cast<int>(std::min<int64_t>(round_up64(ceil_div64(groups, max_vpt), kWarp), 1 << 20));
    p.rows_per_block = 1;
    if (p.threads_x > bound(max_vpt)) return RowsPlan{};  // looped
  }
  p.rows = true;
  p.max_threads = bound(p.vpt);
  p.blocks_needed = ceil_div64(M, p.rows_per_block);
  return p;
}

// Row stride of the (G, N) partial-sum buffers: a multiple of 8, so every group of partials is 16-byte aligned.
inline int64_t partial_stride(int64_t N) { return round_up64(N, kGroupSize); }

// --------------------------------------------------------------------------------------------------- tiled
struct TilePlan {
  int tx = 0, ty = 0;      // blockDim: tx threads across (each one group of 8 columns), ty rows down
  int64_t col_tiles = 0;   // gridDim.x
  int64_t row_blocks = 0;  // gridDim.y: blocks down the rows (grid stride); also G of the column sums
};

// tx: a power of two <= 32 covering the row's groups; ty = 256 / tx. col_tiles x row_blocks ~ one wave of
// `resident` blocks, row_blocks <= 65535 and <= the row steps.
inline TilePlan plan_tiled(int64_t M, int64_t N, int64_t resident) {
  TilePlan t;
  const int64_t groups = ceil_div64(N, kGroupSize);
  t.tx = 1;
  while (t.tx < kWarp && t.tx < groups) t.tx *= 2;
  t.ty = kTiledThreads / t.tx;
  t.col_tiles = ceil_div64(groups, t.tx);
  if (t.col_tiles > 2147483647LL)
    throw std::runtime_error("gpuopt: N = " + std::to_string(N) + " is too large for the CUDA grid");
  const int64_t steps = std::max<int64_t>(1, ceil_div64(M, t.ty));
  t.row_blocks = std::max<int64_t>(
      1, std::min<int64_t>({ceil_div64(std::max<int64_t>(resident, 1), t.col_tiles), steps, int64_t(kMaxGridY)}));
  return t;
}

// Stage 2: ceil(N / 32) x (number of sums) blocks of 32 x 32 threads.
inline int64_t column_sum_blocks(int64_t N) { return ceil_div64(N, kColumnSumTile); }

}  // namespace cuda
}  // namespace gpuopt

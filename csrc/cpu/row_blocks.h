// Deterministic row reductions on the CPU: rows are split into a fixed number of blocks that depends on M only,
// each block sums its rows in order into its own partial row, and the partials are summed in block order, so
// the bits do not depend on the number of threads.
#pragma once
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace gpuopt {

// Up to 64 blocks of at least 16 rows (fewer rows per block would make the partial rows, zeroed and summed once
// per call, a sizeable share of the traffic when M is small and N large).
struct RowBlocks {
  int64_t blocks;
  int64_t rows_per_block;
  explicit RowBlocks(int64_t M)
      : blocks(M > 0 ? std::min<int64_t>(64, std::max<int64_t>(1, M / 16)) : 0),
        rows_per_block(blocks ? (M + blocks - 1) / blocks : 0) {}
  int64_t begin(int64_t blk) const { return blk * rows_per_block; }
  int64_t end(int64_t blk, int64_t M) const { return std::min(M, (blk + 1) * rows_per_block); }
};

// Runs worker(take) on up to ntiles of torch's intra-op threads; take() hands out the tile indices 0, 1, ...
// dynamically (one atomic counter), and returns ntiles or more once all are taken. Dynamic hand-out keeps a
// thread that the OS preempts (a busy machine) from holding up the others with a fixed half of the work. The
// worker may set up per-thread scratch before its take() loop; what a tile computes must not depend on which
// thread runs it (so results do not depend on the thread count).
template <typename Worker>
void parallel_tiles(int64_t ntiles, const Worker& worker) {
  if (ntiles <= 0) return;
  std::atomic<int64_t> next{0};
  auto take = [&next]() { return next.fetch_add(1, std::memory_order_relaxed); };
  const int64_t threads = std::min<int64_t>(ntiles, static_cast<int64_t>(torch::stable::get_num_threads()));
  torch::stable::parallel_for(0, threads, 1, [&](int64_t, int64_t) { worker(take); });
}

// out[j] = sum over blocks b (in order) of partial[b * N + j].
template <typename acc_t, typename out_t>
void sum_partials(const std::vector<acc_t>& partial, int64_t blocks, int64_t N, out_t* out) {
  torch::stable::parallel_for(0, N, 1024, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      acc_t s = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) s += partial[blk * N + j];
      out[j] = static_cast<out_t>(s);
    }
  });
}

}  // namespace gpuopt

// Deterministic row reductions on the CPU: rows are split into a fixed number of blocks that depends on M only,
// each block sums its rows in order into its own partial row, and the partials are summed in block order, so
// the bits do not depend on the number of threads.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace gpuopt {

struct RowBlocks {
  int64_t blocks;
  int64_t rows_per_block;
  explicit RowBlocks(int64_t M) : blocks(std::min<int64_t>(M, 64)), rows_per_block(blocks ? (M + blocks - 1) / blocks : 0) {}
  int64_t begin(int64_t blk) const { return blk * rows_per_block; }
  int64_t end(int64_t blk, int64_t M) const { return std::min(M, (blk + 1) * rows_per_block); }
};

// out[j] = sum over blocks b (in order) of partial[b * N + j].
template <typename acc_t, typename out_t>
void sum_partials(const std::vector<acc_t>& partial, int64_t blocks, int64_t N, out_t* out) {
  at::parallel_for(0, N, 1024, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      acc_t s = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) s += partial[blk * N + j];
      out[j] = static_cast<out_t>(s);
    }
  });
}

}  // namespace gpuopt

// Dropout keep bits of a run of consecutive elements on the CPU, from the Philox definition in philox.h.
#pragma once
#include <cstdint>

namespace gpuopt {

// keep[j] = 1 if element (idx0 + j) is kept under `seed` and `threshold`, else 0, for j in [0, n).
void dropout_keep_row(int64_t seed, int64_t idx0, int64_t n, uint32_t threshold, uint8_t* keep);

}  // namespace gpuopt

// SASS fixture for tests/test_sass.py. Regenerate loops.sass (from tests/sass_fixtures/) with:
//   nvcc -arch=sm_90 -cubin -O3 loops.cu -o /tmp/loops.cubin && cuobjdump -sass /tmp/loops.cubin > loops.sass
// and the same code with label branch targets (the disassembler that cuobjdump runs, on its own):
//   nvdisasm -c /tmp/loops.cubin > loops_labels.sass
#include <cuda_runtime.h>

// Grid-stride copy with 16-byte loads and stores; one loop, each load used at once by its store.
extern "C" __global__ void copy_f4(const float4* __restrict__ x, float4* __restrict__ y, long n) {
    long stride = (long)gridDim.x * blockDim.x;
#pragma unroll 1
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = x[i];
    }
}

// Rows in an outer grid-stride loop, columns in an inner loop: two nested loops.
extern "C" __global__ void row_sums(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
#pragma unroll 1
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
        float acc = 0.f;
#pragma unroll 1
        for (int c = 0; c < cols; ++c) acc += x[(long)r * cols + c];
        out[r] = acc;
    }
}

// Straight-line code: no loop, one 4-byte load of each input, one store.
extern "C" __global__ void axpy_one(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ z,
                                    float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = a * x[i] + y[i];
}

// SASS fixture for tests/test_sass.py. Regenerate batching.sass (from tests/sass_fixtures/) with:
//   nvcc -arch=sm_90 -cubin -O3 batching.cu -o /tmp/batching.cubin && cuobjdump -sass /tmp/batching.cubin > batching.sass
#include <cuda_runtime.h>

__device__ __forceinline__ float hsum(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// Each iteration loads one float4 and uses it at once: one wait per 16 bytes.
extern "C" __global__ void sum_immediate(const float4* __restrict__ x, float* __restrict__ out, int n) {
    float acc = 0.f;
    int stride = gridDim.x * blockDim.x;
#pragma unroll 1
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) acc += hsum(x[i]);
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// Software prefetch, two register buffers: the loads of the next elements are issued before the current ones are
// used, so each wait covers more bytes.
extern "C" __global__ void sum_prefetch(const float4* __restrict__ x, float* __restrict__ out, int n) {
    float acc = 0.f;
    int stride = gridDim.x * blockDim.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float4 a = i < n ? x[i] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
    for (; i + 2 * stride < n; i += 2 * stride) {
        float4 b = x[i + stride];
        acc += hsum(a);
        a = x[i + 2 * stride];
        acc += hsum(b);
    }
    if (i < n) acc += hsum(a);
    if (i + stride < n) acc += hsum(x[i + stride]);
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

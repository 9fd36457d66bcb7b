// Deliberately wrong kernels, built from the CUDA backend's own device helpers (csrc/cuda/kernel_utils.cuh), to
// prove the emulator reports each class of bug it is there for. Each has a correct twin, run by "correct", so
// the error is the bug's and not the harness's. Test-only.
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/kernel_utils.cuh"
#include "cuda_emu.h"

namespace {

using gpuopt::dev::kGroup;

// bias-add + ReLU over groups of 8 with scalar stores; the bug: `valid` one too large, so the last group of the
// last row writes one element past the end of the output.
struct OffByOneParams {
  const float* x;
  const float* bias;
  float* out;
  int64_t M, N;
  int extra;  // 1: the bug, 0: the correct kernel
};

void bias_relu_off_by_one(OffByOneParams p) {
  const int64_t c0 = int64_t(threadIdx.x) * kGroup;
  if (c0 >= p.N) return;
  const int in_row = gpuopt::dev::group_size(p.N, c0);
  const int valid = in_row + p.extra;
  for (int64_t row = blockIdx.x; row < p.M; row += gridDim.x) {
    float v[kGroup], b[kGroup];
    gpuopt::dev::load_group(p.x + row * p.N + c0, in_row, false, v);
    gpuopt::dev::load_param_group(p.bias, c0, in_row, false, 0.0f, b);
    for (int j = 0; j < kGroup; ++j) v[j] = v[j] + b[j] > 0 ? v[j] + b[j] : 0.0f;
    gpuopt::dev::store_group(p.out + row * p.N + c0, valid, false, v);
  }
}

// Copies groups of 8 with 16-byte vector loads; the bug: the source is offset by one element.
struct CopyParams {
  const float* x;
  float* out;
  int offset;
};

void vector_copy(CopyParams p) {
  float v[kGroup];
  const int64_t c0 = int64_t(threadIdx.x) * kGroup;
  gpuopt::dev::load_group(p.x + p.offset + c0, kGroup, true, v);
  gpuopt::dev::store_group(p.out + c0, kGroup, true, v);
}

// A row sum over a 128-thread block; the bug: only the first two warps call it, inside a branch.
struct SumParams {
  const float* x;
  float* out;
  int divergent;
};

void row_sum_kernel(SumParams p) {
  GPUOPT_SHARED_ARRAY(float, red, 32);
  float v = p.x[threadIdx.x];
  if (!p.divergent || threadIdx.x < 64) v = gpuopt::dev::row_sum(v, red);
  if (threadIdx.x == 0) p.out[0] = v;
}

void run_off_by_one(int extra) {
  const int64_t M = 3, N = 7;
  std::vector<float> host(M * N, 1.0f), bias(N, 0.5f);
  gpuopt_emu::DeviceBuffer x("x", host.data(), host.size() * 4), b("bias", bias.data(), bias.size() * 4);
  gpuopt_emu::DeviceBuffer out("out", host.size() * 4);
  gpuopt_emu::launch_kernel("bias_relu_off_by_one", dim3(2), dim3(32), 32, bias_relu_off_by_one,
                            OffByOneParams{x.data_as<float>(), b.data_as<float>(), out.data_as<float>(), M, N, extra});
  for (float v : out.to_vector<float>()) TORCH_CHECK(v == 1.5f, "bias_relu_off_by_one: wrong value ", v);
}

void run_vector_copy(int offset) {
  std::vector<float> host(8 * 32 + 8, 2.0f);
  gpuopt_emu::DeviceBuffer x("x", host.size() * 4, 0);
  x.copy_from_host(host.data(), host.size() * 4);
  gpuopt_emu::DeviceBuffer out("out", 8 * 32 * 4, 0);
  gpuopt_emu::launch_kernel("vector_copy", dim3(1), dim3(32), 32, vector_copy,
                            CopyParams{x.data_as<float>(), out.data_as<float>(), offset});
  for (float v : out.to_vector<float>()) TORCH_CHECK(v == 2.0f, "vector_copy: wrong value ", v);
}

void run_row_sum(int divergent) {
  std::vector<float> host(128, 1.0f);
  gpuopt_emu::DeviceBuffer x("x", host.data(), host.size() * 4), out("out", 4);
  gpuopt_emu::launch_kernel("row_sum_kernel", dim3(1), dim3(128), 128, row_sum_kernel,
                            SumParams{x.data_as<float>(), out.data_as<float>(), divergent});
  TORCH_CHECK(out.to_vector<float>()[0] == 128.0f, "row_sum_kernel: wrong sum");
}

void run(const std::string& name) {
  if (name == "write_past_row_end") {
    run_off_by_one(1);
  } else if (name == "misaligned_vector_load") {
    run_vector_copy(1);
  } else if (name == "divergent_syncthreads") {
    run_row_sum(1);
  } else if (name == "correct") {
    run_off_by_one(0);
    run_vector_copy(0);
    run_row_sum(0);
  } else {
    TORCH_CHECK(false, "gpuopt_emu_wrong.run: unknown kernel ", name);
  }
}

}  // namespace

TORCH_LIBRARY(gpuopt_emu_wrong, m) { m.def("run(str name) -> ()", &run); }

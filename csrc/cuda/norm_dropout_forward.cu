// CUDA registration of gpuopt::layer_norm_dropout_relu and gpuopt::norm_dropout (torch_ops.h on the GPU backend, the
// same kernels). One translation unit per op direction, so a build compiles them in parallel.
#include "cuda/cuda_launcher.h"
#include "cuda/torch_ops.h"

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("layer_norm_dropout_relu", TORCH_BOX(&gpuopt::ldr_forward_op<gpuopt::CudaBackend>));
  m.impl("norm_dropout", TORCH_BOX(&gpuopt::nd_forward_op<gpuopt::CudaBackend>));
}

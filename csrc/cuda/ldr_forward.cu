// CUDA registration of gpuopt::layer_norm_dropout_relu (ops_glue.h on the GPU backend). One translation unit
// per op direction, so a build compiles them in parallel.
#include <torch/library.h>

#include "cuda/cuda_launcher.h"
#include "cuda/ops_glue.h"

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("layer_norm_dropout_relu", &gpuopt::ldr_forward_op<gpuopt::CudaBackend>);
}

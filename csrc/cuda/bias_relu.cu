// CUDA registration of gpuopt::bias_relu and its backward (ops_glue.h on the GPU backend).
#include <torch/library.h>

#include "cuda/cuda_launcher.h"
#include "cuda/ops_glue.h"

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("bias_relu", &gpuopt::bias_relu_op<gpuopt::CudaBackend>);
  m.impl("bias_relu_backward", &gpuopt::bias_relu_backward_op<gpuopt::CudaBackend>);
}

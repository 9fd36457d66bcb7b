// CUDA registration of gpuopt::layer_norm_dropout_relu_backward and norm_dropout_backward (torch_ops.h on the GPU
// backend).
#include "cuda/cuda_launcher.h"
#include "cuda/torch_ops.h"

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("layer_norm_dropout_relu_backward", TORCH_BOX(&gpuopt::ldr_backward_op<gpuopt::CudaBackend>));
  m.impl("norm_dropout_backward", TORCH_BOX(&gpuopt::nd_backward_op<gpuopt::CudaBackend>));
}

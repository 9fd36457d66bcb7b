// CUDA registration of gpuopt::dropout_add_norm_backward (torch_ops.h on the GPU backend).
#include "cuda/cuda_launcher.h"
#include "cuda/torch_ops.h"

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("dropout_add_norm_backward", TORCH_BOX(&gpuopt::dan_backward_op<gpuopt::CudaBackend>));
}

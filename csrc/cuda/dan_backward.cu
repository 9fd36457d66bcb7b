// CUDA registration of gpuopt::dropout_add_norm_backward (ops_glue.h on the GPU backend).
#include "cuda/cuda_launcher.h"
#include "cuda/ops_glue.h"

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("dropout_add_norm_backward", TORCH_BOX(&gpuopt::dan_backward_op<gpuopt::CudaBackend>));
}

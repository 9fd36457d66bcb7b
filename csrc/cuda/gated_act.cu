// CUDA registration of gpuopt::gated_act and gpuopt::gated_act_backward (gated_act_torch_ops.h on the GPU backend).
#include "cuda/cuda_launcher.h"
#include "cuda/gated_act_torch_ops.h"

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("gated_act", TORCH_BOX(&gpuopt::gated_act_op<gpuopt::CudaBackend>));
  m.impl("gated_act_backward", TORCH_BOX(&gpuopt::gated_act_backward_op<gpuopt::CudaBackend>));
}

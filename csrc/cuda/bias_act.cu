// CUDA registration of gpuopt::bias_relu, gpuopt::bias_act and their backwards (torch_ops.h on the GPU backend).
#include "cuda/cuda_launcher.h"
#include "cuda/torch_ops.h"

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("bias_relu", TORCH_BOX(&gpuopt::bias_relu_op<gpuopt::CudaBackend>));
  m.impl("bias_relu_backward", TORCH_BOX(&gpuopt::bias_relu_backward_op<gpuopt::CudaBackend>));
  m.impl("bias_act", TORCH_BOX(&gpuopt::bias_act_op<gpuopt::CudaBackend>));
  m.impl("bias_act_backward", TORCH_BOX(&gpuopt::bias_act_backward_op<gpuopt::CudaBackend>));
}

// Every schema of the gpuopt namespace, defined once. Backends add kernels with TORCH_LIBRARY_IMPL in
// csrc/cpu/ and csrc/cuda/; gpuopt_ops/ops.py adds the fake kernels and autograd.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// `import gpuopt_ops._C` loads this library, which runs the static registrations below. No pybind11 surface.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "gpuopt C++/CUDA operators", -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(gpuopt, m) {
  m.def(
      "layer_norm_dropout_relu(Tensor x, Tensor? weight, Tensor? bias, Tensor seed, float p, float eps)"
      " -> (Tensor out, Tensor mean, Tensor rstd)");
  m.def(
      "layer_norm_dropout_relu_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, Tensor mean,"
      " Tensor rstd, Tensor seed, float p) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)");
  m.def("bias_relu(Tensor x, Tensor bias) -> Tensor");
  m.def("bias_relu_backward(Tensor grad_out, Tensor out) -> (Tensor grad_x, Tensor grad_bias)");
}

// Every schema of the gpuopt namespace, defined once. Backends add kernels with TORCH_LIBRARY_IMPL in
// csrc/cpu/ and csrc/cuda/; gpuopt_ops/ops.py adds the fake kernels and autograd.
#include <Python.h>
#include <torch/library.h>

#include "schemas.h"

extern "C" {
// `import gpuopt_ops._C` loads this library, which runs the static registrations below. No pybind11 surface.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "gpuopt C++/CUDA operators", -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(gpuopt, m) {
  gpuopt::define_schemas(m);
}

// Every schema of the gpuopt namespace, defined once. Backends add kernels with STABLE_TORCH_LIBRARY_IMPL in
// csrc/cpu/ and csrc/cuda/; gpuopt_ops/ops.py adds the fake kernels and autograd. The library is built against
// the LibTorch stable ABI and Python's limited API (abi3), so one binary serves every torch >= 2.11 and
// Python >= 3.10.
#include <Python.h>

#include "schemas.h"
#include "torch_stable.h"

extern "C" {
// `import gpuopt_ops._C` loads this library, which runs the static registrations below. No pybind11 surface.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "gpuopt C++/CUDA operators", -1, nullptr};
  return PyModule_Create(&module_def);
}
}

STABLE_TORCH_LIBRARY(gpuopt, m) { gpuopt::define_schemas(m); }

// Every schema of the gpuopt namespace, defined once. Backends add kernels with STABLE_TORCH_LIBRARY_IMPL in
// csrc/cpu/ and csrc/cuda/; gpuopt_ops/ops.py adds the fake kernels and autograd. The library is built against
// the LibTorch stable ABI and Python's limited API (abi3), so one binary serves every torch >= 2.11 and
// Python >= 3.10.
#include <Python.h>

#include "schemas.h"
#include "torch_stable.h"

// How this library was built, passed by setup.py to the compiler and read by gpuopt_ops/build_info.py: the torch it
// was built with and, in a CUDA build, its TORCH_CUDA_ARCH_LIST. Kept in the binary, the record cannot go stale.
#ifndef GPUOPT_BUILT_WITH_TORCH
#define GPUOPT_BUILT_WITH_TORCH "unknown"
#endif

extern "C" {
// `import gpuopt_ops._C` loads this library, which runs the static registrations below. No pybind11 surface; two
// module constants, TORCH_VERSION and CUDA_ARCH_LIST (None in a CPU-only build).
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "gpuopt C++/CUDA operators", -1, nullptr};
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
#if defined(GPUOPT_WITH_CUDA) && defined(GPUOPT_CUDA_ARCH_LIST)
  PyObject* arch = PyUnicode_FromString(GPUOPT_CUDA_ARCH_LIST);
#else
  PyObject* arch = Py_NewRef(Py_None);
#endif
  const bool ok = arch != nullptr && PyModule_AddObjectRef(module, "CUDA_ARCH_LIST", arch) == 0 &&
                  PyModule_AddStringConstant(module, "TORCH_VERSION", GPUOPT_BUILT_WITH_TORCH) == 0;
  Py_XDECREF(arch);
  if (!ok) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
}

STABLE_TORCH_LIBRARY(gpuopt, m) { gpuopt::define_schemas(m); }

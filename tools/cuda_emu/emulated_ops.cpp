// The gpuopt ops of the CUDA backend, with their real schemas under the namespace gpuopt_emu, running the CUDA backend's own
// glue (csrc/cuda/torch_ops.h), launch sequence (launch.cuh) and kernel headers on the CPU under the
// emulation of the CUDA execution model. Outputs and scratch start poisoned (0xFF: NaN), and the guards of every
// buffer are checked after every launch. Built only by the emulator tests.
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/arch_message.h"
#include "cuda/gated_act_torch_ops.h"
#include "cuda/launch.cuh"
#include "cuda/torch_ops.h"
#include "cuda_emu.h"
#include "schemas.h"
#include "torch_stable.h"

namespace gpuopt {
namespace {

// The emulated device: few SMs and a low occupancy cap, so modest row counts already exceed the persistent
// grid and every grid-stride loop runs more than once. Set from the tests with gpuopt_emu::configure.
struct EmulatedDevice {
  int sm_count = 4;
  int max_blocks_per_sm = 2;
  int64_t shared_per_block = 227 * 1024;  // sm_90's opt-in maximum
};
EmulatedDevice& device() {
  static EmulatedDevice d;
  return d;
}

// The Launcher of launch.cuh on the emulator.
struct EmuLauncher {
  std::vector<std::unique_ptr<gpuopt_emu::DeviceBuffer>> scratch_buffers;

  int sm_count() const { return device().sm_count; }

  int64_t shared_per_block() const { return device().shared_per_block; }

  // Occupancy model: the 2048 threads of an SM, at most 32 blocks, the 228 KiB of shared memory an SM (dynamic
  // memory plus 1 KiB a block), capped by the emulated device.
  template <class P>
  int blocks_per_sm(void (*)(P), int threads, int64_t dynamic_shared = 0) const {
    const int by_shared = dynamic_shared > 0 ? static_cast<int>(228 * 1024 / (dynamic_shared + 1024)) : 32;
    return std::max(1, std::min({device().max_blocks_per_sm, 2048 / std::max(threads, 1), 32, by_shared}));
  }

  template <class P>
  void run(const char* name, void (*kernel)(P), dim3 grid, dim3 block, int max_threads, const P& params,
           int64_t dynamic_shared = 0) {
    gpuopt_emu::launch_kernel_shared(name, grid, block, max_threads, static_cast<size_t>(dynamic_shared), kernel,
                                     params);
  }

  template <class T>
  T* scratch(int64_t count) {
    scratch_buffers.push_back(std::make_unique<gpuopt_emu::DeviceBuffer>(
        "scratch" + std::to_string(scratch_buffers.size()), static_cast<size_t>(count) * sizeof(T)));
    return scratch_buffers.back()->data_as<T>();
  }
};

// The emulator Backend of torch_ops.h: every input mirrored into a guarded "device" buffer at the same address
// modulo 256 (an unaligned view stays unaligned), every output a poisoned buffer copied back by finish().
struct EmuBackend {
  std::vector<std::unique_ptr<gpuopt_emu::DeviceBuffer>> buffers;
  std::vector<std::pair<gpuopt_emu::DeviceBuffer*, Tensor>> outputs;
  EmuLauncher launch;

  explicit EmuBackend(const Tensor&) {}
  const void* in(const char* name, const Tensor& t) {
    if (!t.defined()) return nullptr;
    buffers.push_back(std::make_unique<gpuopt_emu::DeviceBuffer>(name, t.data_ptr(), nbytes(t)));
    return buffers.back()->data();
  }
  void* out(const char* name, const Tensor& t) {
    buffers.push_back(std::make_unique<gpuopt_emu::DeviceBuffer>(name, nbytes(t)));
    outputs.emplace_back(buffers.back().get(), t);
    return buffers.back()->data();
  }
  EmuLauncher& launcher() { return launch; }
  void finish() {
    for (auto& [buf, t] : outputs)
      if (nbytes(t) > 0) buf->copy_to_host(t.data_ptr(), nbytes(t));
  }
};

// Sets the emulated device (SM count, occupancy cap, shared memory a block: what the launch plans see; the
// emulator itself allows 227 KiB); returns the previous [sm_count, max_blocks_per_sm, shared_per_block].
std::vector<int64_t> configure(int64_t sm_count, int64_t max_blocks_per_sm, int64_t shared_per_block) {
  GPUOPT_CHECK(sm_count >= 1 && max_blocks_per_sm >= 1, "gpuopt_emu.configure: both counts must be >= 1");
  GPUOPT_CHECK(shared_per_block >= 0 && shared_per_block <= 227 * 1024,
               "gpuopt_emu.configure: shared_per_block must be in [0, 232448]");
  std::vector<int64_t> old{device().sm_count, device().max_blocks_per_sm, device().shared_per_block};
  device().sm_count = static_cast<int>(sm_count);
  device().max_blocks_per_sm = static_cast<int>(max_blocks_per_sm);
  device().shared_per_block = shared_per_block;
  return old;
}

// The launches since the last call, "kernel grid=(x,y,z) block=(x,y,z)", and clears the log.
std::vector<std::string> take_launches() {
  std::vector<std::string> out;
  for (const auto& r : gpuopt_emu::launch_log()) {
    out.push_back(r.kernel + " grid=(" + std::to_string(r.grid.x) + "," + std::to_string(r.grid.y) + "," +
                  std::to_string(r.grid.z) + ") block=(" + std::to_string(r.block.x) + "," +
                  std::to_string(r.block.y) + "," + std::to_string(r.block.z) + ")");
  }
  gpuopt_emu::clear_launch_log();
  return out;
}

// gated_act's walk (gated_act_kernels.cuh) on the host, for index arithmetic past 2^31 that no emulated tensor can
// reach: the gate-layout offsets of the groups a thread visits, from output element `first` (8t) on, one grid
// stride of `step` elements apart, `count` of them.
std::vector<int64_t> gated_walk_offsets(int64_t n, int64_t row, int64_t ld, int64_t step, int64_t first,
                                        int64_t count) {
  const dev::GatedGeometry geo = cuda::gated_geometry(n, row, ld, step);
  dev::GatedWalk w = dev::gated_walk_at(first, geo);
  std::vector<int64_t> out;
  for (int64_t k = 0; k < count; ++k) {
    out.push_back(w.g);
    dev::gated_walk_step(w, geo);
  }
  return out;
}

// The CUDA backend's error for a GPU outside the build's TORCH_CUDA_ARCH_LIST (cuda_launcher.h raises it).
std::string missing_arch_message(int64_t major, int64_t minor, int64_t device, std::string name,
                                 std::string built_for) {
  return cuda::missing_arch_message(static_cast<int>(major), static_cast<int>(minor), static_cast<int>(device),
                                    name, built_for);
}

}  // namespace
}  // namespace gpuopt

// The real schemas (csrc/schemas.h) under this namespace, registered through the stable ABI as _C's are.
STABLE_TORCH_LIBRARY(gpuopt_emu, m) {
  gpuopt::define_schemas(m);
  m.def("configure(int sm_count, int max_blocks_per_sm, int shared_per_block=232448) -> int[]");
  m.def("take_launches() -> str[]");
  m.def("missing_arch_message(int major, int minor, int device, str name, str built_for) -> str");
  m.def("gated_walk_offsets(int n, int row, int ld, int step, int first, int count) -> int[]");
}

STABLE_TORCH_LIBRARY_IMPL(gpuopt_emu, CPU, m) {
  m.impl("layer_norm_dropout_relu", TORCH_BOX(&gpuopt::ldr_forward_op<gpuopt::EmuBackend>));
  m.impl("layer_norm_dropout_relu_backward", TORCH_BOX(&gpuopt::ldr_backward_op<gpuopt::EmuBackend>));
  m.impl("bias_relu", TORCH_BOX(&gpuopt::bias_relu_op<gpuopt::EmuBackend>));
  m.impl("bias_relu_backward", TORCH_BOX(&gpuopt::bias_relu_backward_op<gpuopt::EmuBackend>));
  m.impl("bias_act", TORCH_BOX(&gpuopt::bias_act_op<gpuopt::EmuBackend>));
  m.impl("bias_act_backward", TORCH_BOX(&gpuopt::bias_act_backward_op<gpuopt::EmuBackend>));
  m.impl("dropout_add_norm", TORCH_BOX(&gpuopt::dan_forward_op<gpuopt::EmuBackend>));
  m.impl("dropout_add_norm_backward", TORCH_BOX(&gpuopt::dan_backward_op<gpuopt::EmuBackend>));
  m.impl("norm_dropout", TORCH_BOX(&gpuopt::nd_forward_op<gpuopt::EmuBackend>));
  m.impl("norm_dropout_backward", TORCH_BOX(&gpuopt::nd_backward_op<gpuopt::EmuBackend>));
  m.impl("gated_act", TORCH_BOX(&gpuopt::gated_act_op<gpuopt::EmuBackend>));
  m.impl("gated_act_backward", TORCH_BOX(&gpuopt::gated_act_backward_op<gpuopt::EmuBackend>));
}

// Ops without tensor arguments dispatch to CompositeExplicitAutograd (no dispatch key comes from their inputs).
STABLE_TORCH_LIBRARY_IMPL(gpuopt_emu, CompositeExplicitAutograd, m) {
  m.impl("configure", TORCH_BOX(&gpuopt::configure));
  m.impl("take_launches", TORCH_BOX(&gpuopt::take_launches));
  m.impl("missing_arch_message", TORCH_BOX(&gpuopt::missing_arch_message));
  m.impl("gated_walk_offsets", TORCH_BOX(&gpuopt::gated_walk_offsets));
}

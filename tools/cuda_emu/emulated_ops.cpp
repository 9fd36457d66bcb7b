// The gpuopt ops of the CUDA backend, with their real schemas under the namespace gpuopt_emu, running the CUDA backend's own
// glue (csrc/cuda/torch_ops.h), launch sequence (launch.cuh) and kernel headers on the CPU under the
// emulation of the CUDA execution model. Outputs and scratch start poisoned (0xFF: NaN), and the guards of every
// buffer are checked after every launch. Built by the emulator tests and by the performance model, which plans the
// launches of its cases without running them (configure_plan).
#include <dlfcn.h>

#include <algorithm>
#include <map>
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

// Plan-only mode (gpuopt_emu::configure_plan): the ops run their host code on the caller's tensors, touch no
// element, and record their launches without running them. The blocks a kernel keeps resident on an SM come from
// the emulator's rule, or from a table the caller fills (the performance model: the sm_90 occupancy of the built
// extension's kernels); a launch plan that asks the table for a kernel it lacks gets 1 and leaves the question in
// `queries` for the caller to answer before planning again.
struct PlanState {
  bool on = false;
  bool table = false;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> occupancy;  // (entry, threads, dynamic shared) -> blocks
  std::vector<int64_t> queries;                                        // (entry, threads, dynamic shared) triples
};
PlanState& plan() {
  static PlanState s;
  return s;
}

// A kernel's entry point as an offset into the library that holds it (what its symbol table gives), -1 if unknown.
int64_t entry_offset(const void* entry) {
  Dl_info info{};
  if (entry == nullptr || dladdr(entry, &info) == 0 || info.dli_fbase == nullptr) return -1;
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(entry) - reinterpret_cast<uintptr_t>(info.dli_fbase));
}

// The Launcher of launch.cuh on the emulator.
struct EmuLauncher {
  std::vector<std::unique_ptr<gpuopt_emu::DeviceBuffer>> scratch_buffers;

  int sm_count() const { return device().sm_count; }

  int64_t shared_per_block() const { return device().shared_per_block; }

  // Occupancy model: the 2048 threads of an SM, at most 32 blocks, the 228 KiB of shared memory an SM (dynamic
  // memory plus 1 KiB a block), capped by the emulated device.
  template <class P>
  int blocks_per_sm(void (*kernel)(P), int threads, int64_t dynamic_shared = 0) const {
    if (plan().on && plan().table)
      return planned_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, dynamic_shared);
    const int by_shared = dynamic_shared > 0 ? static_cast<int>(228 * 1024 / (dynamic_shared + 1024)) : 32;
    return std::max(1, std::min({device().max_blocks_per_sm, 2048 / std::max(threads, 1), 32, by_shared}));
  }

  template <class P>
  void run(const char* name, void (*kernel)(P), dim3 grid, dim3 block, int max_threads, const P& params,
           int64_t dynamic_shared = 0) {
    gpuopt_emu::launch_kernel_shared(name, grid, block, max_threads, static_cast<size_t>(dynamic_shared), kernel,
                                     params);
  }

  static int planned_blocks_per_sm(const void* kernel, int threads, int64_t dynamic_shared) {
    const auto key = std::make_tuple(entry_offset(kernel), int64_t(threads), dynamic_shared);
    const auto it = plan().occupancy.find(key);
    if (it != plan().occupancy.end()) return static_cast<int>(it->second);
    plan().queries.insert(plan().queries.end(), {std::get<0>(key), std::get<1>(key), std::get<2>(key)});
    return 1;
  }

  template <class T>
  T* scratch(int64_t count) {
    if (plan().on) {  // never written: the launches do not run
      alignas(256) static unsigned char nowhere[256];
      return reinterpret_cast<T*>(nowhere);
    }
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
    if (plan().on) return t.data_ptr();
    buffers.push_back(std::make_unique<gpuopt_emu::DeviceBuffer>(name, t.data_ptr(), nbytes(t)));
    return buffers.back()->data();
  }
  void* out(const char* name, const Tensor& t) {
    if (plan().on) return t.data_ptr();
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

// Plan-only mode on or off (above PlanState); `table`: the blocks per SM from `occupancy`, (entry, threads, dynamic
// shared, blocks) quadruples (replacing the table), else the emulator's rule. Returns the previous mode: 0 off, 1
// planning on the emulator's rule, 2 on a table.
int64_t configure_plan(bool on, bool table, std::vector<int64_t> occupancy) {
  GPUOPT_CHECK(occupancy.size() % 4 == 0, "gpuopt_emu.configure_plan: occupancy holds quadruples");
  const int64_t old = plan().on ? (plan().table ? 2 : 1) : 0;
  plan().on = on;
  plan().table = table;
  plan().occupancy.clear();
  plan().queries.clear();
  for (size_t i = 0; i < occupancy.size(); i += 4)
    plan().occupancy[std::make_tuple(occupancy[i], occupancy[i + 1], occupancy[i + 2])] = occupancy[i + 3];
  gpuopt_emu::set_plan_only(on);
  return old;
}

// The occupancy questions of plan-only launches since the last call, (entry, threads, dynamic shared) triples.
std::vector<int64_t> take_occupancy_queries() {
  std::vector<int64_t> out;
  out.swap(plan().queries);
  return out;
}

// The launches since the last call, 9 numbers each: the kernel's entry (entry_offset), grid x y z, block x y z,
// dynamic shared bytes, 1 if it ran (or was planned) without error; clears the log.
std::vector<int64_t> take_launch_records() {
  std::vector<int64_t> out;
  for (const auto& r : gpuopt_emu::launch_log()) {
    for (const int64_t v :
         {entry_offset(r.entry), int64_t(r.grid.x), int64_t(r.grid.y), int64_t(r.grid.z), int64_t(r.block.x),
          int64_t(r.block.y), int64_t(r.block.z), int64_t(r.dynamic_shared), int64_t(r.ok)})
      out.push_back(v);
  }
  gpuopt_emu::clear_launch_log();
  return out;
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

// Registers an op's entry and its backward's (the CUDA backend's glue on EmuBackend) as the kernels of `name` and
// `backward_name`.
template <auto kForward, auto kBackward>
void impl_with_backward(torch::stable::detail::StableLibrary& m, const char* name, const char* backward_name) {
  m.impl(name, TORCH_BOX(kForward));
  m.impl(backward_name, TORCH_BOX(kBackward));
}

// The ops of the CUDA backend, each with its backward, as the CPU kernels of gpuopt_emu.
void impl_emulated_ops(torch::stable::detail::StableLibrary& m) {
  using B = EmuBackend;
  impl_with_backward<&ldr_forward_op<B>, &ldr_backward_op<B>>(m, "layer_norm_dropout_relu",
                                                              "layer_norm_dropout_relu_backward");
  impl_with_backward<&bias_relu_op<B>, &bias_relu_backward_op<B>>(m, "bias_relu", "bias_relu_backward");
  impl_with_backward<&bias_act_op<B>, &bias_act_backward_op<B>>(m, "bias_act", "bias_act_backward");
  impl_with_backward<&dan_forward_op<B>, &dan_backward_op<B>>(m, "dropout_add_norm", "dropout_add_norm_backward");
  impl_with_backward<&nd_forward_op<B>, &nd_backward_op<B>>(m, "norm_dropout", "norm_dropout_backward");
  impl_with_backward<&gated_act_op<B>, &gated_act_backward_op<B>>(m, "gated_act", "gated_act_backward");
}

}  // namespace
}  // namespace gpuopt

// The real schemas (csrc/schemas.h) under this namespace, registered through the stable ABI as _C's are.
STABLE_TORCH_LIBRARY(gpuopt_emu, m) {
  gpuopt::define_schemas(m);
  m.def("configure(int sm_count, int max_blocks_per_sm, int shared_per_block=232448) -> int[]");
  m.def("take_launches() -> str[]");
  m.def("configure_plan(bool on, bool table=False, int[] occupancy=[]) -> int");
  m.def("take_occupancy_queries() -> int[]");
  m.def("take_launch_records() -> int[]");
  m.def("missing_arch_message(int major, int minor, int device, str name, str built_for) -> str");
  m.def("gated_walk_offsets(int n, int row, int ld, int step, int first, int count) -> int[]");
}

STABLE_TORCH_LIBRARY_IMPL(gpuopt_emu, CPU, m) { gpuopt::impl_emulated_ops(m); }

// Ops without tensor arguments dispatch to CompositeExplicitAutograd (no dispatch key comes from their inputs).
STABLE_TORCH_LIBRARY_IMPL(gpuopt_emu, CompositeExplicitAutograd, m) {
  m.impl("configure", TORCH_BOX(&gpuopt::configure));
  m.impl("take_launches", TORCH_BOX(&gpuopt::take_launches));
  m.impl("configure_plan", TORCH_BOX(&gpuopt::configure_plan));
  m.impl("take_occupancy_queries", TORCH_BOX(&gpuopt::take_occupancy_queries));
  m.impl("take_launch_records", TORCH_BOX(&gpuopt::take_launch_records));
  m.impl("missing_arch_message", TORCH_BOX(&gpuopt::missing_arch_message));
  m.impl("gated_walk_offsets", TORCH_BOX(&gpuopt::gated_walk_offsets));
}

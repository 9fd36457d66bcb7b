// Torch ops (namespace gpuopt_emu_selftest) over the emulator self-test kernels of runtime_selftest_kernels.h,
// for tests/test_emulator_runtime.py. CPU tensors in, results written into caller-allocated tensors; emulator
// errors surface as RuntimeError with the emulator's message.
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "runtime_selftest_kernels.h"

namespace {

void check_cpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "gpuopt_emu_selftest: ", what,
              " must be a contiguous CPU tensor");
}

void block_sum(const at::Tensor& x, const at::Tensor& out, int64_t blocks, int64_t threads, std::string method) {
  check_cpu(x, "x");
  check_cpu(out, "out");
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat, "block_sum: float32 tensors");
  TORCH_CHECK(x.numel() == blocks * threads && out.numel() == blocks * threads, "block_sum: blocks * threads");
  selftest::block_sum(x.data_ptr<float>(), out.data_ptr<float>(), static_cast<int>(blocks),
                      static_cast<int>(threads), method);
}

void shuffle(const at::Tensor& x, const at::Tensor& out, std::string op, int64_t arg, int64_t width) {
  check_cpu(x, "x");
  check_cpu(out, "out");
  TORCH_CHECK(x.scalar_type() == out.scalar_type() && x.numel() == out.numel(), "shuffle: x and out alike");
  const int n = static_cast<int>(x.numel());
  if (x.element_size() == 4) {
    if (x.is_floating_point()) {
      selftest::shuffle(x.data_ptr<float>(), out.data_ptr<float>(), n, op, static_cast<int>(arg),
                        static_cast<int>(width));
    } else {
      selftest::shuffle(static_cast<const int32_t*>(x.data_ptr()), static_cast<int32_t*>(out.data_ptr()), n, op,
                        static_cast<int>(arg), static_cast<int>(width));
    }
  } else {
    TORCH_CHECK(x.element_size() == 8, "shuffle: 4- or 8-byte elements");
    if (x.is_floating_point()) {  // exercise a floating-point T as well as an integer one
      selftest::shuffle(x.data_ptr<double>(), out.data_ptr<double>(), n, op, static_cast<int>(arg),
                        static_cast<int>(width));
    } else {
      selftest::shuffle(static_cast<const int64_t*>(x.data_ptr()), static_cast<int64_t*>(out.data_ptr()), n, op,
                        static_cast<int>(arg), static_cast<int>(width));
    }
  }
}

void vote(const at::Tensor& pred, const at::Tensor& out) {
  check_cpu(pred, "pred");
  check_cpu(out, "out");
  TORCH_CHECK(pred.scalar_type() == at::kInt && out.scalar_type() == at::kLong, "vote: int32 pred, int64 out");
  TORCH_CHECK(out.numel() == 6 * pred.numel(), "vote: out has 6 values per thread");
  selftest::vote(pred.data_ptr<int>(), out.data_ptr<int64_t>(), static_cast<int>(pred.numel()));
}

void shared_poison(const at::Tensor& fbits, const at::Tensor& dbits, const at::Tensor& nan, const at::Tensor& addr,
                   int64_t blocks, int64_t threads) {
  const int64_t n = blocks * threads;
  TORCH_CHECK(fbits.numel() == n && dbits.numel() == n && nan.numel() == n && addr.numel() == 2 * n,
              "shared_poison: sizes");
  TORCH_CHECK(fbits.element_size() == 4 && dbits.element_size() == 8 && nan.scalar_type() == at::kInt &&
                  addr.scalar_type() == at::kLong,
              "shared_poison: dtypes");
  selftest::shared_poison(static_cast<uint32_t*>(fbits.data_ptr()), static_cast<uint64_t*>(dbits.data_ptr()),
                          nan.data_ptr<int>(), addr.data_ptr<int64_t>(), static_cast<int>(blocks),
                          static_cast<int>(threads));
}

dim3 to_dim3(const std::vector<int64_t>& v) {
  TORCH_CHECK(v.size() == 3, "expected 3 dimensions");
  return dim3(static_cast<unsigned>(v[0]), static_cast<unsigned>(v[1]), static_cast<unsigned>(v[2]));
}

void indices(const at::Tensor& out, std::vector<int64_t> grid, std::vector<int64_t> block) {
  check_cpu(out, "out");
  const dim3 g = to_dim3(grid), b = to_dim3(block);
  TORCH_CHECK(out.scalar_type() == at::kLong &&
                  out.numel() == int64_t(g.x) * g.y * g.z * b.x * b.y * b.z * 8,
              "indices: out has 8 int64 per thread");
  selftest::indices(out.data_ptr<int64_t>(), g, b);
}

void block_order(const at::Tensor& order, int64_t gx, int64_t gy) {
  check_cpu(order, "order");
  TORCH_CHECK(order.scalar_type() == at::kInt && order.numel() == gx * gy, "block_order: gx * gy int32");
  selftest::block_order(order.data_ptr<int>(), static_cast<int>(gx), static_cast<int>(gy));
}

std::tuple<int64_t, int64_t> load16_sum(const at::Tensor& x, int64_t byte_offset) {
  check_cpu(x, "x");
  int64_t misalignment = -1;
  const int64_t sum = selftest::load16_sum(x.data_ptr(), x.numel() * x.element_size(), byte_offset, &misalignment);
  return {sum, misalignment};
}

void error_case(std::string name) { selftest::run_error_case(name); }

std::string launch_log() { return selftest::launch_log_text(); }

int64_t launch_count() { return static_cast<int64_t>(gpuopt_emu::launch_count()); }

void clear_launch_log() { gpuopt_emu::clear_launch_log(); }

}  // namespace

TORCH_LIBRARY(gpuopt_emu_selftest, m) {
  m.def("block_sum(Tensor x, Tensor(a!) out, int blocks, int threads, str method) -> ()", &block_sum);
  m.def("shuffle(Tensor x, Tensor(a!) out, str op, int arg, int width) -> ()", &shuffle);
  m.def("vote(Tensor pred, Tensor(a!) out) -> ()", &vote);
  m.def(
      "shared_poison(Tensor(a!) fbits, Tensor(b!) dbits, Tensor(c!) nan, Tensor(d!) addr, int blocks, int threads)"
      " -> ()",
      &shared_poison);
  m.def("indices(Tensor(a!) out, int[] grid, int[] block) -> ()", &indices);
  m.def("block_order(Tensor(a!) order, int gx, int gy) -> ()", &block_order);
  m.def("load16_sum(Tensor x, int byte_offset) -> (int, int)", &load16_sum);
  m.def("error_case(str name) -> ()", &error_case);
  m.def("launch_log() -> str", &launch_log);
  m.def("launch_count() -> int", &launch_count);
  m.def("clear_launch_log() -> ()", &clear_launch_log);
}

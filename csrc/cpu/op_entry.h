// What the CPU entries of the ops share: the entry torch calls (the op's check, then its run on the checked spec)
// and, for the norm ops, the run that reads the seed, dispatches the dtypes and picks the fp64 or the fp32 path.
#pragma once

#include <type_traits>

#include "checks.h"
#include "cpu/dropout_mask.h"
#include "dtypes.h"
#include "torch_stable.h"

namespace gpuopt {

// CpuEntry<check, run>::call(args...) = run(check(args...)): an op's entry with its check's parameters (those of the
// op's schema), so each op's CPU code is only its run on the spec.
template <auto kCheck, auto kRun, typename = decltype(kCheck)>
struct CpuEntry;
template <auto kCheck, auto kRun, typename Spec, typename... Args>
struct CpuEntry<kCheck, kRun, Spec (*)(Args...)> {
  static auto call(Args... args) { return kRun(kCheck(args...)); }
};

// Registers CpuEntry<check, run> as the CPU kernel of op `name`.
template <auto kCheck, auto kRun>
void impl_cpu(torch::stable::detail::StableLibrary& m, const char* name) {
  using Entry = CpuEntry<kCheck, kRun>;
  m.impl(name, TORCH_BOX(&Entry::call));
}

// The CPU kernels of an op and its backward, run and run_backward, registered for each pair of ops that share them:
// CpuOp<run, run_backward>::impl<check, check_backward>(m, name, backward_name).
template <auto kRun, auto kRunBackward>
struct CpuOp {
  template <auto kCheck, auto kCheckBackward>
  static void impl(torch::stable::detail::StableLibrary& m, const char* name, const char* backward_name) {
    impl_cpu<kCheck, kRun>(m, name);
    impl_cpu<kCheckBackward, kRunBackward>(m, backward_name);
  }
};

// The spec's storage types: f(TypeTag<x>, TypeTag<param>) for the norm ops, f(TypeTag<x>, TypeTag<sum>,
// TypeTag<param>) for dropout_add_norm.
template <typename F>
void dispatch_spec_dtypes(const NormSpec& a, const F& f) {
  dispatch_dtypes<HostStorage>(a.x_dtype, a.param_dtype, f);
}
template <typename F>
void dispatch_spec_dtypes(const AddNormSpec& a, const F& f) {
  dispatch_dtypes<HostStorage>(a.x_dtype, a.sum_dtype, a.param_dtype, f);
}

// A norm op's run on its allocated outputs, unless M = 0: reads the seed, then calls fp64(tags..., seed) for fp64 x
// (the generic loops in fp64) or fp32(tags..., seed) for fp32 / bf16 / fp16 x (the fp32 row kernels), tags the
// TypeTags of dispatch_spec_dtypes.
template <typename Spec, typename Fp64, typename Fp32>
void run_rows_cpu(const Spec& a, const Fp64& fp64, const Fp32& fp32) {
  if (a.M == 0) return;
  const DropoutSeed seed = read_dropout_seed(a.dropout, a.seed);
  dispatch_spec_dtypes(a, [&](auto xt, auto... more) {
    if constexpr (std::is_same_v<typename decltype(xt)::type, double>) {
      fp64(xt, more..., seed);
    } else {
      fp32(xt, more..., seed);
    }
  });
}

}  // namespace gpuopt

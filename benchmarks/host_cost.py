"""Host time of the Triton launchers: what one call of an op's Python launcher costs on the CPU before any kernel
runs (configuration, grid planning, argument packing), beside the GPU time its bytes need. Runs anywhere (no GPU).

    python -m benchmarks.host_cost [--mbytes 256] [--repeat 300] [--gbps 3900]

The launchers run on meta tensors of the benchmark's shapes (benchmarks/run.py: `--mbytes` of forward data a
case), with the kernel launches replaced by a counter and the compiled-kernel facts by a constant (a GPU launch
reads them from a cache), so the time printed is the launcher's own Python work, not Triton's launch of the
compiled kernel (its own host cost, about tens of microseconds a launch, comes on top) nor torch's dispatch.

Beside it: the op's ideal bytes over `--gbps` (3900 GB/s: a device copy on the H200, read + write, docs/RESULTS.md),
i.e. the GPU time of the op at copy speed, an estimate. Where host time per call approaches that, a benchmark
that launches the op back to back (do_bench) measures the host, not the kernel.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


class _Counter:
    """A `wrap` hook: each launch only counts."""

    def __init__(self):
        self.launches = 0

    def __call__(self, kernel):
        counter = self

        class _Grid:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    counter.launches += 1

                return launch

        return _Grid()


def _facts(kernel, args, kwargs):
    from gpuopt_ops.triton_kernels.common import KernelFacts

    return KernelFacts(64, 0, int(kwargs.get("num_warps", 4)))


def cases(dtype: torch.dtype, n: int, mbytes: float):
    """(op, direction, ideal bytes, launcher call(wrap)) for one shape."""
    from gpuopt_ops.triton_kernels import bias_relu as BR
    from gpuopt_ops.triton_kernels import dropout_add_norm as DAN
    from gpuopt_ops.triton_kernels import layer_norm_dropout_relu as LDR

    m = max(1, int(mbytes * 2**20) // (n * dtype.itemsize))
    e = dtype.itemsize * m * n

    def t(*shape, dt=dtype):
        return torch.empty(*shape, device="meta", dtype=dt)

    x, out, g, gx, r, s, gs, gr = (t(m, n) for _ in range(8))
    w, b, gw, gb = t(n), t(n), t(n, dt=torch.float32), t(n, dt=torch.float32)
    mean, rstd, seed = t(m, dt=torch.float32), t(m, dt=torch.float32), t(1, dt=torch.int64)
    kw = dict(sm_count=132, facts=_facts)
    return [
        ("layer_norm_dropout_relu", "fwd", 2 * e,
         lambda wrap: LDR.launch_forward(x, w, b, seed, out, mean, rstd, 0.1, 1e-5, wrap=wrap, **kw)),
        ("layer_norm_dropout_relu", "bwd", 3 * e,
         lambda wrap: LDR.launch_backward(g, x, w, b, mean, rstd, seed, gx, gw, gb, 0.1, wrap=wrap, **kw)),
        ("dropout_add_norm", "fwd", 4 * e,
         lambda wrap: DAN.launch_forward(x, r, w, b, seed, out, s, mean, rstd, 0.1, 1e-5, False, wrap=wrap, **kw)),
        ("dropout_add_norm", "bwd", 5 * e,
         lambda wrap: DAN.launch_backward(
             g, gs, s, w, b, mean, rstd, seed, gx, gr, gw, gb, 0.1, False, wrap=wrap, **kw)),
        ("bias_relu", "fwd", 2 * e, lambda wrap: BR.launch_forward(x, b, out, wrap=wrap, **kw)),
        ("bias_relu", "bwd", 3 * e, lambda wrap: BR.launch_backward(g, out, gx, gb, wrap=wrap, **kw)),
    ]  # fmt: skip


def measure(dtypes, ns, mbytes: float, repeat: int, gbps: float) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for n in ns:
            for op, direction, nbytes, call in cases(dtype, n, mbytes):
                counter = _Counter()
                for _ in range(10):  # warm-up: caches of the launchers' planning
                    call(counter)
                counter.launches = 0
                t0 = time.perf_counter()
                for _ in range(repeat):
                    call(counter)
                host_us = (time.perf_counter() - t0) / repeat * 1e6
                rows.append(
                    dict(
                        op=op,
                        direction=direction,
                        dtype=str(dtype).replace("torch.", ""),
                        n=n,
                        launches=counter.launches // repeat,
                        host_us=host_us,
                        gpu_us_at_copy=nbytes / (gbps * 1e3),
                    )
                )
    return rows


def main(argv=None) -> int:
    os.environ.pop("TRITON_INTERPRET", None)  # the launchers as a GPU run imports them (before the first import)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mbytes", type=float, default=256.0, help="forward bytes a case, as benchmarks/run.py (MB)")
    ap.add_argument("--ns", default="1024,4096,16384")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--gbps", type=float, default=3900.0, help="copy bandwidth for the GPU-time column (GB/s)")
    a = ap.parse_args(argv)
    names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    rows = measure([names[d] for d in a.dtypes.split(",")], [int(n) for n in a.ns.split(",")], a.mbytes, a.repeat,
                   a.gbps)  # fmt: skip
    print(f"host time of one launcher call (measured here) vs GPU time at {a.gbps:.0f} GB/s (estimate), "
          f"{a.mbytes:g} MB of forward data")  # fmt: skip
    for r in rows:
        print(
            f"{r['op']:24s} {r['direction']} {r['dtype']:9s} N={r['n']:<6d} launches {r['launches']}  "
            f"host {r['host_us']:7.1f} us  GPU at copy speed {r['gpu_us_at_copy']:7.1f} us  "
            f"ratio {r['host_us'] / r['gpu_us_at_copy']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

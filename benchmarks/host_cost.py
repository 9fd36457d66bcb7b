"""Host time of the Triton launchers: what one call of an op's Python launcher costs on the CPU before any kernel
runs (configuration, grid planning, argument packing), beside the GPU time its bytes need. Runs anywhere (no GPU).

    python -m benchmarks.host_cost [--mbytes 256] [--repeat 300] [--gbps 3900]

The launchers run on meta tensors of the benchmark's shapes (benchmarks/run.py: `--mbytes` of forward data a
case), with the kernel launches replaced by a counter (meta tensors have no compiled kernel to ask: the planning
rule), so the time printed is the launcher's own Python work on a repeated call, not Triton's launch of the
compiled kernel (its own host cost, several microseconds a launch, comes on top) nor torch's dispatch.

    python -m benchmarks.host_cost --parts [--ns ...] [--dtypes ...]

breaks the whole host path of each Triton op's call into its parts (measure_parts): autograd, the op's
dispatch, its checks, the launcher, the compiled-kernel queries (at a cache hit's cost), allocations and launches.
Times are the CPU time of this process (the fastest of 7 rounds), so other work on a shared machine adds little.

Beside it: the op's ideal bytes over `--gbps` (3900 GB/s: a device copy on the H200, read + write, docs/RESULTS.md),
i.e. the GPU time of the op at copy speed, an estimate. Where host time per call approaches that, a benchmark
that launches the op back to back (do_bench) measures the host, not the kernel.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import torch


class _Counter:
    """A `wrap` hook: each launch only counts (`wrap(kernel)[grid](...)` builds nothing a launch, so that the
    counter adds as little as it can to the time measured)."""

    def __init__(self):
        self.launches = 0

    def __call__(self, kernel):
        return self

    def __getitem__(self, grid):
        return self._launch

    def _launch(self, *args, **kwargs):
        self.launches += 1


def cases(dtype: torch.dtype, n: int, mbytes: float):
    """(op, direction, ideal bytes, launcher call(wrap)) for one shape."""
    from gpuopt_ops.triton_kernels import bias_act as BR
    from gpuopt_ops.triton_kernels import dropout_add_norm as DAN
    from gpuopt_ops.triton_kernels import norm_dropout as LDR

    m = max(1, int(mbytes * 2**20) // (n * dtype.itemsize))
    e = dtype.itemsize * m * n

    def t(*shape, dt=dtype):
        return torch.empty(*shape, device="meta", dtype=dt)

    x, out, g, gx, r, s, gs, gr = (t(m, n) for _ in range(8))
    w, b, gw, gb = t(n), t(n), t(n, dt=torch.float32), t(n, dt=torch.float32)
    mean, rstd, seed = t(m, dt=torch.float32), t(m, dt=torch.float32), t(1, dt=torch.int64)
    return [
        ("layer_norm_dropout_relu", "fwd", 2 * e,
         lambda wrap: LDR.launch_forward(x, w, b, seed, out, mean, rstd, 0.1, 1e-5, wrap=wrap)),
        ("layer_norm_dropout_relu", "bwd", 3 * e,
         lambda wrap: LDR.launch_backward(g, x, w, b, mean, rstd, seed, gx, gw, gb, 0.1, wrap=wrap)),
        ("dropout_add_norm", "fwd", 4 * e,
         lambda wrap: DAN.launch_forward(x, r, w, b, seed, out, s, mean, rstd, 0.1, 1e-5, False, wrap=wrap)),
        ("dropout_add_norm", "bwd", 5 * e,
         lambda wrap: DAN.launch_backward(
             g, gs, s, w, b, mean, rstd, seed, gx, gr, gw, gb, 0.1, False, wrap=wrap)),
        ("bias_relu", "fwd", 2 * e, lambda wrap: BR.launch_forward(x, b, out, wrap=wrap)),
        ("bias_relu", "bwd", 3 * e, lambda wrap: BR.launch_backward(g, out, gx, gb, wrap=wrap)),
    ]  # fmt: skip


def measure(dtypes, ns, mbytes: float, repeat: int, gbps: float) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for n in ns:
            for op, direction, nbytes, call in cases(dtype, n, mbytes):
                counter = _Counter()
                host_us = _time(
                    functools.partial(call, counter), max(1, repeat // 7), warm=10
                )  # warm: the launchers' caches
                counter.launches = 0
                call(counter)
                rows.append(
                    dict(
                        op=op,
                        direction=direction,
                        dtype=str(dtype).replace("torch.", ""),
                        n=n,
                        launches=counter.launches,
                        host_us=host_us,
                        gpu_us_at_copy=nbytes / (gbps * 1e3),
                    )
                )
    return rows


# --------------------------------------------------------------------------------------------- the whole path
class _FactsHit:
    """Stands in for common.compiled_facts on meta tensors at the cost of a hit of its cache: torch.cuda's
    availability check and the same key (the arguments' specializations) looked up in a dict. Counts its calls."""

    def __init__(self):
        self.calls = 0
        self._seen = {}

    def __call__(self, kernel, device, args, kwargs):
        from gpuopt_ops.triton_kernels import common as C

        self.calls += 1
        torch.cuda.is_available()
        key = (kernel, 0, tuple(C._spec(a) for a in args), tuple(sorted((k, C._spec(v)) for k, v in kwargs.items())))
        got = self._seen.get(key)
        if got is None:
            got = self._seen[key] = C.KernelFacts(64, 0, int(kwargs.get("num_warps", 4)))
        return got


class _CountAllocs:
    """Counts the tensors allocated through torch.empty / zeros / empty_like / zeros_like while active (the
    launchers' and the ops' own allocations; what torch allocates inside its ops is not counted)."""

    NAMES = ("empty", "zeros", "empty_like", "zeros_like")

    def __enter__(self):
        self.allocs = 0
        self._orig = {k: getattr(torch, k) for k in self.NAMES}

        def counting(fn):
            def alloc(*args, **kwargs):
                self.allocs += 1
                return fn(*args, **kwargs)

            return alloc

        for k, fn in self._orig.items():
            setattr(torch, k, counting(fn))
        return self

    def __exit__(self, *exc):
        for k, fn in self._orig.items():
            setattr(torch, k, fn)


class _MetaCase:
    """The shapes of a host-cost case: M rows of N (M from --mbytes of x), meta tensors of them, and the op's seed,
    p and eps."""

    def __init__(self, dtype: torch.dtype, n: int, mbytes: float):
        self.dtype, self.n = dtype, n
        self.m = max(1, int(mbytes * 2**20) // (n * dtype.itemsize))
        self.seed = self.t(1, dt=torch.int64)
        self.p, self.eps = 0.1, 1e-5

    def t(self, *shape, dt=None, grad=False):
        return torch.empty(*shape, device="meta", dtype=dt or self.dtype, requires_grad=grad)


def _ldr_case(c: _MetaCase, name, fwd_op, bwd_op, check, flags, flag_kw):
    """layer_norm_dropout_relu, or norm_dropout with its flags: layer_norm_dropout_relu's kernels."""
    from gpuopt_ops.triton_kernels import norm_dropout as LDR

    m, n, t, seed, p, eps = c.m, c.n, c.t, c.seed, c.p, c.eps

    def make(grad):
        return dict(x=t(m, n, grad=grad), w=t(n, grad=grad), b=t(n, grad=grad))

    def fwd(a):
        return fwd_op(a["x"], a["w"], a["b"], seed, p, eps, *flags)

    def saved(a):
        out, mean, rstd = fwd_op(a["x"], a["w"], a["b"], seed, p, eps, *flags)
        return (t(m, n), a["x"], a["w"], a["b"], mean, rstd, seed, p, *flags)

    return dict(
        op=name, make=make, fwd=fwd, inputs=lambda a: [a["x"], a["w"], a["b"]], saved=saved, bwd=bwd_op,
        check=lambda s: check(*s),
        launcher=lambda s: LDR.launch_backward(
            s[0], s[1], s[2], s[3], s[4], s[5], s[6], t(m, n), t(n), t(n), p, wrap=_WRAP_HOLDER[0], **flag_kw),
    )  # fmt: skip


def _bias_case(c: _MetaCase, name, act):
    """bias_relu (act None) or bias_act with act code `act`: bias_relu's kernels."""
    from gpuopt_ops import checks as V
    from gpuopt_ops import triton_ops as T
    from gpuopt_ops.triton_kernels import bias_act as BR

    m, n, t, f32 = c.m, c.n, c.t, torch.float32

    def make(grad):
        return dict(x=t(m, n, grad=grad), b=t(n, grad=grad))

    if act is None:
        fwd = lambda a: T.triton_bias_relu(a["x"], a["b"])  # noqa: E731
        saved = lambda a: (t(m, n), T.triton_bias_relu(a["x"], a["b"]))  # noqa: E731
        return dict(
            op=name, make=make, fwd=fwd, inputs=lambda a: [a["x"], a["b"]], saved=saved,
            bwd=T.triton_bias_relu_backward, check=lambda s: V.check_bias_relu_backward(*s),
            launcher=lambda s: BR.launch_backward(s[0], s[1], t(m, n), t(n, dt=f32), wrap=_WRAP_HOLDER[0]),
        )  # fmt: skip
    fwd = lambda a: T.triton_bias_act(a["x"], a["b"], act)  # noqa: E731
    saved = lambda a: (t(m, n), a["x"], a["b"], act)  # noqa: E731
    return dict(
        op=name, make=make, fwd=fwd, inputs=lambda a: [a["x"], a["b"]], saved=saved,
        bwd=T.triton_bias_act_backward, check=lambda s: V.check_bias_act_backward(*s),
        launcher=lambda s: BR.launch_backward(
            s[0], s[1], t(m, n), t(n, dt=f32), bias=s[2], act=act, wrap=_WRAP_HOLDER[0]),
    )  # fmt: skip


def _dan_case(c: _MetaCase):
    """dropout_add_norm (LayerNorm) with a residual."""
    from gpuopt_ops import checks as V
    from gpuopt_ops import triton_ops as T
    from gpuopt_ops.triton_kernels import dropout_add_norm as DAN

    m, n, t, seed, p, eps = c.m, c.n, c.t, c.seed, c.p, c.eps

    def make(grad):
        return dict(x=t(m, n, grad=grad), r=t(m, n, grad=grad), w=t(n, grad=grad), b=t(n, grad=grad))

    fwd = lambda a: T.triton_dropout_add_norm(a["x"], a["r"], a["w"], a["b"], seed, p, eps, False, False)  # noqa: E731

    def saved(a):
        _, s, mean, rstd = fwd(a)
        return (t(m, n), None, s, a["w"], a["b"], mean, rstd, seed, p, False, True)

    return dict(
        op="dropout_add_norm", make=make, fwd=fwd, inputs=lambda a: [a["x"], a["r"], a["w"], a["b"]],
        saved=saved, bwd=T.triton_dropout_add_norm_backward,
        check=lambda s: V.check_dropout_add_norm_backward(*s),
        launcher=lambda s: DAN.launch_backward(
            s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], t(m, n), t(m, n), t(n), t(n), p, False,
            wrap=_WRAP_HOLDER[0]),
    )  # fmt: skip


def _op_cases(dtype: torch.dtype, n: int, mbytes: float):
    """(op, inputs maker, forward op call, backward op call, checks call of the backward, launcher of the
    backward) for the Triton ops, on meta tensors of the benchmark's shapes (weight and bias, p = 0.1; dropout_add_norm
    with a residual)."""
    from gpuopt_ops import checks as V
    from gpuopt_ops import triton_ops as T

    c = _MetaCase(dtype, n, mbytes)
    return [
        _bias_case(c, "bias_relu", None),
        _bias_case(c, "bias_act_gelu", 1),
        _ldr_case(c, "layer_norm_dropout_relu", T.triton_layer_norm_dropout_relu,
                  T.triton_layer_norm_dropout_relu_backward, V.check_ldr_backward, (), {}),
        _ldr_case(c, "norm_dropout_rms", T.triton_norm_dropout, T.triton_norm_dropout_backward,
                  V.check_norm_dropout_backward, (True, False), dict(rms=True, relu=False)),
        _dan_case(c),
    ]  # fmt: skip


_WRAP_HOLDER = [None]


def _time(fn, repeat: int, warm: int = 5) -> float:
    """The fastest of 7 rounds of the mean CPU time of fn() (us, this process's CPU time: the time it waits for a
    core on a shared machine is not counted), after `warm` calls."""
    for _ in range(warm):
        fn()
    rounds = []
    for _ in range(7):
        t0 = time.process_time()
        for _ in range(repeat):
            fn()
        rounds.append((time.process_time() - t0) / repeat * 1e6)
    return min(rounds)


def measure_parts(dtypes, ns, mbytes: float, repeat: int) -> list[dict]:
    """The host path of the Triton ops, part by part, on meta tensors with the launches counted, not run, and the
    compiled-kernel facts from a stand-in at a cache hit's cost (_FactsHit), so that every Python step a GPU call
    takes runs here:

    - bwd_autograd: torch.autograd.grad through the op (the engine, the registered backward, the op's dispatch
      and everything below), minus bwd_op;
    - bwd_op: the backward op called directly (dispatch, the triton_op backend, checks, allocations, launcher);
    - bwd_checks: the op's input checks alone; bwd_launcher: the launcher alone (its planning, the compiled-fact
      queries, the partial buffers, the launches counted);
    - facts_us: the part of the launcher's time spent in compiled-fact queries (the launcher with the stand-in
      minus the launcher with a free one), and their number a call;
    - allocs: tensors the backward op allocates; launches: Triton launches of a backward call;
    - fwd_op: the forward op called directly; fwd_autograd: the forward under autograd minus fwd_op.
    Triton's own launch (binder, cache lookup, the driver) comes on top of each launch (not measured here)."""
    from gpuopt_ops import triton_ops as T
    from gpuopt_ops.triton_kernels import common as C

    orig = (T._skip_launch, T._WRAP, C.compiled_facts)
    rows = []
    try:
        T._skip_launch = lambda x, op: False
        for dtype in dtypes:
            for n in ns:
                for case in _op_cases(dtype, n, mbytes):
                    rows.append(_parts_of(case, dtype, n, repeat))
    finally:
        T._skip_launch, T._WRAP, C.compiled_facts = orig
        _WRAP_HOLDER[0] = None
    return rows


def _parts_of(case: dict, dtype: torch.dtype, n: int, repeat: int) -> dict:
    """One row of measure_parts (the op's launches counted, the compiled facts from _FactsHit)."""
    from gpuopt_ops import triton_ops as T
    from gpuopt_ops.triton_kernels import common as C

    counter, hit = _Counter(), _FactsHit()
    T._WRAP = _WRAP_HOLDER[0] = counter
    C.compiled_facts = hit
    plain = case["make"](False)
    graded = case["make"](True)
    s = case["saved"](plain)
    bwd, fwd, launcher = case["bwd"], case["fwd"], case["launcher"]
    y = fwd(graded)
    y0 = y[0] if isinstance(y, tuple) else y
    ins = case["inputs"](graded)
    g = torch.empty_like(y0)
    row = dict(op=case["op"], dtype=str(dtype).replace("torch.", ""), n=n)
    row["fwd_op"] = _time(lambda: fwd(plain), repeat)
    row["fwd_autograd"] = _time(lambda: fwd(graded), repeat) - row["fwd_op"]
    row["bwd_op"] = _time(lambda: bwd(*s), repeat)
    row["bwd_autograd"] = _time(lambda: torch.autograd.grad(y0, ins, g, retain_graph=True), repeat) - row["bwd_op"]
    row["bwd_checks"] = _time(lambda: case["check"](s), repeat)
    row["bwd_launcher"] = _time(lambda: launcher(s), repeat)
    hit.calls = 0
    counter.launches = 0
    launcher(s)
    row["facts_calls"], row["launches"] = hit.calls, counter.launches
    const = C.KernelFacts(64, 0, 4)
    C.compiled_facts = lambda kernel, device, args, kwargs: const
    row["facts_us"] = max(0.0, row["bwd_launcher"] - _time(lambda: launcher(s), repeat))
    C.compiled_facts = hit
    with _CountAllocs() as mode:
        bwd(*s)
    row["allocs"] = mode.allocs
    return row


def print_parts(rows) -> None:
    print("host path of the Triton ops, part by part (us a call, measured here; meta tensors, launches counted)")
    head = ("op", "dtype", "N", "fwd op", "fwd autograd", "bwd total", "bwd autograd", "bwd op", "checks",
            "launcher", "facts", "queries", "allocs", "launches")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        vals = (r["op"], r["dtype"], str(r["n"]), f"{r['fwd_op']:.1f}", f"{r['fwd_autograd']:.1f}",
                f"{r['bwd_op'] + r['bwd_autograd']:.1f}", f"{r['bwd_autograd']:.1f}", f"{r['bwd_op']:.1f}",
                f"{r['bwd_checks']:.1f}", f"{r['bwd_launcher']:.1f}", f"{r['facts_us']:.1f}", str(r["facts_calls"]),
                str(r["allocs"]), str(r["launches"]))  # fmt: skip
        print("| " + " | ".join(vals) + " |")


def main(argv=None) -> int:
    os.environ.pop("TRITON_INTERPRET", None)  # the launchers as a GPU run imports them (before the first import)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mbytes", type=float, default=256.0, help="forward bytes a case, as benchmarks/run.py (MB)")
    ap.add_argument("--ns", default="1024,4096,16384")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--gbps", type=float, default=3900.0, help="copy bandwidth for the GPU-time column (GB/s)")
    ap.add_argument("--parts", action="store_true", help="the ops' whole host path, part by part (measure_parts)")
    a = ap.parse_args(argv)
    names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if a.parts:
        print_parts(measure_parts([names[d] for d in a.dtypes.split(",")], [int(n) for n in a.ns.split(",")],
                                  a.mbytes, max(1, a.repeat // 5)))  # fmt: skip
        return 0
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

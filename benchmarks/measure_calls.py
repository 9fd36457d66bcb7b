"""benchmarks/gpu_measure.py's calls and their timing: a row's inputs and call, the profiler session of a group,
the eager (do_bench) and CUDA-graph replay times."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from benchmarks.measure_plan import (
    EAGER_REP_MS,
    EAGER_WARMUP_MS,
    ELEMENTS,
    EPS,
    MARKER,
    MARKER_CYCLES,
    PEER_BACKENDS,
    PROFILE_CALLS,
    REPLAY_CALLS,
    REPLAY_TIMES,
    P,
    Row,
)
from benchmarks.measure_results import aggregate_kernels, median, split_at_markers


# ------------------------------------------------------------------------------------------------ the calls
def make_inputs(dtype_name: str, n: int, device: str, elements: int = ELEMENTS, seed: int = 0) -> dict:
    import torch

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    m = elements // n
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, device=device, generator=gen)).to(dtype)

    return {
        "x": rnd(m, n).requires_grad_(True),
        "r": rnd(m, n).requires_grad_(True),
        "w": rnd(n, scale=0.1, shift=1.0).requires_grad_(True),
        "b": rnd(n, scale=0.1).requires_grad_(True),
        "g": rnd(m, n),
        "gs": rnd(m, n),
    }


def _forward(row: Row, t: dict, backend: str):
    """(forward callable -> tuple of outputs, the inputs whose gradients the backward computes, the gradients of
    the outputs)."""
    import torch

    x, r, w, b, g, gs = (t[k] for k in ("x", "r", "w", "b", "g", "gs"))
    if row.backend in PEER_BACKENDS:
        if row.backend == "liger" and row.op == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            # its backward overwrites the tensors it saved (gate and up) with their gradients: copies, not the
            # group's inputs
            a, u = (v.detach().clone().requires_grad_(True) for v in (x, r))
            return (lambda: (LigerSiLUMulFunction.apply(a, u),)), (a, u), (g,)
        if row.backend == "liger":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return (lambda: (LigerLayerNormFunction.apply(x, w, b, EPS),)), (x, w, b), (g,)
        raise ValueError("quack rows are made by _quack_call")
    import gpuopt_ops as G

    if row.op == "ldr":
        return (lambda: (G.layer_norm_dropout_relu(x, x.shape[-1], w, b, p=P, backend=backend),)), (x, w, b), (g,)
    if row.op == "bias_relu":
        return (lambda: (G.bias_relu(x, b, backend=backend),)), (x, b), (g,)
    if row.op == "dan_ln":
        return (lambda: G.dropout_add_norm(x, r, w, b, p=P, prenorm=True, backend=backend)), (x, r, w, b), (g, gs)
    if row.op == "dan_rms":
        fn = lambda: G.dropout_add_norm(x, r, w, None, norm="rms", p=P, prenorm=True, backend=backend)  # noqa: E731
        return fn, (x, r, w), (g, gs)
    if row.op == "rms_drop":
        return (lambda: (G.norm_dropout(x, w, None, norm="rms", p=P, backend=backend),)), (x, w), (g,)
    if row.op == "bias_gelu":
        return (lambda: (G.bias_act(x, b, act="gelu", backend=backend),)), (x, b), (g,)
    if row.op == "gated_silu":  # gate = x, up = r; no dropout (the model's gated rows)
        return (lambda: (G.gated_act(x, r, act="silu", backend=backend),)), (x, r), (g,)
    if row.op == "gated_silu_packed":  # one (M, 2F) input [x | r], made once a group
        if "xr" not in t:
            t["xr"] = torch.cat([x.detach(), r.detach()], dim=-1).requires_grad_(True)
        xr = t["xr"]
        return (lambda: (G.gated_act(xr, None, act="silu", backend=backend),)), (xr,), (g,)
    if row.op == "copy":
        y = torch.empty_like(x, requires_grad=False)
        return (lambda: (y.copy_(x.detach()),)), (), ()
    raise ValueError(f"unknown op {row.op!r}")


def make_call(row: Row, t: dict, device: str) -> Callable[[], object]:
    """A no-argument callable running one call of the row on the inputs `t`."""
    import torch

    backend = row.backend
    if row.backend == "quack":
        from benchmarks.providers import _quack_runner

        return _quack_runner("ldr", row.direction, device, t["x"], t["w"], t["b"], t["g"])
    fwd, inputs, grads = _forward(row, t, backend)
    if row.direction == "fwd" or row.op == "copy":

        def run():
            with torch.no_grad():
                return fwd()

        return run
    with torch.enable_grad():
        outs = fwd()
    return lambda: torch.autograd.grad(outs, inputs, grads, retain_graph=True)


def sync(device: str) -> None:
    """Waits for the device's queued work (a no-op on the CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------ timing
def _device_events(prof) -> list[tuple[str, float, float]]:
    """(name, start us, duration us) of a profiler session's kernels, memsets and memcpys (not the GPU spans of
    record_function ranges)."""
    import torch

    return [
        (e.name, e.time_range.start, e.time_range.elapsed_us())
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith("gpu_measure_")
    ]


_MARKER_NAME: list[str] = []


def marker_name() -> str:
    """The profiler's name of torch.cuda._sleep's kernel on this machine, read once from a session of that kernel
    alone (which also pays the profiler's first start); MARKER where that session shows no single kernel."""
    if not _MARKER_NAME:
        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(MARKER_CYCLES)
            torch.cuda.synchronize()
        names = {name for name, _, _ in _device_events(prof)}
        _MARKER_NAME.append(names.pop() if len(names) == 1 else MARKER)
    return _MARKER_NAME[0]


def profile_group(live: list[tuple[int, Callable]], device: str, calls: int = PROFILE_CALLS) -> dict:
    """One profiler session over a group's rows: per row index, (kernel_us, kernels, host_us). A marker kernel
    precedes each row's calls and follows the last; each call runs inside a record_function range."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for i, fn in live:
            if device == "cuda":
                torch.cuda._sleep(MARKER_CYCLES)
            for _ in range(calls):
                with record_function(f"gpu_measure_row_{i}"):
                    fn()
            sync(device)
        if device == "cuda":
            torch.cuda._sleep(MARKER_CYCLES)
            torch.cuda.synchronize()
    host: dict[int, list[float]] = {}
    for e in prof.events():
        if e.name.startswith("gpu_measure_row_") and e.device_type == torch.autograd.DeviceType.CPU:
            host.setdefault(int(e.name.rsplit("_", 1)[1]), []).append(e.time_range.elapsed_us())
    out = {i: {"host_us": median(host.get(i, [])), "kernel_us": None, "kernels": None} for i, _ in live}
    if device == "cuda":
        chunks = split_at_markers(_device_events(prof), marker_name())
        if len(chunks) == len(live):
            for (i, _), chunk in zip(live, chunks):
                k_us, kernels = aggregate_kernels(chunk, calls)
                out[i].update(kernel_us=k_us, kernels=kernels)
        else:
            for i, _ in live:
                out[i]["error"] = f"profiler: {len(chunks)} marker-separated chunks for {len(live)} rows"
    return out


def time_eager(fn, device: str) -> float:
    """Microseconds a call, as benchmarks/run.py measures (do_bench median on a GPU; perf_counter on a CPU)."""
    if device == "cuda":
        from benchmarks import run as BR

        med, _, _ = BR.time_gpu(fn, EAGER_WARMUP_MS, EAGER_REP_MS)
        return med[0] * 1e3
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def time_replay(make_fn: Callable[[], Callable], calls: int = REPLAY_CALLS, times: int = REPLAY_TIMES) -> float:
    """Microseconds a call in a CUDA graph of `calls` calls, the median of `times` event-timed replays.

    make_fn builds the call on the capture's side stream: a backward row's forward runs there, and autograd runs
    a backward node on its forward's stream, so the backward's kernels are launched into the capturing stream."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn = make_fn()
        fn()
    s.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(times):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / calls)
    del graph, fn
    return statistics.median(samples)

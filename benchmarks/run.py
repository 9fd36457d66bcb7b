"""Side-by-side benchmark of the gpuopt ops against eager PyTorch, torch.compile, Liger and a plain copy.

    python -m benchmarks.run                       # GPU if there is one, else CPU; CSV under bench_out/
    python -m benchmarks.run --device cpu --ops ldr --dtypes fp32 --ns 1024 --m 8192 --providers cpu,eager,compile,copy
    python -m benchmarks.run --quick               # tiny shapes, seconds (the CI smoke test)

Every provider of a case runs on the same input tensors, in the same process, one after the other (on the CPU
in `--rounds` interleaved rounds whose samples are pooled), so ratios between providers are meaningful even on
a noisy machine; absolute times are not.

Providers
    cuda     torch.ops.gpuopt.* C++/CUDA kernels (through gpuopt_ops.layer_norm_dropout_relu / bias_relu and
             their autograd, i.e. what a user calls)                                            GPU only
    cpu      the same ops on their C++ CPU kernels                                              CPU only
    triton   the Triton twins (backend='triton', torch.ops.gpuopt.triton_*), skipped with a note when
             gpuopt_ops.triton_ops cannot be imported                                            GPU only
    eager    F.layer_norm -> F.dropout -> F.relu, and relu(x + b)
    compile  torch.compile of the eager code: mode="max-autotune" on GPU, default mode on CPU; dynamic=False
    liger    Liger-Kernel's LayerNorm + torch dropout + relu (ldr), its SwiGLU (LigerSiLUMulFunction: gated with
             --act silu, two tensors), when liger_kernel is importable; its SwiGLU backward writes the
             gradients into the tensors it saved, so it runs on copies of the inputs
    quack    quack-kernels' LayerNorm alone, no dropout or ReLU (ldr only): the norm-only speed anchor
    copy     y.copy_(x) on an (M, N) tensor of the case's dtype: this machine's bandwidth baseline

Modes
    fwd      the training forward (dropout active), autograd off (torch.no_grad)
    bwd      torch.autograd.grad of a forward taken once (retain_graph=True): the backward kernels alone
    fwd+bwd  forward with autograd on, then torch.autograd.grad (a training step of the block)

Bytes model (GB/s = bytes / time). It counts the minimal traffic of a fused kernel, with e = bytes per element
of x (2 for bf16/fp16, 4 for fp32), pe = bytes per element of the parameters (the dtype of x here), a = 4 bytes
of a fp32 statistic. Every provider of a case is charged the same bytes, so GB/s is proportional to 1/time
(eager really moves more: its GB/s is an "effective" figure, comparable with the fused ones).
    ldr  fwd      read x (M*N*e) + weight, bias (2*N*pe); write out (M*N*e) + mean, rstd (2*M*a)
    ldr  bwd      read grad_out, x (2*M*N*e) + weight, bias (2*N*pe) + mean, rstd (2*M*a);
                  write grad_x (M*N*e) + dgamma, dbeta (2*N*pe)
    bias_relu fwd read x (M*N*e) + bias (N*pe); write out (M*N*e)
    bias_relu bwd read grad_out, out (2*M*N*e); write grad_x (M*N*e) + dbias (N*pe)
    dan_ln   fwd  dropout(x) + residual → LayerNorm, the sum also returned (prenorm): read x, residual
                  (2*M*N*e) + weight, bias (2*N*pe); write out, sum (2*M*N*e) + mean, rstd (2*M*a)
    dan_ln   bwd  read grad_out, sum (2*M*N*e) + weight, bias + mean, rstd; write grad_x, grad_residual
                  (2*M*N*e) + dgamma, dbeta (2*N*pe)
    add_rms  fwd  x + residual → RMSNorm (no dropout, no bias), the sum returned: as dan_ln with one parameter
                  and one statistic
    ln_drop       LayerNorm → dropout (BERT's embeddings; gpuopt_ops.norm_dropout): as ldr
    bias_gelu fwd read x (M*N*e) + bias (N*pe); write out (M*N*e)
    bias_gelu bwd read grad_out, x (2*M*N*e) + bias (N*pe); write grad_x (M*N*e) + dbias (N*pe)
    gated    fwd  gated_act(gate, up, act=--act) (SwiGLU by default; gpuopt_ops.gated_act, eager
                  gpuopt_ops.reference.eager_gated_act), N = F, the output's last dimension, dropout p = --gated-p
                  (default 0, as LLaMA-style MLPs): read gate, up (2*M*N*e); write out (M*N*e)
    gated    bwd  read grad_out, gate, up (3*M*N*e); write grad_gate, grad_up (2*M*N*e)
    gated_packed  the same with one (M, 2N) input holding [gate | up] (a fused gate_up projection's output), whose
                  gradient is one (M, 2N) tensor [grad_gate | grad_up]: the same bytes
    fwd+bwd       the sum of fwd and bwd
    copy          read x + write y (2*M*N*e)
ratio_copy = GB/s / GB/s of the copy measured in the same case; speedup_vs_eager = eager ms / ms,
speedup_vs_compile = compile ms / ms (empty when that provider did not run).

M (rows) is chosen per (dtype, N) so that the forward's bytes are at least --mbytes MB (default 256 MB on GPU,
16 MB on CPU), unless --m fixes it. Timing: triton.testing.do_bench (quantiles 0.5, 0.2, 0.8) on GPU: wall
time between events, so the host's cost of planning and launching the kernels shows where it exceeds their GPU
time; with --graphs, triton.testing.do_bench_cudagraph instead: replays of a CUDA graph of the runner (the
kernels alone; a provider that cannot be captured is noted and left out). A run with and one without --graphs
on the same cases separate the two. torch.utils.benchmark.Timer.blocked_autorange on CPU (all threads torch
uses), median / p20 / p80 of its per-run times.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable

import torch

from benchmarks.csv_columns import COLUMNS
from benchmarks.providers import GATED_OPS, Skip, _import_gpuopt, make_runner

OPS = ("ldr", "bias_relu", "dan_ln", "add_rms", "ln_drop", "bias_gelu", "gated", "gated_packed")
GATED_ACTS = ("silu", "gelu", "gelu_tanh", "relu")
MODES = ("fwd", "bwd", "fwd+bwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GPU_NS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
CPU_NS = (256, 1024, 4096, 16384)
GPU_PROVIDERS = ("cuda", "triton", "eager", "compile", "liger", "quack", "copy")
CPU_PROVIDERS = ("cpu", "eager", "compile", "copy")


# ------------------------------------------------------------------------------------------------ bytes model
def bytes_moved(op: str, mode: str, m: int, n: int, dtype: torch.dtype) -> int:
    """Minimal traffic of a fused kernel for (op, mode); see the module docstring."""
    e = torch.empty((), dtype=dtype).element_size()
    pe, a = e, 4
    if op == "copy":
        return 2 * m * n * e
    if op in ("ldr", "ln_drop"):
        fwd = 2 * m * n * e + 2 * n * pe + 2 * m * a
        bwd = 3 * m * n * e + 4 * n * pe + 2 * m * a
    elif op == "bias_relu":
        fwd = 2 * m * n * e + n * pe
        bwd = 3 * m * n * e + n * pe
    elif op in ("dan_ln", "add_rms"):
        k = 2 if op == "dan_ln" else 1  # parameters and statistics
        fwd = 4 * m * n * e + k * n * pe + k * m * a
        bwd = 4 * m * n * e + 2 * k * n * pe + k * m * a
    elif op == "bias_gelu":
        fwd = 2 * m * n * e + n * pe
        bwd = 3 * m * n * e + 2 * n * pe
    elif op in GATED_OPS:  # n = F, the output's last dimension
        fwd = 3 * m * n * e
        bwd = 5 * m * n * e
    else:
        raise ValueError(op)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def rows_for(n: int, dtype: torch.dtype, mbytes: float) -> int:
    """Smallest M whose forward (read x + write out) moves at least `mbytes` MB."""
    e = torch.empty((), dtype=dtype).element_size()
    return max(1, math.ceil(mbytes * 2**20 / (2 * n * e)))


# ------------------------------------------------------------------------------------------------ timing
def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_gpu(fn, warmup_ms: float, rep_ms: float, graphs: bool = False):
    import triton.testing

    if graphs:  # fn is called once (warm-up) and timed, then captured and replayed
        med, p20, p80 = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    else:
        med, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    return [med], [p20], [p80]


def time_cpu(fn, min_run_time: float) -> list[float]:
    """Per-run times in ms of blocked_autorange (all of torch's intra-op threads)."""
    from torch.utils import benchmark

    t = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = t.blocked_autorange(min_run_time=min_run_time)
    return [s * 1e3 for s in m.times]


def _percentile(vals: list[float], q: float) -> float:
    s = sorted(vals)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ------------------------------------------------------------------------------------------------ main loop
def metadata(device: str) -> dict[str, str]:
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "threads": str(torch.get_num_threads()),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        meta["triton"] = "not installed"
    meta["cuda"] = str(torch.version.cuda)
    if device == "cuda":
        meta["device"] = torch.cuda.get_device_name()
    else:
        name = ""
        try:
            with open("/proc/cpuinfo") as fh:
                for line in fh:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        meta["device"] = f"CPU {name} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
    try:
        import gpuopt_ops.build_info as bi

        meta["gpuopt_built_with_torch"] = bi.TORCH_VERSION
    except Exception:  # noqa: BLE001
        pass
    return meta


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma list of {OPS}")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {MODES}")
    ap.add_argument("--dtypes", default=None, help="comma list of bf16,fp16,fp32 (GPU default: all three, CPU: fp32)")
    ap.add_argument("--ns", default=None, help="comma list of N (GPU default 256..65536, CPU 256..16384)")
    ap.add_argument("--providers", default=None, help=f"GPU default {GPU_PROVIDERS}, CPU {CPU_PROVIDERS}")
    ap.add_argument("--m", type=int, default=None, help="fix the number of rows M (else sized by --mbytes)")
    ap.add_argument("--mbytes", type=float, default=None, help="forward bytes per case in MB (GPU 256, CPU 16)")
    ap.add_argument("--p", type=float, default=0.1, help="dropout probability")
    ap.add_argument("--gated-p", type=float, default=0.0, help="dropout probability of the gated ops (default 0)")
    ap.add_argument("--act", default="silu", choices=GATED_ACTS, help="activation of the gated ops (default silu)")
    ap.add_argument("--out", default="bench_out", help="output folder (CSV: bench_<device>.csv)")
    _add_timing_flags(ap)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def _add_timing_flags(ap: argparse.ArgumentParser) -> None:
    """How long and how the cases are timed: budget, --quick, rounds, per-device timing knobs, threads."""
    ap.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds; no new case starts once spent (GPU default none, CPU 300)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny shapes and short timings (smoke test): N 256,512, fp32, 1 MB, no compile",
    )
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds per case (CPU 3, GPU 1)")
    ap.add_argument("--min-run-time", type=float, default=None, help="CPU: seconds per provider per round")
    ap.add_argument("--rep-ms", type=float, default=None, help="GPU: do_bench rep (ms), default 100")
    ap.add_argument(
        "--graphs",
        action="store_true",
        help="GPU: time CUDA-graph replays of each runner (the kernels without the host's launch cost)",
    )
    ap.add_argument("--threads", type=int, default=None, help="CPU: torch.set_num_threads (default: torch's)")


def _comma_list(ap: argparse.ArgumentParser, text: str, what: str, known, shown) -> list[str]:
    """The entries of a comma list, each one of `known` (else the parser's error, listing `shown`)."""
    items = [s for s in text.split(",") if s]
    for item in items:
        if item not in known:
            ap.error(f"unknown {what} {item!r}; choose from {shown}")
    return items


def parse_args(argv=None):
    ap = _parser()
    args = ap.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        ap.error("--device cuda but torch.cuda.is_available() is False")
    if args.graphs and not gpu:
        ap.error("--graphs times CUDA graphs: it needs --device cuda")
    args.ops = _comma_list(ap, args.ops, "op", OPS, OPS)
    args.modes = _comma_list(ap, args.modes, "mode", MODES, MODES)
    if args.dtypes is None:
        args.dtypes = "fp32" if (args.quick or not gpu) else "bf16,fp16,fp32"
    args.dtypes = _comma_list(ap, args.dtypes, "dtype", DTYPES, tuple(DTYPES))
    if args.ns is None:
        args.ns = "256,512" if args.quick else ",".join(map(str, GPU_NS if gpu else CPU_NS))
    args.ns = [int(s) for s in args.ns.split(",") if s]
    if args.providers is None:
        prov = GPU_PROVIDERS if gpu else CPU_PROVIDERS
        if args.quick:
            prov = tuple(x for x in prov if x not in ("compile",))
        args.providers = ",".join(prov)
    known = set(GPU_PROVIDERS) | set(CPU_PROVIDERS)
    args.providers = _comma_list(ap, args.providers, "provider", known, sorted(known))
    _timing_defaults(args, gpu)
    return args


def _timing_defaults(args, gpu: bool) -> None:
    """The defaults of the sizing and timing flags, which depend on the device and --quick."""
    if args.mbytes is None:
        args.mbytes = 1.0 if args.quick else (256.0 if gpu else 16.0)
    if args.time_budget is None and not gpu:
        args.time_budget = 300.0
    if args.rounds is None:
        args.rounds = 1 if (gpu or args.quick) else 3
    if args.min_run_time is None:
        args.min_run_time = 0.01 if args.quick else 0.25
    if args.rep_ms is None:
        args.rep_ms = 20.0 if args.quick else 100.0


def run(args) -> str:
    device = args.device
    gpu = device == "cuda"
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_{device}.csv")
    meta = metadata(device)
    if gpu:
        meta["timing"] = "CUDA graph replays (--graphs)" if args.graphs else "events around each call (do_bench)"
    notes: list[str] = []
    t_start = time.monotonic()
    # bias_relu's fused ops need gpuopt too; load it once so import time is not charged to a case
    if any(p_ in ("cuda", "cpu", "triton") for p_ in args.providers):
        _import_gpuopt()
    cases = [(dt, n, op, mode) for dt in args.dtypes for n in args.ns for op in args.ops for mode in args.modes]
    rows: list[dict] = []
    skipped: dict[str, str] = {}
    done = 0
    with open(path, "w", newline="") as fh:
        writer = _csv_writer(fh, meta)
        inputs_key, inputs = None, None
        for dt_name, n, op, mode in cases:
            if args.time_budget is not None and time.monotonic() - t_start > args.time_budget:
                notes.append(
                    f"time budget of {args.time_budget:.0f} s spent: ran {done} of {len(cases)} cases, stopped cleanly"
                )
                break
            dtype = DTYPES[dt_name]
            m = args.m if args.m else rows_for(n, dtype, args.mbytes)
            if inputs_key != (dt_name, n, m):
                inputs = None
                inputs_key, inputs = (dt_name, n, m), _case_inputs(device, dtype, m, n, args.seed)
            case = f"{op} {mode} {dt_name} M={m} N={n}"
            runners = _runners(args, op, mode, inputs, case, notes, skipped)
            samples = _time_runners(args, runners, case, notes)
            runners.clear()
            case_rows = _case_rows(args, samples, (op, mode, dt_name, m, n))
            for r in case_rows.values():
                writer.writerow({k: _fmt(v) for k, v in r.items()})
                rows.append(r)
            fh.flush()
            done += 1
            _print_case(op, mode, dt_name, m, n, case_rows)
        for s in skipped:
            notes.append(f"skipped provider: {s}")
        for note in notes:
            fh.write(f"# note: {note}\n")
    print(f"\nwrote {path} ({len(rows)} rows, {done} of {len(cases)} cases, {time.monotonic() - t_start:.0f} s)")
    for note in notes:
        print(f"note: {note}")
    print_summary(rows)
    return path


def _csv_writer(fh, meta: dict[str, str]) -> csv.DictWriter:
    """The CSV's '# key: value' header lines (metadata, command, where the columns are explained), then its
    column row; returns the writer of the rows."""
    for k, v in meta.items():
        fh.write(f"# {k}: {v}\n")
    fh.write(f"# command: {' '.join(sys.argv)}\n")
    fh.write("# bytes model and column meanings: benchmarks/run.py docstring\n")
    writer = csv.DictWriter(fh, fieldnames=COLUMNS)
    writer.writeheader()
    fh.flush()
    return writer


def _case_inputs(device: str, dtype: torch.dtype, m: int, n: int, seed: int) -> tuple:
    """(x, w, b, g, r) of an (M, N) case, drawn from a generator seeded with `seed`: x, the parameters and the
    residual require grad; g is the output's gradient."""
    if device == "cuda":
        torch.cuda.empty_cache()
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, n, device=device, dtype=dtype, generator=gen).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(n, device=device, generator=gen)).to(dtype).requires_grad_(True)
    b = (0.1 * torch.randn(n, device=device, generator=gen)).to(dtype).requires_grad_(True)
    g = torch.randn(m, n, device=device, dtype=dtype, generator=gen)
    r = torch.randn(m, n, device=device, dtype=dtype, generator=gen).requires_grad_(True)
    return x, w, b, g, r


def _runners(args, op: str, mode: str, inputs: tuple, case: str, notes: list, skipped: dict) -> dict[str, Callable]:
    """Each provider's runner of the case, run twice (warm-up, compilation); a provider that cannot run here goes
    into `skipped`, one that fails into `notes`."""
    x, w, b, g, r = inputs
    runners: dict[str, Callable] = {}
    for prov in args.providers:
        try:
            p_op = args.gated_p if op in GATED_OPS else args.p
            runners[prov] = make_runner(prov, op, mode, args.device, p_op, x, w, b, g, r, args.act)
            runners[prov]()  # warm-up (and compilation)
            runners[prov]()
            _sync(args.device)
        except Skip as s:
            runners.pop(prov, None)
            skipped.setdefault(f"{prov} ({s})", "")
        except Exception as err:  # noqa: BLE001
            runners.pop(prov, None)
            msg = f"{prov} failed on {case}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            notes.append(msg)
            print("  " + msg, file=sys.stderr)
            if os.environ.get("GPUOPT_BENCH_DEBUG"):
                traceback.print_exc()
    return runners


def _time_runners(args, runners: dict[str, Callable], case: str, notes: list) -> dict[str, list[list[float]]]:
    """provider -> [medians, p20s, p80s] pooled over --rounds interleaved rounds (on the CPU, every sample in the
    first list); a provider whose timing fails is noted and left with no samples."""
    samples: dict[str, list[list[float]]] = {pr: [[], [], []] for pr in runners}
    for _ in range(args.rounds):
        for prov, fn in runners.items():
            try:
                if args.device == "cuda":
                    med, lo, hi = time_gpu(fn, 10.0 if args.quick else 25.0, args.rep_ms, args.graphs)
                    samples[prov][0] += med
                    samples[prov][1] += lo
                    samples[prov][2] += hi
                else:
                    samples[prov][0] += time_cpu(fn, args.min_run_time)
            except Exception as err:  # noqa: BLE001
                notes.append(f"{prov} failed timing {case}: {type(err).__name__}: {err}")
                samples[prov] = [[], [], []]
    return samples


def _case_rows(args, samples: dict, case: tuple) -> dict[str, dict]:
    """provider -> the CSV row of the case (op, mode, dtype name, M, N): times, GB/s, and the ratios to the copy,
    eager and compile rows of the same case."""
    op, mode, dt_name, m, n = case
    case_rows = {}
    for prov, (med, lo, hi) in samples.items():
        if not med:
            continue
        if args.device == "cuda":  # medians of the per-round quantiles
            ms, p20, p80 = _percentile(med, 0.5), _percentile(lo, 0.5), _percentile(hi, 0.5)
        else:
            ms, p20, p80 = _percentile(med, 0.5), _percentile(med, 0.2), _percentile(med, 0.8)
        nbytes = bytes_moved("copy" if prov == "copy" else op, mode, m, n, DTYPES[dt_name])
        case_rows[prov] = {
            "provider": prov,
            "op": op,
            "mode": mode,
            "dtype": dt_name,
            "M": m,
            "N": n,
            "p": args.gated_p if op in GATED_OPS else args.p,
            "ms_median": ms,
            "ms_p20": p20,
            "ms_p80": p80,
            "gbps": nbytes / (ms * 1e6),
            "device": args.device,
        }
    copy_gbps = case_rows.get("copy", {}).get("gbps")
    eager_ms = case_rows.get("eager", {}).get("ms_median")
    compile_ms = case_rows.get("compile", {}).get("ms_median")
    for r in case_rows.values():
        r["ratio_copy"] = r["gbps"] / copy_gbps if copy_gbps else ""
        r["speedup_vs_eager"] = eager_ms / r["ms_median"] if eager_ms and r["provider"] != "copy" else ""
        r["speedup_vs_compile"] = compile_ms / r["ms_median"] if compile_ms and r["provider"] != "copy" else ""
    return case_rows


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def _print_case(op, mode, dt, m, n, case_rows) -> None:
    parts = []
    for prov, r in case_rows.items():
        s = f"{prov} {r['ms_median']:.4g} ms {r['gbps']:.1f} GB/s"
        if prov != "copy" and r.get("speedup_vs_eager"):
            s += f" x{r['speedup_vs_eager']:.2f}e"
        if prov != "copy" and r.get("speedup_vs_compile"):
            s += f" x{r['speedup_vs_compile']:.2f}c"
        parts.append(s)
    print(f"{op:9s} {mode:7s} {dt:4s} M={m:<8d} N={n:<6d} | " + " | ".join(parts), flush=True)


def print_summary(rows: list[dict]) -> None:
    """Headline ratios: per (op, mode, dtype) and fused provider, geometric means over N of the speed-ups."""
    fused = [r for r in rows if r["provider"] in ("cuda", "cpu", "triton", "liger")]
    if not fused:
        return
    print("\nsummary (geometric mean over N; x eager / x compile = speed-up; %copy = share of copy GB/s)")
    print(
        f"{'op':9s} {'mode':7s} {'dtype':5s} {'provider':8s} {'#N':>3s} {'x eager':>8s} {'x compile':>9s} "
        f"{'%copy(mean)':>11s} {'best GB/s':>10s}"
    )
    groups: dict[tuple, list[dict]] = {}
    for r in fused:
        groups.setdefault((r["op"], r["mode"], r["dtype"], r["provider"]), []).append(r)

    def gmean(vals):
        vals = [v for v in vals if isinstance(v, float) and v > 0]
        return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None

    for (op, mode, dt, prov), rs in groups.items():
        ge, gc = gmean([r["speedup_vs_eager"] for r in rs]), gmean([r["speedup_vs_compile"] for r in rs])
        pc = [r["ratio_copy"] for r in rs if isinstance(r["ratio_copy"], float)]
        print(
            f"{op:9s} {mode:7s} {dt:5s} {prov:8s} {len(rs):3d} "
            f"{'-' if ge is None else f'{ge:.2f}':>8s} {'-' if gc is None else f'{gc:.2f}':>9s} "
            f"{'-' if not pc else f'{100 * sum(pc) / len(pc):.0f}%':>11s} {max(r['gbps'] for r in rs):10.1f}"
        )


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

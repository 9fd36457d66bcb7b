"""Activation memory of one fused block against the eager block: `python -m benchmarks.memory [--device cuda]`.

Two figures per (block, dtype):
  saved   bytes autograd keeps for backward, counted with torch.autograd.graph.saved_tensors_hooks over the
          unique storages of the saved tensors (inputs that are saved count too: both blocks save x).
          Fused layer_norm_dropout_relu saves x, weight, bias, mean, rstd and the 8-byte seed (no mask, no
          output); eager LayerNorm -> dropout -> ReLU saves x, weight, bias, mean, rstd, the dropout mask (bool on
          CUDA, a float noise tensor on CPU) and the ReLU output.
  peak    (CUDA only) torch.cuda.max_memory_allocated during forward + backward, above what was allocated
          before (inputs and grad_out), and what is still allocated after forward (output + saved).
Target: fused saved bytes <= 0.5 x eager for layer_norm_dropout_relu. bias_relu saves only its output in both
forms (eager ReLU also keeps its output), so its ratio is 1: printed for information.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections.abc import Callable

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TARGET = 0.5


def saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of the unique storages autograd saves while fn() runs its forward."""
    from gpuopt_ops.memory import saved_tensor_bytes

    return saved_tensor_bytes(fn)[0]


def _blocks(device: str, p: float):
    import gpuopt_ops
    from gpuopt_ops import reference as R

    backend = "cuda" if device == "cuda" else "cpu"
    return {
        "ldr": {
            "fused": lambda x, w, b: gpuopt_ops.layer_norm_dropout_relu(x, x.shape[-1], w, b, p=p, backend=backend),
            "eager": lambda x, w, b: R.eager_layer_norm_dropout_relu(x, w, b, p, True, 1e-5),
        },
        "bias_relu": {
            "fused": lambda x, w, b: gpuopt_ops.bias_relu(x, b, backend=backend),
            "eager": lambda x, w, b: R.eager_bias_relu(x, b),
        },
    }


def peak_bytes(fn, x, g) -> dict[str, int]:
    """CUDA: bytes held after forward, and the peak during forward + backward, above the baseline."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = fn()
    torch.cuda.synchronize()
    after_fwd = torch.cuda.memory_allocated() - base
    y.backward(g)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del y
    return {"after_fwd": after_fwd, "peak": peak}


def measure(
    device: str = "cpu", m: int = 256, n: int = 1024, dtypes=("fp32", "bf16"), p: float = 0.1, ops=("ldr", "bias_relu")
) -> list[dict]:
    rows = []
    blocks = _blocks(device, p)
    for dt_name in dtypes:
        dtype = DTYPES[dt_name]
        for op in ops:
            res = {}
            for kind in ("fused", "eager"):
                gen = torch.Generator(device=device).manual_seed(0)
                x = torch.randn(m, n, device=device, dtype=dtype, generator=gen).requires_grad_(True)
                w = torch.ones(n, device=device, dtype=dtype, requires_grad=True)
                b = torch.zeros(n, device=device, dtype=dtype, requires_grad=True)
                g = torch.randn(m, n, device=device, dtype=dtype, generator=gen)
                f = blocks[op][kind]

                def step(f=f, x=x, w=w, b=b):  # bound now: the loop variables change on the next kind
                    return f(x, w, b)

                r = {"saved": saved_bytes(step)}
                if device == "cuda":
                    r.update(peak_bytes(step, x, g))
                res[kind] = r
            row = {
                "op": op,
                "dtype": dt_name,
                "M": m,
                "N": n,
                "p": p,
                "device": device,
                "fused_saved": res["fused"]["saved"],
                "eager_saved": res["eager"]["saved"],
                "saved_ratio": res["fused"]["saved"] / res["eager"]["saved"],
            }
            if device == "cuda":
                row.update(
                    {
                        "fused_after_fwd": res["fused"]["after_fwd"],
                        "eager_after_fwd": res["eager"]["after_fwd"],
                        "fused_peak": res["fused"]["peak"],
                        "eager_peak": res["eager"]["peak"],
                        "peak_ratio": res["fused"]["peak"] / max(1, res["eager"]["peak"]),
                    }
                )
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--m", type=int, default=None, help="rows (GPU default 8192, CPU 256)")
    ap.add_argument("--n", type=int, default=None, help="normalized size (GPU default 4096, CPU 1024)")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--out", default=None, help="folder for memory_<device>.csv (default: print only)")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    m = args.m or (8192 if device == "cuda" else 256)
    n = args.n or (4096 if device == "cuda" else 1024)
    rows = measure(device, m, n, [d for d in args.dtypes.split(",") if d], args.p)
    mib = 2**20
    print(f"activation memory, {device}, M={m}, N={n}, p={args.p} (MiB; saved = unique storages saved for backward)")
    for r in rows:
        line = (
            f"{r['op']:9s} {r['dtype']:4s} saved fused {r['fused_saved'] / mib:8.2f}  eager "
            f"{r['eager_saved'] / mib:8.2f}  ratio {r['saved_ratio']:.3f}"
        )
        if device == "cuda":
            line += (
                f" | after fwd fused {r['fused_after_fwd'] / mib:.1f} eager {r['eager_after_fwd'] / mib:.1f}"
                f" | peak fused {r['fused_peak'] / mib:.1f} eager {r['eager_peak'] / mib:.1f} "
                f"ratio {r['peak_ratio']:.3f}"
            )
        if r["op"] == "ldr":
            line += f"  [target <= {TARGET}: {'met' if r['saved_ratio'] <= TARGET else 'MISSED'}]"
        print(line)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"memory_{device}.csv")
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {path}")
    ok = all(r["saved_ratio"] <= TARGET for r in rows if r["op"] == "ldr")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

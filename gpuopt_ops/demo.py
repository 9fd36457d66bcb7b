"""Runs both fused ops forward and backward and prints their agreement with the unfused PyTorch reference.

python -m gpuopt_ops.demo   (the README's main command until the training loop lands)
"""

from __future__ import annotations

import sys

import torch

import gpuopt_ops
from gpuopt_ops import reference as R


def _max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def check_device(device: str, m: int = 256, n: int = 1000, p: float = 0.1) -> bool:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, n, generator=gen).to(device).requires_grad_()
    w = (1 + 0.1 * torch.randn(n, generator=gen)).to(device).requires_grad_()
    b = (0.1 * torch.randn(n, generator=gen)).to(device).requires_grad_()
    seed = torch.tensor([2024], device=device)
    ok = True
    out, _, _ = torch.ops.gpuopt.layer_norm_dropout_relu(x, w, b, seed, p, 1e-5)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, w, b), g)
    ref, _, _ = R.layer_norm_dropout_relu(x, w, b, seed, p, 1e-5, compute_dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, (x, w, b), g.double())
    rows = [("layer_norm_dropout_relu out", out, ref, 1e-4)] + [
        (f"layer_norm_dropout_relu d{name}", gr, rg, 1e-3) for name, gr, rg in zip("xwb", grads, ref_grads)]
    bias = torch.randn(n, generator=gen).to(device).requires_grad_()
    y = gpuopt_ops.bias_relu(x, bias)
    gy = torch.autograd.grad(y, (x, bias), g)
    yr = R.bias_relu(x, bias, compute_dtype=torch.float64)
    gyr = torch.autograd.grad(yr, (x, bias), g.double())
    rows += [("bias_relu out", y, yr, 1e-6), ("bias_relu dx", gy[0], gyr[0], 1e-6),
             ("bias_relu dbias", gy[1], gyr[1], 1e-3)]
    print(f"\n{device}: x {m}x{n} fp32, p={p}")
    for name, ours, ref_t, tol in rows:
        d = _max_diff(ours, ref_t)
        status = "ok" if d <= tol else "MISMATCH"
        ok &= d <= tol
        print(f"  {name:34s} max|ours - fp64 reference| = {d:.2e}  (tol {tol:.0e})  {status}")
    mask = R.dropout_keep_mask(2024, m, n, p, device=device)
    frac = mask.double().mean().item()
    # every nonzero output must be a kept element of the Python Philox mask
    consistent = not bool(((out > 0) & ~mask).any())
    ok &= consistent
    print(f"  dropout keep fraction {frac:.4f} (expected {1 - p:.4f}); outputs consistent with the Python "
          f"Philox mask: {consistent}")
    return ok


def main() -> int:
    print(f"gpuopt demo: torch {torch.__version__}")
    ok = check_device("cpu")
    if torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key(
            "gpuopt::layer_norm_dropout_relu", "CUDA"):
        ok &= check_device("cuda")
    print("\nall agree" if ok else "\nMISMATCH found")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

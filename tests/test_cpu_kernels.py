"""The vectorized CPU kernels: every Philox path, thread-count independence, fp16/bf16 conversions, tiles."""

import os
import subprocess
import sys

import pytest
import torch

import gpuopt_ops  # noqa: F401
from gpuopt_ops import reference as R

from helpers import seed_tensor

ops = torch.ops.gpuopt

# Shapes that cross the CPU kernels' tiles (2048-element dropout tiles, ~16K-element scheduling tiles) with rows
# that start off an 8-element Philox group (N % 8 != 0), and the 32-group AVX2/AVX-512 batches.
MASK_SHAPES = [(1, 8), (3, 7), (300, 123), (70, 4099), (2, 65533), (1000, 3), (9, 2048), (5, 4104)]
MASK_SCRIPT = r"""
import sys, torch, gpuopt_ops
from gpuopt_ops import reference as R
ops = torch.ops.gpuopt
bad = []
for m, n in {shapes}:
    for seed in (0, 2**40 + 3, -5):
        x = torch.randn(m, n)
        out = ops.layer_norm_dropout_relu(x, torch.zeros(n), torch.ones(n), torch.tensor([seed]), 0.3, 1e-5)[0]
        ours = (out > 0).to(torch.int32)
        ref = R.dropout_keep_mask(seed, m, n, 0.3).to(torch.int32)
        if not torch.equal(ours, ref):
            bad.append((m, n, seed))
print("BAD", bad)
sys.exit(1 if bad else 0)
"""


@pytest.mark.parametrize("path", ["default", "avx2", "scalar"])
def test_every_philox_path_matches_reference(path):
    """GPUOPT_CPU_PHILOX caps the Philox path (AVX-512 / AVX2 / scalar): all give DESIGN.md's bits."""
    env = dict(os.environ)
    env.pop("GPUOPT_CPU_PHILOX", None)
    if path != "default":
        env["GPUOPT_CPU_PHILOX"] = path
    proc = subprocess.run([sys.executable, "-c", MASK_SCRIPT.format(shapes=MASK_SHAPES)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("m,n", MASK_SHAPES)
def test_masks_across_tiles_match_reference(m, n):
    seed = 1234 + m
    out = ops.layer_norm_dropout_relu(torch.randn(m, n), torch.zeros(n), torch.ones(n), seed_tensor(seed), 0.6,
                                      1e-5)[0]
    assert torch.equal((out > 0).to(torch.int32), R.dropout_keep_mask(seed, m, n, 0.6).to(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n", [(1000, 512), (5000, 3), (70, 4099)])
def test_results_do_not_depend_on_thread_count(dtype, m, n):
    g = torch.Generator().manual_seed(m + n)
    x = torch.randn(m, n, generator=g).to(dtype)
    w = torch.randn(n, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    go = torch.randn(m, n, generator=g).to(dtype)
    seed = seed_tensor(5)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out, mean, rstd = ops.layer_norm_dropout_relu(x, w, b, seed, 0.2, 1e-5)
            grads = ops.layer_norm_dropout_relu_backward(go, x, w, b, mean, rstd, seed, 0.2)
            bo = ops.bias_relu(x, b)
            results.append([out, mean, rstd, *grads, bo, *ops.bias_relu_backward(go, bo)])
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, c in zip(results[0], other):
            assert torch.equal(a, c)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_rounding_is_bitwise_torchs(dtype):
    """fp32 -> bf16/fp16 rounds to nearest even like c10 (bias_relu computes x + b in fp32, as eager does)."""
    x = torch.randn(301, 1037).to(dtype)
    x[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
    b = torch.randn(1037).to(dtype)
    bf = torch.randn(1037)
    for ours, ref in [(ops.bias_relu(x, b), torch.relu(x + b)),
                      (ops.bias_relu(x, bf), torch.relu(x.float() + bf).to(dtype))]:
        assert torch.equal(torch.isnan(ours), torch.isnan(ref))
        assert torch.equal(ours.view(torch.int16)[1:], ref.view(torch.int16)[1:])
        assert torch.equal(ours[0, 1:], ref[0, 1:])


def test_nan_semantics_match_fused_math():
    """fused_math.h: a NaN that survives dropout stays NaN, a dropped one is 0; bias_relu propagates NaN."""
    n = 64
    x = torch.randn(3, n)
    x[1, 5] = float("nan")  # the whole row's statistics become NaN
    seed = seed_tensor(9)
    keep = R.dropout_keep_mask(9, 3, n, 0.5)
    for p, kept in ((0.5, keep[1]), (0.0, torch.ones(n, dtype=torch.bool))):
        out = ops.layer_norm_dropout_relu(x, torch.ones(n), torch.zeros(n), seed, p, 1e-5)[0]
        assert torch.equal(torch.isnan(out[1]), kept)
        assert (out[1][~kept] == 0).all()
        assert not torch.isnan(out[0]).any() and not torch.isnan(out[2]).any()
    xb = torch.randn(2, n)
    xb[0, 3] = float("nan")
    out = ops.bias_relu(xb, torch.zeros(n))
    assert torch.isnan(out[0, 3]) and torch.isnan(out).sum() == 1

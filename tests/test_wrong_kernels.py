"""Deliberately wrong kernels must fail the checks the real ones pass (gpu-mode reference-kernels practice)."""

import numpy as np
import pytest
import torch

import gpuopt_ops  # noqa: F401
from gpuopt_ops import reference as R

from helpers import assert_close_to_reference, ldr_reference_and_grads, make_inputs, seed_tensor

ops = torch.ops.gpuopt


def wrong_counter_mask(seed, m, n, p):
    """One Philox call per element with counter idx (not idx >> 3): a different, equally random mask."""
    idx = np.arange(m * n, dtype=np.int64)
    s = seed & 0xFFFFFFFFFFFFFFFF
    w0 = R.philox4x32_10_array(idx.astype(np.uint64), np.zeros(m * n, np.uint64), 0, 0, s & 0xFFFFFFFF,
                               s >> 32)[0]
    return torch.from_numpy((w0 & np.uint64(0xFFFF)).astype(np.int64) >= R.dropout_threshold(p)).reshape(m, n)


def test_wrong_philox_counter_is_rejected_by_mask_check():
    m, n, seed, p = 6, 40, 77, 0.5
    x = torch.randn(m, n)
    ours = ops.layer_norm_dropout_relu(x, torch.zeros(n), torch.ones(n), seed_tensor(seed), p, 1e-5)[0] > 0
    assert torch.equal(ours, R.dropout_keep_mask(seed, m, n, p))
    assert not torch.equal(wrong_counter_mask(seed, m, n, p), R.dropout_keep_mask(seed, m, n, p))


def test_backward_with_a_different_mask_is_rejected():
    """A backward that does not recompute the forward's mask (here: another seed) fails the gradient check."""
    x, w, b = make_inputs((8,), 64, torch.float32)
    g = torch.randn(x.shape)
    seed = seed_tensor(5)
    out, mean, rstd = ops.layer_norm_dropout_relu(x, w, b, seed, 0.3, 1e-5)
    good = ops.layer_norm_dropout_relu_backward(g, x, w, b, mean, rstd, seed, 0.3)[0]
    bad = ops.layer_norm_dropout_relu_backward(g, x, w, b, mean, rstd, seed_tensor(6), 0.3)[0]
    _, (ref_gx, _, _) = ldr_reference_and_grads(x, w, b, seed, 0.3, 1e-5, g, torch.float64)
    _, (low_gx, _, _) = ldr_reference_and_grads(x, w, b, seed, 0.3, 1e-5, g, torch.float32)
    assert_close_to_reference("grad_x", good, ref_gx, low_gx, 1e-5)
    with pytest.raises(AssertionError):
        assert_close_to_reference("grad_x", bad, ref_gx, low_gx, 1e-5)


def test_low_precision_statistics_are_rejected():
    """Statistics kept in bf16 (a bug seen in peers) fail the fp32 tolerance."""
    x, w, b = make_inputs((16,), 256, torch.float32, seed=3)
    x = x * 10 + 100  # large mean: bf16 statistics lose the signal
    seed = seed_tensor(1)
    ref64, _ = ldr_reference_and_grads(x, w, b, seed, 0.1, 1e-5, torch.ones_like(x), torch.float64)
    low, _ = ldr_reference_and_grads(x, w, b, seed, 0.1, 1e-5, torch.ones_like(x), torch.float32)
    ours = ops.layer_norm_dropout_relu(x, w, b, seed, 0.1, 1e-5)[0]
    assert_close_to_reference("out", ours, ref64, low, 1e-5)
    xb = x.to(torch.bfloat16).float()
    mean = xb.mean(-1, keepdim=True).to(torch.bfloat16).float()
    rstd = torch.rsqrt(((xb - mean) ** 2).mean(-1, keepdim=True) + 1e-5).to(torch.bfloat16).float()
    y = (x - mean) * rstd * w + b
    keep = R.dropout_keep_mask(1, 16, 256, 0.1)
    bad = torch.relu(torch.where(keep, y * R.dropout_scale(0.1), torch.zeros(())))
    with pytest.raises(AssertionError):
        assert_close_to_reference("out", bad, ref64, low, 1e-5)


def test_empty_kernel_is_rejected():
    x, w, b = make_inputs((4,), 32, torch.float32)
    ref64, _ = ldr_reference_and_grads(x, w, b, seed_tensor(0), 0.0, 1e-5, torch.ones_like(x), torch.float64)
    low, _ = ldr_reference_and_grads(x, w, b, seed_tensor(0), 0.0, 1e-5, torch.ones_like(x), torch.float32)
    with pytest.raises(AssertionError):
        assert_close_to_reference("out", torch.zeros_like(x), ref64, low, 1e-5)

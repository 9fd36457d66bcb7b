"""The dropout RNG: Random123 known-answer vectors, and the op's keep pattern equals the Python reference."""

import numpy as np
import pytest
import torch

import gpuopt_ops  # noqa: F401
from gpuopt_ops import reference as R

from helpers import seed_tensor

KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_reference_philox_known_answers(ctr, key, expected):
    assert R.philox4x32_10(ctr, key) == expected


def keep_pattern(x, seed, p):
    """The op's keep bits, read through weight 0 / bias 1: out = scale where kept, 0 where dropped."""
    n = x.shape[-1]
    w = torch.zeros(n, dtype=x.dtype)
    b = torch.ones(n, dtype=x.dtype)
    out, _, _ = torch.ops.gpuopt.layer_norm_dropout_relu(x, w, b, seed_tensor(seed), p, 1e-5)
    return out.reshape(-1, n) > 0


def test_known_answer_through_the_op():
    x = torch.zeros(1, 8)
    out, _, _ = torch.ops.gpuopt.layer_norm_dropout_relu(x, torch.zeros(8), torch.ones(8), seed_tensor(0), 0.5,
                                                         1e-5)
    assert out.tolist() == [[2, 0, 2, 2, 2, 2, 2, 2]]


@pytest.mark.parametrize("m,n", [(1, 8), (3, 7), (5, 37), (4, 1), (2, 1000), (16, 123)])
@pytest.mark.parametrize("seed", [0, 1, 12345, 2**40 + 3, -5, 2**62 - 1])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_pattern_equals_python_philox(m, n, seed, p):
    x = torch.randn(m, n)
    ours = keep_pattern(x, seed, p)
    ref = R.dropout_keep_mask(seed, m, n, p)
    # compare as integers, never through floats
    assert torch.equal(ours.to(torch.int32), ref.to(torch.int32))


def test_lane_order_matches_design():
    """Element idx takes lane idx & 7: check lanes 0..7 of one group against the raw Philox words."""
    seed = 987654321
    words = R.philox4x32_10((5, 0, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))
    lanes = []
    for w in words:
        lanes += [w & 0xFFFF, w >> 16]
    assert R.dropout_uniform16(seed, np.arange(40, 48)).tolist() == lanes


@pytest.mark.parametrize("p", [0.1, 0.37, 0.8])
def test_keep_fraction_within_5_sigma(p):
    m, n = 256, 1024
    keep = keep_pattern(torch.randn(m, n), 42, p)
    total = m * n
    q = 1 - R.dropout_threshold(p) / 65536
    sigma = (q * (1 - q) / total) ** 0.5
    assert abs(keep.double().mean().item() - q) < 5 * sigma


def test_same_seed_same_bits_and_different_seed_different_mask():
    x = torch.randn(64, 300)
    a = torch.ops.gpuopt.layer_norm_dropout_relu(x, None, None, seed_tensor(7), 0.3, 1e-5)[0]
    b = torch.ops.gpuopt.layer_norm_dropout_relu(x, None, None, seed_tensor(7), 0.3, 1e-5)[0]
    c = torch.ops.gpuopt.layer_norm_dropout_relu(x, None, None, seed_tensor(8), 0.3, 1e-5)[0]
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert not torch.equal(a, c)


def test_threshold_quantization():
    assert R.dropout_threshold(0.0) == 0 and R.dropout_threshold(1.0) == 65536
    assert R.dropout_threshold(0.5) == 32768
    for p in np.linspace(0, 1, 101):
        assert abs(R.dropout_threshold(p) / 65536 - p) <= 2**-17 + 1e-12

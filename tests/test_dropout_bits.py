"""Dropout bits: DESIGN.md's one Philox definition, checked on its known answers and, as integers (never through
floats), on every backend's keep masks; the threshold and scale; the backward's recomputed mask; and deliberately
wrong counters that the mask comparison must catch.
"""

import importlib.util
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import gpuopt_ops
from gpuopt_ops import reference as R

from backends import BY_NAME, DEFAULT, backend_params, marks_for, require_op
from helpers import seed_tensor

CPU = BY_NAME["cpu"]
EPS = 1e-5
# signed, unsigned-looking, > 2^32, the extremes of int64
SEEDS = [0, 1, 77, -1, -123456789, 2**32 + 5, 2**62 + 3, -(2**63)]

KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def keep_bits(backend, x, seed, p, op=None):
    """The op's keep bits as int32, read through weight 0 / bias 1: out = scale where kept, 0 where dropped."""
    n = x.shape[-1]
    op = op or backend.op("layer_norm_dropout_relu")
    dev = backend.device
    out = op(
        x.to(dev),
        torch.zeros(n, dtype=x.dtype, device=dev),
        torch.ones(n, dtype=x.dtype, device=dev),
        seed_tensor(seed, dev),
        p,
        EPS,
    )[0]
    return (out.cpu() != 0).to(torch.int32).reshape(-1, n)


def reference_bits(seed, m, n, p):
    return R.dropout_keep_mask(seed, m, n, p).to(torch.int32)


# ---------------------------------------------------------------------------------------------- the definition
@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_reference_philox_known_answers(ctr, key, expected):
    """Random123's Philox4x32-10 known-answer vectors, on the Python reference."""
    assert R.philox4x32_10(ctr, key) == expected


def test_lane_order_matches_design():
    """Element idx takes 16-bit lane idx & 7 of its group's four words: lanes 0..7 of group 5."""
    seed = 987654321
    words = R.philox4x32_10((5, 0, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))
    lanes = [half for w in words for half in (w & 0xFFFF, w >> 16)]
    assert R.dropout_uniform16(seed, np.arange(40, 48)).tolist() == lanes


def test_threshold_quantization():
    assert R.dropout_threshold(0.0) == 0 and R.dropout_threshold(1.0) == 65536
    assert R.dropout_threshold(0.5) == 32768
    for p in np.linspace(0, 1, 101):
        assert abs(R.dropout_threshold(p) / 65536 - p) <= 2**-17 + 1e-12


# ---------------------------------------------------------------------------------------------- every backend
@pytest.mark.parametrize("backend", backend_params())
def test_known_answer_through_the_op(backend):
    """DESIGN.md: seed 0, p = 0.5, x (1, 8), weight 0, bias 1 => out = [2, 0, 2, 2, 2, 2, 2, 2]."""
    dev = backend.device
    out = backend.op("layer_norm_dropout_relu")(
        torch.zeros(1, 8, device=dev),
        torch.zeros(8, device=dev),
        torch.ones(8, device=dev),
        seed_tensor(0, dev),
        0.5,
        EPS,
    )[0]
    assert out.cpu().tolist() == [[2.0, 0.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]]


# (M, N): one group; N < 8 odd; prime N (groups straddle rows); N = 1; N % 8 == 0 not a power of two; more rows
# with odd N; N % 8 == 0 (one Philox call per 8 elements); a power of two
@pytest.mark.parametrize("m,n", [(1, 8), (3, 7), (5, 37), (4, 1), (2, 1000), (16, 123), (6, 40), (3, 64)])
@pytest.mark.parametrize("backend", backend_params())
def test_keep_mask_equals_the_python_philox(backend, m, n):
    for seed in SEEDS:
        for p in (0.1, 0.5, 0.9):
            x = torch.randn(m, n)
            assert torch.equal(keep_bits(backend, x, seed, p), reference_bits(seed, m, n, p)), (seed, p)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("p", [0.1, 0.37, 0.8])
def test_keep_fraction_within_5_sigma(backend, p):
    m, n = 64, 1024
    keep = keep_bits(backend, torch.randn(m, n), 42, p)
    q = 1 - R.dropout_threshold(p) / 65536
    sigma = (q * (1 - q) / (m * n)) ** 0.5
    assert abs(keep.double().mean().item() - q) < 5 * sigma


@pytest.mark.parametrize("backend", backend_params())
def test_same_seed_same_bits_another_seed_another_mask(backend):
    dev = backend.device
    op = backend.op("layer_norm_dropout_relu")
    x = torch.randn(64, 300, device=dev)
    a = op(x, None, None, seed_tensor(7, dev), 0.3, EPS)[0]
    b = op(x, None, None, seed_tensor(7, dev), 0.3, EPS)[0]
    c = op(x, None, None, seed_tensor(8, dev), 0.3, EPS)[0]
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert not torch.equal(a, c)


@pytest.mark.parametrize("backend", backend_params())
def test_torch_manual_seed_reproduces_the_public_function(backend):
    """The public function draws its seed from torch's generator on x's device: manual_seed repeats a mask, the
    next call draws a new one (multi-dimensional normalized_shape here)."""
    x = torch.randn(3, 4, 5, 16, device=backend.device)
    draws = []
    for reseed in (True, True, False):
        if reseed:
            torch.manual_seed(0)
        draws.append(gpuopt_ops.layer_norm_dropout_relu(x, (5, 16), p=0.5, backend=backend.api))
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("n", [37, 64])  # the generic and the 8-lane RNG paths
def test_backward_recomputes_the_forward_mask(backend, n):
    """With weight 0, bias 1 and grad_out 1 on one row, grad_bias = scale on kept elements, 0 on dropped."""
    dev = backend.device
    seed, p = -987654321, 0.35
    x = torch.randn(1, n, device=dev)
    w, b = torch.zeros(n, device=dev), torch.ones(n, device=dev)
    out, mean, rstd = backend.op("layer_norm_dropout_relu")(x, w, b, seed_tensor(seed, dev), p, EPS)
    _, _, gb = backend.op("layer_norm_dropout_relu_backward")(
        torch.ones_like(x), x, w, b, mean, rstd, seed_tensor(seed, dev), p
    )
    assert torch.equal((gb.cpu() != 0)[None], out.cpu() != 0)
    assert torch.equal((out.cpu() != 0).to(torch.int32), reference_bits(seed, 1, n, p))
    kept = gb[gb != 0].cpu()
    assert torch.equal(kept, torch.full_like(kept, R.dropout_scale(p)))


def dan_bits(backend, m, n, seed, p, dtype=torch.float32):
    """dropout_add_norm's keep bits as int32, read two ways: its `sum` with x = 1 and no residual (scale where kept,
    exactly 0 where dropped), and its backward's grad_x with grad_out = 0 and grad_sum = 1 (dS = 1)."""
    dev = backend.device
    x = torch.ones(m, n, dtype=dtype, device=dev)
    fwd, bwd = backend.op("dropout_add_norm"), backend.op("dropout_add_norm_backward")
    _, s, mean, rstd = fwd(x, None, None, None, seed_tensor(seed, dev), p, EPS, False, False)
    gx = bwd(
        torch.zeros_like(x), torch.ones_like(s), s, None, None, mean, rstd, seed_tensor(seed, dev), p, False, False
    )[0]
    return (s.cpu() != 0).to(torch.int32), (gx.cpu() != 0).to(torch.int32), s.cpu(), gx.cpu()


# rows the Triton kernels split into chunks (3 x 256, 4 x 256 in the forward), in fp32 and bf16 (the other shapes:
# test_dropout_add_norm_mask_is_layer_norm_dropout_relus)
@pytest.mark.parametrize("m,n", [(2, 768), (2, 1024)])
@pytest.mark.parametrize("backend", backend_params())
def test_dropout_add_norm_keep_mask_of_chunked_rows(backend, m, n):
    """The mask in the forward's sum and the backward's grad_x equals the Philox reference, with the kept values
    x * scale exactly."""
    require_op(backend, "dropout_add_norm")
    for seed in (-1, 2**32 + 5):
        for dtype in (torch.float32, torch.bfloat16):
            fwd, bwd, s, gx = dan_bits(backend, m, n, seed, 0.3, dtype)
            assert torch.equal(fwd, reference_bits(seed, m, n, 0.3)), (seed, dtype)
            assert torch.equal(bwd, fwd), (seed, dtype)
            scale = torch.tensor(R.dropout_scale(0.3), dtype=torch.float32).to(dtype)
            assert torch.all(s[fwd != 0] == scale) and torch.all(gx[bwd != 0] == scale), (seed, dtype)


@pytest.mark.parametrize("backend", backend_params("triton", "triton-interpret"))
def test_triton_dropout_add_norm_keep_mask_looped(triton_looped, backend):
    """The looped dropout_add_norm kernels (N = 40 and 37 > 16 under the fixture: fast and generic RNG) against
    the reference bits and the CPU backend."""
    require_op(backend, "dropout_add_norm")
    for n in (40, 37):
        fwd, bwd, _, _ = dan_bits(backend, 3, n, 2**33 + 17, 0.4)
        assert torch.equal(fwd, reference_bits(2**33 + 17, 3, n, 0.4))
        assert torch.equal(bwd, fwd)
        assert torch.equal(fwd, dan_bits(CPU, 3, n, 2**33 + 17, 0.4)[0])


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("p", [0.0, 1.0])
def test_dropout_add_norm_edge_probabilities(backend, p):
    """p = 0: sum = x + residual (one rounding), grad_x = dS; p = 1: sum = residual exactly, grad_x exact zeros."""
    require_op(backend, "dropout_add_norm")
    dev = backend.device
    x = torch.randn(4, 40, dtype=torch.bfloat16, device=dev)
    r = torch.randn(4, 40, dtype=torch.float32, device=dev)
    seed = seed_tensor(5, dev)
    _, s, mean, rstd = backend.op("dropout_add_norm")(x, r, None, None, seed, p, EPS, True, True)
    expected = r if p == 1.0 else x.float() + r
    assert torch.equal(s, expected)
    gs = torch.randn(4, 40, dtype=torch.float32, device=dev)
    gx, gr, _, _ = backend.op("dropout_add_norm_backward")(
        torch.zeros_like(x), gs, s, None, None, mean, rstd, seed, p, True, True
    )
    assert torch.equal(gr, gs)  # grad_out = 0: dS = grad_sum
    assert torch.equal(gx, torch.zeros_like(x) if p == 1.0 else gs.to(torch.bfloat16))


@pytest.mark.parametrize("backend", backend_params())
def test_threshold_and_scale_match_the_reference(backend):
    """t = round(p * 65536) half up; the scale each kernel applies (read through weight 0, bias 1) is the
    reference's 65536 / (65536 - t) in the accumulation dtype: fp32 for fp32 x, fp64 for fp64 x; exact zeros at
    t = 65536."""
    dev = backend.device
    n = 256
    op = backend.op("layer_norm_dropout_relu")
    if backend.triton:
        from gpuopt_ops.triton_kernels import norm_dropout as ldr_kernels
    for p in [0.0, 1e-6, 0.5 / 65536, 0.49999 / 65536, 0.1, 0.25, 1 / 3, 0.5, 0.9, 1 - 1e-6, 1 - 0.5 / 65536, 1.0]:
        t = R.dropout_threshold(p)
        if backend.triton:
            assert ldr_kernels.dropout_threshold(p) == t, p
        for dtype in (torch.float32, torch.float64):
            w, b = torch.zeros(n, device=dev, dtype=dtype), torch.ones(n, device=dev, dtype=dtype)
            out = op(torch.randn(1, n, device=dev, dtype=dtype), w, b, seed_tensor(3, dev), p, EPS)[0]
            kept = out[out != 0].cpu()
            assert (kept.numel() == 0) == (t == 65536), (p, dtype)
            assert torch.equal(kept, torch.full_like(kept, 1.0 if t == 0 else R.dropout_scale(p, dtype))), (p, dtype)
    # Triton divides in fp32 in its fp32 kernels: for every t that is the fp32 rounding of the fp64 quotient, i.e.
    # the C++ kernels' static_cast<float> of the double scale, bit for bit.
    t = np.arange(65536)
    assert np.array_equal(
        (65536.0 / (65536.0 - t)).astype(np.float32), np.float32(65536.0) / (65536 - t).astype(np.float32)
    )


@pytest.mark.parametrize("backend", backend_params("triton", "triton-interpret"))
def test_triton_keep_mask_3d_and_looped(triton_looped, backend):
    """3-D x on the looped kernels (N = 40 > 16 under the fixture, fast RNG path)."""
    x = torch.randn(2, 3, 40)
    seed = 2**33 + 17
    assert torch.equal(keep_bits(backend, x, seed, 0.4), reference_bits(seed, 6, 40, 0.4))


@pytest.mark.parametrize("backend", backend_params(*DEFAULT, "cuda-emulated"))
@pytest.mark.parametrize("m,n", [(3, 7), (5, 37), (16, 123), (6, 40), (2, 1000)])
def test_dropout_add_norm_mask_is_layer_norm_dropout_relus(backend, m, n):
    """dropout_add_norm keeps the element of linear index idx exactly when layer_norm_dropout_relu does at the same
    seed (one Philox definition), forward (read from `sum` with no residual: x * scale where kept, 0 where dropped)
    and backward (grad_out 0, grad_sum 1: grad_x = scale where kept), as integers."""
    require_op(backend, "dropout_add_norm")
    dev = backend.device
    dan, dan_bwd = backend.op("dropout_add_norm"), backend.op("dropout_add_norm_backward")
    for seed in (0, -5, 2**40 + 3):
        for p in (0.1, 0.6):
            x = torch.randn(m, n) + 10  # never 0: a zero in `sum` means dropped
            s_ = seed_tensor(seed, dev)
            _, s, mean, rstd = dan(x.to(dev), None, None, None, s_, p, EPS, False, False)
            fwd = (s.cpu() != 0).to(torch.int32)
            g0, g1 = torch.zeros(m, n, device=dev), torch.ones(m, n, device=dev)
            gx = dan_bwd(g0, g1, s, None, None, mean, rstd, s_, p, False, False)[0]
            bwd = (gx.cpu() != 0).to(torch.int32)
            ldr = keep_bits(CPU, x, seed, p)
            assert torch.equal(fwd, ldr) and torch.equal(bwd, ldr), (seed, p)
            assert torch.equal(ldr, reference_bits(seed, m, n, p))
            kept = gx[gx != 0].cpu()
            assert torch.equal(kept, torch.full_like(kept, R.dropout_scale(p)))


def _gated_mask_params():
    """Every backend at every (M, N); the tile-crossing shapes run on the slow backends (the emulated CUDA source,
    Triton's interpreter) in the full suite only, and on the CPU kernels, whose tiles they cross, in both."""
    for m, n in [(3, 7), (5, 37), (16, 123), (6, 40), (3, 4099), (1, 8195)]:
        for p in backend_params(*DEFAULT, "cuda-emulated"):
            marks = marks_for(p, full_suite_only=n > 4096 and p.values[0].runs_slowly)
            yield pytest.param(p.values[0], m, n, id=f"{m}-{n}-{p.id}", marks=marks)


@pytest.mark.parametrize("backend,m,n", list(_gated_mask_params()))
def test_gated_act_mask_is_layer_norm_dropout_relus(backend, m, n):
    """gated_act keeps output element (r, c) exactly when layer_norm_dropout_relu keeps linear index r*F + c at the
    same seed, in both layouts, forward (act relu, gate and up 1: out = scale where kept) and backward (grad_up =
    grad_out * relu(gate) = scale where kept), as integers; (1, 8195) and (3, 4099) cross the CPU's 8192-element
    tiles off a Philox group boundary."""
    require_op(backend, "gated_act")
    dev = backend.device
    op, op_bwd = backend.op("gated_act"), backend.op("gated_act_backward")
    cases = [(seed, p) for seed in (0, -5, 2**40 + 3) for p in (0.1, 0.6)]
    if backend.interpreted and m * n > 4096:  # the tile-crossing shapes are the CPU's; the interpreter takes one
        cases = cases[-1:]
    for seed, p in cases:
        ldr = keep_bits(CPU, torch.randn(m, n), seed, p)
        assert torch.equal(ldr, reference_bits(seed, m, n, p))
        s_ = seed_tensor(seed, dev)
        ones, g1 = torch.ones(m, n, device=dev), torch.ones(m, n, device=dev)
        for gate, up in ((ones, ones), (torch.ones(m, 2 * n, device=dev), None)):
            out = op(gate, up, s_, p, 0)
            gg, gu = op_bwd(g1, gate, up, s_, p, 0)
            grad_up = gg[:, n:] if up is None else gu
            fwd, bwd = ((t.cpu() != 0).to(torch.int32) for t in (out, grad_up))
            assert torch.equal(fwd, ldr) and torch.equal(bwd, ldr), (seed, p, up is None)
            kept = out[out != 0].cpu()
            assert torch.equal(kept, torch.full_like(kept, R.dropout_scale(p)))


# ---------------------------------------------------------------------------------------------- at GPU scale
@pytest.mark.parametrize("backend", backend_params("cuda", "triton"))
@pytest.mark.parametrize(
    "m,n",
    [
        (3, 7),
        (5, 8),
        (64, 1000),
        (33, 1024),
        (7, 4096),
        (4, 12288),
        (3, 65536),
        (2, 65533),
        (2, 131072),
        (3, 65544),
        (70000, 64),
    ],
)
def test_gpu_masks_equal_the_cpu_backend(backend, m, n):
    """Every path of the GPU kernels (warp rows, block rows, looped, odd N, many rows) against the C++ CPU op."""
    for seed in (0, -5, 99, 2**40 + 7):
        x = torch.randn(m, n)
        assert torch.equal(keep_bits(backend, x, seed, 0.3), keep_bits(CPU, x, seed, 0.3)), seed


@pytest.mark.parametrize("backend", backend_params("cuda", "triton"))
@pytest.mark.parametrize("m,n", [(3, 7), (5, 8), (64, 1000), (7, 4096), (3, 11008), (2, 14336), (700, 64), (1, 65533)])
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_gated_masks_equal_the_cpu_backend(backend, m, n, packed):
    """Every path of the GPU gated_act kernels (vector and element by element, both layouts, LLaMA / Mistral
    intermediate sizes) keeps what the C++ CPU op keeps, forward and backward."""
    require_op(backend, "gated_act")
    for seed in (0, -5, 2**40 + 7):
        gate = torch.rand(m, 2 * n if packed else n) + 1  # > 0: out = relu(gate) * up != 0 where kept
        up = None if packed else torch.rand(m, n) + 1
        g = torch.ones(m, n)
        bits = []
        for be in (backend, CPU):
            dev = be.device
            args = (gate.to(dev), None if up is None else up.to(dev), seed_tensor(seed, dev), 0.3, 0)
            out = be.op("gated_act")(*args)
            gg, gu = be.op("gated_act_backward")(g.to(dev), *args)
            grads = gg if packed else torch.cat([gg, gu], -1)
            bits.append(((out.cpu() != 0).to(torch.int32), (grads.cpu() != 0).to(torch.int32)))
        assert torch.equal(bits[0][0], bits[1][0]) and torch.equal(bits[0][1], bits[1][1]), seed


# ---------------------------------------------------------------------------------------------- CPU vector paths
# Shapes that cross the CPU kernels' tiles (2048-element dropout tiles, ~16K-element scheduling tiles) with rows
# that start off an 8-element Philox group (N % 8 != 0), and the 32-group AVX2 / AVX-512 batches.
MASK_SHAPES = [(1, 8), (3, 7), (300, 123), (70, 4099), (2, 65533), (1000, 3), (9, 2048), (5, 4104)]
MASK_SCRIPT = r"""
import sys, torch, gpuopt_ops
import gpuopt_ops
from gpuopt_ops import reference as R
bad = []
for m, n in {shapes}:
    for seed in (0, 2**40 + 3, -5):
        out = torch.ops.gpuopt.layer_norm_dropout_relu(torch.randn(m, n), torch.zeros(n), torch.ones(n),
                                                       torch.tensor([seed]), 0.3, 1e-5)[0]
        if not torch.equal((out > 0).to(torch.int32), R.dropout_keep_mask(seed, m, n, 0.3).to(torch.int32)):
            bad.append((m, n, seed))
print("BAD", bad)
sys.exit(1 if bad else 0)
"""


@pytest.mark.parametrize("m,n", MASK_SHAPES)
def test_cpu_masks_across_tiles_match_the_reference(m, n):
    """The widest Philox path of this CPU, in this process."""
    seed = 1234 + m
    assert torch.equal(keep_bits(CPU, torch.randn(m, n), seed, 0.6), reference_bits(seed, m, n, 0.6))


@pytest.mark.slow
@pytest.mark.parametrize("path", ["avx2", "scalar"])
def test_cpu_capped_philox_paths_match_the_reference(path):
    """GPUOPT_CPU_PHILOX caps the path (read once per process, so a fresh interpreter each): same bits."""
    env = dict(os.environ, GPUOPT_CPU_PHILOX=path)
    proc = subprocess.run(
        [sys.executable, "-c", MASK_SCRIPT.format(shapes=MASK_SHAPES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------- wrong counters
def wrong_counter_mask(seed, m, n, p):
    """One Philox call per element with counter idx (not idx >> 3): a different, equally random mask."""
    idx = np.arange(m * n, dtype=np.int64)
    s = seed & 0xFFFFFFFFFFFFFFFF
    w0 = R.philox4x32_10_array(idx.astype(np.uint64), np.zeros(m * n, np.uint64), 0, 0, s & 0xFFFFFFFF, s >> 32)[0]
    return torch.from_numpy((w0 & np.uint64(0xFFFF)).astype(np.int64) >= R.dropout_threshold(p)).reshape(m, n)


def test_a_wrong_counter_is_rejected_by_the_mask_check():
    m, n, seed, p = 6, 40, 77, 0.5
    assert torch.equal(keep_bits(CPU, torch.randn(m, n), seed, p), reference_bits(seed, m, n, p))
    assert not torch.equal(wrong_counter_mask(seed, m, n, p), R.dropout_keep_mask(seed, m, n, p))


@pytest.fixture
def off_by_one_triton_kernels(tmp_path):
    """The Triton LayerNorm kernels rebuilt from their own source with the Philox group counter off by one (both
    RNG paths, in the shared row helpers of triton_kernels/rows.py), as modules of the installed package: a
    deliberately wrong kernel that nothing in the product can switch on."""
    from gpuopt_ops.triton_kernels import norm_dropout as ldr_kernels
    from gpuopt_ops.triton_kernels import norm_dropout_forward as fwd_kernels
    from gpuopt_ops.triton_kernels import rows as row_helpers

    rows_source = inspect.getsource(row_helpers)
    edits = [
        ("g = idx >> 3\n", "g = (idx >> 3) + 1\n"),
        (
            "g = ((base[:, None] + col0) >> 3) + gcols[None, :]",
            "g = ((base[:, None] + col0) >> 3) + gcols[None, :] + 1",
        ),
    ]
    for old, new in edits:
        assert rows_source.count(old) == 1, f"the kernel source changed: update this fixture ({old!r})"
        rows_source = rows_source.replace(old, new)
    # the forward kernels read the row helpers; the launchers read the forward kernels and the row planners
    fwd_source = inspect.getsource(fwd_kernels)
    ldr_source = inspect.getsource(ldr_kernels)
    for source, old in ((fwd_source, "from .rows import"), (ldr_source, "from .norm_dropout_forward import")):
        assert source.count(old) == 1, f"the kernel source changed: update this fixture ({old!r})"
    fwd_source = fwd_source.replace("from .rows import", "from .off_by_one_rows import")
    ldr_source = ldr_source.replace("from .rows import", "from .off_by_one_rows import")
    ldr_source = ldr_source.replace("from .norm_dropout_forward import", "from .off_by_one_forward import")
    loaded = []
    try:
        modules = (("off_by_one_rows", rows_source), ("off_by_one_forward", fwd_source), ("off_by_one_ldr", ldr_source))
        for name, source in modules:
            path = tmp_path / f"{name}.py"
            path.write_text(source)
            qual = f"gpuopt_ops.triton_kernels.{name}"
            spec = importlib.util.spec_from_file_location(qual, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[qual] = module
            loaded.append(qual)
            spec.loader.exec_module(module)
        yield module
    finally:
        for qual in loaded:
            sys.modules.pop(qual, None)


@pytest.mark.parametrize("backend", backend_params("triton", "triton-interpret"))
def test_a_triton_kernel_with_a_wrong_counter_is_caught(backend, off_by_one_triton_kernels):
    m, seed, p = 4, 77, 0.5
    dev = backend.device

    def wrong_op(x, w, b, s, p, eps):
        out = torch.empty_like(x)
        mean, rstd = torch.empty(m, device=dev), torch.empty(m, device=dev)
        off_by_one_triton_kernels.launch_forward(x, w, b, s, out, mean, rstd, p, eps)
        return out, mean, rstd

    for n in (40, 37):  # fast (N % 8 == 0) and generic RNG paths
        x = torch.randn(m, n)
        good = reference_bits(seed, m, n, p)
        assert torch.equal(keep_bits(backend, x, seed, p), good)
        bad = keep_bits(backend, x, seed, p, op=wrong_op)
        assert not torch.equal(bad, good)
        assert not torch.equal(bad, keep_bits(CPU, x, seed, p))

"""Triton twins of the fused ops (torch.ops.gpuopt.triton_*) against the fp64 reference and the C++ ops.

Without a GPU, the kernels run on CPU tensors under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1
before triton is imported); on a GPU machine the same tests run the compiled kernels on CUDA tensors, and the
`triton_gpu`-marked tests (Triton vs CUDA, Inductor, large N) run too. Shapes are small: the interpreter is slow.
"""

import importlib
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import gpuopt_ops  # noqa: E402
from gpuopt_ops import ops as gpuopt_ops_module  # noqa: E402
from gpuopt_ops import reference as R  # noqa: E402

from helpers import (FLOORS, BiasReluLdrBlock, assert_close_to_reference, check_bias_relu_against_reference,  # noqa: E402
                     check_fp64_dropout_precision, check_grad_bias_is_unrounded_fp32, ldr_reference_and_grads,
                     make_inputs, opcheck_four_ops, seed_tensor)

T = pytest.importorskip("gpuopt_ops.triton_ops")
from gpuopt_ops.triton_kernels import layer_norm_dropout_relu as LDR  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
if not HAS_CUDA and not T.INTERPRETED:
    pytest.skip("no GPU and the Triton kernels are not interpreted (TRITON_INTERPRET=1 unset)",
                allow_module_level=True)

ops = torch.ops.gpuopt
EPS = 1e-5

# N = 1, odd, prime, 3-D x, N % 8 == 0 (one Philox call per 8 elements), M = 0
SHAPES = [((4,), 1), ((3,), 7), ((5,), 37), ((2, 3), 123), ((6,), 64), ((0,), 16)]
LOW_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SEEDS = [0, 1, 77, -1, -123456789, 2**32 + 5, 2**62 + 3, -(2**63)]


def run_triton(x, w, b, seed, p, eps, grad_out):
    out, mean, rstd = ops.triton_layer_norm_dropout_relu(x, w, b, seed, p, eps)
    gx, gw, gb = ops.triton_layer_norm_dropout_relu_backward(grad_out, x, w, b, mean, rstd, seed, p)
    return out, mean, rstd, gx, gw, gb


def acc_of(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_against_reference(x, w, b, seed, p, grad_out, affine=True):
    dtype = x.dtype
    out, mean, rstd, gx, gw, gb = run_triton(x, w, b, seed, p, EPS, grad_out)
    ref64, (rgx, rgw, rgb) = ldr_reference_and_grads(x, w, b, seed, p, EPS, grad_out, torch.float64)
    low, (lgx, lgw, lgb) = ldr_reference_and_grads(x, w, b, seed, p, EPS, grad_out, dtype)
    m = x.numel() // x.shape[-1]
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert mean.dtype == acc_of(dtype) and mean.shape == (m,) and rstd.shape == (m,)
    fl = FLOORS[dtype]
    assert_close_to_reference("out", out, ref64, low, fl)
    assert_close_to_reference("grad_x", gx, rgx, lgx, fl)
    if affine:
        assert gw.dtype == w.dtype and gb.dtype == b.dtype
        assert_close_to_reference("grad_weight", gw, rgw, lgw, fl * max(1, m))
        assert_close_to_reference("grad_bias", gb, rgb, lgb, fl * max(1, m))
    else:
        assert gw.numel() == 0 and gb.numel() == 0
    return out, mean, rstd, gx, gw, gb


def keep_bits(out):
    """Integer keep mask of an output computed with weight = 0, bias = 1 (out = scale kept, 0 dropped)."""
    return (out != 0).to(torch.int32).cpu()


def cpp_keep_bits(seed, m, n, p):
    x = torch.randn(m, n)
    out = ops.layer_norm_dropout_relu(x, torch.zeros(n), torch.ones(n), seed_tensor(seed), p, EPS)[0]
    return keep_bits(out)


def triton_keep_bits(seed, m, n, p, device=DEVICE, dtype=torch.float32):
    x = torch.randn(m, n, device=device, dtype=dtype)
    w = torch.zeros(n, device=device, dtype=dtype)
    b = torch.ones(n, device=device, dtype=dtype)
    out = ops.triton_layer_norm_dropout_relu(x, w, b, seed_tensor(seed, device), p, EPS)[0]
    return keep_bits(out)


@pytest.fixture
def looped(monkeypatch):
    """Forces the looped (long-row) kernels for N > 16, with 16-column chunks, so small N exercises them."""
    for name in ("FWD_MAX_FUSED_N", "FWD_MAX_FUSED_N_FP64", "BWD_MAX_FUSED_N", "BWD_MAX_FUSED_N_FP64"):
        monkeypatch.setattr(LDR, name, 16)


# ----------------------------------------------------------------------------------- values vs reference
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("prefix,n", SHAPES)
@pytest.mark.parametrize("p", [0.0, 0.25])
@pytest.mark.parametrize("affine", [True, False])
def test_matches_reference(dtype, prefix, n, p, affine):
    x, w, b = make_inputs(prefix, n, dtype, DEVICE, affine=affine)
    grad_out = torch.randn(x.shape, dtype=torch.float64, device=DEVICE).to(dtype)
    check_against_reference(x, w, b, seed_tensor(1234, DEVICE), p, grad_out, affine)


@pytest.mark.parametrize("prefix,n", [((3,), 7), ((2, 3), 40)])
def test_fp64_matches_reference(prefix, n):
    """fp64 x: fp64 statistics and accumulation (the interpreter and Triton on the GPU both do fp64)."""
    x, w, b = make_inputs(prefix, n, torch.float64, DEVICE)
    g = torch.randn(x.shape, dtype=torch.float64, device=DEVICE)
    check_against_reference(x, w, b, seed_tensor(9, DEVICE), 0.3, g)


@pytest.mark.parametrize("path", ["single-block", "looped"])
def test_fp64_with_dropout_is_fp64_accurate(request, path):
    """Every kernel computes its own dropout scale: the single-block and the looped ones (N = 40 > 16)."""
    if path == "looped":
        request.getfixturevalue("looped")
    check_fp64_dropout_precision(ops.triton_layer_norm_dropout_relu, ops.triton_layer_norm_dropout_relu_backward,
                                 DEVICE)


def test_fp64_gradcheck():
    x, w, b = make_inputs((2,), 6, torch.float64, DEVICE, requires_grad=True)
    seed = seed_tensor(99, DEVICE)
    fn = lambda x, w, b: ops.triton_layer_norm_dropout_relu(x, w, b, seed, 0.3, EPS)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_params_with_low_precision_x(dtype):
    x, w, b = make_inputs((9,), 100, dtype, DEVICE, param_dtype=torch.float32)
    seed = seed_tensor(3, DEVICE)
    g = torch.randn(x.shape, device=DEVICE).to(dtype)
    out, _, _, gx, gw, gb = run_triton(x, w, b, seed, 0.2, EPS, g)
    ref64, (rgx, rgw, rgb) = ldr_reference_and_grads(x, w, b, seed, 0.2, EPS, g, torch.float64)
    low, (lgx, lgw, lgb) = ldr_reference_and_grads(x, w.to(dtype), b.to(dtype), seed, 0.2, EPS, g, dtype)
    assert gw.dtype == torch.float32 and gb.dtype == torch.float32 and out.dtype == dtype
    assert_close_to_reference("out", out, ref64, low, FLOORS[dtype])
    assert_close_to_reference("grad_x", gx, rgx, lgx, FLOORS[dtype])
    assert_close_to_reference("grad_weight", gw, rgw, lgw, 1e-2)
    assert_close_to_reference("grad_bias", gb, rgb, lgb, 1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("n", [37, 64])  # generic RNG path and the 8-lane fast path, 3 and 4 chunks
def test_looped_path_matches_reference_and_single_block(looped, dtype, n):
    x, w, b = make_inputs((5,), n, dtype, DEVICE)
    g = torch.randn(x.shape, dtype=torch.float64, device=DEVICE).to(dtype)
    seed = seed_tensor(4321, DEVICE)
    assert not LDR.forward_config(n, dtype).fused and not LDR.backward_config(n, dtype).fused
    looped_res = check_against_reference(x, w, b, seed, 0.25, g)
    for name in ("FWD_MAX_FUSED_N", "FWD_MAX_FUSED_N_FP64", "BWD_MAX_FUSED_N", "BWD_MAX_FUSED_N_FP64"):
        setattr(LDR, name, 1 << 14)  # the fixture restores the originals
    fused_res = run_triton(x, w, b, seed, 0.25, EPS, g)
    assert torch.equal(keep_bits(looped_res[0]), keep_bits(fused_res[0]))
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    for name, a, c in zip(["out", "mean", "rstd", "gx", "gw", "gb"], looped_res, fused_res):
        assert (a.double() - c.double()).abs().max().item() <= tol * max(1.0, c.double().abs().max().item()), name


def test_large_row_looped_path():
    """A real long row (N = 65536 > the single-block limits), forward and backward, fp32."""
    m, n = 2, 65536
    assert not LDR.forward_config(n, torch.float32).fused
    x, w, b = make_inputs((m,), n, torch.float32, DEVICE)
    g = torch.randn(x.shape, device=DEVICE)
    check_against_reference(x, w, b, seed_tensor(2**40 + 1, DEVICE), 0.1, g)
    ours = triton_keep_bits(2**40 + 1, m, n, 0.1)
    assert torch.equal(ours, R.dropout_keep_mask(2**40 + 1, m, n, 0.1).to(torch.int32))
    assert torch.equal(ours, cpp_keep_bits(2**40 + 1, m, n, 0.1))


def test_non_contiguous_input_and_params():
    x = torch.randn(40, 24, device=DEVICE).t()  # (24, 40), transposed
    w, b = torch.randn(80, device=DEVICE)[::2], torch.randn(40, device=DEVICE)
    seed = seed_tensor(5, DEVICE)
    ours = ops.triton_layer_norm_dropout_relu(x, w, b, seed, 0.3, EPS)
    ref = ops.triton_layer_norm_dropout_relu(x.contiguous(), w.contiguous(), b, seed, 0.3, EPS)
    for a, c in zip(ours, ref):
        assert torch.equal(a, c)
    g = torch.randn(24, 40, device=DEVICE).t().contiguous().t()  # non-contiguous grad_out too
    bw = ops.triton_layer_norm_dropout_relu_backward(g, x, w, b, ours[1], ours[2], seed, 0.3)
    bw_ref = ops.triton_layer_norm_dropout_relu_backward(g.contiguous(), x.contiguous(), w.contiguous(), b,
                                                         ref[1], ref[2], seed, 0.3)
    for a, c in zip(bw, bw_ref):
        assert torch.equal(a, c)
    cpu = ops.layer_norm_dropout_relu(x.cpu(), w.cpu(), b.cpu(), seed.cpu(), 0.3, EPS)[0]
    torch.testing.assert_close(ours[0].cpu(), cpu, atol=1e-5, rtol=1e-5)


def test_empty_rows():
    x = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    out = gpuopt_ops.layer_norm_dropout_relu(x, 8, w, None, p=0.2, backend="triton")
    assert out.shape == (0, 8)
    out.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
    gx, gb = ops.triton_bias_relu_backward(torch.randn(0, 3, device=DEVICE), torch.randn(0, 3, device=DEVICE))
    assert gx.shape == (0, 3) and torch.equal(gb, torch.zeros(3, device=DEVICE))


def test_meta_tensors_give_output_metadata():
    x = torch.empty(5, 3, 40, device="meta", dtype=torch.bfloat16)
    w = torch.empty(40, device="meta")
    out, mean, rstd = ops.triton_layer_norm_dropout_relu(x, w, w, torch.empty(1, dtype=torch.int64,
                                                                                device="meta"), 0.1, EPS)
    assert out.shape == x.shape and out.dtype == x.dtype and mean.shape == (15,) and rstd.dtype == torch.float32
    gx, gw, gb = ops.triton_layer_norm_dropout_relu_backward(out, x, w, w, mean, rstd, torch.empty(
        1, dtype=torch.int64, device="meta"), 0.1)
    assert gx.shape == x.shape and gw.shape == (40,) and gw.dtype == torch.float32
    assert ops.triton_bias_relu(x, w).shape == x.shape
    gx, gb = ops.triton_bias_relu_backward(out, out)
    assert gb.shape == (40,) and gb.dtype == torch.float32  # the accumulation dtype


# ------------------------------------------------------------------------------------------- dropout bits
@pytest.mark.parametrize("m,n", [(3, 7), (5, 37), (2, 123), (4, 16), (6, 40), (1, 8), (2, 1), (3, 64)])
def test_keep_mask_bit_identical_to_cpp_and_reference(m, n):
    for seed in SEEDS:
        for p in (0.3, 0.5):
            ours = triton_keep_bits(seed, m, n, p)
            assert torch.equal(ours, cpp_keep_bits(seed, m, n, p)), (seed, p)
            assert torch.equal(ours, R.dropout_keep_mask(seed, m, n, p).to(torch.int32)), (seed, p)


def test_keep_mask_3d_and_looped(looped):
    x = torch.randn(2, 3, 40, device=DEVICE)  # looped: 40 > 16, fast RNG path (40 % 8 == 0)
    seed = 2**33 + 17
    out = ops.triton_layer_norm_dropout_relu(x, torch.zeros(40, device=DEVICE), torch.ones(40, device=DEVICE),
                                             seed_tensor(seed, DEVICE), 0.4, EPS)[0]
    assert torch.equal(keep_bits(out).reshape(6, 40), R.dropout_keep_mask(seed, 6, 40, 0.4).to(torch.int32))
    assert torch.equal(keep_bits(out).reshape(6, 40), cpp_keep_bits(seed, 6, 40, 0.4))


def test_known_answer_through_the_op():
    """DESIGN.md: seed 0, p = 0.5, x (1, 8), weight 0, bias 1 => out = [2, 0, 2, 2, 2, 2, 2, 2]."""
    x = torch.randn(1, 8, device=DEVICE)
    out = ops.triton_layer_norm_dropout_relu(x, torch.zeros(8, device=DEVICE), torch.ones(8, device=DEVICE),
                                             seed_tensor(0, DEVICE), 0.5, EPS)[0]
    assert out.cpu().tolist() == [[2.0, 0.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]]


@pytest.mark.parametrize("n", [37, 64])
def test_backward_recomputes_the_forward_mask(n):
    """With weight 0, bias 1 and grad_out 1 on one row, grad_bias = scale on kept elements, 0 on dropped."""
    seed, p = -987654321, 0.35
    x = torch.randn(1, n, device=DEVICE)
    w, b = torch.zeros(n, device=DEVICE), torch.ones(n, device=DEVICE)
    out, mean, rstd = ops.triton_layer_norm_dropout_relu(x, w, b, seed_tensor(seed, DEVICE), p, EPS)
    _, _, gb = ops.triton_layer_norm_dropout_relu_backward(torch.ones_like(x), x, w, b, mean, rstd,
                                                           seed_tensor(seed, DEVICE), p)
    assert torch.equal(keep_bits(gb[None]), keep_bits(out))
    assert torch.equal(keep_bits(out), R.dropout_keep_mask(seed, 1, n, p).to(torch.int32))
    assert torch.equal(gb[gb != 0].cpu(), torch.full_like(gb[gb != 0].cpu(), R.dropout_scale(p)))


def test_p1_gives_zeros_and_zero_grads():
    x, w, b = make_inputs((16,), 40, torch.float32, DEVICE, requires_grad=True)
    out = gpuopt_ops.layer_norm_dropout_relu(x, 40, w, b, p=1.0, backend="triton")
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    for t in (x, w, b):
        assert torch.equal(t.grad, torch.zeros_like(t.grad)) and not torch.isnan(t.grad).any()


def test_same_seed_same_bits_and_deterministic_grads():
    x, w, b = make_inputs((300,), 64, torch.float32, DEVICE)  # 10 row tiles over 8 row groups (interpreter)
    g = torch.randn(x.shape, device=DEVICE)
    r1 = run_triton(x, w, b, seed_tensor(11, DEVICE), 0.1, EPS, g)
    r2 = run_triton(x, w, b, seed_tensor(11, DEVICE), 0.1, EPS, g)
    for a, c in zip(r1, r2):
        assert torch.equal(a, c)
    r3 = run_triton(x, w, b, seed_tensor(12, DEVICE), 0.1, EPS, g)
    assert not torch.equal(r1[0], r3[0])


def test_public_function_manual_seed_and_multi_dim_shape():
    x = torch.randn(3, 4, 5, 6, device=DEVICE)
    w, b = torch.randn(5, 6, device=DEVICE), torch.randn(5, 6, device=DEVICE)
    out = gpuopt_ops.layer_norm_dropout_relu(x, (5, 6), w, b, p=0.0, backend="triton")
    ref = torch.relu(torch.nn.functional.layer_norm(x, (5, 6), w, b))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.manual_seed(0)
    a = gpuopt_ops.layer_norm_dropout_relu(x, (5, 6), w, b, p=0.5, backend="triton")
    torch.manual_seed(0)
    c = gpuopt_ops.layer_norm_dropout_relu(x, (5, 6), w, b, p=0.5, backend="triton")
    assert torch.equal(a, c)


def test_autograd_matches_explicit_backward():
    x, w, b = make_inputs((6,), 24, torch.float32, DEVICE, requires_grad=True)
    seed = seed_tensor(8, DEVICE)
    out = ops.triton_layer_norm_dropout_relu(x, w, b, seed, 0.2, EPS)[0]
    g = torch.randn_like(out)
    out.backward(g)
    _, mean, rstd = ops.triton_layer_norm_dropout_relu(x.detach(), w.detach(), b.detach(), seed, 0.2, EPS)
    gx, gw, gb = ops.triton_layer_norm_dropout_relu_backward(g, x.detach(), w.detach(), b.detach(), mean, rstd,
                                                             seed, 0.2)
    assert torch.equal(x.grad, gx) and torch.equal(w.grad, gw) and torch.equal(b.grad, gb)


# ------------------------------------------------------------------------------------------------ bias_relu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("prefix,n", [((4,), 1), ((3,), 7), ((5,), 37), ((2, 3), 123), ((0,), 16), ((70,), 300)])
def test_bias_relu_matches_reference_and_cpp(dtype, prefix, n):
    x, _, b = make_inputs(prefix, n, dtype, DEVICE)
    g = torch.randn(x.shape, dtype=torch.float64, device=DEVICE).to(dtype)
    out = ops.triton_bias_relu(x, b)
    gx, gb = ops.triton_bias_relu_backward(g, out)
    assert out.dtype == dtype and gx.dtype == dtype and gb.dtype == acc_of(dtype)
    check_bias_relu_against_reference(x, b, g, out, gx, gb)
    cpu_out = ops.bias_relu(x.cpu(), b.cpu())
    assert torch.equal(out.cpu(), cpu_out)  # same fp32 (fp64) add, relu and rounding
    cpu_gx, cpu_gb = ops.bias_relu_backward(g.cpu(), cpu_out)
    assert torch.equal(gx.cpu(), cpu_gx)
    fl = FLOORS[dtype]
    torch.testing.assert_close(gb.cpu(), cpu_gb, atol=fl * max(1, x.numel() // n), rtol=fl)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bias_relu_backward_grad_bias_is_unrounded_fp32(dtype):
    check_grad_bias_is_unrounded_fp32(ops.triton_bias_relu, ops.triton_bias_relu_backward, DEVICE, dtype)


def test_bias_relu_autograd_fp32_bias_and_determinism():
    x = torch.randn(10, 33, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    b = torch.randn(33, device=DEVICE, requires_grad=True)
    gpuopt_ops.bias_relu(x, b, backend="triton").float().sum().backward()
    assert b.grad.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    ref = (torch.relu(x.detach().float() + b.detach()) > 0).float().sum(0)
    torch.testing.assert_close(b.grad, ref, atol=0.5, rtol=1e-2)
    xs = torch.randn(600, 48, device=DEVICE)
    out = ops.triton_bias_relu(xs[:, ::2], b[:24].detach())  # non-contiguous x
    torch.testing.assert_close(out, torch.relu(xs[:, ::2] + b[:24].detach()))
    g = torch.randn_like(out)
    r1, r2 = ops.triton_bias_relu_backward(g, out), ops.triton_bias_relu_backward(g, out)
    assert torch.equal(r1[0], r2[0]) and torch.equal(r1[1], r2[1])


# ---------------------------------------------------------------------------------------------- errors
def _first_line(excinfo):
    return str(excinfo.value).splitlines()[0]


LDR_BAD = [
    dict(x=torch.randint(0, 3, (4, 8))),
    dict(weight=torch.randn(7)),
    dict(weight=torch.randn(8, dtype=torch.float64)),
    dict(bias=torch.randn(8, dtype=torch.float16)),
    dict(seed=torch.zeros(1, dtype=torch.int32)),
    dict(seed=torch.zeros(2, dtype=torch.int64)),
    dict(p=1.5),
    dict(p=float("nan")),
    dict(eps=0.0),
    dict(x=torch.randn(4, 0), weight=None, bias=None),
]


@pytest.mark.parametrize("change", LDR_BAD, ids=lambda c: "-".join(c))
def test_forward_error_messages_identical_to_cpp(change):
    kw = dict(x=torch.randn(4, 8), weight=torch.randn(8), bias=torch.randn(8),
              seed=torch.zeros(1, dtype=torch.int64), p=0.1, eps=1e-5)
    kw.update(change)
    msgs = []
    for op in (ops.layer_norm_dropout_relu, ops.triton_layer_norm_dropout_relu):
        with pytest.raises(RuntimeError) as e:
            op(*kw.values())
        msgs.append(_first_line(e))
    assert msgs[0].startswith("gpuopt.layer_norm_dropout_relu: ")
    assert msgs[0] == msgs[1]


def test_backward_and_bias_relu_error_messages_identical_to_cpp():
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    seed = torch.zeros(1, dtype=torch.int64)
    _, mean, rstd = ops.layer_norm_dropout_relu(x, w, b, seed, 0.1, EPS)
    bad_calls = [
        ("layer_norm_dropout_relu_backward", (torch.randn(4, 9), x, w, b, mean, rstd, seed, 0.1)),
        ("layer_norm_dropout_relu_backward", (torch.randn(4, 8), x, w, b, torch.zeros(3), rstd, seed, 0.1)),
        ("layer_norm_dropout_relu_backward", (torch.randn(4, 8), x, w, b, mean, rstd.double(), seed, 0.1)),
        ("bias_relu", (torch.randn(3, 5), torch.randn(4))),
        ("bias_relu", (torch.randint(0, 2, (3, 5)), torch.randn(5))),
        ("bias_relu_backward", (torch.randn(3, 4), torch.randn(3, 5))),
        ("bias_relu_backward", (torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5))),
    ]
    for name, args in bad_calls:
        msgs = []
        for op in (getattr(ops, name), getattr(ops, "triton_" + name)):
            with pytest.raises(RuntimeError) as e:
                op(*args)
            msgs.append(_first_line(e))
        assert msgs[0].startswith(f"gpuopt.{name}: ") and msgs[0] == msgs[1], name


def test_schemas_match_the_cpp_ops():
    for name in ("layer_norm_dropout_relu", "layer_norm_dropout_relu_backward", "bias_relu",
                 "bias_relu_backward"):
        cpp = getattr(ops, name).default._schema
        tri = getattr(ops, "triton_" + name).default._schema
        assert [(a.name, str(a.type)) for a in cpp.arguments] == [(a.name, str(a.type)) for a in tri.arguments]
        assert [str(r.type) for r in cpp.returns] == [str(r.type) for r in tri.returns]
        # torch versions whose triton_op ignores `schema=` infer unnamed returns; names match where honoured
        if all(r.name for r in tri.returns):
            assert str(tri).replace("triton_", "", 1) == str(cpp)


def test_backend_errors(monkeypatch):
    x = torch.randn(2, 8)
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1 before importing triton.*backend='cpu'"):
            gpuopt_ops.layer_norm_dropout_relu(x, 8, backend="triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(T, "INTERPRETED", False)  # as if the kernels had been compiled for the GPU
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1.*backend='cpu'"):
        gpuopt_ops.bias_relu(x, torch.randn(8), backend="triton")
    with pytest.raises(RuntimeError, match="cannot run on CPU tensors.*TRITON_INTERPRET=1"):
        ops.triton_bias_relu(x, torch.randn(8))


def test_clear_errors_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    with pytest.raises(RuntimeError, match="backend='triton' needs the triton package"):
        gpuopt_ops_module._check_backend("triton", torch.randn(2, 3), "bias_relu")
    monkeypatch.delitem(sys.modules, "gpuopt_ops.triton_ops")
    with pytest.raises(ImportError, match="gpuopt_ops.triton_ops needs the `triton` package"):
        importlib.import_module("gpuopt_ops.triton_ops")


# ---------------------------------------------------------------------------------- opcheck / compile
def opcheck_samples():
    for dtype in (torch.float32, torch.bfloat16):
        for prefix, n, affine in [((3,), 7, True), ((2, 3), 16, False)]:
            x, w, b = make_inputs(prefix, n, dtype, DEVICE, affine=affine, requires_grad=True)
            yield x, w, b, seed_tensor(5, DEVICE)


def test_opcheck_triton_ops():
    """Under the interpreter the ops are kept opaque (interpreted kernels cannot run on fake tensors), so this
    checks the schema, fake kernel, autograd registration and AOT dispatch of the op as a whole; on CUDA
    (compiled kernels) AOT dispatch decomposes the op into its Triton kernels and checks that path."""
    opcheck_four_ops(ops.triton_layer_norm_dropout_relu, ops.triton_layer_norm_dropout_relu_backward,
                     ops.triton_bias_relu, ops.triton_bias_relu_backward, opcheck_samples(), EPS)


def Block(n):
    return BiasReluLdrBlock(n, ops.triton_bias_relu, ops.triton_layer_norm_dropout_relu, EPS)


def compile_and_compare(device, m=5, n=24):
    torch._dynamo.reset()
    model = Block(n).to(device)
    x = torch.randn(m, n, device=device, requires_grad=True)
    seed = seed_tensor(m, device)
    explain = torch._dynamo.explain(model)(x, seed)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x, seed)
    out.sum().backward()
    got = x.grad.clone(), model.w.grad.clone(), model.b.grad.clone(), model.lin_b.grad.clone()
    x.grad = None
    model.zero_grad()
    ref = model(x, seed)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    for a, c in zip(got, (x.grad, model.w.grad, model.b.grad, model.lin_b.grad)):
        torch.testing.assert_close(a, c)
    return compiled, x, seed


def test_compile_fullgraph():
    """Runs everywhere: on the interpreter the triton ops are opaque custom ops inside the compiled graph."""
    compile_and_compare(DEVICE)


def test_compile_fullgraph_public_functions_backend_triton():
    """The public wrappers' backend checks (TRITON_INTERPRET, triton import) trace without graph breaks."""
    def f(x, b):
        y = gpuopt_ops.bias_relu(x, b, backend="triton")
        return gpuopt_ops.layer_norm_dropout_relu(y, 16, b, b, p=0.0, backend="triton")

    torch._dynamo.reset()
    x, b = torch.randn(4, 16, device=DEVICE), torch.randn(16, device=DEVICE)
    assert torch._dynamo.explain(f)(x, b).graph_break_count == 0
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, b), f(x, b))


def test_dropout_threshold_and_scale_match_reference():
    """t is csrc's; the scale each kernel computes (read through weight 0, bias 1: out = scale where kept) is the
    reference's in the accumulation dtype: fp32 for fp32 x, fp64 for fp64 x."""
    n = 256
    w, b = torch.zeros(n, device=DEVICE, dtype=torch.float64), torch.ones(n, device=DEVICE, dtype=torch.float64)
    for p in [0.0, 1e-6, 0.5 / 65536, 0.49999 / 65536, 0.1, 0.25, 1 / 3, 0.5, 0.9, 1 - 1e-6, 1 - 0.5 / 65536, 1.0]:
        t = LDR.dropout_threshold(p)
        assert t == R.dropout_threshold(p), p
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(1, n, device=DEVICE, dtype=dtype)
            out = ops.triton_layer_norm_dropout_relu(x, w.to(dtype), b.to(dtype), seed_tensor(3, DEVICE), p, EPS)[0]
            kept = out[out != 0].cpu()
            assert (kept.numel() == 0) == (t == 65536), (p, dtype)
            assert torch.equal(kept, torch.full_like(kept, 1.0 if t == 0 else R.dropout_scale(p, dtype))), (p, dtype)
    # The fp32 kernels divide in fp32: for every t that is the fp32 rounding of the fp64 quotient, i.e. the
    # static_cast<float>(DropoutParams::scale) of the C++ and CUDA kernels, bit for bit.
    t = np.arange(65536)
    assert np.array_equal((65536.0 / (65536.0 - t)).astype(np.float32),
                          np.float32(65536.0) / (65536 - t).astype(np.float32))


# ------------------------------------------------------------------------------------- wrong kernel
def test_wrong_philox_counter_is_detected(monkeypatch):
    """A kernel with an off-by-one Philox group counter gives an equally random but different mask: the mask
    comparison (the one the tests above use) must catch it."""
    m, n, seed, p = 4, 40, 77, 0.5
    ref = R.dropout_keep_mask(seed, m, n, p).to(torch.int32)
    assert torch.equal(triton_keep_bits(seed, m, n, p), ref)
    monkeypatch.setattr(LDR, "DEBUG_COUNTER_OFFSET", 1)
    for nn in (n, 37):  # fast (N % 8 == 0) and generic RNG paths
        bad = triton_keep_bits(seed, m, nn, p)
        good = R.dropout_keep_mask(seed, m, nn, p).to(torch.int32)
        assert not torch.equal(bad, good)
        assert not torch.equal(bad, cpp_keep_bits(seed, m, nn, p))


# --------------------------------------------------------------------------------------------- GPU only
def _has_cuda_kernels():
    return torch._C._dispatch_has_kernel_for_dispatch_key("gpuopt::layer_norm_dropout_relu", "CUDA")


@pytest.mark.triton_gpu
@pytest.mark.parametrize("m,n", [(3, 7), (5, 8), (64, 1000), (33, 1024), (7, 4096), (4, 12288), (3, 65536),
                                 (2, 65533), (70000, 64)])
def test_gpu_triton_mask_identical_to_cuda_and_cpu(m, n):
    if not _has_cuda_kernels():
        pytest.skip("the gpuopt build has no CUDA kernels")
    for seed in (0, -5, 2**40 + 7):
        x = torch.randn(m, n, device="cuda")
        w, b = torch.zeros(n, device="cuda"), torch.ones(n, device="cuda")
        s = seed_tensor(seed, "cuda")
        tri = keep_bits(ops.triton_layer_norm_dropout_relu(x, w, b, s, 0.3, EPS)[0])
        cuda = keep_bits(ops.layer_norm_dropout_relu(x, w, b, s, 0.3, EPS)[0])
        assert torch.equal(tri, cuda)
        if m * n <= 1 << 20:
            assert torch.equal(tri, cpp_keep_bits(seed, m, n, 0.3))


@pytest.mark.triton_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("n", [1, 37, 256, 1024, 8192, 12288, 32768, 65536])
@pytest.mark.parametrize("affine", [True, False])
def test_gpu_triton_matches_cuda(dtype, n, affine):
    if not _has_cuda_kernels():
        pytest.skip("the gpuopt build has no CUDA kernels")
    x, w, b = make_inputs((6,), n, dtype, "cuda", affine=affine)
    g = torch.randn(x.shape, device="cuda").to(dtype)
    seed = seed_tensor(4, "cuda")
    res = []
    for fwd, bwd in ((ops.layer_norm_dropout_relu, ops.layer_norm_dropout_relu_backward),
                     (ops.triton_layer_norm_dropout_relu, ops.triton_layer_norm_dropout_relu_backward)):
        out, mean, rstd = fwd(x, w, b, seed, 0.1, EPS)
        res.append([t.double() for t in (out, mean, rstd, *bwd(g, x, w, b, mean, rstd, seed, 0.1))])
    tol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    for name, a, c in zip(["out", "mean", "rstd", "gx", "gw", "gb"], *res):
        assert a.shape == c.shape, name
        if a.numel():
            assert (a - c).abs().max().item() <= tol * max(1.0, a.abs().max().item()), name


@pytest.mark.triton_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_large_n_matches_reference(dtype):
    x, w, b = make_inputs((4,), 65536, dtype, "cuda")
    g = torch.randn(x.shape, device="cuda").to(dtype)
    check_against_reference(x, w, b, seed_tensor(3, "cuda"), 0.1, g)
    x, w, b = make_inputs((3,), 100000, dtype, "cuda")
    g = torch.randn(x.shape, device="cuda").to(dtype)
    check_against_reference(x, w, b, seed_tensor(3, "cuda"), 0.1, g)


@pytest.mark.triton_gpu
def test_gpu_many_rows_deterministic():
    x = torch.randn(70000, 64, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    g = torch.randn_like(x)
    r1 = run_triton(x, w, b, seed_tensor(1, "cuda"), 0.2, EPS, g)
    r2 = run_triton(x, w, b, seed_tensor(1, "cuda"), 0.2, EPS, g)
    for a, c in zip(r1, r2):
        assert torch.equal(a, c)


@pytest.mark.triton_gpu
def test_gpu_inductor_sees_the_triton_kernels():
    """torch.compile(fullgraph=True) with Inductor: 0 graph breaks, and the generated code launches our kernels
    (triton_op decomposition) instead of calling the op as an opaque extern."""
    from torch._inductor.utils import run_and_get_code

    compiled, x, seed = compile_and_compare("cuda", m=33, n=256)
    torch._dynamo.reset()
    model = Block(256).cuda()
    _, codes = run_and_get_code(torch.compile(model, fullgraph=True), x.detach(), seed)
    code = "\n".join(codes)
    assert "ldr_fwd_fused_kernel" in code and "bias_relu_fwd_kernel" in code


@pytest.mark.triton_gpu
def test_gpu_opcheck_large_n():
    x, w, b = make_inputs((2,), 65536, torch.float32, "cuda", requires_grad=True)
    torch.library.opcheck(ops.triton_layer_norm_dropout_relu, (x, w, b, seed_tensor(1, "cuda"), 0.2, EPS))


# ------------------------------------------------------------------------- GPU compile check, CPU only
_COMPILE_CHECK = r'''
import os, subprocess, sys, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime import driver
from gpuopt_ops.triton_kernels import bias_relu as BR, layer_norm_dropout_relu as L

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float64: "*fp64",
       torch.int64: "*i64"}
compiled = []


class Compile:
    """Stands in for wrap_triton: compiles the launch it is given for sm_90 instead of running it."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, num_warps=4, **kwargs):
            bound = dict(zip(self.kernel.arg_names, args), **kwargs)
            sig, consts = {}, {}
            for p in self.kernel.params:
                v = bound[p.name]
                if p.is_constexpr:
                    sig[p.name], consts[p.name] = "constexpr", v
                elif isinstance(v, torch.Tensor):
                    sig[p.name] = PTR[v.dtype]
                elif isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise TypeError(f"{p.name}={v!r}")
                else:
                    sig[p.name] = "fp32" if isinstance(v, float) else "i32"
            k = triton.compile(ASTSource(self.kernel, sig, constexprs=consts), target=TARGET,
                               options={"num_warps": num_warps})
            name = f"{self.kernel.__name__}[{num_warps}w]"
            if os.path.exists(CUOBJDUMP):  # register spills show up as a non-zero stack frame
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(k.asm["cubin"])
                    f.flush()
                    usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True,
                                           text=True).stdout
                assert "STACK:0 " in usage, (name, consts, usage)
                name += "[" + usage.split("REG:")[1].split()[0] + "r]"
            compiled.append(name)
        return launch


def ldr(m, n, dtype, pdtype, p, affine=True, bwd_max=None):
    x = torch.randn(m, n, dtype=dtype)
    w = torch.randn(n, dtype=pdtype) if affine else None
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    mean, rstd, seed = torch.empty(m, dtype=acc), torch.empty(m, dtype=acc), torch.zeros(1, dtype=torch.int64)
    L.launch_forward(x, w, w, seed, x, mean, rstd, p, 1e-5, wrap=Compile)
    L.launch_backward(x, x, w, w, mean, rstd, seed, x, w, w, p, wrap=Compile, max_fused_n=bwd_max)


ldr(64, 1000, torch.bfloat16, torch.float32, 0.1)         # single block, 8-lane RNG
ldr(8, 37, torch.float16, torch.float16, 0.1, False)      # generic RNG, no affine
# Largest single-block forward; looped backward. These compiles have no alignment hints (scalar loads), and
# without them the fused N = 8192 backward spills (120 B); the aligned variants a launch compiles are gated by
# tests/test_triton_compile.py (no spills).
ldr(2, 8192, torch.float32, torch.float32, 0.1, bwd_max=4096)
ldr(2, 65533, torch.float64, torch.float64, 0.1)          # fp64, looped, generic RNG
ldr(4, 4096, torch.float32, torch.float32, 0.0)           # p = 0: no RNG
BR.launch_forward(torch.randn(8, 300, dtype=torch.bfloat16), torch.randn(300), torch.empty(8, 300,
                  dtype=torch.bfloat16), wrap=Compile)
BR.launch_backward(torch.randn(8, 300), torch.randn(8, 300), torch.empty(8, 300), torch.empty(300), wrap=Compile)


class FakeDriver:  # Inductor's TTIR analysis asks the active driver for its target
    def get_current_target(self):
        return TARGET


driver.set_active(FakeDriver())
try:
    from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors
except ImportError:  # older torch (2.11): only the mutation analysis, a list of the written argument names
    from torch._higher_order_ops.triton_kernel_wrap import identify_mutated_tensors as identify_accessed_tensors

x, v, s = torch.empty(64, 1000), torch.empty(64), torch.zeros(1, dtype=torch.int64)
flags = dict(HAS_W=True, HAS_B=True, DROPOUT=True, FAST_RNG=True, IS_FP64=False, CTR_OFFSET=0, RTNE_BF16=False)
ldr_in = dict(X=x, W=x, B=x, MEAN=v, RSTD=v, SEED=s, M=64, N=1000, threshold=13107)
cases = [
    (L.ldr_fwd_fused_kernel, dict(ldr_in, OUT=x, eps_hi=1e-5, eps_lo=0.0, BLOCK_M=4, BLOCK_N=1024, **flags),
     {"OUT", "MEAN", "RSTD"}),
    (L.ldr_fwd_looped_kernel, dict(ldr_in, OUT=x, eps_hi=1e-5, eps_lo=0.0, BLOCK_N=256, **flags),
     {"OUT", "MEAN", "RSTD"}),
    (L.ldr_bwd_fused_kernel, dict(ldr_in, DY=x, DX=x, PDW=x, PDB=x, BLOCK_M=2, BLOCK_N=1024, **flags),
     {"DX", "PDW", "PDB"}),
    (L.ldr_bwd_row_coef_kernel, dict(ldr_in, DY=x, C1=v, C2=v, BLOCK_N=256, **flags), {"C1", "C2"}),
    (L.ldr_bwd_chunk_kernel, dict(ldr_in, DY=x, C1=v, C2=v, DX=x, PDW=x, PDB=x, BLOCK_M=4, BLOCK_N=256, **flags),
     {"DX", "PDW", "PDB"}),
    (L.sum_partials_kernel, dict(P=x, OUT=v, G=64, N=1000, BLOCK_G=4, BLOCK_N=1024, RTNE_BF16=False), {"OUT"}),
    (BR.bias_relu_fwd_kernel, dict(X=x, B=v, OUT=x, M=64, N=1000, IS_FP64=False, BLOCK_M=4, BLOCK_N=1024,
                                   RTNE_BF16=False), {"OUT"}),
    (BR.bias_relu_bwd_kernel, dict(DY=x, OUT=x, DX=x, PDB=x, M=64, N=1000, IS_FP64=False, BLOCK_M=16,
                                   BLOCK_N=256, RTNE_BF16=False), {"DX", "PDB"}),
]
for kernel, kwargs, expected in cases:
    accesses = identify_accessed_tensors(kernel, kwargs, {})
    if isinstance(accesses, (list, tuple, set)):
        written = set(accesses)
    else:
        rw = getattr(accesses, "read_writes", accesses)
        written = {d.name for d in rw.writes}
    assert written == expected, (kernel.__name__, written)
print("COMPILED", len(compiled), " ".join(compiled))
print("ANALYSED", len(cases))
'''


@pytest.mark.skipif(HAS_CUDA, reason="the GPU tests run the kernels themselves")
def test_kernels_compile_for_sm90_and_inductor_sees_only_output_stores():
    """Without a GPU the kernels only ever run under the interpreter, which accepts code the compiler rejects.
    So compile the launches of the real launch helpers (several shapes/dtypes/paths) for sm_90 through Triton's
    compiler and ptxas, check that no configuration spills registers, and that Inductor's TTIR mutation analysis
    finds exactly the output pointers written (otherwise torch.compile would clone every input before each
    kernel)."""
    import os
    import subprocess
    from pathlib import Path

    pytest.importorskip("triton.backends.nvidia")
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", _COMPILE_CHECK], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    assert "ANALYSED 8" in res.stdout, res.stdout
    assert int(res.stdout.split("COMPILED ")[1].split()[0]) >= 20, res.stdout


# ------------------------------------------------------------------------------ device guard, import, tiling
class _GuardRecorder:
    """Stands in for torch.cuda.device: records which device is current while the launchers run."""

    current = []

    def __init__(self, device):
        self.device = torch.device(device)

    def __enter__(self):
        _GuardRecorder.current.append(self.device)

    def __exit__(self, *exc):
        _GuardRecorder.current.pop()


def test_every_launch_runs_under_the_tensors_device(monkeypatch):
    """No GPU needed: fake CUDA tensors on cuda:1, torch.cuda.device mocked, the launch replaced by a recorder of
    the device current at launch time. Every kernel of every launcher must launch with cuda:1 current."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gpuopt_ops.triton_kernels import bias_relu as BR

    monkeypatch.setattr(torch.cuda, "device", _GuardRecorder)
    launched = []

    def wrap(kernel):
        class Launch:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    cur = _GuardRecorder.current[-1] if _GuardRecorder.current else None
                    launched.append((kernel.__name__, cur))
                return run
        return Launch()

    dev = torch.device("cuda:1")
    with FakeTensorMode():
        for n in (64, 8192, 20000):  # fused forward/backward, looped backward, looped forward
            x = torch.empty(4, n, device=dev, dtype=torch.bfloat16)
            w = torch.empty(n, device=dev)
            v = torch.empty(4, device=dev)
            s = torch.empty(1, device=dev, dtype=torch.int64)
            LDR.launch_forward(x, w, w, s, x, v, v, 0.1, 1e-5, wrap=wrap, sm_count=132)
            LDR.launch_backward(x, x, w, w, v, v, s, x, w, w, 0.1, wrap=wrap, sm_count=132)
            BR.launch_forward(x, w, x, wrap=wrap, sm_count=132)
            BR.launch_backward(x, x, x, w, wrap=wrap, sm_count=132)
    names = {k for k, _ in launched}
    assert names == {"ldr_fwd_fused_kernel", "ldr_fwd_looped_kernel", "ldr_bwd_fused_kernel",
                     "ldr_bwd_row_coef_kernel", "ldr_bwd_chunk_kernel", "sum_partials_kernel",
                     "bias_relu_fwd_kernel", "bias_relu_bwd_kernel"}, names
    assert all(d == dev for _, d in launched), launched
    assert not _GuardRecorder.current
    # CPU and meta tensors: no guard at all
    assert not isinstance(LDR.device_guard(torch.device("cpu")), _GuardRecorder)
    assert not isinstance(LDR.device_guard(torch.device("meta")), _GuardRecorder)


@pytest.mark.triton_gpu
def test_gpu_launches_on_the_tensors_device_not_the_current_one():
    """On a real GPU: x on the last device while device 0 is current gives the same results as x on device 0
    (with one GPU this still runs the guard; with several it checks it really switches)."""
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    x, w, b = make_inputs((64,), 1000, torch.float32, "cuda:0")
    seed = seed_tensor(7, "cuda:0")
    ref = ops.triton_layer_norm_dropout_relu(x, w, b, seed, 0.2, EPS)
    torch.cuda.set_device(0)
    got = ops.triton_layer_norm_dropout_relu(x.to(last), w.to(last), b.to(last), seed.to(last), 0.2, EPS)
    for r, g in zip(ref, got):
        assert g.device == last
        torch.testing.assert_close(g.cpu(), r.cpu(), rtol=0, atol=0)


def _fresh_python(code):
    """stdout of `code` in a new interpreter (a fresh import of gpuopt_ops); fails with its stderr."""
    import subprocess

    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stdout


def test_import_gpuopt_ops_registers_the_triton_twins():
    out = _fresh_python("import torch, gpuopt_ops, sys; op = torch.ops.gpuopt.triton_layer_norm_dropout_relu; "
                        "print('OK', op.default._schema.name, 'gpuopt_ops.triton_ops' in sys.modules)")
    assert "OK gpuopt::triton_layer_norm_dropout_relu True" in out


def test_import_gpuopt_ops_without_triton_still_works():
    out = _fresh_python("import sys; sys.modules['triton'] = None; import torch, gpuopt_ops; "
                        "print('OK', hasattr(torch.ops.gpuopt, 'triton_bias_relu'), 'gpuopt_ops.triton_ops' in sys.modules)")
    assert "OK False False" in out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_n8192_takes_the_fused_backward_and_grid_from_sm_count(dtype):
    cfg = LDR.backward_config(8192, dtype)
    assert cfg.fused and cfg.block_m == 1 and cfg.block_n == 8192 and cfg.num_warps == 16
    assert not LDR.backward_config(16384, dtype).fused
    launched = []

    def wrap(kernel):
        class Launch:
            def __getitem__(self, grid):
                return lambda *a, **k: launched.append((kernel.__name__, tuple(grid)))
        return Launch()

    m = 4096
    meta = lambda *s, dt=dtype: torch.empty(s, device="meta", dtype=dt)  # noqa: E731
    acc = torch.float32
    for sms in (132, 78):
        launched.clear()
        LDR.launch_backward(meta(m, 8192), meta(m, 8192), meta(8192), meta(8192), meta(m, dt=acc),
                            meta(m, dt=acc), meta(1, dt=torch.int64), meta(m, 8192), meta(8192), meta(8192), 0.1,
                            wrap=wrap, sm_count=sms)
        assert launched[0] == ("ldr_bwd_fused_kernel", (sms * LDR.backward_programs_per_sm(cfg, dtype),))
        # stage 2: many programs over 32-column blocks
        assert launched[1:] == [("sum_partials_kernel", (8192 // 32,))] * 2

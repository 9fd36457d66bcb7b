"""Correctness: every op of tests/op_table.py on every backend of tests/backends.py against the unfused fp64
reference, then the edge inputs (p = 0 and 1, NaN/Inf, M = 0, huge and many rows, non-contiguous views, AMP),
agreement with the C++ CPU backend, the paths each backend picks, and proof that the checks reject wrong results.
"""

import pytest
import torch
import torch.nn.functional as F

import gpuopt_ops
from gpuopt_ops import reference as R

from backends import BY_NAME, DEFAULT, backend_params, require_op
from helpers import (
    FLOORS,
    GuardRecorder,
    assert_close_to_reference,
    assert_unrounded_fp32_sum,
    check_fp64_dropout_precision,
    check_grad_bias_is_unrounded_fp32,
    ldr_reference_and_grads,
    make_inputs,
    seed_tensor,
)
from op_table import DTYPES, OPS, OPS_BY_NAME, SHAPES, Sample, check_against_reference

LDR = OPS_BY_NAME["layer_norm_dropout_relu"]
BIAS_RELU = OPS_BY_NAME["bias_relu"]
CPU = BY_NAME["cpu"]
EPS = 1e-5


# ---------------------------------------------------------------------------------------------- the matrix
def _backend_op_params():
    """Every shape of SHAPES on every backend of the default list for every op, plus the extra backends an entry
    names (newer ops: the emulated CUDA source). A backend without the op's kernel skips at run time, with the
    reason (require_op). The fast lane gives the two slow backends (the emulated CUDA source, Triton's interpreter)
    the shapes up to N = 123; N = 1000 (every row over several warps) runs for them in the full suite, and for the
    CPU kernels in both."""
    for prefix, n in SHAPES:
        shape = f"{'x'.join(map(str, prefix))}x{n}"
        for op in OPS:
            for variant in op.variants:
                for dtype in variant.dtypes or DTYPES:
                    for p in backend_params(*DEFAULT, *op.extra_backends):
                        marks = list(p.marks)
                        if p.id == "cuda-emulated" and dtype in (torch.float16, torch.float64):
                            marks.append(pytest.mark.slow)  # the emulator's fast lane: fp32 and bf16
                        elif p.values[0].runs_slowly and n > 123:
                            marks.append(pytest.mark.slow)
                        ident = f"{shape}-{p.id}-{op.name}-{variant.name}-{str(dtype)[6:]}"
                        yield pytest.param(p.values[0], op, variant, dtype, prefix, n, marks=marks, id=ident)


@pytest.mark.parametrize("backend,op,variant,dtype,prefix,n", list(_backend_op_params()))
def test_matches_reference(backend, op, variant, dtype, prefix, n):
    """Outputs and every gradient against the fp64 reference (2x PyTorch's own error), dtypes and shapes."""
    require_op(backend, op.name)
    sample = op.sample(prefix, n, dtype, backend.device, **variant.options)
    check_against_reference(op, backend, sample)


# ---------------------------------------------------------------------------------------------- dropout_add_norm
DAN_BACKENDS = backend_params(*DEFAULT, "cuda-emulated")


@pytest.mark.parametrize("backend", DAN_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_dropout_add_norm_p0_no_residual_is_plain_norm(backend, dtype, rms):
    """p = 0 and no residual: out is F.layer_norm / F.rms_norm (weight and bias given; none), `sum` is x bit for
    bit (signed zeros included), and the gradients are the plain norm's."""
    require_op(backend, "dropout_add_norm")
    dev = backend.device
    x, w, b = make_inputs((37,), 104, dtype, dev)
    x[0, :3] = torch.tensor([0.0, -0.0, 1e-30])
    seed = seed_tensor(11, dev)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype != torch.bfloat16 else dict(atol=2e-2, rtol=2e-2)
    for weight, bias in ((w, b), (None, None)):
        out, s, mean, rstd = backend.op("dropout_add_norm")(x, None, weight, bias, seed, 0.0, EPS, rms, False)
        assert torch.equal(s.cpu().view(torch.int8), x.cpu().view(torch.int8)), "sum must be x bit for bit"
        ref = x.float().cpu()
        wr = None if weight is None else weight.float().cpu()
        br = None if bias is None else bias.float().cpu()
        if rms:
            expect = F.rms_norm(ref, (104,), wr, EPS) + (0 if br is None else br)
        else:
            expect = F.layer_norm(ref, (104,), wr, br, EPS)
        torch.testing.assert_close(out.cpu().float(), expect, **tol)
    if backend.name != "cuda-emulated":  # the public function on this backend: forward and gradients
        xs, ws, bs = (t.detach().clone().requires_grad_() for t in (x, w, b))
        ours = gpuopt_ops.dropout_add_norm(xs, None, ws, bs, norm="rms" if rms else "layer", backend=backend.api)
        xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
        plain = F.rms_norm(xr, (104,), wr, EPS) + br if rms else F.layer_norm(xr, (104,), wr, br, EPS)
        g = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)).to(dtype).to(dev)
        ga = torch.autograd.grad(ours, (xs, ws, bs), g)
        gb = torch.autograd.grad(plain, (xr, wr, br), g)
        torch.testing.assert_close(ours, plain, **tol)
        for a, c in zip(ga, gb):
            torch.testing.assert_close(a, c, atol=tol["atol"] * 40, rtol=tol["rtol"] * 10)


@pytest.mark.parametrize("backend", DAN_BACKENDS)
def test_dropout_add_norm_p1_drops_x_exactly(backend):
    """p = 1: sum = residual exactly (the dropped x through a select, never x * inf), grad_x exact zeros."""
    require_op(backend, "dropout_add_norm")
    dev = backend.device
    x, w, b = make_inputs((9,), 40, torch.float32, dev)
    x[0, 0] = float("inf")
    r = torch.randn(9, 40, generator=torch.Generator().manual_seed(2)).to(dev)
    out, s, mean, rstd = backend.op("dropout_add_norm")(x, r, w, b, seed_tensor(1, dev), 1.0, EPS, False, False)
    assert torch.equal(s, r) and out.isfinite().all()
    g = torch.randn_like(x)
    gx, gr, _, _ = backend.op("dropout_add_norm_backward")(
        g, None, s, w, b, mean, rstd, seed_tensor(1, dev), 1.0, False, True
    )
    assert torch.equal(gx, torch.zeros_like(gx)) and gr.isfinite().all() and (gr != 0).any()


@pytest.mark.parametrize("backend", backend_params())
def test_dropout_add_norm_autograd_prenorm_and_shared_grads(backend):
    """Through the public function: prenorm returns (out, sum); a gradient reaching `sum` from its other users
    joins dS; without dropout both inputs get the same values (S = x's dtype), with residual_in_fp32 the
    residual's gradient is fp32; a sum that is the only output used still gives x its gradient."""
    require_op(backend, "dropout_add_norm")
    dev = backend.device
    for dtype, rif, p in ((torch.float32, False, 0.0), (torch.float32, False, 0.3), (torch.bfloat16, True, 0.0)):
        x, w, b = make_inputs((16,), 48, dtype, dev, requires_grad=True)
        s_dtype = torch.float32 if rif else dtype
        r = torch.randn(16, 48, device=dev).to(s_dtype).requires_grad_()
        torch.manual_seed(7)
        out, s = gpuopt_ops.dropout_add_norm(x, r, w, b, p=p, prenorm=True, residual_in_fp32=rif, backend=backend.api)
        assert out.dtype == dtype and s.dtype == s_dtype
        go, gs = torch.randn_like(out), torch.randn_like(s)
        gx, gr, gw, gb = torch.autograd.grad((out, s), (x, r, w, b), (go, gs))
        torch.manual_seed(7)
        seed = gpuopt_ops.draw_seed(x.device) if p > 0 else seed_tensor(0, dev)
        ref = check_against_reference(
            OPS_BY_NAME["dropout_add_norm"],
            CPU,
            Sample(
                dict(
                    x=x.detach().cpu(),
                    residual=r.detach().cpu(),
                    weight=w.detach().cpu(),
                    bias=b.detach().cpu(),
                    seed=seed.cpu(),
                    p=p,
                    eps=EPS,
                    rms=False,
                    residual_in_fp32=rif,
                ),
                go.cpu(),
                gs.cpu(),
            ),
        )
        for name, got in (("grad_x", gx), ("grad_residual", gr), ("grad_weight", gw), ("grad_bias", gb)):
            assert got.dtype == ref[name].dtype, name
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(got.cpu(), ref[name], rtol=tol, atol=tol)
        assert gr.dtype == s_dtype
        if p == 0 and not rif:
            assert torch.equal(gx, gr)
    x = torch.randn(4, 8, device=dev, requires_grad=True)
    _, s = gpuopt_ops.dropout_add_norm(x, None, p=0.0, prenorm=True, backend=backend.api)
    (gx,) = torch.autograd.grad(s.sum(), x)
    assert torch.equal(gx, torch.ones_like(x))


# ---------------------------------------------------------------------------------------------- LayerNorm edges
@pytest.mark.parametrize("backend", backend_params())
def test_p0_and_eval_equal_plain_layer_norm_relu(backend):
    x, w, b = make_inputs((32,), 77, torch.float32, backend.device)
    ref = torch.relu(F.layer_norm(x, (77,), w, b, EPS))
    out = gpuopt_ops.layer_norm_dropout_relu(x, 77, w, b, p=0.0, backend=backend.api)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out_eval = gpuopt_ops.layer_norm_dropout_relu(x, 77, w, b, p=0.5, training=False, backend=backend.api)
    torch.testing.assert_close(out_eval, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", backend_params())
def test_p1_gives_zeros_and_zero_grads(backend):
    """p = 1 drops everything through a select: exact zeros, never NaN (no infinite scale)."""
    x, w, b = make_inputs((16,), 40, torch.float32, backend.device, requires_grad=True)
    out = gpuopt_ops.layer_norm_dropout_relu(x, 40, w, b, p=1.0, backend=backend.api)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    for t in (x, w, b):
        assert torch.equal(t.grad, torch.zeros_like(t.grad)) and not torch.isnan(t.grad).any()


@pytest.mark.parametrize("backend", backend_params())
def test_public_function_multi_dim_normalized_shape(backend):
    x = torch.randn(3, 4, 5, 6, device=backend.device)
    w, b = torch.randn(5, 6, device=backend.device), torch.randn(5, 6, device=backend.device)
    out = gpuopt_ops.layer_norm_dropout_relu(x, (5, 6), w, b, p=0.0, backend=backend.api)
    torch.testing.assert_close(out, torch.relu(F.layer_norm(x, (5, 6), w, b)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", backend_params())
def test_fp64_with_dropout_is_fp64_accurate(backend):
    """fp64 x: every constant is fp64, the dropout scale included (an fp32 scale would be off by ~1e-7)."""
    check_fp64_dropout_precision(
        backend.op("layer_norm_dropout_relu"), backend.op("layer_norm_dropout_relu_backward"), backend.device
    )


@pytest.mark.parametrize("backend", backend_params())
def test_empty_rows(backend):
    """M = 0: empty outputs and grad_x, zero parameter gradients (a sum over no rows), through autograd."""
    dev = backend.device
    x = torch.randn(0, 8, device=dev, requires_grad=True)
    w = torch.randn(8, device=dev, requires_grad=True)
    out = gpuopt_ops.layer_norm_dropout_relu(x, 8, w, None, p=0.2, backend=backend.api)
    assert out.shape == (0, 8)
    out.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
    _, mean, rstd = backend.op("layer_norm_dropout_relu")(x.detach(), None, None, seed_tensor(0, dev), 0.1, EPS)
    assert mean.shape == (0,) and rstd.shape == (0,)
    o = backend.op("bias_relu")(torch.randn(0, 3, device=dev), torch.randn(3, device=dev))
    gx, gb = backend.op("bias_relu_backward")(torch.randn(0, 3, device=dev), o)
    assert o.shape == gx.shape == (0, 3) and torch.equal(gb, torch.zeros(3, device=dev))


@pytest.mark.parametrize("backend", backend_params())
def test_non_contiguous_inputs_give_the_contiguous_results(backend):
    """A transposed x, a strided weight and a non-contiguous grad_out: the same bits as contiguous copies."""
    dev = backend.device
    ldr, ldr_bwd = backend.op("layer_norm_dropout_relu"), backend.op("layer_norm_dropout_relu_backward")
    x = torch.randn(40, 24, device=dev).t()  # (24, 40), transposed
    w, b = torch.randn(80, device=dev)[::2], torch.randn(40, device=dev)
    seed = seed_tensor(5, dev)
    ours = ldr(x, w, b, seed, 0.3, EPS)
    ref = ldr(x.contiguous(), w.contiguous(), b, seed, 0.3, EPS)
    for a, c in zip(ours, ref):
        assert torch.equal(a, c)
    g = torch.randn(24, 40, device=dev).t().contiguous().t()
    bw = ldr_bwd(g, x, w, b, ours[1], ours[2], seed, 0.3)
    bw_ref = ldr_bwd(g.contiguous(), x.contiguous(), w.contiguous(), b, ref[1], ref[2], seed, 0.3)
    for a, c in zip(bw, bw_ref):
        assert torch.equal(a, c)
    xs = torch.randn(10, 64, device=dev)[:, ::2]
    torch.testing.assert_close(backend.op("bias_relu")(xs, b[:32]), torch.relu(xs + b[:32]))


@pytest.mark.parametrize("backend", backend_params())
def test_nan_and_inf_rows_follow_the_reference(backend):
    """A NaN or Inf poisons its own row only; a NaN that survives dropout stays NaN, a dropped one is 0 (ReLU is
    y <= 0 ? 0 : y, as torch.relu); huge finite rows do not overflow the two-pass statistics."""
    dev = backend.device
    ldr = backend.op("layer_norm_dropout_relu")
    x, w, b = make_inputs((6,), 40, torch.float32)
    x[1, 3] = float("nan")
    x[2, 0] = float("inf")
    x[3, 5] = -float("inf")
    x[4] = 1e30
    seed = seed_tensor(1)
    out, _, _ = ldr(*(t.to(dev) for t in (x, w, b, seed)), 0.25, EPS)
    ref, _, _ = R.layer_norm_dropout_relu(x, w, b, seed, 0.25, EPS, compute_dtype=torch.float32)
    torch.testing.assert_close(out.cpu(), ref, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert out[[0, 5]].isfinite().all(), "a NaN stays in its row"
    n = 64
    xn = torch.randn(3, n)
    xn[1, 5] = float("nan")
    keep = R.dropout_keep_mask(9, 3, n, 0.5)
    for p, kept in ((0.5, keep[1]), (0.0, torch.ones(n, dtype=torch.bool))):
        o = ldr(xn.to(dev), torch.ones(n, device=dev), torch.zeros(n, device=dev), seed_tensor(9, dev), p, EPS)[0]
        o = o.cpu()
        assert torch.equal(torch.isnan(o[1]), kept) and (o[1][~kept] == 0).all()
    xb = torch.tensor([[float("nan"), 1.0, float("inf"), -float("inf")]])
    got = backend.op("bias_relu")(xb.to(dev), torch.zeros(4, device=dev)).cpu()
    torch.testing.assert_close(got, torch.relu(xb), equal_nan=True)


@pytest.mark.parametrize("backend", backend_params("cpu", "cuda", "triton"))  # interpreter: minutes per row
@pytest.mark.parametrize("m,n", [(3, 65536), (2, 70001), (70000, 8)])
def test_huge_rows_and_many_rows(backend, m, n):
    """Rows past every single-block limit (any N, odd too), and more rows than one grid holds."""
    dev = backend.device
    x, w, b = make_inputs((m,), n, torch.float32, device=dev)
    seed = seed_tensor(2**40 + 3, dev)
    g = torch.randn_like(x)
    out, mean, rstd = backend.op("layer_norm_dropout_relu")(x, w, b, seed, 0.1, EPS)
    gx, gw, gb = backend.op("layer_norm_dropout_relu_backward")(g, x, w, b, mean, rstd, seed, 0.1)
    xs, ws, bs, gs = (t.cpu().double() for t in (x, w, b, g))
    ref64, (rgx, rgw, rgb) = ldr_reference_and_grads(xs, ws, bs, seed.cpu(), 0.1, EPS, gs, torch.float64)
    assert (out.cpu().double() - ref64).abs().max() < 1e-4
    assert (gx.cpu().double() - rgx).abs().max() < 1e-3
    assert (gw.cpu().double() - rgw).abs().max() < 1e-5 * m + 1e-3
    assert (gb.cpu().double() - rgb).abs().max() < 1e-5 * m + 1e-3
    keep = R.dropout_keep_mask(2**40 + 3, m, n, 0.1)
    assert torch.equal((out.cpu() != 0) | (ref64 == 0), keep | (ref64 == 0))
    o = backend.op("bias_relu")(x, b)
    gx2, gb2 = backend.op("bias_relu_backward")(g, o)
    assert torch.equal(o.cpu(), torch.relu(x.cpu() + b.cpu()))
    assert (gb2.cpu().double() - (gs * (o.cpu() > 0)).sum(0)).abs().max() < 1e-5 * m + 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("backend", backend_params("cuda", "triton"))
def test_more_than_2_pow_31_elements_forward(backend):
    """numel > 2^31: int64 indexing in every kernel."""
    m, n = 2**31 // 1024 + 3, 1024
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    out, _, _ = backend.op("layer_norm_dropout_relu")(x, w, torch.zeros_like(w), seed_tensor(4, "cuda"), 0.0, EPS)
    ref = torch.relu(F.layer_norm(x[-5:].float(), (n,)))
    torch.testing.assert_close(out[-5:].float(), ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(backend.op("bias_relu")(x, w)[-5:], torch.relu(x[-5:] + w))


# ---------------------------------------------------------------------------------------------- dtypes and AMP
@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_rounding_is_bitwise_torchs(backend, dtype):
    """fp32 -> bf16/fp16 rounds to nearest even like torch (bias_relu adds in fp32, as eager PyTorch does),
    with NaN, +-Inf and signed zeros, for a bias of x's dtype and an fp32 bias."""
    dev = backend.device
    m = 41 if backend.interpreted else 301  # 301 rows cross the CPU kernels' scheduling tiles
    x = torch.randn(m, 1037).to(dtype)
    x[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
    b, bf = torch.randn(1037).to(dtype), torch.randn(1037)
    op = backend.op("bias_relu")
    for ours, ref in [
        (op(x.to(dev), b.to(dev)).cpu(), torch.relu(x + b)),
        (op(x.to(dev), bf.to(dev)).cpu(), torch.relu(x.float() + bf).to(dtype)),
    ]:
        assert torch.equal(torch.isnan(ours), torch.isnan(ref))
        assert torch.equal(ours.view(torch.int16)[1:], ref.view(torch.int16)[1:])
        assert torch.equal(ours[0, 1:], ref[0, 1:])


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bias_relu_grad_bias_is_unrounded_fp32(backend, dtype):
    """bf16/fp16 out: grad_bias comes back in fp32, the unrounded sum of grad_x's exact values."""
    check_grad_bias_is_unrounded_fp32(backend.op("bias_relu"), backend.op("bias_relu_backward"), backend.device, dtype)


@pytest.mark.parametrize("backend", backend_params())
def test_autocast_fp32_bias_gets_the_unrounded_fp32_grad(backend):
    """bf16 activations with an fp32 bias (autocast): the bias's .grad is fp32 and the unrounded sum of the
    gradient reaching the op, not that sum rounded to bf16 on the way. (LinearBiasReLU under autocast is nn.Linear
    then ReLU, whose bias gradient is eager's: test_modules' 16-bit linear test.)"""
    dev = backend.device
    torch.manual_seed(0)
    m, n = 256, 48
    bias = (0.1 * torch.randn(n, device=dev)).requires_grad_()
    out = gpuopt_ops.bias_relu(torch.randn(m, n, device=dev).to(torch.bfloat16), bias, backend=backend.api)
    assert out.dtype == torch.bfloat16 and bias.dtype == torch.float32
    g = torch.randn(m, n, device=dev)
    (out.float() * g).sum().backward()
    assert_unrounded_fp32_sum("bias.grad", bias.grad, g.to(torch.bfloat16) * (out.detach() > 0), torch.bfloat16)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16])
def test_autocast_has_no_rule_the_op_keeps_its_input_dtype(backend, amp_dtype):
    """No autocast rule (a decision, DESIGN 1.2): the op runs in the dtype it is given (under autocast, the matmul's
    low-precision output) and takes the fp32 parameters as they are; parameter gradients stay fp32."""
    dev = backend.device
    ldr = backend.op("layer_norm_dropout_relu")
    torch.manual_seed(0)
    x, w, b = make_inputs((16,), 96, torch.float32, dev, param_dtype=torch.float32, requires_grad=True)
    lin = torch.nn.Linear(96, 96).to(dev)
    seed = seed_tensor(5, dev)
    with torch.autocast(dev, dtype=amp_dtype):
        assert ldr(x, w, b, seed, 0.1, EPS)[0].dtype == torch.float32
        y = lin(x)
        assert y.dtype == amp_dtype
        out, _, _ = ldr(y, w, b, seed, 0.1, EPS)
    assert out.dtype == amp_dtype
    g = torch.randn_like(out)
    gy, gw, gb = torch.autograd.grad(out, (y, w, b), g)
    assert gw.dtype == torch.float32 and gb.dtype == torch.float32
    args = [t.detach().cpu() for t in (y, w, b)]
    ref64, (rgy, rgw, _) = ldr_reference_and_grads(*args, seed.cpu(), 0.1, EPS, g.cpu(), torch.float64)
    low, (lgy, lgw, _) = ldr_reference_and_grads(
        args[0], args[1].to(amp_dtype), args[2].to(amp_dtype), seed.cpu(), 0.1, EPS, g.cpu(), amp_dtype
    )
    fl = FLOORS[amp_dtype]
    assert_close_to_reference("out", out.detach().cpu(), ref64, low, fl)
    assert_close_to_reference("grad_x", gy.cpu(), rgy, lgy, fl)
    assert_close_to_reference("grad_weight", gw.cpu(), rgw, lgw, fl * 16)


# ---------------------------------------------------------------------------------------------- across backends
def _agreement_params():
    """(backend, N) pairs for the comparison with the C++ CPU backend. On a GPU every path of both GPU backends:
    warp rows (37, 256, 768, 1024), block rows (4104: N % 8 == 0, not a power of two; 8192; 12288; 16384), looped
    (32768, 65536, 131072, and 1 / odd N). Under the interpreter the single-block and looped Triton paths are
    covered by the Triton tests below, so four small rows suffice (96: three chunks of 32 columns)."""
    gpu_ns = [1, 37, 256, 768, 1024, 4104, 8192, 12288, 16384, 32768, 65536, 131072]
    for p in backend_params("cuda", "triton"):
        for n in gpu_ns:
            yield pytest.param(p.values[0], n, marks=p.marks, id=f"{p.id}-{n}")
    for p in backend_params("triton-interpret"):
        for n in (37, 64, 96, 300):
            yield pytest.param(p.values[0], n, marks=p.marks, id=f"{p.id}-{n}")


@pytest.mark.parametrize("backend,n", list(_agreement_params()))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
def test_agrees_with_the_cpu_backend(backend, n, dtype, affine):
    """Same inputs and seed as the C++ CPU op: the dropout masks bit for bit, bias-ReLU's out and grad_x bit for
    bit, everything that depends on summation order close."""
    x, w, b = make_inputs((6,), n, dtype, affine=affine)
    g = torch.randn(x.shape).to(dtype)
    seed = seed_tensor(4)
    ones = torch.ones(n, dtype=dtype)
    sides = []  # the CPU backend's results, then the backend's, all on the CPU
    for be, dev in ((CPU, "cpu"), (backend, backend.device)):
        args = [t.to(dev) if t is not None else None for t in (x, w, b)]
        ldr = be.op("layer_norm_dropout_relu")
        out, mean, rstd = ldr(*args, seed.to(dev), 0.1, EPS)
        grads = be.op("layer_norm_dropout_relu_backward")(g.to(dev), *args, mean, rstd, seed.to(dev), 0.1)
        # with weight 0 and bias 1 the output is the dropout scale where kept: the mask, compared as integers
        probe = ldr(x.to(dev), (0 * ones).to(dev), ones.to(dev), seed.to(dev), 0.3, EPS)[0]
        side = {
            "ldr": [t.cpu().double() for t in (out, mean, rstd, *grads)],
            "mask": (probe.cpu() != 0).to(torch.int32),
        }
        if affine:
            o = be.op("bias_relu")(x.to(dev), b.to(dev))
            side["bias_relu"] = [t.cpu() for t in (o, *be.op("bias_relu_backward")(g.to(dev), o))]
        sides.append(side)
    ref, got = sides
    tol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    for name, a, c in zip(["out", "mean", "rstd", "grad_x", "grad_weight", "grad_bias"], ref["ldr"], got["ldr"]):
        assert a.shape == c.shape, name
        if a.numel():
            assert (a - c).abs().max().item() <= tol * max(1.0, a.abs().max().item()), name
    assert torch.equal(ref["mask"], got["mask"])
    if affine:
        (o0, gx0, gb0), (o1, gx1, gb1) = ref["bias_relu"], got["bias_relu"]
        assert torch.equal(o0, o1) and torch.equal(gx0, gx1)
        assert gb0.dtype == gb1.dtype
        torch.testing.assert_close(gb0, gb1, atol=FLOORS[dtype] * 6, rtol=FLOORS[dtype])


@pytest.mark.cuda
@pytest.mark.parametrize("n", [768, 8192, 65544])  # warp rows, block rows, looped
def test_cuda_unaligned_views_take_the_scalar_path_and_agree(n):
    """x one element past a 16-byte boundary and weight / bias as unaligned views: the element-wise path, same
    masks as the CPU op."""

    def shifted(t):
        flat = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
        v = flat[1 : 1 + t.numel()].view(t.shape)
        v.copy_(t)
        return v

    x, w, b = make_inputs((5,), n, torch.float16)
    seed = seed_tensor(8)
    masks = []
    for dev in ("cpu", "cuda"):
        xs, ws, bs = (shifted(t.to(dev)) for t in (x, w, b))
        out, _, _ = CPU.op("layer_norm_dropout_relu")(xs, ws, bs, seed.to(dev), 0.3, EPS)
        masks.append((out.cpu() != 0).to(torch.int32))
    assert torch.equal(masks[0], masks[1])


# ---------------------------------------------------------------------------------------------- CPU kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n", [(1000, 512), (5000, 3), (70, 4099)])  # many short rows, N % 8 != 0, long rows
def test_cpu_results_do_not_depend_on_the_thread_count(dtype, m, n):
    """The CPU backend splits rows into blocks by M alone: 1, 2 or 3 threads give the same bits, column sums too
    (dropout_add_norm: residual go, grad_sum x, both norms)."""
    ops = CPU.op
    g = torch.Generator().manual_seed(m + n)
    x, w, b, go = (torch.randn(*s, generator=g).to(dtype) for s in ((m, n), (n,), (n,), (m, n)))
    seed = seed_tensor(5)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out, mean, rstd = ops("layer_norm_dropout_relu")(x, w, b, seed, 0.2, EPS)
            grads = ops("layer_norm_dropout_relu_backward")(go, x, w, b, mean, rstd, seed, 0.2)
            bo = ops("bias_relu")(x, b)
            rms = n % 2 == 1  # RMSNorm for the odd rows, LayerNorm for N = 512
            dan = ops("dropout_add_norm")(x, go, w, b, seed, 0.2, EPS, rms, False)
            dan_grads = ops("dropout_add_norm_backward")(go, x, dan[1], w, b, *dan[2:], seed, 0.2, rms, True)
            results.append([out, mean, rstd, *grads, bo, *ops("bias_relu_backward")(go, bo), *dan, *dan_grads])
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, c in zip(results[0], other):
            assert torch.equal(a, c)


# ---------------------------------------------------------------------------------------------- Triton paths
TRITON = backend_params("triton", "triton-interpret")


@pytest.mark.parametrize("backend", TRITON)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("n", [37, 64])  # generic RNG path and the 8-lane fast path, 3 and 4 chunks
def test_triton_looped_path_matches_reference_and_single_block(triton_looped, backend, dtype, n):
    looped = triton_looped
    sample = LDR.sample((5,), n, dtype, backend.device, p=0.25, seed=4321)
    assert not looped.forward_config(n, dtype).fused and not looped.backward_config(n, dtype).fused
    looped_res = check_against_reference(LDR, backend, sample)
    looped.ROW_LIMITS = looped.RowLimits()  # the default limits: the single-block kernels (the fixture restores)
    fused_res = LDR.run(backend, sample)
    assert torch.equal(looped_res["out"] != 0, fused_res["out"] != 0)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    for name, a in looped_res.items():
        a, c = a.double(), fused_res[name].double()
        assert (a - c).abs().max().item() <= tol * max(1.0, c.abs().max().item()), name


@pytest.mark.parametrize("backend", TRITON)
def test_triton_looped_path_fp64_dropout_precision(triton_looped, backend):
    """The looped kernels compute their own dropout scale in fp64 too (N = 40 > 16)."""
    check_fp64_dropout_precision(
        backend.op("layer_norm_dropout_relu"), backend.op("layer_norm_dropout_relu_backward"), backend.device
    )


def check_ldr_and_its_mask(backend, m, n, dtype, p, seed):
    """layer_norm_dropout_relu on (m, n) against the reference, and its mask bit for bit: a probe with weight 0 and
    bias 1 is nonzero exactly where an element is kept."""
    sample = LDR.sample((m,), n, dtype, backend.device, p=p, seed=seed)
    check_against_reference(LDR, backend, sample)
    w = sample.args["weight"]
    probe = backend.op("layer_norm_dropout_relu")(
        sample.args["x"], torch.zeros_like(w), torch.ones_like(w), sample.args["seed"], p, EPS
    )[0]
    assert torch.equal(probe.cpu() != 0, R.dropout_keep_mask(seed, m, n, p))


@pytest.mark.parametrize("backend", TRITON)
def test_triton_real_long_row(backend):
    """Past the single-block limits with the real chunking (no fixture): forward 4096-column chunks, backward the
    row-coefficient and chunk kernels, and the mask. N = 65536 on a GPU; N = 8200 (just past 8192: two forward
    chunks, nine backward chunks) keeps the interpreter to seconds."""
    from gpuopt_ops.triton_kernels import plans

    n = 8200 if backend.interpreted else 65536
    assert not plans.forward_config(n, torch.float32).fused
    assert not plans.backward_config(n, torch.float32).fused
    check_ldr_and_its_mask(backend, 2, n, torch.float32, 0.1, 2**40 + 1)


@pytest.mark.parametrize("backend", TRITON)
@pytest.mark.parametrize("m,n", [(300, 96), (70, 768)])  # 3 chunks of 32 / 256 columns; more tiles than programs
@pytest.mark.parametrize(
    "dtype",
    # the tiling is the dtype's own only through the plan's checks above; the fast lane runs fp32
    [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],
    ids=lambda d: str(d)[6:],
)
def test_triton_three_chunk_rows_on_persistent_grids(backend, m, n, dtype):
    """N = 3 x 2^k takes the single-block kernels with three chunks of N / 3 columns (no padded lanes), and the
    persistent grids give each program several row tiles (8 programs under the interpreter): the reference, and
    the mask bit for bit."""
    from gpuopt_ops.triton_kernels import plans

    for cfg in (plans.forward_config(n, dtype), plans.backward_config(n, dtype)):
        assert cfg.fused and cfg.chunks == 3 and cfg.block_n == n // 3
        assert -(-m // cfg.block_m) > 8
    check_ldr_and_its_mask(backend, m, n, dtype, 0.2, 2**35 + 3)


@pytest.mark.parametrize("backend", TRITON)
def test_triton_n16384_one_pass_forward_matches_reference(backend):
    """N = 16384 runs the single-block forward over four 4096-column chunks (the interpreter has no compiled
    kernel to report spills, so it always does): the reference, and the mask bit for bit."""
    from gpuopt_ops.triton_kernels import plans

    n = 16384
    assert plans.forward_config(n, torch.bfloat16).fused
    check_ldr_and_its_mask(backend, 2, n, torch.bfloat16, 0.1, 2**33 + 5)


@pytest.mark.parametrize("op", ["layer_norm_dropout_relu", "dropout_add_norm"])
def test_triton_n16384_forward_is_one_pass_unless_the_compiled_kernel_spills(op):
    """Launch planning (no GPU needed: meta tensors, launches recorded, the compiled kernel's facts stood in for):
    N = 16384 takes the single-block forward over four 4096-column chunks at 16 warps, one program an SM, holding
    the weight and bias across its rows; where that compiled kernel spills registers, the same kernel without
    holding them; where that spills too, the looped kernel (a program a row, 4096-column steps). 12288 (three
    chunks) never falls back."""
    pytest.importorskip("triton")
    from gpuopt_ops.triton_kernels import common, plans
    from gpuopt_ops.triton_kernels import dropout_add_norm as dan_kernels
    from gpuopt_ops.triton_kernels import norm_dropout as ldr_kernels

    bf16 = torch.bfloat16
    capped = plans.ROW_LIMITS.capped(8192)
    cfg = plans.forward_config(16384, bf16)
    assert cfg.fused and (cfg.chunks, cfg.block_n, cfg.block_m, cfg.num_warps) == (4, 4096, 1, 16)
    assert plans.wide_fallback(cfg, 16384, bf16) == plans.forward_config(16384, bf16, capped)
    assert plans.wide_fallback(plans.forward_config(12288, bf16), 12288, bf16) is None
    launched = []

    def wrap(kernel):
        class Launch:
            def __getitem__(self, grid):
                return lambda *a, **k: launched.append(
                    (kernel.__name__, tuple(grid), k["num_warps"], k.get("HOIST_PARAMS"))
                )

        return Launch()

    meta = lambda *s, dt=torch.bfloat16: torch.empty(s, device="meta", dtype=dt)  # noqa: E731
    m, n, f32 = 64, 16384, torch.float32
    prefix = "nd" if op == "layer_norm_dropout_relu" else "dan"
    fused, looped = f"{prefix}_fwd_fused_kernel", f"{prefix}_fwd_looped_kernel"
    cases = (  # (spills of the kernel holding the parameters, without them), what launches
        ((0, 0), (fused, (64,), 16, True)),
        ((24, 0), (fused, (64,), 16, False)),
        ((24, 8), (looped, (m,), 8, None)),
    )
    for spills, want in cases:
        launched.clear()

        def facts(kernel, args, kwargs, spills=spills):  # 128 registers at 16 warps: one program an SM
            assert kernel.__name__ == fused
            return common.KernelFacts(128, 0, kwargs["num_warps"], spills[0 if kwargs["HOIST_PARAMS"] else 1])

        x, w, seed, out = meta(m, n), meta(n), meta(1, dt=torch.int64), meta(m, n)
        if op == "layer_norm_dropout_relu":
            module, args = ldr_kernels, (x, w, w, seed, out, meta(m, dt=f32), meta(m, dt=f32), 0.1, 1e-5)
        else:
            args = (x, meta(m, n), w, w, seed, out, meta(m, n), meta(m, dt=f32), meta(m, dt=f32), 0.1, 1e-5, False)
            module = dan_kernels
        module.launch_forward(*args, wrap=wrap, plan=module.plan_forward(*args, sm_count=64, facts=facts))
        assert launched == [want], launched


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_triton_n8192_takes_the_fused_backward_with_a_grid_from_the_sm_count(dtype):
    """Launch planning (no GPU needed: meta tensors, launches recorded): N = 8192 takes the single-block
    backward on SMs x resident programs per SM (of the compiled kernel, or what `facts` reports), 16384 the
    wide one, and 16384 with a smaller limit the looped one; stage 2 is one launch with one program per 32
    columns of dgamma and of dbeta."""
    pytest.importorskip("triton")
    from gpuopt_ops.triton_kernels import common, plans
    from gpuopt_ops.triton_kernels import norm_dropout as ldr_kernels

    cfg = plans.backward_config(8192, dtype)
    assert cfg.fused and cfg.block_m == 1 and cfg.block_n == 8192 and cfg.num_warps == 16
    assert plans.backward_config(16384, dtype).chunks == (4 if dtype.itemsize == 2 else 8)
    assert not plans.backward_config(16384, dtype, plans.ROW_LIMITS.capped(8192)).fused
    launched = []

    def wrap(kernel):
        class Launch:
            def __getitem__(self, grid):
                return lambda *a, **k: launched.append((kernel.__name__, tuple(grid)))

        return Launch()

    m = 4096
    meta = lambda *s, dt=dtype: torch.empty(s, device="meta", dtype=dt)  # noqa: E731
    asked = []

    def facts(kernel, args, kwargs):  # stands in for the compiled kernel: 64 registers, 2 per SM at 16 warps
        asked.append((kernel.__name__, kwargs["num_warps"]))
        return common.KernelFacts(64, 1024, kwargs["num_warps"])

    for sms, hook, per_sm in ((132, None, 1), (78, None, 1), (132, facts, 2)):
        launched.clear()
        stats = meta(m, dt=torch.float32)
        args = (meta(m, 8192), meta(m, 8192), meta(8192), meta(8192), stats, stats, meta(1, dt=torch.int64))
        args += (meta(m, 8192), meta(8192), meta(8192), 0.1)
        ldr_kernels.launch_backward(*args, wrap=wrap, plan=ldr_kernels.plan_backward(*args, sm_count=sms, facts=hook))
        # without a compiled kernel to ask (meta tensors, no hook): the planning rule, PLANNING_REGS registers
        assert per_sm == common.resident_programs_per_sm(common.KernelFacts(64 if hook else 128, 1024, 16))
        block_n = common.sum_partials_config(sms * per_sm, 8192, 2)[1]  # stage 2: <= 264 programs
        assert launched == [("nd_bwd_fused_kernel", (sms * per_sm,)), ("sum_partials_kernel", (8192 // block_n, 2))]
    assert asked == [("nd_bwd_fused_kernel", 16)]


@pytest.mark.parametrize("backend", TRITON)
@pytest.mark.parametrize(
    "n,dtype,op,extra",
    # the fast lane runs the first case of each op; the full suite the variants after them
    [
        (12288, torch.bfloat16, "norm_dropout", dict(rms=True)),
        (12288, torch.bfloat16, "layer_norm_dropout_relu", {}),
        (12288, torch.bfloat16, "dropout_add_norm", dict(rms=False)),
        pytest.param(16384, torch.float16, "layer_norm_dropout_relu", dict(affine=False), marks=pytest.mark.slow),
        pytest.param(
            16384,
            torch.float32,
            "norm_dropout",
            dict(rms=False, relu=True, p=0.0, affine=False),
            marks=pytest.mark.slow,
        ),
        pytest.param(
            16384,
            torch.bfloat16,
            "dropout_add_norm",
            dict(rms=True, prenorm=True, residual_in_fp32=True, params="bias", param_dtype=torch.float32),
            marks=pytest.mark.slow,
        ),
        pytest.param(12288, torch.float32, "layer_norm_dropout_relu", dict(hold="half"), marks=pytest.mark.slow),
        pytest.param(
            12288,
            torch.bfloat16,
            "dropout_add_norm",
            dict(rms=False, residual_in_fp32=True, hold="half"),
            marks=pytest.mark.slow,
        ),
    ],
)
def test_triton_wide_backward_matches_reference(backend, n, dtype, op, extra, monkeypatch):
    """N = 12288 and 16384 plan the wide single-block backward (nd_bwd_wide_kernel / dan_bwd_wide_kernel: 4096-column
    chunks at 16 warps; the interpreter has no compiled kernel to report spills, so it always runs it, where a GPU
    runs the looped kernels for the kinds that spill): the fp64 reference, every output and gradient; ReLU or
    not, no parameters, bias only in fp32, p = 0, prenorm and an fp32 sum. hold="half": the kernel holding half
    its row's chunks of x (the sum) and reading the others again in pass 2, the last rung of wide_holds, which a
    GPU runs where the whole row spills."""
    from gpuopt_ops.triton_kernels import common, plans

    extra = dict(extra)
    held_half = []
    hold_half = extra.pop("hold", None) == "half"
    if hold_half:
        plain = plans.wide_kwargs

        def half(cfg, dt):
            held_half.append(plans.wide_holds(cfg, cfg.chunks * cfg.block_n)[-1])
            return {**plain(cfg, dt), "HOLD": held_half[-1]}

        monkeypatch.setattr(plans, "wide_kwargs", half)
        monkeypatch.setattr(common, "_PLANS", {})  # plans made with it are not kept past this test
    spec = OPS_BY_NAME[op]
    sample = spec.sample((2,), n, dtype, backend.device, **{"p": 0.2, **extra})
    held = torch.float32 if extra.get("residual_in_fp32") else dtype  # the sum dropout_add_norm's kernel holds
    sums = sum(sample.args[k] is not None for k in ("weight", "bias"))
    cfg = plans.backward_config(n, dtype, held=held, sums=sums)
    # 4096-column chunks at 16 warps where every held operand is 16-bit, else 2048 at 8 (255 registers)
    want = (n // 4096, 4096, 1, 16) if held.itemsize == 2 else (n // 2048, 2048, 1, 8)
    assert cfg.fused and (cfg.chunks, cfg.block_n, cfg.block_m, cfg.num_warps) == want
    check_against_reference(spec, backend, sample)
    if hold_half:  # the backward ran holding half its chunks
        assert held_half and set(held_half) == {cfg.chunks // 2}


@pytest.mark.parametrize("op", ["layer_norm_dropout_relu", "dropout_add_norm"])
@pytest.mark.parametrize("n", [12288, 16384])
def test_triton_wide_backward_is_one_pass_unless_the_compiled_kernel_spills(op, n):
    """Launch planning (meta tensors, launches recorded, the compiled kernel's facts stood in for): N = 12288 and
    16384 run the wide single-block backward where that compiled kernel fits its registers; where holding the
    whole row spills, the same kernel holding one chunk fewer at a time, down to half the row (wide_holds); else
    the looped kernels (row coefficients, then chunks); 8192 and fp64 never take it. At 16384 with a weight and a
    bias the held row and the two accumulators pass WIDE_BWD_REGS: the looped kernels are planned without
    compiling the wide one (the weight alone, one accumulator, takes it)."""
    pytest.importorskip("triton")
    from gpuopt_ops.triton_kernels import common, plans
    from gpuopt_ops.triton_kernels import dropout_add_norm as dan_kernels
    from gpuopt_ops.triton_kernels import norm_dropout as ldr_kernels

    bf16, f32 = torch.bfloat16, torch.float32
    capped = plans.ROW_LIMITS.capped(8192)
    m = 64
    cfg = plans.backward_config(n, bf16)
    assert plans.wide_backward_fallback(cfg, n, bf16) == plans.backward_config(n, bf16, capped)
    assert plans.wide_backward_fallback(plans.backward_config(8192, bf16), 8192, bf16) is None
    assert not plans.backward_config(n, torch.float64).fused
    # the register rule: 16-bit at 16 warps, fp32 (x, or a held fp32 sum) at 8
    assert plans.backward_config(n, bf16, sums=1).fused
    assert plans.backward_config(n, bf16, sums=2).fused == (n == 12288)
    assert plans.backward_config(n, f32, sums=2).fused == (n == 12288)
    assert plans.backward_config(n, bf16, held=f32, sums=2).fused == (n == 12288)
    if n == 16384:  # planned looped at once: exactly the looped kernels' own config
        for dt, held in ((bf16, None), (f32, None), (bf16, f32)):
            assert plans.backward_config(n, dt, held=held, sums=2) == plans.backward_config(n, dt, capped)
    launched = []

    def wrap(kernel):
        class Launch:
            def __getitem__(self, grid):
                return lambda *a, **k: launched.append((kernel.__name__, k.get("BLOCK_N"), k.get("VEC"), k.get("HOLD")))

        return Launch()

    meta = lambda *s, dt=bf16: torch.empty(s, device="meta", dtype=dt)  # noqa: E731
    prefix = "nd" if op == "layer_norm_dropout_relu" else "dan"
    looped = [f"{prefix}_bwd_row_coef_kernel", f"{prefix}_bwd_chunk_kernel", "sum_partials_kernel"]
    chunks = n // 4096
    rungs = plans.wide_holds(cfg, n)  # one chunk fewer at a time, down to half the row
    assert rungs == tuple(range(chunks - 1, (chunks + 1) // 2 - 1, -1)) and rungs[-1] * 2 >= chunks
    # spills: of the wide kernel while it holds more than `fits` chunks (0: never)
    for spills, fits, bias in ((0, None, False), (56, 0, False), (56, rungs[-1], False), (0, None, True)):
        launched.clear()
        asked = []

        def facts(kernel, args, kwargs, spills=spills, fits=fits, asked=asked):  # 128 registers at 16 warps
            wide = "wide" in kernel.__name__
            asked.append((kernel.__name__, kwargs.get("HOLD")) if wide else kernel.__name__)
            over = wide and (fits is None or kwargs["HOLD"] > fits)
            return common.KernelFacts(128, 0, kwargs["num_warps"], spills if over else 0)

        b = meta(n) if bias else None
        stats, seed = meta(m, dt=f32), meta(1, dt=torch.int64)
        if op == "layer_norm_dropout_relu":
            module = ldr_kernels
            args = (meta(m, n), meta(m, n), meta(n), b, stats, stats, seed, meta(m, n), meta(n), b, 0.1)
        else:
            module = dan_kernels
            args = (meta(m, n), meta(m, n), meta(m, n), meta(n), b, stats, stats, seed, meta(m, n), meta(m, n))
            args += (meta(n), b, 0.1, False)
        module.launch_backward(*args, wrap=wrap, plan=module.plan_backward(*args, sm_count=64, facts=facts))
        names = [k[0] for k in launched]
        wide = f"{prefix}_bwd_wide_kernel"
        if bias and n == 16384:  # planned looped: the wide kernel is never compiled
            assert not any(wide in a for a in asked) and names == looped
            continue
        assert asked[0] == (wide, chunks)  # the whole row first
        if not spills or fits:
            hold = chunks if not spills else fits
            # the rungs asked in turn until one fits: none where the whole row fits
            assert [a for a in asked if wide in a] == [(wide, h) for h in (chunks, *rungs) if h >= hold]
            assert names == [wide, "sum_partials_kernel"] and launched[0][1] == 4096 and launched[0][3] == hold
            assert launched[0][2] == 8  # VEC: a thread's 8 bf16 side by side (4096 columns, 512 threads)
        else:  # every rung spills
            assert [a for a in asked if wide in a] == [(wide, h) for h in (chunks, *rungs)]
            assert names == looped
            assert launched[1][1] == 1024 and launched[1][2] is None  # the looped kernels' own chunks


def test_triton_bias_act_tiles_and_row_groups():
    """Launch planning of bias_act (no GPU needed): the forward's column tile is the power of two that pads N least
    (N = 768: 256 columns, not 1024 with a quarter masked off); the backward's row groups fill whole waves, taking
    two waves where one leaves more than 3 % of the slots idle (N = 12288: 48 tiles x 5 = 240 on 264 slots)."""
    pytest.importorskip("triton")
    from gpuopt_ops.triton_kernels import bias_act as br_kernels
    from gpuopt_ops.triton_kernels import common

    assert br_kernels._tile(768) == (16, 256)
    assert br_kernels._tile(1536) == (8, 512)
    assert br_kernels._tile(4096) == (4, 1024) and br_kernels._tile(12288) == (4, 1024)
    assert br_kernels._tile(1000) == (4, 1024)  # every width pads it to 1024: the widest
    assert br_kernels._tile(100) == (32, 128)
    assert common.column_groups(32, 264, 132) == 8  # one full wave
    assert common.column_groups(3, 264, 132) == 88
    assert common.column_groups(48, 396, 132) == 8  # 384 of 396 slots: >= 97 %
    assert common.column_groups(48, 264, 132) == 11  # 528 programs: two full waves of 264
    assert common.column_groups(200, 264, 132) == 1  # nothing fills better: one group


def test_triton_every_launch_runs_under_the_tensors_device(monkeypatch):
    """No GPU needed: fake CUDA tensors on cuda:1, torch.cuda.device mocked, launches recorded with the device
    current at launch time. Every kernel of every launcher must launch with cuda:1 current."""
    pytest.importorskip("triton")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gpuopt_ops.triton_kernels import bias_act as br_kernels
    from gpuopt_ops.triton_kernels import common
    from gpuopt_ops.triton_kernels import norm_dropout as ldr_kernels

    monkeypatch.setattr(torch.cuda, "device", GuardRecorder)
    launched = []

    def wrap(kernel):
        class Launch:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    cur = GuardRecorder.current[-1] if GuardRecorder.current else None
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
            ldr_kernels.launch_forward(x, w, w, s, x, v, v, 0.1, 1e-5, wrap=wrap)
            ldr_kernels.launch_backward(x, x, w, w, v, v, s, x, w, w, 0.1, wrap=wrap)
            br_kernels.launch_forward(x, w, x, wrap=wrap)
            br_kernels.launch_backward(x, x, x, w, wrap=wrap)
    assert {k for k, _ in launched} == {
        "nd_fwd_fused_kernel",
        "nd_fwd_looped_kernel",
        "nd_bwd_fused_kernel",
        "nd_bwd_row_coef_kernel",
        "nd_bwd_chunk_kernel",
        "sum_partials_kernel",
        "bias_act_fwd_kernel",
        "bias_act_bwd_kernel",
    }
    assert all(d == dev for _, d in launched), launched
    assert not GuardRecorder.current
    assert not isinstance(common.device_guard(torch.device("cpu")), GuardRecorder)
    assert not isinstance(common.device_guard(torch.device("meta")), GuardRecorder)


@pytest.mark.parametrize("backend", backend_params("cuda", "triton"))
def test_gpu_launches_on_the_tensors_device_not_the_current_one(backend):
    """x on the last device while device 0 is current gives the results of x on device 0."""
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    x, w, b = make_inputs((64,), 1000, torch.float32, "cuda:0")
    seed = seed_tensor(7, "cuda:0")
    op = backend.op("layer_norm_dropout_relu")
    ref = op(x, w, b, seed, 0.2, EPS)
    torch.cuda.set_device(0)
    got = op(x.to(last), w.to(last), b.to(last), seed.to(last), 0.2, EPS)
    for r, g in zip(ref, got):
        assert g.device == last
        torch.testing.assert_close(g.cpu(), r.cpu(), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- the checks bite
# Deliberately wrong results must fail the checks the real kernels pass (gpu-mode reference-kernels practice).
def test_a_backward_with_another_mask_is_rejected():
    """A backward that does not recompute the forward's mask (here: another seed) fails the gradient check."""
    ops = CPU.op
    x, w, b = make_inputs((8,), 64, torch.float32)
    g = torch.randn(x.shape)
    seed = seed_tensor(5)
    out, mean, rstd = ops("layer_norm_dropout_relu")(x, w, b, seed, 0.3, EPS)
    good = ops("layer_norm_dropout_relu_backward")(g, x, w, b, mean, rstd, seed, 0.3)[0]
    bad = ops("layer_norm_dropout_relu_backward")(g, x, w, b, mean, rstd, seed_tensor(6), 0.3)[0]
    _, (ref_gx, _, _) = ldr_reference_and_grads(x, w, b, seed, 0.3, EPS, g, torch.float64)
    _, (low_gx, _, _) = ldr_reference_and_grads(x, w, b, seed, 0.3, EPS, g, torch.float32)
    assert_close_to_reference("grad_x", good, ref_gx, low_gx, 1e-5)
    with pytest.raises(AssertionError):
        assert_close_to_reference("grad_x", bad, ref_gx, low_gx, 1e-5)


def test_low_precision_statistics_are_rejected():
    """Statistics kept in bf16 (a bug seen in peers) fail the fp32 tolerance."""
    x, w, b = make_inputs((16,), 256, torch.float32, seed=3)
    x = x * 10 + 100  # large mean: bf16 statistics lose the signal
    seed = seed_tensor(1)
    ref64, _ = ldr_reference_and_grads(x, w, b, seed, 0.1, EPS, torch.ones_like(x), torch.float64)
    low, _ = ldr_reference_and_grads(x, w, b, seed, 0.1, EPS, torch.ones_like(x), torch.float32)
    ours = CPU.op("layer_norm_dropout_relu")(x, w, b, seed, 0.1, EPS)[0]
    assert_close_to_reference("out", ours, ref64, low, 1e-5)
    xb = x.to(torch.bfloat16).float()
    mean = xb.mean(-1, keepdim=True).to(torch.bfloat16).float()
    rstd = torch.rsqrt(((xb - mean) ** 2).mean(-1, keepdim=True) + EPS).to(torch.bfloat16).float()
    keep = R.dropout_keep_mask(1, 16, 256, 0.1)
    bad = torch.relu(torch.where(keep, ((x - mean) * rstd * w + b) * R.dropout_scale(0.1), torch.zeros(())))
    with pytest.raises(AssertionError):
        assert_close_to_reference("out", bad, ref64, low, 1e-5)


def test_an_empty_kernel_is_rejected():
    x, w, b = make_inputs((4,), 32, torch.float32)
    ref64, _ = ldr_reference_and_grads(x, w, b, seed_tensor(0), 0.0, EPS, torch.ones_like(x), torch.float64)
    low, _ = ldr_reference_and_grads(x, w, b, seed_tensor(0), 0.0, EPS, torch.ones_like(x), torch.float32)
    with pytest.raises(AssertionError):
        assert_close_to_reference("out", torch.zeros_like(x), ref64, low, 1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_activation_loops_flush_subnormals_and_restore_the_fp_mode(threads):
    """The CPU activation loops (bias_act acts 1-3, gated_act) run with FTZ/DAZ, as the GPU's .ftz primitives
    (a clamped arm of their exp2 is subnormal and would cost a microcode assist per vector): a subnormal input
    reads as 0 and a subnormal result is written as 0. The caller's floating-point mode is restored afterwards,
    so PyTorch's own ops still produce subnormals."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tiny = torch.full((64, 256), 3e-39)  # subnormal in fp32
        one = torch.ones(64, 256)
        s = seed_tensor(0)
        assert bool((torch.ops.gpuopt.gated_act(one, tiny, s, 0.0, 3) == 0).all()), "silu(1) * 3e-39 flushed"
        assert bool((torch.ops.gpuopt.bias_act(tiny, torch.zeros(256), 1) == 0).all()), "gelu(3e-39) flushed"
        gg, gu = torch.ops.gpuopt.gated_act_backward(one, tiny, one, s, 0.0, 3)
        assert bool((gu == 0).all()) and bool((gg == 0.5).all()), "silu'(0) = 0.5, silu(0) = 0"
        assert (torch.full((3,), 3e-39) * 1.0).ne(0).all(), "the caller's MXCSR is back: no FTZ/DAZ after the op"
        assert float(torch.tensor(1e-38) / 16) != 0.0
    finally:
        torch.set_num_threads(old)

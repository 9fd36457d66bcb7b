"""Autograd and the op registrations on every backend: gradcheck in fp64, torch.library.opcheck (schema, fake
kernel, autograd registration, AOT dispatch), autograd equal to the explicit backward op, double backward refused,
and deterministic gradients (same inputs, same bits).
"""

import pytest
import torch

import gpuopt_ops

from backends import backend_params, require_op
from helpers import make_inputs, opcheck_four_ops, seed_tensor

EPS = 1e-5


@pytest.mark.parametrize("backend", backend_params())
def test_gradcheck_fp64_with_dropout(backend):
    dev = backend.device
    m, n = 4, 9  # the slow backends' gradcheck takes its fast mode (Backend.gradcheck): two runs an input
    x, w, b = make_inputs((m,), n, torch.float64, dev, requires_grad=True)
    seed = seed_tensor(99, dev)
    ldr = backend.op("layer_norm_dropout_relu")
    assert backend.gradcheck(lambda x, w, b: ldr(x, w, b, seed, 0.3, EPS)[0], (x, w, b), eps=1e-6, atol=1e-5)
    xb = torch.randn(5, 7, dtype=torch.float64, device=dev, requires_grad=True)
    bb = torch.randn(7, dtype=torch.float64, device=dev, requires_grad=True)
    assert backend.gradcheck(backend.op("bias_relu"), (xb, bb))


def opcheck_samples(device, large=False):
    """fp32 with both parameters, bf16 without (3-D x), fp64 (the accumulation dtype changes the fake kernel's
    outputs): one sample each; the schema, fake kernel and autograd do not depend on more shapes. On a GPU also a
    row past every single-block limit."""
    yield (*make_inputs((3,), 7, torch.float32, device, requires_grad=True), seed_tensor(5, device))
    yield (*make_inputs((2, 3), 16, torch.bfloat16, device, affine=False, requires_grad=True), seed_tensor(5, device))
    yield (*make_inputs((3,), 7, torch.float64, device, requires_grad=True), seed_tensor(5, device))
    if large:
        yield (*make_inputs((2,), 65536, torch.float32, device, requires_grad=True), seed_tensor(1, device))


@pytest.mark.parametrize("backend", backend_params())
def test_opcheck_all_four_ops(backend):
    """Under the interpreter the Triton ops stay opaque (interpreted kernels cannot run on fake tensors), so this
    checks the op as a whole; on a GPU AOT dispatch decomposes the Triton ops into their kernels."""
    opcheck_four_ops(
        backend.op("layer_norm_dropout_relu"),
        backend.op("layer_norm_dropout_relu_backward"),
        backend.op("bias_relu"),
        backend.op("bias_relu_backward"),
        opcheck_samples(backend.device, large=backend.gpu),
        EPS,
    )


@pytest.mark.parametrize("backend", backend_params())
def test_autograd_equals_the_explicit_backward_op(backend):
    dev = backend.device
    ldr, ldr_bwd = backend.op("layer_norm_dropout_relu"), backend.op("layer_norm_dropout_relu_backward")
    x, w, b = make_inputs((6,), 24, torch.float32, dev, requires_grad=True)
    seed = seed_tensor(8, dev)
    out = ldr(x, w, b, seed, 0.2, EPS)[0]
    g = torch.randn_like(out)
    out.backward(g)
    _, mean, rstd = ldr(x.detach(), w.detach(), b.detach(), seed, 0.2, EPS)
    gx, gw, gb = ldr_bwd(g, x.detach(), w.detach(), b.detach(), mean, rstd, seed, 0.2)
    assert torch.equal(x.grad, gx) and torch.equal(w.grad, gw) and torch.equal(b.grad, gb)


@pytest.mark.parametrize("backend", backend_params())
def test_bias_relu_autograd_casts_the_fp32_grad_once_to_the_bias_dtype(backend):
    """bf16 x with an fp32 bias: x.grad bf16, bias.grad fp32 (the count of positive outputs per column here)."""
    dev = backend.device
    x = torch.randn(10, 33, dtype=torch.bfloat16, device=dev, requires_grad=True)
    b = torch.randn(33, device=dev, requires_grad=True)
    gpuopt_ops.bias_relu(x, b, backend=backend.api).float().sum().backward()
    assert b.grad.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    ref = (torch.relu(x.detach().float() + b.detach()) > 0).float().sum(0)
    torch.testing.assert_close(b.grad, ref, atol=0.5, rtol=1e-2)


@pytest.mark.parametrize("backend", backend_params())
def test_double_backward_raises_instead_of_a_silent_zero(backend):
    dev = backend.device
    x, w, b = make_inputs((4,), 16, torch.float64, device=dev, requires_grad=True)
    out = backend.op("layer_norm_dropout_relu")(x, w, b, seed_tensor(0, dev), 0.2, EPS)[0]
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        gx.sum().backward()
    o = backend.op("bias_relu")(x, b)
    (gb,) = torch.autograd.grad(o.square().sum(), b, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        gb.sum().backward()


@pytest.mark.parametrize("backend", backend_params())
def test_same_inputs_same_bits_including_the_column_sums(backend):
    """Forward and backward twice give identical bits: the column sums (dgamma, dbeta, dbias) use fixed partial
    rows and a fixed summation order, no float atomics. On a GPU 70000 rows (many grid strides); here 300 rows
    (10 row tiles over the interpreter's 8 row groups, 64 CPU row blocks). Another seed gives another output."""
    dev = backend.device
    m, dtype = (70000, torch.bfloat16) if backend.gpu else (300, torch.float32)
    x, w, b = make_inputs((m,), 64, dtype, dev, param_dtype=torch.float32)
    g = torch.randn(x.shape, device=dev).to(dtype)
    ldr, ldr_bwd = backend.op("layer_norm_dropout_relu"), backend.op("layer_norm_dropout_relu_backward")

    def run(seed):
        s = seed_tensor(seed, dev)
        out, mean, rstd = ldr(x, w, b, s, 0.1, EPS)
        o = backend.op("bias_relu")(x, b)
        return [out, mean, rstd, *ldr_bwd(g, x, w, b, mean, rstd, s, 0.1), o, *backend.op("bias_relu_backward")(g, o)]

    r1, r2 = run(11), run(11)
    for a, c in zip(r1, r2):
        assert torch.equal(a, c)
    assert not torch.equal(r1[0], run(12)[0])


@pytest.mark.parametrize("backend", backend_params())
def test_bias_act_autograd(backend):
    """gradcheck in fp64 for every activation (relu away from its kink), opcheck of the op pair, what autograd
    saves (relu: the output; the others: x and the bias), the AMP cast of grad_bias to an fp32 bias, and the
    public function's names."""
    dev = backend.device
    op, op_bwd = backend.op("bias_act"), backend.op("bias_act_backward")
    g = torch.Generator().manual_seed(3)
    for act in (0, 1, 2, 3):
        x = (torch.randn(3, 5, generator=g, dtype=torch.float64) * 2).to(dev).requires_grad_()
        b = torch.randn(5, generator=g, dtype=torch.float64).to(dev).requires_grad_()
        assert backend.gradcheck(lambda x, b, act=act: op(x, b, act), (x, b), eps=1e-6, atol=1e-6)
        # autograd equals the backward op called on what the contract says is saved
        out = op(x, b, act)
        go = torch.randn_like(out)
        gx, gb = torch.autograd.grad(out, (x, b), go)
        ex, eb = op_bwd(go, (out if act == 0 else x).detach(), b.detach(), act)
        assert torch.equal(gx, ex) and torch.equal(gb, eb)
        if act in (0, 1):  # the two autograd paths (saved output, saved x); opcheck is the slow part
            torch.library.opcheck(op, (x, b, act))
    # AMP: bf16 x, fp32 bias: grad_bias arrives in the bias's dtype, summed in fp32
    xh = torch.randn(4, 8, generator=g).to(torch.bfloat16).to(dev).requires_grad_()
    bh = torch.randn(8, generator=g).to(dev).requires_grad_()
    out = gpuopt_ops.bias_act(xh, bh, act="silu", backend=backend.api)
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and xh.grad.dtype == torch.bfloat16 and bh.grad.dtype == torch.float32
    ex, eb = op_bwd(torch.ones_like(out), xh.detach(), bh.detach(), 3)
    assert torch.equal(bh.grad, eb)
    with pytest.raises(RuntimeError, match="double backward"):
        y = op(x, b, 1)
        gx, _ = torch.autograd.grad(y.sum(), (x, b), create_graph=True)
        gx.sum().backward()


# ---------------------------------------------------------------------------------------------- dropout_add_norm
def _dan_samples(device):
    """(x, residual, weight, bias, rms, residual_in_fp32): LayerNorm with everything in fp64; RMSNorm with a bias
    only and no residual in fp32; bf16 x with an fp32 residual (residual_in_fp32) and fp32 weight."""
    x, w, b = make_inputs((3,), 7, torch.float64, device, requires_grad=True)
    yield x, torch.randn_like(x).requires_grad_(), w, b, False, False
    x, _, b = make_inputs((2, 3), 16, torch.float32, device, requires_grad=True)
    yield x, None, None, b, True, False
    x, w, _ = make_inputs((4,), 8, torch.bfloat16, device, param_dtype=torch.float32, requires_grad=True)
    yield x, torch.randn(4, 8, device=device, requires_grad=True), w, None, False, True


# the interpreter's case (5-8 s of gradchecks and opchecks) in the full suite only; the fast lane keeps the CPU
# kernels' and the Triton ops' gradients against the reference (test_correctness.py)
@pytest.mark.parametrize("backend", backend_params(slow_in_full_suite=True))
def test_dropout_add_norm_gradcheck_and_opcheck(backend):
    """gradcheck in fp64 with dropout (out and sum both used), LayerNorm and RMSNorm; opcheck of both ops (schema,
    fake kernel, autograd registration, AOT dispatch) with and without grad_sum; double backward refused."""
    require_op(backend, "dropout_add_norm")
    dev = backend.device
    dan, dan_bwd = backend.op("dropout_add_norm"), backend.op("dropout_add_norm_backward")
    seed = seed_tensor(99, dev)
    x, w, b = make_inputs((2,), 5, torch.float64, dev, requires_grad=True)
    r = torch.randn_like(x).requires_grad_()
    for rms in (False, True):

        def f(x, r, w, b, rms=rms):
            out, s, _, _ = dan(x, r, w, b, seed, 0.3, EPS, rms, False)
            return out, s

        assert backend.gradcheck(f, (x, r, w, b), eps=1e-6, atol=1e-5)
    for i, (x, r, w, b, rms, rif) in enumerate(_dan_samples(dev)):
        torch.library.opcheck(dan, (x, r, w, b, seed, 0.2, EPS, rms, rif))
        d = [None if t is None else t.detach() for t in (x, r, w, b)]
        out, s, mean, rstd = dan(*d, seed, 0.2, EPS, rms, rif)
        gs = torch.randn_like(s) if i != 1 else None  # with and without grad_sum
        args = (torch.randn_like(out), gs, s, d[2], d[3], mean, rstd, seed, 0.2, rms, r is not None)
        torch.library.opcheck(dan_bwd, args)
    x, w, b = make_inputs((3,), 6, torch.float32, dev, requires_grad=True)
    out = gpuopt_ops.dropout_add_norm(x, None, w, b, p=0.2, backend=backend.api)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        gx.sum().backward()


# ---------------------------------------------------------------------------------------------- norm_dropout
# the interpreter's case (5-8 s of gradchecks and opchecks) in the full suite only; the fast lane keeps the CPU
# kernels' and the Triton ops' gradients against the reference (test_correctness.py)
@pytest.mark.parametrize("backend", backend_params(slow_in_full_suite=True))
def test_norm_dropout_gradcheck_and_opcheck(backend):
    """gradcheck in fp64 with dropout for every (norm, activation); opcheck of both ops (schema, fake kernel,
    autograd registration, AOT dispatch) in fp32 (RMSNorm, identity, the (0,) mean) and bf16 without parameters
    (LayerNorm, ReLU); the public function's autograd; double backward refused."""
    require_op(backend, "norm_dropout")
    dev = backend.device
    nd, nd_bwd = backend.op("norm_dropout"), backend.op("norm_dropout_backward")
    seed = seed_tensor(99, dev)
    x, w, b = make_inputs((2,), 5, torch.float64, dev, requires_grad=True)
    flags = (False, True)
    for rms, relu in [(r, a) for r in flags for a in flags]:  # every flag combination

        def f(x, w, b, rms=rms, relu=relu):
            return nd(x, w, b, seed, 0.3, EPS, rms, relu)[0]

        assert backend.gradcheck(f, (x, w, b), eps=1e-6, atol=1e-5), (rms, relu)
    samples = (
        (*make_inputs((3,), 7, torch.float32, dev, requires_grad=True), True, False),
        (*make_inputs((2, 3), 16, torch.bfloat16, dev, affine=False, requires_grad=True), False, True),
    )
    for x, w, b, rms, relu in samples:
        torch.library.opcheck(nd, (x, w, b, seed, 0.2, EPS, rms, relu))
        d = [None if t is None else t.detach() for t in (x, w, b)]
        out, mean, rstd = nd(*d, seed, 0.2, EPS, rms, relu)
        assert mean.shape == ((0,) if rms else (x.numel() // x.shape[-1],))
        torch.library.opcheck(nd_bwd, (torch.randn_like(out), *d, mean, rstd, seed, 0.2, rms, relu))
    x, w, b = make_inputs((3,), 6, torch.float32, dev, requires_grad=True)
    out = gpuopt_ops.norm_dropout(x, w, b, norm="rms", p=0.2, backend=backend.api)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        gx.sum().backward()


# the interpreter's case (5-8 s of gradchecks and opchecks) in the full suite only; the fast lane keeps the CPU
# kernels' and the Triton ops' gradients against the reference (test_correctness.py)
@pytest.mark.parametrize("backend", backend_params(slow_in_full_suite=True))
def test_gated_act_autograd(backend):
    """gradcheck in fp64 for every activation and both layouts (relu away from its kink, dropout on and off),
    opcheck of the op pair, autograd equal to the backward op on the saved inputs (nothing else is saved), and the
    public function: same seed, same mask; training=False drops nothing."""
    require_op(backend, "gated_act")
    dev = backend.device
    op, op_bwd = backend.op("gated_act"), backend.op("gated_act_backward")
    g = torch.Generator().manual_seed(5)
    layouts = ((False, 0.0), (True, 0.0), (False, 0.3), (True, 0.3))
    for act, packed, p in [(act, packed, p) for act in (0, 1, 2, 3) for packed, p in layouts]:
        gate = (torch.randn(3, 10 if packed else 5, generator=g, dtype=torch.float64) * 2).to(dev)
        up = None if packed else torch.randn(3, 5, generator=g, dtype=torch.float64).to(dev)
        gate.requires_grad_()
        if up is not None:
            up.requires_grad_()
        seed = seed_tensor(77, dev)
        leaves = (gate,) if packed else (gate, up)

        def fn(*ts, act=act, p=p, seed=seed, packed=packed):
            return op(ts[0], None if packed else ts[1], seed, p, act)

        assert backend.gradcheck(fn, leaves, eps=1e-6, atol=1e-6)
        out = fn(*leaves)
        go = torch.randn_like(out)
        grads = torch.autograd.grad(out, leaves, go)
        eg, eu = op_bwd(go, gate.detach(), None if up is None else up.detach(), seed, p, act)
        assert torch.equal(grads[0], eg) and (packed or torch.equal(grads[1], eu))
        if act == 3 and p == 0.3:  # opcheck is the slow part: one layout each
            torch.library.opcheck(op, (gate, up, seed, p, act))
    # the public function: torch.manual_seed reproduces the mask; eval mode drops nothing
    gate = torch.randn(4, 16, device=dev)
    torch.manual_seed(0)
    a = gpuopt_ops.gated_act(gate, act="gelu", p=0.5, backend=backend.api)
    torch.manual_seed(0)
    b = gpuopt_ops.gated_act(gate, act="gelu", p=0.5, backend=backend.api)
    assert torch.equal(a, b) and bool((a == 0).any())
    c = gpuopt_ops.gated_act(gate, act="gelu", p=0.5, training=False, backend=backend.api)
    assert torch.equal(c, op(gate, None, seed_tensor(0, dev), 0.0, 1))

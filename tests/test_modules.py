"""nn.Module drop-ins: same parameters and answers as the unfused PyTorch modules, state dicts both ways."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import gpuopt_ops
from gpuopt_ops.modules import (
    EagerLayerNormDropoutReLU,
    EagerLinearReLU,
    FusedBiasReLU,
    FusedLayerNormDropoutReLU,
    LinearBiasReLU,
    unfused_equivalent,
)


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return module


@pytest.mark.parametrize("shape,normalized", [((6, 37), 37), ((2, 5, 16), (16,)), ((3, 4, 6), (4, 6))])
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
def test_layer_norm_module_matches_unfused(shape, normalized, affine, bias):
    fused = _randomize(FusedLayerNormDropoutReLU(normalized, p=0.0, elementwise_affine=affine, bias=bias))
    ln = nn.LayerNorm(normalized, elementwise_affine=affine, bias=bias)
    ln.load_state_dict(fused.state_dict())  # fused -> unfused
    x = torch.randn(*shape, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out, ref = fused(x), F.relu(ln(x2))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(fused.named_parameters(), ln.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    back = FusedLayerNormDropoutReLU(normalized, p=0.0, elementwise_affine=affine, bias=bias)
    back.load_state_dict(ln.state_dict())  # unfused -> fused
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), fused.state_dict().values()))
    assert sorted(fused.state_dict()) == sorted(ln.state_dict())


def test_layer_norm_module_dropout_train_and_eval():
    m = FusedLayerNormDropoutReLU(512, p=0.5)
    x = torch.randn(64, 512)
    torch.manual_seed(3)
    a = m(x)
    torch.manual_seed(3)
    b = m(x)
    assert torch.equal(a, b), "the mask must follow torch's generator"
    c = m(x)
    assert not torch.equal(a, c), "a new forward draws a new mask"
    base = F.relu(F.layer_norm(x, (512,), eps=1e-5))
    dropped = ((a == 0) & (base > 0)).sum().item() / (base > 0).sum().item()
    assert 0.45 < dropped < 0.55
    torch.testing.assert_close(a[a != 0], 2 * base[a != 0], rtol=1e-5, atol=1e-5)
    m.eval()
    torch.testing.assert_close(m(x), base, rtol=1e-5, atol=1e-5)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    m(x)
    assert torch.equal(before, torch.get_rng_state()), "eval draws no random numbers"


def test_linear_bias_relu_matches_linear_and_inits_like_it():
    torch.manual_seed(5)
    fused = LinearBiasReLU(20, 33)
    torch.manual_seed(5)
    lin = nn.Linear(20, 33)
    assert all(torch.equal(a, b) for a, b in zip(fused.state_dict().values(), lin.state_dict().values())), (
        "same seed, same initial weights as nn.Linear"
    )
    assert sorted(fused.state_dict()) == sorted(lin.state_dict())
    x = torch.randn(2, 7, 20, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out, ref = fused(x), F.relu(lin(x2))
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(fused.weight.grad, lin.weight.grad)
    torch.testing.assert_close(fused.bias.grad, lin.bias.grad, rtol=1e-5, atol=1e-5)
    lin2 = nn.Linear(20, 33)
    lin2.load_state_dict(fused.state_dict())
    fused.load_state_dict(lin.state_dict())


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("how", ["bf16", "fp16", "autocast_bf16"])
def test_16_bit_linear_keeps_the_bias_in_the_matmul(act, how):
    """In bf16 / fp16 (the data's, or autocast's) LinearBiasReLU / LinearBiasAct give nn.Linear → act's bits: the
    bias is added before the matmul's one rounding. Split off after it, a bias that cancels most of x @ w.T leaves
    that rounding's error, relative to the small result, in place (the case below: ~0.5 of an ulp of 8, against
    results of about 1/64)."""
    from gpuopt_ops.modules import LinearBiasAct

    dtype = torch.float16 if how == "fp16" else torch.bfloat16
    fused = LinearBiasReLU(64, 48) if act == "relu" else LinearBiasAct(64, 48, act=act)
    torch.manual_seed(3)
    x = torch.randn(32, 64)
    with torch.no_grad():
        fused.weight.copy_(torch.randn(48, 64) / 8)
        # a bias that cancels x @ w.T of row 0 up to a small remainder, so the sum is ~1/64 where x @ w.T is ~1
        fused.bias.copy_(-(x[0] @ fused.weight.T) + torch.linspace(-1 / 64, 1 / 64, 48))
    lin = nn.Linear(64, 48)
    lin.load_state_dict(fused.state_dict())
    fn = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "silu": F.silu}[act]
    if how == "autocast_bf16":
        xs = x.clone().requires_grad_(True)
        xr = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, ref = fused(xs), fn(lin(xr))
    else:
        fused.to(dtype), lin.to(dtype)
        xs, xr = (x.to(dtype).requires_grad_(True) for _ in range(2))
        out, ref = fused(xs), fn(lin(xr))
    assert out.dtype == ref.dtype == dtype
    assert torch.equal(out, ref), f"{act} {how}: max |diff| {(out.float() - ref.float()).abs().max().item():.3g}"
    g = torch.randn(out.shape, dtype=out.dtype)
    out.backward(g)
    ref.backward(g)
    assert torch.equal(xs.grad, xr.grad)
    assert torch.equal(fused.bias.grad, lin.bias.grad)
    # row 0 against its fp64 truth on the 16-bit operands: one rounding of results ~1/64 away (< 1e-4), where the
    # split form, bias_act(x @ w.T) on the rounded matmul, is up to half an ulp of ~1 off (2e-3 in bf16)
    q = [t.detach().to(dtype).double() for t in (x[0], fused.weight, fused.bias)]
    truth = fn(q[0] @ q[1].T + q[2])
    assert (out[0].double() - truth).abs().max().item() < 1e-4
    xq, wq = x[:1].to(dtype), fused.weight.detach().to(dtype)
    split = gpuopt_ops.bias_act(F.linear(xq, wq), fused.bias.detach().to(dtype), act=act)
    assert (split[0].double() - truth).abs().max().item() > 2e-4, "the case must separate the two forms"


def test_fused_bias_relu_module():
    m = _randomize(FusedBiasReLU(9))
    x = torch.randn(4, 3, 9, requires_grad=True)
    out = m(x)
    torch.testing.assert_close(out, F.relu(x + m.bias))
    out.sum().backward()
    torch.testing.assert_close(m.bias.grad, ((x + m.bias) > 0).float().sum((0, 1)))


def test_extra_repr_and_bad_backend():
    assert "backend='cpu'" in repr(FusedLayerNormDropoutReLU(8, backend="cpu"))
    assert "backend='auto'" in repr(LinearBiasReLU(3, 4))
    assert "backend='auto'" in repr(FusedBiasReLU(4))
    with pytest.raises(ValueError, match="backend must be one of"):
        FusedBiasReLU(4, backend="gpu")
    with pytest.raises(ValueError, match="dropout probability"):
        FusedLayerNormDropoutReLU(4, p=1.5)


def test_unfused_equivalent_copies_parameters():
    fused = _randomize(FusedLayerNormDropoutReLU(16, p=0.0))
    twin = unfused_equivalent(fused)
    assert isinstance(twin, EagerLayerNormDropoutReLU)
    x = torch.randn(5, 16)
    torch.testing.assert_close(fused(x), twin(x), rtol=1e-5, atol=1e-5)
    lin = LinearBiasReLU(4, 6)
    assert isinstance(unfused_equivalent(lin), EagerLinearReLU)
    torch.testing.assert_close(unfused_equivalent(lin)(x[:, :4]), lin(x[:, :4]))


def _models(p):
    torch.manual_seed(11)
    fused = nn.Sequential(
        LinearBiasReLU(12, 32),
        FusedLayerNormDropoutReLU(32, p),
        LinearBiasReLU(32, 32),
        FusedLayerNormDropoutReLU(32, p),
        nn.Linear(32, 3),
    )
    torch.manual_seed(11)
    eager = nn.Sequential(
        EagerLinearReLU(12, 32),
        EagerLayerNormDropoutReLU(32, p),
        EagerLinearReLU(32, 32),
        EagerLayerNormDropoutReLU(32, p),
        nn.Linear(32, 3),
    )
    return fused, eager


def test_model_trains_like_the_unfused_model():
    fused, eager = _models(0.0)
    assert all(torch.equal(a, b) for a, b in zip(fused.state_dict().values(), eager.state_dict().values()))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 12, generator=g), torch.randint(0, 3, (256,), generator=g)
    losses = {}
    for name, model in (("fused", fused), ("eager", eager)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[name] = []
        for step in range(30):
            idx = slice(32 * (step % 8), 32 * (step % 8 + 1))
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    torch.testing.assert_close(torch.tensor(losses["fused"]), torch.tensor(losses["eager"]), rtol=1e-4, atol=1e-5)
    assert losses["fused"][-1] < 0.7 * losses["fused"][0], "the model must actually learn"


@pytest.mark.parametrize("how", ["checkpoint", "checkpoint_sequential"])
def test_activation_checkpointing_recomputes_the_same_mask(how):
    fused, _ = _models(0.3)
    x = torch.randn(64, 12)

    def grads(use_ckpt):
        fused.zero_grad(set_to_none=True)
        torch.manual_seed(123)
        if not use_ckpt:
            out = fused(x)
        elif how == "checkpoint":
            body = nn.Sequential(*list(fused)[:4])
            out = fused[4](checkpoint(body, x, use_reentrant=False))
        else:
            out = checkpoint_sequential(fused, 2, x, use_reentrant=False)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in fused.parameters()]

    out0, g0 = grads(False)
    out1, g1 = grads(True)
    assert torch.equal(out0, out1)
    for a, b in zip(g0, g1):
        assert torch.equal(a, b), "checkpointed backward must recompute the same dropout mask"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_modules_under_autocast_with_fp32_params(dtype):
    fused, eager = _models(0.0)
    x = torch.randn(16, 12)
    with torch.autocast("cpu", dtype=dtype):
        out, ref = fused(x), eager(x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out.float(), ref.float(), rtol=5e-2, atol=5e-2)
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in fused.parameters())


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
def test_dropout_add_norm_modules_are_drop_ins(norm, affine, bias):
    """FusedDropoutAddLayerNorm / FusedDropoutAddRMSNorm: nn.LayerNorm's / nn.RMSNorm's parameters (names,
    registration, initialisation), state dicts loading both ways, and in eval (dropout off) the answer of the
    unfused norm(x + residual); prenorm also returns the sum."""
    from gpuopt_ops.modules import FusedDropoutAddLayerNorm, FusedDropoutAddRMSNorm

    n = 24
    if norm == "layer":
        fused = FusedDropoutAddLayerNorm(n, p=0.3, elementwise_affine=affine, bias=bias)
        ref = nn.LayerNorm(n, elementwise_affine=affine, bias=bias)
    else:
        if not bias and affine:
            pytest.skip("nn.RMSNorm has no bias")
        fused = FusedDropoutAddRMSNorm(n, p=0.3, elementwise_affine=affine)
        ref = nn.RMSNorm(n, elementwise_affine=affine)
    assert dict(fused.named_parameters()).keys() == dict(ref.named_parameters()).keys()
    assert fused._parameters.keys() == ref._parameters.keys()  # None parameters registered alike
    for (k, a), b in zip(fused.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), k  # ones and zeros
    _randomize(ref, seed=3)
    fused.load_state_dict(ref.state_dict())
    ref.load_state_dict(fused.state_dict())
    fused.eval()
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(5, n, generator=g) for _ in range(2))
    torch.testing.assert_close(fused(x, r), ref(x + r), rtol=1e-5, atol=1e-5)
    fused.prenorm = True
    out, s = fused(x, r)
    torch.testing.assert_close(out, ref(x + r), rtol=1e-5, atol=1e-5)
    assert torch.equal(s, x + r)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("affine,bias", [(True, True), (False, False)])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_norm_dropout_modules_are_drop_ins(norm, affine, bias, activation):
    """FusedLayerNormDropout / FusedRMSNormDropout: nn.LayerNorm's / nn.RMSNorm's parameters and initialisation,
    state dicts loading both ways; in eval the unfused norm (→ ReLU), in training the dropout's scale and share."""
    from gpuopt_ops.modules import FusedLayerNormDropout, FusedRMSNormDropout

    n = 32
    if norm == "layer":
        fused = FusedLayerNormDropout(n, p=0.25, elementwise_affine=affine, bias=bias, activation=activation)
        ref = nn.LayerNorm(n, elementwise_affine=affine, bias=bias)
    else:
        fused = FusedRMSNormDropout(n, p=0.25, elementwise_affine=affine, activation=activation)
        ref = nn.RMSNorm(n, elementwise_affine=affine)
    assert fused._parameters.keys() == ref._parameters.keys()
    for (k, a), b in zip(fused.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), k
    _randomize(ref, seed=4)
    fused.load_state_dict(ref.state_dict())
    ref.load_state_dict(fused.state_dict())
    act = torch.relu if activation == "relu" else (lambda t: t)
    x = torch.randn(64, n, generator=torch.Generator().manual_seed(2))
    fused.eval()
    torch.testing.assert_close(fused(x), act(ref(x)), rtol=1e-5, atol=1e-5)
    fused.train()
    torch.manual_seed(0)
    y = fused(x)
    expect = act(ref(x)) / 0.75
    kept = y != 0
    torch.testing.assert_close(y[kept], expect[kept], rtol=1e-5, atol=1e-5)
    dropped = 1 - kept.float().mean().item() if activation is None else None
    if dropped is not None:
        assert 0.2 < dropped < 0.3, dropped
    with pytest.raises(ValueError, match="activation must be None or 'relu'"):
        type(fused)(n, activation="gelu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_rms_norm_modules_resolve_the_default_eps_as_pytorch_does(dtype):
    """eps=None is nn.RMSNorm's default: ATen takes the epsilon of the type it computes in, fp32 for 16-bit inputs
    (not bf16's 7.8e-3). Small inputs make the difference large (an output error of ~0.6 with bf16's epsilon)."""
    from gpuopt_ops.modules import FusedDropoutAddRMSNorm, FusedRMSNormDropout, default_rms_eps

    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    assert default_rms_eps(dtype) == torch.finfo(compute).eps
    n = 64
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(16, n, generator=gen) * 1e-3).to(dtype)
    r = (torch.randn(16, n, generator=gen) * 1e-3).to(dtype)
    ref = nn.RMSNorm(n).to(dtype).eval()
    _randomize(ref, seed=5)
    tol = dict(rtol=2e-2, atol=2e-2) if compute is torch.float32 and dtype is not torch.float32 else {}
    for fused, args, expect in (
        (FusedRMSNormDropout(n, p=0.1), (x,), ref(x)),
        (FusedDropoutAddRMSNorm(n, p=0.1), (x, r), ref(x + r)),
    ):
        fused = fused.to(dtype).eval()
        fused.load_state_dict(ref.state_dict())
        assert fused.eps is None
        torch.testing.assert_close(fused(*args), expect, **tol)

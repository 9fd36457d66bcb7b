"""gpuopt_ops.fuse / unfuse on unmodified models, and the torch.compile backend "gpuopt"."""

import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gpuopt_ops
from gpuopt_ops.compile_backend import gpuopt_backend, rewrite_graph
from gpuopt_ops.modules import (
    FusedLayerNormDropout,
    FusedLayerNormDropoutReLU,
    FusedRMSNormDropout,
    LinearBiasAct,
    LinearBiasReLU,
)

from backends import backend_params

torchvision = pytest.importorskip("torchvision")


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """LayerNorm weights of 1 and biases of 0 would hide a parameter mix-up: draw every parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * 0.5)
    return model


def _tv_mlp(dropout=0.1):
    torch.manual_seed(0)
    return _randomize(
        torchvision.ops.MLP(24, [48, 40, 10], norm_layer=nn.LayerNorm, activation_layer=nn.ReLU, dropout=dropout)
    )


def _same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def _types(seq: nn.Sequential):
    return [type(m).__name__ for m in seq]


# ---------------------------------------------------------------------------------------------- fuse on a library model
def test_torchvision_mlp_fused_matches_the_original():
    model = _tv_mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fused = gpuopt_ops.fuse(model)
    # the torchvision MLP is Linear, LayerNorm, ReLU, Dropout per hidden layer, then Linear, Dropout
    assert _types(fused) == ["Linear", "FusedLayerNormDropoutReLU", "Identity", "Identity"] * 2 + ["Linear", "Dropout"]
    assert fused[1].p == 0.1 and fused[5].p == 0.1
    assert _types(model)[:4] == ["Linear", "LayerNorm", "ReLU", "Dropout"], "the original was modified"
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert fused[1].weight is not model[1].weight, "fuse(inplace=False) must not share the original's tensors"
    _same_state(model, fused)

    x = torch.randn(37, 24)
    model.eval(), fused.eval()
    torch.testing.assert_close(fused(x), model(x), atol=1e-5, rtol=1e-5)

    # gradients reach every parameter and match the stock model's (eval: no dropout)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    (model(xa) ** 2).sum().backward()
    (fused(xb) ** 2).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, atol=1e-5, rtol=1e-4)
    for (name, pa), (_, pb) in zip(model.named_parameters(), fused.named_parameters()):
        assert pb.grad is not None and pb.grad.abs().sum() > 0, name
        torch.testing.assert_close(pb.grad, pa.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_checkpoints_move_between_fused_and_unfused_copies(tmp_path):
    model, other = (
        _tv_mlp(),
        _randomize(
            torchvision.ops.MLP(24, [48, 40, 10], norm_layer=nn.LayerNorm, activation_layer=nn.ReLU, dropout=0.1),
            seed=1,
        ),
    )
    fused = gpuopt_ops.fuse(other)
    path = tmp_path / "stock.pt"
    torch.save(model.state_dict(), path)
    fused.load_state_dict(torch.load(path, weights_only=True))  # stock checkpoint → fused model
    _same_state(model, fused)
    buf = io.BytesIO()
    fused[1].weight.data.mul_(2.0)
    torch.save(fused.state_dict(), buf)
    buf.seek(0)
    model.load_state_dict(torch.load(buf, weights_only=True))  # fused checkpoint → stock model
    _same_state(model, fused)
    x = torch.randn(5, 24)
    torch.testing.assert_close(fused.eval()(x), model.eval()(x), atol=1e-5, rtol=1e-5)


def test_train_mode_dropout_follows_model_train_and_eval():
    fused = gpuopt_ops.fuse(nn.Sequential(nn.LayerNorm(512), nn.ReLU(), nn.Dropout(0.5)))
    x = torch.randn(64, 512)
    eval_out = fused.eval()(x)
    torch.testing.assert_close(eval_out, F.relu(F.layer_norm(x, (512,))), atol=1e-5, rtol=1e-5)
    torch.manual_seed(0)
    train_out = fused.train()(x)
    positive = eval_out > 0
    dropped = (train_out[positive] == 0).float().mean().item()
    assert 0.45 < dropped < 0.55, dropped
    torch.testing.assert_close(train_out[positive & (train_out > 0)], 2 * eval_out[positive & (train_out > 0)])
    torch.manual_seed(0)
    assert torch.equal(fused(x), train_out), "torch.manual_seed must reproduce the mask"


@pytest.mark.parametrize("backend", backend_params("cuda", "triton", "triton-interpret"))
def test_fused_torchvision_mlp_on_the_other_backends(backend):
    """backend= reaches the fused modules; the same eval outputs and gradients as the stock model."""
    device = backend.device
    model = _tv_mlp().to(device).eval()
    fused = gpuopt_ops.fuse(model, backend=backend.api)
    assert fused[1].backend == backend.api
    x = torch.randn(6, 24, device=device)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = model(xa), fused(xb)
    torch.testing.assert_close(yb, ya, atol=1e-5, rtol=1e-5)
    ya.square().sum().backward()
    yb.square().sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fused[1].weight.grad, model[1].weight.grad, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- every pattern, by hand
def _ln():
    return nn.LayerNorm(16)


PATTERNS = {
    "ln-dropout-relu": (lambda: [_ln(), nn.Dropout(0.25), nn.ReLU()], FusedLayerNormDropoutReLU, 0.25),
    "ln-relu-dropout": (lambda: [_ln(), nn.ReLU(), nn.Dropout(0.25)], FusedLayerNormDropoutReLU, 0.25),
    "ln-relu": (lambda: [_ln(), nn.ReLU()], FusedLayerNormDropoutReLU, 0.0),
    "ln-relu-inplace": (lambda: [_ln(), nn.ReLU(inplace=True)], FusedLayerNormDropoutReLU, 0.0),
    "ln-no-bias-relu": (lambda: [nn.LayerNorm(16, bias=False), nn.ReLU()], FusedLayerNormDropoutReLU, 0.0),
    "ln-no-affine-dropout-relu": (
        lambda: [nn.LayerNorm(16, elementwise_affine=False, eps=1e-3), nn.Dropout(0.1), nn.ReLU()],
        FusedLayerNormDropoutReLU,
        0.1,
    ),
    "layernorm-dropout": (lambda: [nn.LayerNorm(16), nn.Dropout(0.2)], FusedLayerNormDropout, 0.2),
    "rmsnorm-dropout": (lambda: [nn.RMSNorm(16), nn.Dropout(0.2)], FusedRMSNormDropout, 0.2),
    "rmsnorm-dropout-relu": (lambda: [nn.RMSNorm(16, eps=1e-6), nn.Dropout(0.3), nn.ReLU()], FusedRMSNormDropout, 0.3),
    "rmsnorm-relu-no-affine": (lambda: [nn.RMSNorm(16, elementwise_affine=False), nn.ReLU()], FusedRMSNormDropout, 0.0),
    "linear-relu": (lambda: [nn.Linear(16, 16), nn.ReLU()], LinearBiasReLU, None),
    "linear-relu-inplace": (lambda: [nn.Linear(16, 16), nn.ReLU(inplace=True)], LinearBiasReLU, None),
    "linear-gelu": (lambda: [nn.Linear(16, 16), nn.GELU()], LinearBiasAct, None),
    "linear-gelu-tanh": (lambda: [nn.Linear(16, 16), nn.GELU(approximate="tanh")], LinearBiasAct, None),
    "linear-silu": (lambda: [nn.Linear(16, 16), nn.SiLU()], LinearBiasAct, None),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_each_pattern_is_fused_and_unfused(name, capsys):
    make, cls, p = PATTERNS[name]
    torch.manual_seed(0)
    model = _randomize(nn.Sequential(nn.Linear(8, 16), *make(), nn.Linear(16, 4)))
    fused = gpuopt_ops.fuse(model, verbose=True)
    n = len(model) - 3
    assert type(fused[1]) is cls
    assert _types(fused)[2 : 2 + n] == ["Identity"] * n and type(fused[-1]) is nn.Linear
    if p is not None:
        assert fused[1].p == p and fused[1].eps == model[1].eps
        assert (fused[1].weight is None) == (model[1].weight is None)
        assert (getattr(fused[1], "bias", None) is None) == (getattr(model[1], "bias", None) is None)
    _same_state(model, fused)
    line = capsys.readouterr().out
    assert line.startswith("gpuopt_ops.fuse: 1 (+") and cls.__name__ in line, line
    x = torch.randn(9, 8)
    torch.testing.assert_close(fused.eval()(x), model.eval()(x), atol=1e-5, rtol=1e-5)

    back = gpuopt_ops.unfuse(fused)
    assert _types(back) == _types(model)
    assert [getattr(m, "p", None) for m in back] == [getattr(m, "p", None) for m in model]
    assert [getattr(m, "inplace", None) for m in back] == [getattr(m, "inplace", None) for m in model]
    assert type(fused[1]) is cls, "unfuse(inplace=False) must not modify its argument"
    _same_state(model, back)
    torch.testing.assert_close(back.eval()(x), model.eval()(x), atol=0, rtol=0)


def test_non_patterns_are_left_alone(capsys):
    shared_relu = nn.ReLU()
    model = nn.Sequential(
        nn.LayerNorm(16),
        nn.GELU(),  # not ReLU
        nn.Dropout(0.1),
        nn.LayerNorm(16),
        nn.Tanh(),  # dropout before the norm, no ReLU after it
        nn.LayerNorm((2, 8)),
        nn.Dropout(0.1),
        nn.Tanh(),  # LN over two dimensions → Dropout without ReLU (the norm-dropout modules take one)
        nn.RMSNorm(16),
        nn.Tanh(),  # RMSNorm → not ReLU / Dropout
        nn.LayerNorm(16),
        shared_relu,  # this ReLU object is used twice
        nn.Linear(16, 16, bias=False),
        nn.ReLU(),  # no bias
        nn.Linear(16, 16),
        nn.LeakyReLU(),  # not ReLU
        nn.Linear(16, 16),
        nn.Sequential(nn.ReLU()),  # ReLU in another Sequential: not adjacent
        nn.Linear(16, 16),
        shared_relu,
    )
    fused = gpuopt_ops.fuse(model, verbose=True)
    assert _types(fused) == _types(model)
    assert capsys.readouterr().out == ""


def test_a_module_reused_elsewhere_is_not_fused():
    ln = nn.LayerNorm(16)
    model = nn.Sequential(nn.Sequential(ln, nn.ReLU()), nn.Sequential(ln, nn.Linear(16, 16), nn.ReLU()))
    fused = gpuopt_ops.fuse(model)
    assert _types(fused[0]) == ["LayerNorm", "ReLU"]
    assert _types(fused[1]) == ["LayerNorm", "LinearBiasReLU", "Identity"]


def test_nested_sequentials_inplace_and_backend():
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.LayerNorm(16), nn.ReLU(), nn.Dropout(0.2))

    class Net(nn.Module):  # a custom module holding Sequentials: fuse walks the whole tree
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Sequential(inner), nn.Linear(16, 4))

        def forward(self, x):
            return self.body(x)

    net = Net()
    params = list(net.parameters())
    out = gpuopt_ops.fuse(net, inplace=True, backend="cpu")
    assert out is net
    assert _types(inner) == ["LinearBiasReLU", "Identity", "FusedLayerNormDropoutReLU", "Identity", "Identity"]
    assert inner[0].backend == "cpu" and inner[2].backend == "cpu" and inner[2].p == 0.2
    assert [id(p) for p in net.parameters()] == [id(p) for p in params], (
        "inplace fuse keeps the Parameter objects (an optimizer built before still trains the model)"
    )
    with pytest.raises(ValueError, match="backend"):
        gpuopt_ops.fuse(net, backend="tpu")
    gpuopt_ops.unfuse(net, inplace=True)
    assert _types(inner) == ["Linear", "ReLU", "LayerNorm", "ReLU", "Dropout"]
    assert [id(p) for p in net.parameters()] == [id(p) for p in params]


# ---------------------------------------------------------------------------------------------- the Dynamo backend
class Functional(nn.Module):
    """Functional code, no nn.Sequential: only the compile backend can fuse it."""

    def __init__(self, p=0.0):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 64)
        self.p = p

    def forward(self, x):
        h = F.relu(self.fc1(x))  # linear → relu
        h = F.dropout(self.norm(h), self.p, self.training).relu()  # layer_norm → dropout → Tensor.relu
        h = torch.relu(F.layer_norm(h, (64,), self.norm.weight, None))  # layer_norm → torch.relu
        h = F.relu(self.fc2(h), inplace=True)  # linear → relu(inplace)
        return F.dropout(F.relu(F.layer_norm(h, (64,))), p=self.p, training=self.training)  # ln → relu → dropout


def _capture(log):
    """A backend that only rewrites and runs the graph eagerly (no Inductor): cheap, for the matching tests."""

    def backend(gm, example_inputs):
        log.extend(rewrite_graph(gm))
        return gm.forward

    return backend


def test_the_backend_is_registered():
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    assert "gpuopt" in list_backends(exclude_tags=())
    assert lookup_backend("gpuopt") is gpuopt_backend


def test_compiled_functional_module_runs_our_ops_and_matches_eager(capsys):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _randomize(Functional()).eval()
    x = torch.randn(16, 32)
    compiled = torch.compile(model, backend="gpuopt", options={"verbose": True})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        xa = x.clone().requires_grad_()
        out = compiled(xa)
        out.sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert "gpuopt::layer_norm_dropout_relu" in names and "gpuopt::bias_relu" in names, sorted(names)
    assert "gpuopt::layer_norm_dropout_relu_backward" in names and "gpuopt::bias_relu_backward" in names
    printed = capsys.readouterr().out
    assert printed.count("-> gpuopt::layer_norm_dropout_relu") == 3 and printed.count("gpuopt::bias_relu") == 2

    xb = x.clone().requires_grad_()
    ref = model(xb)
    grads = [prm.grad.clone() for prm in model.parameters()]
    model.zero_grad()
    ref.sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-4)
    for g, prm in zip(grads, model.parameters()):
        torch.testing.assert_close(g, prm.grad, atol=1e-5, rtol=1e-4)


def test_compiled_dropout_draws_a_fresh_plausible_mask_each_call(capsys):
    torch._dynamo.reset()
    torch.manual_seed(0)

    def f(x, w):
        return F.relu(F.dropout(F.layer_norm(x, (256,), w), 0.3, True))

    x, w = torch.randn(128, 256), torch.ones(256)
    compiled = torch.compile(f, backend="gpuopt", options={"verbose": True})
    a, b = compiled(x, w), compiled(x, w)
    positive = F.layer_norm(x, (256,)) > 0
    for out in (a, b):
        dropped = (out[positive] == 0).float().mean().item()
        assert 0.27 < dropped < 0.33, dropped
    assert not torch.equal(a, b), "each call must draw a new seed"
    assert "layer_norm → dropout → relu" in capsys.readouterr().out, "options={'verbose': True} prints the rewrite"


def test_patterns_that_must_not_be_rewritten():
    def f(x, w):
        y = F.layer_norm(x, (16,))
        a = F.relu(y) + y  # layer_norm output used twice
        d = F.dropout(F.layer_norm(x, (16,)), 0.1, True)
        b = F.relu(d) * d.sum()  # dropout output used twice: no relu fused (layer_norm → dropout alone is a site)
        c = F.gelu(F.layer_norm(x, (16,)))  # not relu
        lin = F.linear(x, w)  # no bias
        e = F.relu(lin)
        f2 = F.linear(x, w, torch.ones(16))
        return a, b, c, e, F.relu(f2) + f2  # linear output used twice

    log = []
    torch._dynamo.reset()
    out = torch.compile(f, backend=_capture(log))(torch.randn(4, 16), torch.randn(16, 16))
    assert [line.split(" (")[0] for line in log] == ["layer_norm → dropout"] and len(out) == 5, log

    log2 = []
    torch._dynamo.reset()
    torch.compile(lambda x: F.relu(F.layer_norm(x, (16,))), backend=_capture(log2))(torch.randn(4, 16))
    assert len(log2) == 1 and "layer_norm → relu" in log2[0], "the positive control must be rewritten"


def test_16_bit_linear_sites_keep_their_bias():
    """A bf16 / fp16 linear or addmm (its inputs', or autocast's) adds its bias before its one rounding: the
    linear → relu / bias_act rules leave it as it is (the output equals eager's bits), and fuse the fp32 control."""

    def f(x, w, b, a2, w2):
        r = F.relu(F.linear(x, w, b))
        g = F.gelu(torch.addmm(b, a2, w2))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            s = F.silu(F.linear(x.float(), w.float(), b.float()))
        return r, g, s

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        torch.manual_seed(0)
        args = [t.to(dtype) for t in (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16), torch.randn(8, 16))]
        args.append(torch.randn(16, 16).to(dtype))
        log = []
        torch._dynamo.reset()
        got = torch.compile(f, backend=_capture(log))(*args)
        want = f(*args)
        kinds = sorted(line.split(" (")[0] for line in log)
        if dtype == torch.float32:  # the fp32 linear and addmm fuse; the autocast one does not
            assert kinds == ["addmm → gelu", "linear → relu"], log
            torch.testing.assert_close(got, want)
        else:
            assert kinds == [], log
            assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_training_false_dropout_is_fused_with_p_zero():
    log = []
    torch._dynamo.reset()
    f = torch.compile(lambda x: F.relu(F.dropout(F.layer_norm(x, (16,)), 0.5, training=False)), backend=_capture(log))
    x = torch.randn(8, 16)
    torch.testing.assert_close(f(x), F.relu(F.layer_norm(x, (16,))), atol=1e-6, rtol=1e-6)
    assert len(log) == 1 and "training=False" in log[0]


def test_dynamic_batch_sizes_recompile_at_most_once(capsys):
    torch._dynamo.reset()
    compiles = []

    def counting(gm, example_inputs):
        compiles.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        return gpuopt_backend(gm, example_inputs, options={"verbose": True})

    torch.manual_seed(0)
    model = _randomize(Functional()).eval()
    compiled = torch.compile(model, backend=counting)
    for batch in (4, 7, 12, 33, 5):
        x = torch.randn(batch, 32)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert 1 <= len(compiles) <= 2, compiles
    printed = capsys.readouterr().out  # every compiled graph, the dynamic-shape one too, got all five rewrites
    assert printed.count("-> gpuopt::layer_norm_dropout_relu") == 3 * len(compiles), printed
    assert printed.count("-> linear + gpuopt::bias_relu") == 2 * len(compiles), printed


# ---------------------------------------------------------------------------------------------- transformer blocks
class Blocks(nn.Module):
    """Each site kind the compile backend fuses in transformers, written as the libraries write them."""

    def __init__(self, n=32):
        super().__init__()
        self.ln = nn.LayerNorm(n)
        self.rms = nn.RMSNorm(n, eps=1e-6)
        self.w = nn.Parameter(torch.randn(n))
        self.fc = nn.Linear(n, n)
        self.fc_bias, self.fc_weight = nn.Parameter(torch.randn(n)), nn.Parameter(torch.randn(n, n) / 8)

    def forward(self, x, r):
        a = self.ln(F.dropout(x, 0.1, self.training) + r)  # post-norm: dropout → add → LayerNorm
        s = r + F.dropout(a, 0.1, self.training)  # the sum is reused below: prenorm
        b = self.rms(s)  # dropout → add → nn.RMSNorm (F.rms_norm)
        t = b + x
        h = t.to(torch.float32)  # add → RMSNorm written out, as LLaMA writes it; t has another user: prenorm
        c = self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        d = F.gelu(self.fc(t * 2), approximate="tanh")  # linear → gelu(tanh)
        y = torch.addmm(self.fc_bias, c.view(-1, c.shape[-1]), self.fc_weight).view(c.shape)
        e = 0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * torch.pow(y, 3.0))))  # gelu_new
        return a + s + c + d + e + F.silu(self.fc(a))


def test_transformer_block_sites_are_rewritten_and_match_eager():
    torch.manual_seed(0)
    model = _randomize(Blocks()).eval()
    x, r = torch.randn(3, 5, 32), torch.randn(3, 5, 32)
    log = []
    torch._dynamo.reset()
    got = torch.compile(model, backend=_capture(log))(x, r)
    kinds = sorted(line.split(" (")[0] for line in log)
    assert kinds == sorted(
        [
            "dropout → add → layer_norm",
            "dropout → add → rms_norm",
            "add → written-out RMSNorm",
            "linear → gelu_tanh",
            "addmm → view → gelu_tanh",
            "linear → silu",
        ]
    ), log
    assert sum("prenorm" in line for line in log) == 2, log  # the other uses of s and t take the op's sum output
    torch.testing.assert_close(got, model(x, r), atol=1e-5, rtol=1e-5)


def test_block_patterns_that_must_not_be_rewritten():
    def f(x, r, rb, w):
        a = F.layer_norm(F.dropout(x, 0.1, False) + r[:1], (16,))  # broadcast residual: another function
        b = F.layer_norm(x.half() + rb, (16,))  # fp16 + bf16 promotes to fp32: neither operand is the sum's type
        c = F.layer_norm((x + r).view(4, 2, 8), (2, 8))  # normalized over two dimensions
        d = F.layer_norm(x + r, (16,), eps=0.0)  # eps = 0: the op requires eps > 0
        e = F.gelu(F.linear(x, w), approximate="tanh")  # no bias
        g = F.layer_norm(x, (16,))  # a plain norm: nothing to fuse
        return a, b, c, d, e, g

    log = []
    torch._dynamo.reset()
    x, r = torch.randn(4, 16), torch.randn(4, 16)
    out = torch.compile(f, backend=_capture(log))(x, r, r.to(torch.bfloat16), torch.randn(16, 16))
    assert log == [] and len(out) == 6


def test_a_16_bit_branch_on_an_fp32_residual_is_rewritten_exactly():
    """bf16 + fp32 sums in fp32 (autocast's matmul outputs on the fp32 residual stream): the op takes the branch
    converted to fp32, which is exact, so the result is the unfused one, in fp32, either operand order."""

    def f(x, rb, w, b):
        return F.layer_norm(x + rb, (16,), w, b), F.layer_norm(rb + F.dropout(x, 0.0, True), (16,), w, b)

    log = []
    torch._dynamo.reset()
    x, rb = torch.randn(4, 16), torch.randn(4, 16).to(torch.bfloat16)
    w, b = torch.randn(16), torch.randn(16)
    got = torch.compile(f, backend=_capture(log))(x, rb, w, b)
    assert [line.split(" →")[0] for line in log] == ["16-bit branch", "16-bit residual"], log
    for g, e in zip(got, f(x, rb, w, b)):
        assert g.dtype == e.dtype == torch.float32
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-6)


def test_norm_dropout_sites_are_rewritten_and_match_eager():
    """norm → dropout (→ relu) without an add before it: LayerNorm (BERT's embeddings), F.rms_norm, the written-out
    RMSNorm; in training the kept elements carry the norm's value times the scale, in eval the plain function."""

    class NormDropout(nn.Module):
        def __init__(self, n=32):
            super().__init__()
            self.ln, self.rms = nn.LayerNorm(n), nn.RMSNorm(n, eps=1e-6)
            self.w = nn.Parameter(torch.randn(n))

        def forward(self, x):
            a = F.dropout(self.ln(x), 0.2, self.training)  # layer_norm → dropout
            b = torch.relu(F.dropout(self.rms(a * 3), 0.2, self.training))  # rms_norm → dropout → relu
            h = b.to(torch.float32)
            c = self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
            return a, F.dropout(c, 0.2, self.training)  # written-out RMSNorm → dropout

    torch.manual_seed(0)
    model = _randomize(NormDropout())
    x = torch.randn(4, 7, 32)
    log = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=_capture(log))
    got = compiled.eval()(x)[1]
    kinds = sorted(line.split(" (")[0] for line in log)
    assert kinds == sorted(["layer_norm → dropout", "rms_norm → dropout → relu", "written-out RMSNorm → dropout"]), log
    assert all("gpuopt::norm_dropout" in line for line in log), log
    torch.testing.assert_close(got, model.eval()(x)[1], atol=1e-5, rtol=1e-5)
    model.train()
    torch.manual_seed(3)
    a, _ = compiled(x)
    dropped = (a == 0).float().mean().item()
    assert 0.1 < dropped < 0.3, dropped  # LayerNorm → dropout's share (p = 0.2), drawn in training
    kept = a != 0
    torch.testing.assert_close(a[kept], (model.ln(x) / 0.8)[kept], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- benchmark smoke test
def test_model_benchmark_quick_run(capsys):
    from benchmarks import model as BM

    result = BM.run(BM.parse_args(["--quick", "--device", "cpu"]))
    out = capsys.readouterr().out
    assert "fused / stock step time" in out and "stock" in out and "fused" in out
    assert result["stock"] > 0 and result["fused"] > 0
    assert result["ratio"] == pytest.approx(result["fused"] / result["stock"])

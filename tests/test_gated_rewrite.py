"""The compile backend's gated-MLP rule: `act(gate) * up` (either order) and the [gate | up] halves of one tensor
(chunk, split, slices) become one `gpuopt::gated_act`, with eager's results; the forms that are not the same
function, or that the proof obligations refuse, are left alone."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gpuopt_ops  # noqa: F401  (registers the "gpuopt" backend)
from gpuopt_ops.compile_backend import rewrite_graph

N, F_ = 24, 40


def _capture(log):
    """A backend that only rewrites and runs the graph eagerly (no Inductor): cheap, for the matching tests."""

    def backend(gm, example_inputs):
        log.extend(rewrite_graph(gm))
        return gm.forward

    return backend


def _gelu_written(g):
    return 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * torch.pow(g, 3.0))))


def _gelu_hf_python(g):  # transformers' GELUTanh(use_gelu_tanh_python=True)
    return g * 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * torch.pow(g, 3.0))))


def _gelu_bloom(g):
    return 0.5 * g * (1.0 + torch.tanh(0.79788456 * g * (1 + 0.044715 * g * g)))


# name -> (forward body on gate g and up u, the act the rewrite names)
TWO_TENSOR = {
    "silu": (lambda g, u: F.silu(g) * u, "silu"),
    "silu-up-first": (lambda g, u: u * F.silu(g), "silu"),
    "gelu": (lambda g, u: F.gelu(g) * u, "gelu"),
    "gelu-tanh": (lambda g, u: u * F.gelu(g, approximate="tanh"), "gelu_tanh"),
    "relu": (lambda g, u: F.relu(g) * u, "relu"),
    "relu-method": (lambda g, u: u * g.relu(), "relu"),
    "torch-mul": (lambda g, u: torch.mul(torch.relu(g), u), "relu"),
    "silu-written": (lambda g, u: (g * torch.sigmoid(g)) * u, "silu"),
    "silu-written-sigmoid-first": (lambda g, u: u * (g.sigmoid() * g), "silu"),
    "gelu-written": (lambda g, u: _gelu_written(g) * u, "gelu_tanh"),
    "gelu-written-hf": (lambda g, u: u * _gelu_hf_python(g), "gelu_tanh"),
    "gelu-written-bloom": (lambda g, u: _gelu_bloom(g) * u, "gelu_tanh"),
}


class TwoProj(nn.Module):
    """gate_proj / up_proj / down_proj with the body under test between them (LLaMA's MLP when body is silu)."""

    def __init__(self, body, bias=False, dtype=torch.float32):
        super().__init__()
        self.body = body
        self.gate_proj = nn.Linear(N, F_, bias=bias, dtype=dtype)
        self.up_proj = nn.Linear(N, F_, bias=bias, dtype=dtype)
        self.down_proj = nn.Linear(F_, N, bias=False, dtype=dtype)

    def forward(self, x):
        return self.down_proj(self.body(self.gate_proj(x), self.up_proj(x)))


# name -> (forward of the fused layout on y = gate_up_proj(x), the act); Phi-3 writes the chunk form
PACKED = {
    "chunk": (lambda y: (lambda g, u: u * F.silu(g))(*y.chunk(2, dim=-1)), "silu"),
    "torch-chunk": (lambda y: (lambda g, u: F.silu(g) * u)(*torch.chunk(y, 2, -1)), "silu"),
    "split": (lambda y: (lambda g, u: F.gelu(g) * u)(*y.split(F_, dim=-1)), "gelu"),
    "split-list": (lambda y: (lambda g, u: u * F.relu(g))(*torch.split(y, [F_, F_], dim=2)), "relu"),
    "slices": (lambda y: F.silu(y[..., :F_]) * y[..., F_:], "silu"),
    "slices-full": (lambda y: F.gelu(y[:, :, 0:F_], approximate="tanh") * y[:, :, F_ : 2 * F_], "gelu_tanh"),
}


class OneProj(nn.Module):
    def __init__(self, body, dtype=torch.float32):
        super().__init__()
        self.body = body
        self.gate_up_proj = nn.Linear(N, 2 * F_, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(F_, N, bias=False, dtype=dtype)

    def forward(self, x):
        return self.down_proj(self.body(self.gate_up_proj(x)))


def _check(model, x, want_log, dtype=torch.float32):
    """Eval and training (outputs, input and parameter gradients) against eager; the rewrite log as expected."""
    tol = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}[dtype]
    log = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=_capture(log))
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    want = model(x1)
    want.float().square().sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    got = compiled(x2)
    got.float().square().sum().backward()
    assert [line.split(" -> ")[1] for line in log] == want_log, log
    rtol, atol = tol
    scale = want.detach().abs().max().item()
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol * scale)
    torch.testing.assert_close(x2.grad, x1.grad, rtol=rtol * 10, atol=atol * 10 * x1.grad.abs().max().item())
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[k], rtol=rtol * 10, atol=atol * 10 * grads[k].abs().max(), msg=k)
    return log


@pytest.mark.parametrize("name", list(TWO_TENSOR))
def test_two_tensor_forms_are_rewritten_with_eager_results(name):
    body, act = TWO_TENSOR[name]
    torch.manual_seed(0)
    model = TwoProj(body)
    _check(model, torch.randn(3, 5, N), [f"gpuopt::gated_act ({act})"])


@pytest.mark.parametrize("name", list(PACKED))
def test_halves_of_one_projection_use_the_packed_layout(name):
    body, act = PACKED[name]
    torch.manual_seed(0)
    log = _check(OneProj(body), torch.randn(3, 5, N), [f"gpuopt::gated_act ({act})"])
    assert "[gate | up] halves" in log[0], log


def test_gate_projection_with_a_bias_goes_into_the_gated_op():
    """LLaMA with mlp_bias: the gated rule runs before bias_act / bias_relu, so the linear keeps its bias and the
    activation, the product and nothing else become gated_act."""
    torch.manual_seed(0)
    for act_body, act in ((TWO_TENSOR["silu"][0], "silu"), (TWO_TENSOR["relu"][0], "relu")):
        log = _check(TwoProj(act_body, bias=True), torch.randn(4, N), [f"gpuopt::gated_act ({act})"])
        assert len(log) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_sites_are_rewritten_and_closer_to_fp64_than_eager(dtype):
    """The op computes in fp32 and rounds once, as Inductor's generated code does for a 16-bit pointwise chain;
    eager rounds the activation and the product. The rewritten graph is at least as close to fp64 as eager."""
    torch.manual_seed(0)
    model = TwoProj(TWO_TENSOR["silu"][0], dtype=dtype)
    x = torch.randn(64, N).to(dtype)
    _check(model, x, ["gpuopt::gated_act (silu)"], dtype=dtype)
    log = []
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend=_capture(log))(x).double()
        want = model(x).double()
        g, u = model.gate_proj(x), model.up_proj(x)
        exact_h = F.silu(g.double()) * u.double()
        ours_h = gpuopt_ops.gated_act(g, u).double()
        eager_h = (F.silu(g) * u).double()
    assert (ours_h - exact_h).abs().max() <= (eager_h - exact_h).abs().max()
    assert (got - want).abs().max() <= 4 * torch.finfo(dtype).eps * want.abs().max()


def test_autocast_sites_are_rewritten():
    """Under torch.autocast(bf16) both projections give bf16 and the whole site sits in one autocast region."""
    torch.manual_seed(0)
    model = TwoProj(TWO_TENSOR["silu"][0])
    x = torch.randn(4, 6, N)
    log = []
    torch._dynamo.reset()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
        got = torch.compile(model, backend=_capture(log))(x)
    assert [line.split(" -> ")[1] for line in log] == ["gpuopt::gated_act (silu)"], log
    assert got.dtype == want.dtype == torch.bfloat16
    assert (got.float() - want.float()).abs().max() <= 2e-2 * want.float().abs().max()


def test_forms_that_are_not_the_same_function_are_left_alone():
    def f(g, u, ub, row, w):
        a = F.silu(g) * row  # broadcasting: up of another shape
        b = F.silu(g) * ub  # fp32 * bf16 promotes: another dtype
        s = F.silu(g)
        d = s * u  # the activation has another user (returned)
        e = F.silu(g) * 2.0  # a constant, not a tensor
        h = torch.sigmoid(g) * u  # sigmoid alone is no activation of the op
        k = F.silu(g) * u
        k.mul_(2.0)  # the product written in place afterwards: refused by obligation (4)
        return a, b, d, s, e, h, k

    g, u = torch.randn(4, 16), torch.randn(4, 16)
    args = (g, u, u.to(torch.bfloat16), torch.randn(16), torch.randn(16, 16))
    log = []
    torch._dynamo.reset()
    got = torch.compile(f, backend=_capture(log))(*args)
    want = f(*args)
    assert log == [], log
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_proof_obligations_refuse_mutation_and_mode_changes():
    def inplace_gate(g, u):
        a = F.silu(g)
        g.mul_(2.0)  # gate written between the activation and the product
        return a * u

    def inplace_up(g, u):
        a = F.silu(g)
        u.add_(1.0)  # up written after the activation: the product reads the new u, the op would too, but the
        return a * u  # span holds a write: refused

    def inplace_after(g, u):
        out = F.silu(g) * u
        g.mul_(2.0)  # an input of the op written after it (autograd would save a changed tensor)
        return out

    def autocast_between(g, u):
        a = F.silu(g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = a * u
        return out

    def grad_mode_between(g, u):
        a = F.silu(g)
        with torch.no_grad():
            out = a * u
        return out

    def inplace_activation(g, u):
        return F.silu(g, inplace=True) * u  # the caller's gate changes too: not the op's function

    def inplace_relu(g, u):
        return torch.relu_(g) * u

    cases = (inplace_gate, inplace_up, inplace_after, autocast_between, grad_mode_between, inplace_activation)
    for fn in (*cases, inplace_relu):
        g, u = torch.randn(4, 16), torch.randn(4, 16)
        log = []
        torch._dynamo.reset()
        g1, u1, g2, u2 = g.clone(), u.clone(), g.clone(), u.clone()
        got = torch.compile(fn, backend=_capture(log))(g1, u1)
        want = fn(g2, u2)
        assert log == [], (fn.__name__, log)
        torch.testing.assert_close(got, want, msg=fn.__name__)
        torch.testing.assert_close(g1, g2, msg=fn.__name__)  # the inputs after the call too
        torch.testing.assert_close(u1, u2, msg=fn.__name__)


def test_halves_that_are_not_gate_then_up_use_two_tensors():
    """act on the second half (up first in the layout), or halves of another dimension: still the same function
    with two (strided) tensors, never the packed layout."""
    torch.manual_seed(0)

    def second_half(y):
        u, g = y.chunk(2, dim=-1)
        return F.silu(g) * u

    log = _check(OneProj(second_half), torch.randn(3, N), ["gpuopt::gated_act (silu)"])
    assert "gate, up" in log[0], log

    def first_dim(y):
        g, u = y.chunk(2, dim=0)
        return (F.silu(g) * u)[..., :F_]  # down_proj takes F_ features

    log = _check(OneProj(first_dim), torch.randn(4, N), ["gpuopt::gated_act (silu)"])
    assert "gate, up" in log[0], log


@pytest.mark.slow
def test_inductor_compiles_the_rewritten_site_and_its_difference_from_eager_is_inductors():
    """The default path (Inductor after the rewrite) against eager in bf16, beside Inductor alone: the rewritten
    graph differs from eager by no more than Inductor's own graph does (both compute the chain in fp32)."""
    torch.manual_seed(0)
    model = TwoProj(TWO_TENSOR["silu"][0], dtype=torch.bfloat16)
    x = torch.randn(64, N).to(torch.bfloat16)
    with torch.no_grad():
        want = model(x).float()
        torch._dynamo.reset()
        ind = torch.compile(model, backend="inductor")(x).float()
        torch._dynamo.reset()
        ours = torch.compile(model, backend="gpuopt")(x).float()
    torch._dynamo.reset()
    d_ind, d_ours = (ind - want).abs().max().item(), (ours - want).abs().max().item()
    assert d_ours <= max(2 * d_ind, 4 * torch.finfo(torch.bfloat16).eps * want.abs().max().item()), (d_ours, d_ind)

"""The providers of benchmarks.run: for each (provider, op, mode) a no-argument runner of one timed iteration on
the case's tensors (`make_runner`), or `Skip` with the reason where the provider cannot run here. The providers
are listed in benchmarks/run.py's docstring."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

# the transformer blocks: gpuopt's own op, eager and compile only
BLOCK_OPS = ("dan_ln", "add_rms", "ln_drop", "bias_gelu")
# the gated MLP activation (gpuopt_ops.gated_act): two tensors, or one [gate | up] tensor
GATED_OPS = ("gated", "gated_packed")
EPS = 1e-5


class Skip(Exception):
    """A provider that cannot run here (the reason goes into the notes)."""


def _import_gpuopt():
    import gpuopt_ops  # noqa: F401

    return gpuopt_ops


_TRITON_STATE: dict[str, object] = {}


def _triton_available() -> None:
    if "err" not in _TRITON_STATE:
        try:
            from gpuopt_ops import triton_ops  # noqa: F401

            _TRITON_STATE["err"] = None
        except Exception as err:  # noqa: BLE001
            _TRITON_STATE["err"] = f"gpuopt_ops.triton_ops unavailable ({type(err).__name__}: {err})"
    if _TRITON_STATE["err"]:
        raise Skip(_TRITON_STATE["err"])


def _eager(op: str) -> Callable:
    """The unfused PyTorch code a user writes without gpuopt (gpuopt_ops.reference, shared with the tests)."""
    _import_gpuopt()
    from gpuopt_ops import reference as R

    if op == "ldr":
        return lambda x, w, b, p: R.eager_layer_norm_dropout_relu(x, w, b, p, True, EPS)
    return R.eager_bias_relu


_COMPILED: dict[tuple, Callable] = {}


def _compiled(op: str, device: str) -> Callable:
    key = (op, device)
    if key not in _COMPILED:
        import torch._dynamo

        # one code object serves every shape/dtype/mode: lift the recompile limits so nothing falls back to eager
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 1024)
        if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
            torch._dynamo.config.accumulated_cache_size_limit = 4096
        if hasattr(torch._dynamo.config, "accumulated_recompile_limit"):
            torch._dynamo.config.accumulated_recompile_limit = 4096
        fn = _eager(op)
        kwargs = {"mode": "max-autotune"} if device == "cuda" else {}
        _COMPILED[key] = torch.compile(fn, dynamic=False, **kwargs)
    return _COMPILED[key]


def forward_fn(provider: str, op: str, device: str, p: float) -> Callable:
    """The callable (x, w, b) -> out of a provider for op (bias_relu ignores w)."""
    if provider in ("cuda", "cpu"):
        if (provider == "cuda") != (device == "cuda"):
            raise Skip(f"provider {provider} does not run on device {device}")
        g = _import_gpuopt()
        if op == "ldr":
            return lambda x, w, b: g.layer_norm_dropout_relu(x, x.shape[-1], w, b, p=p, backend=provider)
        return lambda x, w, b: g.bias_relu(x, b, backend=provider)
    if provider == "triton":
        if device != "cuda":
            raise Skip("provider triton is benchmarked on GPU only (the CPU interpreter is not a benchmark)")
        g = _import_gpuopt()
        _triton_available()
        if op == "ldr":
            return lambda x, w, b: g.layer_norm_dropout_relu(x, x.shape[-1], w, b, p=p, backend="triton")
        return lambda x, w, b: g.bias_relu(x, b, backend="triton")
    if provider == "eager":
        fn = _eager(op)
        if op == "ldr":
            return lambda x, w, b: fn(x, w, b, p)
        return lambda x, w, b: fn(x, b)
    if provider == "compile":
        cf = _compiled(op, device)
        if device == "cuda":

            def run(x, w, b):
                torch.compiler.cudagraph_mark_step_begin()
                return cf(x, w, b, p) if op == "ldr" else cf(x, b)

            return run
        return (lambda x, w, b: cf(x, w, b, p)) if op == "ldr" else (lambda x, w, b: cf(x, b))
    if provider == "liger":
        _peer_runs("liger", device, op)
        layer_norm = _peer_import("liger_kernel", "liger_kernel.ops.layer_norm", "LigerLayerNormFunction")
        return lambda x, w, b: F.relu(F.dropout(layer_norm.apply(x, w, b, EPS), p, True))
    raise ValueError(f"unknown provider {provider!r}")


def _peer_runs(provider: str, device: str, op: str) -> None:
    """A peer library's provider (liger, quack) of ldr runs on GPU only and has no other op: else Skip."""
    if device != "cuda":
        raise Skip(f"{provider} runs on GPU only")
    if op != "ldr":
        raise Skip(f"{provider} has no {op}")


def _peer_import(what: str, module: str, *names: str):
    """`from module import *names` of a peer library (one object, or a list of several), or Skip naming `what`
    when that fails (not installed, broken, or another version)."""
    try:
        found = [getattr(importlib.import_module(module), name) for name in names]
    except Exception as err:  # noqa: BLE001
        raise Skip(f"{what} not importable ({type(err).__name__}: {err})") from None
    return found[0] if len(found) == 1 else found


def _quack_runner(op: str, mode: str, device: str, x, w, b, g) -> Callable[[], object]:
    """The norm-only anchor: the quack-kernels LayerNorm (fp32 weight and bias) without dropout or ReLU, forward
    and/or its backward kernel, on the same x and grad_out (the speed a plain normalisation reaches)."""
    _peer_runs("quack", device, op)
    layernorm_bwd, layernorm_fwd = _peer_import("quack", "quack.rmsnorm", "layernorm_bwd", "layernorm_fwd")
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    w32, b32 = w.float(), b.float()
    _, rstd, mean = layernorm_fwd(x2, w32, b32, EPS, return_rstd=True, return_mean=True)
    if mode == "fwd":
        return lambda: layernorm_fwd(x2, w32, b32, EPS)
    if mode == "bwd":
        return lambda: layernorm_bwd(x2, w32, g2, rstd, mean, has_bias=True)

    def run():
        _, r, mu = layernorm_fwd(x2, w32, b32, EPS, return_rstd=True, return_mean=True)
        return layernorm_bwd(x2, w32, g2, r, mu, has_bias=True)

    return run


def _block_eager(op: str, p: float) -> Callable:
    """The unfused PyTorch code of a transformer block op, (x, w, b, r) -> output(s)."""
    if op == "dan_ln":

        def dan_ln(x, w, b, r):
            s = F.dropout(x, p, True) + r
            return F.layer_norm(s, (x.shape[-1],), w, b, EPS), s

        return dan_ln
    if op == "add_rms":

        def add_rms(x, w, b, r):
            s = x + r
            return F.rms_norm(s, (x.shape[-1],), w, EPS), s

        return add_rms
    if op == "ln_drop":
        return lambda x, w, b, r: F.dropout(F.layer_norm(x, (x.shape[-1],), w, b, EPS), p, True)
    return lambda x, w, b, r: F.gelu(x + b)


def _gpuopt_on(provider: str, device: str):
    """gpuopt_ops for a gpuopt provider (cuda, cpu, triton) that runs on `device`, else Skip."""
    if (provider == "cpu") == (device == "cuda"):
        raise Skip(f"provider {provider} does not run on device {device}")
    g = _import_gpuopt()
    if provider == "triton":
        _triton_available()
    return g


def block_forward_fn(provider: str, op: str, device: str, p: float) -> Callable:
    """The callable (x, w, b, r) -> output(s) of a provider for a transformer block op."""
    if provider in ("cuda", "cpu", "triton"):
        g = _gpuopt_on(provider, device)
        if op == "dan_ln":
            return lambda x, w, b, r: g.dropout_add_norm(x, r, w, b, p=p, prenorm=True, backend=provider)
        if op == "add_rms":
            return lambda x, w, b, r: g.dropout_add_norm(
                x, r, w, None, norm="rms", eps=EPS, prenorm=True, backend=provider
            )
        if op == "ln_drop":
            return lambda x, w, b, r: g.norm_dropout(x, w, b, p=p, backend=provider)
        return lambda x, w, b, r: g.bias_act(x, b, act="gelu", backend=provider)
    if provider == "eager":
        return _block_eager(op, p)
    if provider == "compile":
        key = ("block", op, device)
        if key not in _COMPILED:
            _compiled("ldr", device)  # lifts the recompile limits once
            kwargs = {"mode": "max-autotune"} if device == "cuda" else {}
            _COMPILED[key] = torch.compile(_block_eager(op, p), dynamic=False, **kwargs)
        return _COMPILED[key]
    raise Skip(f"{provider} has no {op}")


def gated_forward_fn(provider: str, op: str, device: str, p: float, act: str) -> Callable:
    """The callable (gate, up) -> out of a provider for a gated op (up None: gate holds [gate | up])."""
    if provider in ("cuda", "cpu", "triton"):
        g = _gpuopt_on(provider, device)
        return lambda gate, up: g.gated_act(gate, up, act=act, p=p, backend=provider)
    if provider == "eager":
        _import_gpuopt()
        from gpuopt_ops import reference as R

        return lambda gate, up: R.eager_gated_act(gate, up, act, p, True)
    if provider == "compile":
        key = ("gated", act, p, device)
        if key not in _COMPILED:
            _compiled("ldr", device)  # lifts the recompile limits once
            _import_gpuopt()
            from gpuopt_ops import reference as R

            def composition(gate, up):
                return R.eager_gated_act(gate, up, act, p, True)

            kwargs = {"mode": "max-autotune"} if device == "cuda" else {}
            _COMPILED[key] = torch.compile(composition, dynamic=False, **kwargs)
        cf = _COMPILED[key]
        if device == "cuda":

            def run(gate, up):
                torch.compiler.cudagraph_mark_step_begin()
                return cf(gate, up)

            return run
        return cf
    if provider == "liger":
        if device != "cuda":
            raise Skip("liger runs on GPU only")
        if op != "gated" or act != "silu" or p > 0:
            raise Skip("liger's SwiGLU is silu on two tensors without dropout (gated with --act silu, --gated-p 0)")
        return _peer_import("liger_kernel's SwiGLU", "liger_kernel.ops.swiglu", "LigerSiLUMulFunction").apply
    raise Skip(f"{provider} has no {op}")


def _gated_runner(provider: str, op: str, mode: str, device: str, p: float, act: str, x, r, g) -> Callable[[], object]:
    """gate = x, up = r (op gated), or one (M, 2N) tensor [x | r] (gated_packed); g is the output's gradient. liger
    runs on copies of x and r: its backward overwrites the tensors it saved with the gradients."""
    f = gated_forward_fn(provider, op, device, p, act)
    if op == "gated_packed":
        gate = torch.cat([x.detach(), r.detach()], dim=-1).requires_grad_(True)
        inputs, up = (gate,), None
    elif provider == "liger":
        gate, up = x.detach().clone().requires_grad_(True), r.detach().clone().requires_grad_(True)
        inputs = (gate, up)
    else:
        gate, up = x, r
        inputs = (x, r)
    return _mode_runner(mode, lambda: f(gate, up), inputs, g)


def make_runner(
    provider: str, op: str, mode: str, device: str, p: float, x, w, b, g, r=None, act: str = "silu"
) -> Callable[[], object]:
    """A no-argument callable that runs one timed iteration of (provider, op, mode) on the given inputs (gated ops:
    p is their dropout probability, act their activation)."""
    if provider == "copy":
        y = torch.empty_like(x)
        return lambda: y.copy_(x)
    if provider == "quack":
        return _quack_runner(op, mode, device, x, w, b, g)
    if op in GATED_OPS:
        return _gated_runner(provider, op, mode, device, p, act, x, r, g)
    if op in BLOCK_OPS:
        fb = block_forward_fn(provider, op, device, p)
        inputs = {"dan_ln": (x, r, w, b), "add_rms": (x, r, w), "ln_drop": (x, w, b), "bias_gelu": (x, b)}[op]

        def f(x, w, b):
            y = fb(x, w, b, r)
            return y[0] if isinstance(y, tuple) else y  # the sum's gradient: none (as a last block)

    else:
        f = forward_fn(provider, op, device, p)
        inputs = (x, w, b) if op == "ldr" else (x, b)
    return _mode_runner(mode, lambda: f(x, w, b), inputs, g)


def _mode_runner(mode: str, forward: Callable[[], torch.Tensor], inputs, g) -> Callable[[], object]:
    """One timed iteration of a mode on forward() (a call of the provider on the case's tensors): fwd under
    no_grad; bwd the gradient of one forward taken now (its graph kept for the next iteration); fwd+bwd both."""
    if mode == "fwd":

        def run():
            with torch.no_grad():
                return forward()

        return run
    if mode == "bwd":
        with torch.enable_grad():
            y = forward()
        return lambda: torch.autograd.grad(y, inputs, g, retain_graph=True)
    if mode == "fwd+bwd":

        def run():
            with torch.enable_grad():
                y = forward()
            return torch.autograd.grad(y, inputs, g)

        return run
    raise ValueError(mode)

"""Small programs from the grammar of the `torch.compile(backend="gpuopt")` rewriter's patterns, and of the chains
`gpuopt_ops.fuse()` replaces, with the perturbations that must not change what a program computes; and the
differential check of one program: compiled (or fused) against eager, in eval and in training.

A program is Python source (the body of `forward(self, x, r, t)`) executed into a fresh nn.Module class, so a
failure prints exactly the code that went wrong. `Spec` is what the generator draws; `build(spec)` writes the
source; `check_compiled` / `check_fused` run the comparison and raise AssertionError with the program and the
rewrites in the message.

Families (compile_backend.py's module docstring):

- "norm_chain": a norm (F.layer_norm, nn.LayerNorm, F.rms_norm, nn.RMSNorm, RMSNorm written out) → dropout /
  relu chains (layer_norm_dropout_relu and norm_dropout sites);
- "residual": norm(dropout(h) + r), norm(r + dropout(h)), norm(h + r), norm(dropout(h)), the sum returned too or
  not (pre-norm) (dropout_add_norm sites);
- "bias_act": F.linear / torch.addmm (+ a view) with a bias → relu (three spellings), gelu (both
  approximations), the tanh GELU written out, silu (bias_relu and bias_act sites);
- "gated": the gated MLP, act(gate) * up in either order with gate and up from two bias-free linears, or the
  halves of one projection's output (chunk, split, slices: Phi-3's gate_up_proj), act silu, gelu (both
  approximations), relu (two spellings), SiLU and the tanh GELU written out; a dropout after it when p > 0
  (gated_act sites).

Perturbations: another user of an inner value, `d + d` (gated: `a * a`, `a * gate`), in-place ops inside the
pattern, on its inputs between its first and last node, and outside it; views that keep or change the last dim; a
dtype cast inside the pattern; an autocast region around part of it; broadcasting or larger residuals; eps variants
(None, 0); weight / bias present or not; parameters in fp32 under 16-bit inputs; (gated) an autocast region around
the product alone, the halves of a projection swapped or taken along another dimension.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import linecache
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

import gpuopt_ops  # registers the "gpuopt" backend

DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# max |compiled - eager| / max |eager| allowed, by the least precise dtype the program computes in. A wrong eps in
# bf16 moves results by 0.3-0.8 of the max; rounding the same values in another order moves them by a few ulps.
OUT_TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}
GRAD_TOL = {torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 2e-2}

NORMS = ("ln", "ln_module", "rms", "rms_module", "rms_written")
CHAINS = (("dropout", "relu"), ("relu", "dropout"), ("relu",), ("dropout",))
RESIDUALS = ("dropout_add", "add_dropout", "add", "dropout")
ACTS = ("relu", "relu_method", "torch_relu", "gelu", "gelu_tanh", "gelu_written", "silu")
GATED_ACTS = ("silu", "gelu", "gelu_tanh", "relu", "relu_method", "silu_written", "gelu_written")
GATED_FORMS = ("two", "two_up_first", "chunk", "split", "slices")
PERTURBATIONS = {
    "norm_chain": (
        "none",
        "other_user",
        "inplace_inside",
        "inplace_source",
        "inplace_before",
        "inplace_outside",
        "view_keep",
        "view_change",
        "cast",
        "autocast_first",
        "autocast_rest",
    ),
    "residual": (
        "none",
        "other_user",
        "self_add",
        "inplace_inside",
        "inplace_source",
        "inplace_before",
        "inplace_outside",
        "view_keep",
        "cast",
        "autocast_first",
        "autocast_rest",
        "broadcast",
        "bigger_residual",
    ),
    "bias_act": (
        "none",
        "other_user",
        "inplace_inside",
        "inplace_source",
        "inplace_before",
        "inplace_outside",
        "view_keep",
        "view_change",
        "cast",
        "autocast_first",
        "autocast_rest",
    ),
    "gated": (
        "none",
        "other_user",
        "self_mul",
        "inplace_inside",
        "inplace_source",
        "inplace_before",
        "inplace_outside",
        "view_keep",
        "cast",
        "broadcast",
        "autocast_first",
        "autocast_rest",
        "autocast_between",
        "halves_swapped",
    ),
}
# perturbations after which the rewriter must still fuse (the pattern itself is intact)
KEEPS_FUSION = {"none", "inplace_before"}


@dataclasses.dataclass(frozen=True)
class Spec:
    family: str
    dtype: torch.dtype = torch.float32
    n: int = 32
    lead: tuple = (4,)
    scale: float = 1.0
    norm: str = "ln"
    eps: Optional[float] = None  # None: the op's default
    weight: bool = True
    bias: bool = True
    param_fp32: bool = False
    chain: tuple = ("dropout", "relu")
    residual: str = "dropout_add"
    prenorm: bool = False
    linear: str = "linear"
    act: str = "gelu"
    gated: str = "two"  # the gated family's form: GATED_FORMS
    p: float = 0.0
    perturb: str = "none"
    choice: int = 0  # which inner value / which variant the perturbation picks
    seed: int = 0


@dataclasses.dataclass
class Program:
    spec: Optional[Spec]
    source: str
    module: nn.Module
    inputs: dict  # name -> tensor (x, r, t)
    tol_dtype: torch.dtype
    fuses: bool  # the rewriter must fuse at least one site
    grad_inputs: tuple = ("x", "r")
    mask_check: Optional[str] = None  # how a p > 0 training run is checked: "chain" | "prenorm" | None

    def describe(self) -> str:
        return f"{self.spec}\n{self.source}" if self.spec is not None else self.source


class ProgramModule(nn.Module):
    """Holds a program's parameters; `forward` is the program (set on a subclass per program)."""


_COUNTER = itertools.count()


def make_program(
    source: str,
    params: dict,
    inputs: dict,
    *,
    tol_dtype=torch.float32,
    fuses=False,
    spec=None,
    grad_inputs=("x", "r"),
    mask_check=None,
) -> Program:
    """A Program from the body of `forward(self, x, r, t)`; params: attribute name -> tensor / module / None."""
    body = "\n".join("    " + ln for ln in source.strip("\n").splitlines())
    text = f"def forward(self, x, r=None, t=None):\n{body}\n"
    filename = f"<rewriter-program-{next(_COUNTER)}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)  # tracebacks show the source
    scope = {"torch": torch, "F": F, "math": math}
    exec(compile(text, filename, "exec"), scope)
    cls = type("Program", (ProgramModule,), {"forward": scope["forward"]})
    module = cls()
    for name, value in params.items():
        if isinstance(value, nn.Module):
            setattr(module, name, value)
        elif isinstance(value, torch.Tensor):
            setattr(module, name, nn.Parameter(value))
        else:
            setattr(module, name, value)
    return Program(spec, text, module, inputs, tol_dtype, fuses, grad_inputs, mask_check)


# ---------------------------------------------------------------------------------------------- the generator
def _other(dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if dtype == torch.float32 else torch.float32


def _norm_lines(spec: Spec, src: str, out: str, params: dict, gen: torch.Generator):
    """Lines computing out = norm(src), and the names of the inner values a perturbation may give another user."""
    n, dt = spec.n, spec.dtype
    pdt = torch.float32 if spec.param_fp32 else dt

    def param(offset):
        return (torch.randn(n, generator=gen, dtype=torch.float64) * 0.5 + offset).to(pdt)

    w = "self.w" if spec.weight else "None"
    b = "self.b" if spec.bias else "None"
    params["w"] = param(1.0) if spec.weight else None
    params["b"] = param(0.0) if spec.bias else None
    eps = "" if spec.eps is None else f", eps={spec.eps!r}"
    if spec.norm == "ln":
        return [f"{out} = F.layer_norm({src}, ({n},), {w}, {b}{eps})"], []
    if spec.norm == "rms":
        return [f"{out} = F.rms_norm({src}, ({n},), {w}{eps})"], []
    if spec.norm in ("ln_module", "rms_module"):
        if spec.norm == "ln_module":
            module = nn.LayerNorm(
                n, eps=1e-5 if spec.eps is None else spec.eps, elementwise_affine=spec.weight, bias=spec.bias
            )
        else:
            module = nn.RMSNorm(n, eps=spec.eps, elementwise_affine=spec.weight)
        with torch.no_grad():
            for name in ("weight", "bias"):
                if getattr(module, name, None) is not None:
                    getattr(module, name).copy_(params[name[0]])
        params["norm"] = module.to(pdt)
        params["w"] = params["b"] = None  # the module holds them
        return [f"{out} = self.norm({src})"], []
    # RMSNorm written out, as LLaMA-style models do (upcast to fp32 for 16-bit inputs)
    e = 1e-6 if spec.eps is None else spec.eps
    lines, inner = [], ["var", "nrm"]
    h = src
    if dt != torch.float32:
        lines.append(f"hf = {src}.to(torch.float32)")
        h, inner = "hf", ["hf", "var", "nrm"]
    lines += [f"var = {h}.pow(2).mean(-1, keepdim=True)", f"nrm = {h} * torch.rsqrt(var + {e!r})"]
    if dt != torch.float32:
        lines.append(f"nrm = nrm.to({src}.dtype)")
    lines.append(f"{out} = {w} * nrm" if spec.weight else f"{out} = nrm")
    return lines, inner


def _relu(kind: str, v: str) -> str:
    return {"relu": f"F.relu({v})", "relu_method": f"{v}.relu()", "torch_relu": f"torch.relu({v})"}[kind]


def _act_lines(act: str, y: str, out: str):
    """Lines computing out = act(y), and the activation's inner values."""
    if act in ("relu", "relu_method", "torch_relu"):
        return [f"{out} = {_relu(act, y)}"], []
    if act == "gelu":
        return [f"{out} = F.gelu({y})"], []
    if act == "gelu_tanh":
        return [f'{out} = F.gelu({y}, approximate="tanh")'], []
    if act == "silu":
        return [f"{out} = F.silu({y})"], []
    lines = [
        f"y3 = {y} ** 3",
        "c = 0.044715 * y3",
        f"u = {y} + c",
        "th = torch.tanh(math.sqrt(2.0 / math.pi) * u)",
        f"{out} = 0.5 * {y} * (1.0 + th)",
    ]
    return lines, ["y3", "c", "u", "th"]


def _gated_act_lines(act: str, g: str, out: str):
    """Lines computing out = act(g) for the gated family, and the activation's inner values."""
    if act == "silu_written":
        return [f"sg = torch.sigmoid({g})", f"{out} = {g} * sg"], ["sg"]
    return _act_lines(act, g, out)


def _other_users(inner: list, k: int) -> list:
    """The inner values the program also returns: one (by k), or all of them (k % 4 == 3)."""
    return list(inner) if k % 4 == 3 else [inner[k % len(inner)]]


def _autocast(lines: list, start: int, stop: int) -> list:
    """lines[start:stop] inside `with torch.autocast("cpu", dtype=torch.bfloat16):`."""
    inner = lines[start:stop]
    if not inner:
        return lines
    return (
        lines[:start]
        + ['with torch.autocast("cpu", dtype=torch.bfloat16):']
        + ["    " + s for s in inner]
        + lines[stop:]
    )


def build(spec: Spec) -> Program:
    gen = torch.Generator().manual_seed(spec.seed)
    dt, n, lead = spec.dtype, spec.n, tuple(spec.lead)

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * spec.scale).to(dt)

    params: dict = {}
    x = rnd(*lead, n)
    r = rnd(*lead, n)
    t = rnd(*lead, n)
    pert, k = spec.perturb, spec.choice
    tol_dtype = torch.bfloat16 if dt == torch.float32 and ("cast" in pert or "autocast" in pert) else dt
    if pert.startswith("autocast"):
        tol_dtype = torch.bfloat16
    grad_inputs = ["x", "r"]
    returns_extra: list[str] = []
    mask_check = None
    if spec.family == "norm_chain":
        # in-place on a copy of x, or (inplace_source, odd choice // 2) on the input itself: eval only, since eager
        # refuses to modify a leaf that requires grad
        src = (
            "x1"
            if pert in ("inplace_before", "inplace_outside") or (pert == "inplace_source" and k // 2 % 2 == 0)
            else "x"
        )
        pre = ["x1 = x * 1.0"] if src == "x1" else []
        if pert in ("inplace_before", "inplace_outside"):
            pre.append("x1.add_(0.5)")
        norm, inner = _norm_lines(spec, src, "y0", params, gen)
        body = list(norm)
        first = len(body)  # index of the first chain line
        if pert == "view_keep":
            body.append(f"y0 = y0.reshape(-1, {n})")
        elif pert == "view_change":
            body.append("y0 = y0.view(-1)" if k % 2 == 0 else f"y0 = y0.view(*y0.shape[:-1], {n // 2}, 2)")
        elif pert == "cast":
            body.append(f"y0 = y0.to({_other(dt)})")
        elif pert == "inplace_inside":
            body.append("y0.mul_(-1.5)")
        elif pert == "inplace_source":
            body.append(f"{src}.mul_(-1)")
        cur = "y0"
        for i, step in enumerate(spec.chain):
            nxt = f"y{i + 1}"
            if step == "dropout":
                body.append(f"{nxt} = F.dropout({cur}, {spec.p!r}, self.training)")
            else:
                body.append(f"{nxt} = {_relu(('relu', 'relu_method', 'torch_relu')[k % 3], cur)}")
            inner.append(cur)
            cur = nxt
        out = cur
        if pert == "other_user":
            returns_extra += _other_users(inner, k)
        elif pert == "inplace_source":
            body.append(f"{out} = {out} + {src}")
        elif pert == "inplace_outside":
            body.append(f"{src}.mul_(2)")
            returns_extra.append(src)
        elif pert == "autocast_first":
            body = _autocast(body, 0, first)
        elif pert == "autocast_rest":
            body = _autocast(body, first, len(body))
        lines = pre + body
        if "dropout" in spec.chain and pert == "none":
            mask_check = "chain"
    elif spec.family == "residual":
        h, res = "x", "r"
        pre = []
        if pert in ("inplace_source", "inplace_before", "inplace_outside"):
            pre = ["x1 = x * 1.0", "r1 = r * 1.0"]
            h, res = "x1", "r1"
            if pert != "inplace_source":
                pre += ["x1.add_(0.25)", "r1.mul_(0.5)"]
        if pert == "broadcast":
            r = rnd(n) if k % 2 == 0 else rnd(*([1] * len(lead)), n)
        elif pert == "bigger_residual":
            r = rnd(2, *lead, n)
            grad_inputs = ["x", "r"]
        body = []
        if spec.residual in ("dropout_add", "add_dropout", "dropout"):
            body.append(f"d = F.dropout({h}, {spec.p!r}, self.training)")
            inner = ["d"]
            a = "d"
        else:
            inner, a = [], h
        if pert == "inplace_source":
            body.append(f"{h}.mul_(-1)" if k % 2 == 0 else f"{res}.mul_(-1)")
        if pert == "self_add":
            body.append(f"s = {a} + {a}")
        elif spec.residual == "dropout":
            body.append("s = d")
        elif spec.residual == "add_dropout":
            body.append(f"s = {res} + {a}")
        else:
            body.append(f"s = {a} + {res}")
        if pert == "inplace_inside":
            body.append("s.add_(t)" if k % 2 == 0 else "s.mul_(2)")
        elif pert == "view_keep":
            body.append(f"s = s.reshape(-1, {n})")
        elif pert == "cast":
            body.append(f"s = s.to({_other(dt)})")
        first = len(body)
        norm, ninner = _norm_lines(spec, "s", "y", params, gen)
        body += norm
        inner += ninner
        if pert == "cast":
            body.append(f"y = y.to({dt})")
        if pert == "other_user" and inner:
            returns_extra += _other_users(inner, k)
        if spec.prenorm:
            returns_extra.append("s")
        if pert == "inplace_outside":
            body += [f"{h}.mul_(2)", f"{res}.add_(1)"]
            returns_extra += [h, res]
        if pert == "autocast_first":
            body = _autocast(body, 0, first)
        elif pert == "autocast_rest":
            body = _autocast(body, first, len(body))
        lines = pre + body
        out = "y"
        if spec.residual in ("dropout_add", "add_dropout") and spec.prenorm and pert == "none":
            mask_check = "prenorm"
    elif spec.family == "bias_act":
        m = n  # out features
        params["W"] = (torch.randn(m, n, generator=gen, dtype=torch.float64) / math.sqrt(n)).to(dt)
        params["lb"] = (torch.randn(m, generator=gen, dtype=torch.float64) * 0.5).to(dt) if spec.bias else None
        src = (
            "x1"
            if pert in ("inplace_before", "inplace_outside") or (pert == "inplace_source" and k // 2 % 2 == 0)
            else "x"
        )
        pre = ["x1 = x * 1.0"] if src == "x1" else []
        if pert in ("inplace_before", "inplace_outside"):
            pre.append("x1.add_(0.5)")
        body = []
        if spec.linear == "addmm" and spec.bias:
            body.append(f"y = torch.addmm(self.lb, {src}.reshape(-1, {n}), self.W.t())")
            if pert != "view_change" and len(lead) > 1:
                body.append(f"y = y.view({', '.join(map(str, lead))}, {m})")
        else:
            body.append(f"y = F.linear({src}, self.W, {'self.lb' if spec.bias else 'None'})")
        first = len(body)
        if pert == "view_keep":
            body.append(f"y = y.reshape(-1, {m})")
        elif pert == "view_change":
            body.append("y = y.view(-1)" if k % 2 == 0 else f"y = y.view(-1, {m // 2}, 2)")
        elif pert == "cast":
            body.append(f"y = y.to({_other(dt)})")
        elif pert == "inplace_inside":
            body.append("y.mul_(-1.5)")
        elif pert == "inplace_source":
            body.append(f"{src}.mul_(2)")
        act, inner = _act_lines(spec.act, "y", "z")
        body += act
        inner = ["y", *inner]
        out = "z"
        if pert == "other_user":
            returns_extra += _other_users(inner, k)
        elif pert == "inplace_source":
            body.append(f"z = z + {src}.reshape(z.shape)" if spec.linear == "addmm" else f"z = z + {src}")
        elif pert == "inplace_outside":
            body.append(f"{src}.mul_(2)")
            returns_extra.append(src)
        elif pert == "autocast_first":
            body = _autocast(body, 0, first)
        elif pert == "autocast_rest":
            body = _autocast(body, first, len(body))
        lines = pre + body
    elif spec.family == "gated":
        m, form = n, spec.gated  # the intermediate size F = n

        def weight(rows):
            return (torch.randn(rows, n, generator=gen, dtype=torch.float64) / math.sqrt(n)).to(dt)

        src = (
            "x1"
            if pert in ("inplace_before", "inplace_outside") or (pert == "inplace_source" and k // 2 % 2 == 0)
            else "x"
        )
        pre = ["x1 = x * 1.0"] if src == "x1" else []
        if pert in ("inplace_before", "inplace_outside"):
            pre.append("x1.add_(0.5)")
        packed = form not in ("two", "two_up_first")
        body = []
        if not packed:
            params["Wg"], params["Wu"] = weight(m), weight(m)
            body += [f"g = F.linear({src}, self.Wg)", f"v = F.linear({src}, self.Wu)"]
        else:
            params["W13"] = weight(2 * m)
            body.append(f"y = F.linear({src}, self.W13)")
            if pert == "halves_swapped":  # act on the second half, or halves of the leading dimension
                body.append("v, g = y.chunk(2, dim=-1)" if k % 2 == 0 else "g, v = y.chunk(2, dim=0)")
            elif form == "chunk":
                body.append("g, v = y.chunk(2, dim=-1)")
            elif form == "split":
                body.append(f"g, v = y.split({m}, dim=-1)")
            else:
                body += [f"g = y[..., :{m}]", f"v = y[..., {m}:]"]
        first = len(body)
        if pert == "view_keep":
            body += [f"g = g.reshape(-1, {m})", f"v = v.reshape(-1, {m})"]
        elif pert == "cast":
            body.append(f"g = g.to({_other(dt)})")
        elif pert == "broadcast":
            body.append("v = v[:1]")  # (1, ..., F): broadcast over the rows
        act, inner = _gated_act_lines(spec.act, "g", "a")
        body += act
        inner = ["a", *inner]
        if pert == "inplace_inside":
            body.append(("a.mul_(-1.5)", "g.mul_(-1.5)", "v.mul_(-1.5)")[k % 3])
        elif pert == "inplace_source":
            body.append(f"{src}.mul_(2)")
        if pert == "self_mul":
            product = "z = a * a" if k % 2 == 0 else "z = a * g"
        else:
            up_first = form == "two_up_first" or (packed and k % 2 == 1)
            product = "z = v * a" if up_first else "z = a * v"
        mid = len(body)
        body.append(product)
        out = "z"
        if spec.p > 0:
            body.append(f"z = F.dropout(z, {spec.p!r}, self.training)")
        if pert == "other_user":
            returns_extra += _other_users(inner + ["g"], k)
        elif pert == "inplace_source":
            body.append(f"z = z + {src}[..., :1]")
        elif pert == "inplace_outside":
            body += [f"{src}.mul_(2)", "g.mul_(2)" if k % 2 == 0 else "v.add_(1)"]
            returns_extra.append(src)
        if pert == "autocast_first":
            body = _autocast(body, 0, first)
        elif pert == "autocast_rest":
            body = _autocast(body, first, len(body))
        elif pert == "autocast_between":
            body = _autocast(body, mid, mid + 1)
        lines = pre + body
        if spec.p > 0 and pert == "none":
            mask_check = "chain"
    else:
        raise ValueError(spec.family)
    ret = ", ".join([out, *dict.fromkeys(returns_extra)])
    lines.append(f"return {ret}")
    fuses = pert in KEEPS_FUSION and (
        spec.family == "gated"  # no parameter, bias or eps condition: every intact gated program is a site
        or (
            not spec.param_fp32
            and (spec.eps is None or spec.eps > 0)
            and not (spec.family == "bias_act" and not spec.bias)
            # a bf16 / fp16 matmul keeps its bias (added before its one rounding): no bias_act site
            and not (spec.family == "bias_act" and spec.dtype in (torch.bfloat16, torch.float16))
            # addmm → relu is no pattern of the rewriter (relu after linear only; addmm takes the bias_act activations)
            and not (
                spec.family == "bias_act"
                and spec.linear == "addmm"
                and spec.act in ("relu", "relu_method", "torch_relu")
            )
            and not (spec.family != "bias_act" and spec.norm in ("rms", "rms_module") and spec.eps is None)
        )
    )
    inputs = {"x": x, "r": r, "t": t}
    return make_program(
        "\n".join(lines),
        params,
        inputs,
        tol_dtype=tol_dtype,
        fuses=fuses,
        spec=spec,
        grad_inputs=tuple(grad_inputs),
        mask_check=mask_check,
    )


# ---------------------------------------------------------------------------------------------- nn.Sequential
@dataclasses.dataclass(frozen=True)
class SeqSpec:
    """A model of nn.Sequential blocks: ("ln", eps, affine, bias, tail), ("rms", eps, affine, tail),
    ("linear", bias, act); container: "plain" | "nested" (each block in an inner nn.Sequential) | "subclass"
    (forward not overridden) | "residual" (each module adds its output to its input) | "reversed" (the modules in
    reverse order)."""

    blocks: tuple
    container: str = "plain"
    dtype: torch.dtype = torch.float32
    n: int = 32
    lead: tuple = (4,)
    p: float = 0.0
    scale: float = 1.0
    seed: int = 0


class PlainSubclass(nn.Sequential):
    pass


class ResidualSequential(nn.Sequential):
    def forward(self, x):
        for module in self:
            x = x + module(x)
        return x


class ReversedSequential(nn.Sequential):
    def forward(self, x):
        for module in reversed(self):
            x = module(x)
        return x


_CONTAINERS = {
    "plain": nn.Sequential,
    "nested": nn.Sequential,
    "subclass": PlainSubclass,
    "residual": ResidualSequential,
    "reversed": ReversedSequential,
}
_ACT_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "silu": nn.SiLU}


def build_sequential(spec: SeqSpec):
    """(model, x): the model in spec.dtype, with random parameters."""
    gen = torch.Generator().manual_seed(spec.seed)
    n = spec.n
    modules, groups = [], []
    for block in spec.blocks:
        first = len(modules)
        kind = block[0]
        if kind == "ln":
            _, eps, affine, bias, tail = block
            modules.append(nn.LayerNorm(n, eps=eps, elementwise_affine=affine, bias=bias))
        elif kind == "rms":
            _, eps, affine, tail = block
            modules.append(nn.RMSNorm(n, eps=eps, elementwise_affine=affine))
        else:
            _, bias, act = block
            modules.append(nn.Linear(n, n, bias=bias))
            tail = (act,) if act else ()
        for step in tail:
            modules.append(nn.Dropout(spec.p) if step == "dropout" else _ACT_MODULES[step]())
        groups.append(modules[first:])
    for m in modules:
        for prm in m.parameters(recurse=False):
            with torch.no_grad():
                prm.copy_(torch.randn(prm.shape, generator=gen, dtype=torch.float64) * 0.5 + (prm.dim() == 1))
    cls = _CONTAINERS[spec.container]
    if spec.container == "nested":  # each block an nn.Sequential of its own, inside the outer one
        model = nn.Sequential(*(nn.Sequential(*g) for g in groups))
    else:
        model = cls(*modules)
    x = (torch.randn(*spec.lead, n, generator=gen, dtype=torch.float64) * spec.scale).to(spec.dtype)
    return model.to(spec.dtype), x


# ---------------------------------------------------------------------------------------------- the check
class Rejected(Exception):
    """The program is not a valid test: eager PyTorch (or Dynamo without our backend) cannot run it."""


def _flat(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.detach().double(), want.detach().double()
    scale = w.abs().max().item() if w.numel() else 0.0
    err = (g - w).abs().max().item() if w.numel() else 0.0
    if not math.isfinite(err):
        same_nonfinite = torch.equal(torch.isfinite(g), torch.isfinite(w)) and torch.equal(
            g[~torch.isfinite(g)], w[~torch.isfinite(w)]
        )
        fin = torch.isfinite(w)
        if not same_nonfinite:
            return math.inf
        err = (g[fin] - w[fin]).abs().max().item() if fin.any() else 0.0
        scale = w[fin].abs().max().item() if fin.any() else 0.0
    return err / max(scale, 1e-6)


def compare(got, want, tol: float, what: str) -> None:
    got, want = _flat(got), _flat(want)
    assert len(got) == len(want), f"{what}: {len(got)} outputs, eager has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None or g is None:
            assert g is None and w is None, f"{what}[{i}]: None against {type(w).__name__}"
            continue
        assert g.dtype == w.dtype, f"{what}[{i}]: dtype {g.dtype}, eager {w.dtype}"
        assert g.shape == w.shape, f"{what}[{i}]: shape {tuple(g.shape)}, eager {tuple(w.shape)}"
        err = _rel_err(g, w)
        assert err <= tol, f"{what}[{i}]: max|Δ| / max|eager| = {err:.3g} > {tol:g}"


class Recorder:
    """A Dynamo backend that runs the registered "gpuopt" backend with verbose on and records each graph it is
    given and the rewrites it made (the backend's `gpuopt backend: ...` lines)."""

    def __init__(self, inductor: bool):
        self.options = {"verbose": True} if inductor else {"verbose": True, "inductor": False}
        self.graphs = 0
        self.rewrites: list[str] = []

    def __call__(self, gm, example_inputs):
        backend = torch._dynamo.lookup_backend("gpuopt")
        self.graphs += 1
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            compiled = backend(gm, example_inputs, options=dict(self.options))
        self.rewrites += [ln for ln in buf.getvalue().splitlines() if ln.startswith("gpuopt backend:")]
        return compiled


def _clone_inputs(inputs: dict, grad: tuple) -> dict:
    out = {}
    for k, v in inputs.items():
        if v is None:
            out[k] = None
            continue
        v = v.clone()
        if k in grad and v.is_floating_point():
            v.requires_grad_(True)
        out[k] = v
    return out


def _run(fn, inputs: dict):
    return fn(inputs["x"], inputs["r"], inputs["t"])


def _loss(outs, gen_seed: int):
    g = torch.Generator().manual_seed(gen_seed)
    total = 0.0
    for o in _flat(outs):
        if isinstance(o, torch.Tensor) and o.requires_grad:
            w = torch.randn(o.shape, generator=g, dtype=torch.float64).to(torch.float32)
            total = total + (o.float() * w).sum()
    return total


def _grads(module: nn.Module, inputs: dict, names: tuple) -> dict:
    grads = {f"input {k}": inputs[k].grad for k in names if inputs[k] is not None and inputs[k].grad is not None}
    grads.update({f"param {k}": p.grad for k, p in module.named_parameters() if p.grad is not None})
    return grads


def _eager_works_under_dynamo(program: Program, training: bool) -> bool:
    torch._dynamo.reset()
    program.module.train(training)
    try:
        with torch.no_grad() if not training else contextlib.nullcontext():
            compiled = torch.compile(program.module, backend="eager", fullgraph=True)
            out = _run(compiled, _clone_inputs(program.inputs, program.grad_inputs if training else ()))
        if training:
            _loss(out, 1).backward()
        return True
    except Exception:
        return False
    finally:
        torch._dynamo.reset()


def check_compiled(program: Program, training: bool, inductor: bool = False, values: bool = True) -> Recorder:
    """Compiles program.module with the gpuopt backend and checks it against eager (eval: outputs and the inputs
    after the run; training: p = 0 outputs and every gradient; p > 0 checked with check_dropout_masks, or with
    values=False only that it runs, backpropagates, and gives eager's dtypes and shapes). Raises Rejected where
    eager itself cannot run the program, AssertionError on a difference or a crash."""
    module = program.module
    module.train(training)
    grad = program.grad_inputs if training else ()
    tol, gtol = OUT_TOL[program.tol_dtype], GRAD_TOL[program.tol_dtype]
    ctx = contextlib.nullcontext if training else torch.no_grad
    eager_in = _clone_inputs(program.inputs, grad)
    module.zero_grad(set_to_none=True)
    try:
        with ctx():
            want = _run(module, eager_in)
        if training:
            _loss(want, 1).backward()
    except Exception as e:
        raise Rejected(f"eager: {type(e).__name__}: {e}") from e
    want_grads = _grads(module, eager_in, grad)
    module.zero_grad(set_to_none=True)

    torch._dynamo.reset()
    rec = Recorder(inductor)
    got_in = _clone_inputs(program.inputs, grad)
    mode = "training" if training else "eval"
    try:
        with ctx():
            compiled = torch.compile(module, backend=rec, fullgraph=True)
            got = _run(compiled, got_in)
        if training:
            _loss(got, 1).backward()
    except Exception as e:
        if not _eager_works_under_dynamo(program, training):
            raise Rejected(f"Dynamo cannot run it: {type(e).__name__}: {e}") from e
        raise AssertionError(
            f"{mode}: compiled program raised {type(e).__name__}: {e}\nrewrites: {rec.rewrites}\n{program.describe()}"
        ) from e
    finally:
        torch._dynamo.reset()
    got_grads = _grads(module, got_in, grad)
    module.zero_grad(set_to_none=True)
    info = f"\nrewrites: {rec.rewrites}\n{program.describe()}"
    assert rec.graphs >= 1, "the gpuopt backend was never called" + info
    if not values:  # dropout masks differ from eager's: dtypes and shapes only
        tol = gtol = float("inf")
    try:
        compare(got, want, tol, f"{mode} output")
        for k in program.inputs:
            if program.inputs[k] is None:
                continue  # in-place ops on inputs
            compare(got_in[k].detach(), eager_in[k].detach(), tol, f"{mode} input {k} after the call")
        if training:
            assert got_grads.keys() == want_grads.keys(), f"grads of {sorted(got_grads)}, eager {sorted(want_grads)}"
            for k in want_grads:
                compare(got_grads[k], want_grads[k], gtol, f"gradient of {k}")
        if program.fuses:
            assert rec.rewrites, "a program whose pattern is intact was not rewritten"
    except AssertionError as e:
        raise AssertionError(f"{e}{info}") from None
    return rec


def count_fused_ops(program: Program) -> int:
    """Compiles program (eval, no Inductor) and counts the gpuopt ops its run executes (torch.profiler)."""
    program.module.eval()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            compiled = torch.compile(program.module, backend=Recorder(False), fullgraph=True)
            _run(compiled, _clone_inputs(program.inputs, ()))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                _run(compiled, _clone_inputs(program.inputs, ()))
    finally:
        torch._dynamo.reset()
    return sum(1 for e in prof.events() if e.name.startswith("gpuopt::"))


def _dropout_zero(program: Program, p_spec: Spec) -> Program:
    return build(dataclasses.replace(p_spec, p=0.0))


def check_dropout_masks(program: Program, inductor: bool = False) -> None:
    """Training with p > 0: the masks differ from eager's, so the compiled output is checked against eager's formula
    with the mask recovered from the output. "chain" (norm → dropout (→ relu)): every element is 0 or the p = 0
    result / (1 - p); "prenorm" (the sum returned): every sum element is r or r + h / (1 - p), and the norm output
    equals eager's norm of that sum. The kept fraction must be within 6 sigma of 1 - p."""
    spec = program.spec
    p = spec.p
    tol = OUT_TOL[program.tol_dtype]
    module = program.module.train(True)
    torch._dynamo.reset()
    rec = Recorder(inductor)
    try:
        compiled = torch.compile(module, backend=rec, fullgraph=True)
        got = _flat(_run(compiled, _clone_inputs(program.inputs, program.grad_inputs)))
    finally:
        torch._dynamo.reset()
    info = f"\nrewrites: {rec.rewrites}\n{program.describe()}"
    ref_prog = _dropout_zero(program, spec)
    ref_prog.module.train(True)
    with torch.no_grad():
        ref = _flat(_run(ref_prog.module, _clone_inputs(program.inputs, ())))
    out = got[0].detach()
    if program.mask_check == "chain":
        keep = out != 0
        want = (ref[0].double() / (1 - p)).to(out.dtype)
        scale = want.abs().max().item()
        err = ((out.double() - want.double()).abs() * keep).max().item()
        assert err <= tol * max(scale, 1e-6), f"kept elements: max|Δ| / max = {err / max(scale, 1e-6):.3g}{info}"
        # a kept element of a relu chain may be 0 anyway: count only where the p = 0 result is not 0
        live = ref[0] != 0
        kept, total = (keep & live).sum().item(), live.sum().item()
    else:
        x, r = program.inputs["x"], program.inputs["r"]
        s = got[-1].detach().double()
        scaled = x.double() / (1 - p) + r.double()
        dist_kept = (s - scaled).abs()
        dist_dropped = (s - r.double()).abs()
        keep = dist_kept < dist_dropped
        tol_abs = tol * max(scaled.abs().max().item(), 1e-6) * 4
        bad = torch.where(keep, dist_kept, dist_dropped).max().item()
        assert bad <= tol_abs, f"sum elements neither r nor r + h / (1 - p): {bad:.3g}{info}"
        # the norm of the recovered sum, by eager: the program with p = 0 and h replaced by the kept h / (1 - p)
        h_eff = torch.where(keep, x.double() / (1 - p), torch.zeros_like(x, dtype=torch.float64)).to(x.dtype)
        with torch.no_grad():
            ref2 = _flat(ref_prog.module(h_eff, r, program.inputs["t"]))
        compare([out], [ref2[0]], tol * 2, "norm of the recovered sum")
        kept, total = keep.sum().item(), keep.numel()
    if total >= 50 and 0 < p < 1:
        sigma = math.sqrt(total * p * (1 - p))
        assert abs(kept - total * (1 - p)) <= 6 * sigma + 1, f"kept {kept} of {total} at p = {p}{info}"


def check_fused(spec: SeqSpec, training: bool) -> Optional[list]:
    """gpuopt_ops.fuse(model) against model: eval outputs, or training (p = 0) outputs and parameter gradients
    (by name). Returns fuse()'s verbose lines."""
    model, x = build_sequential(spec)
    model.train(training)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fused = gpuopt_ops.fuse(model, verbose=True)
    lines = buf.getvalue().splitlines()
    info = f"\n{spec}\nfuse(): {lines}\nmodel: {model}"
    tol = OUT_TOL[spec.dtype]
    ctx = contextlib.nullcontext if training else torch.no_grad
    xe, xf = x.clone().requires_grad_(training), x.clone().requires_grad_(training)
    try:
        with ctx():
            want = model(xe)
    except Exception as e:
        raise Rejected(f"eager: {e}") from e
    try:
        with ctx():
            got = fused(xf)
        if training:
            _loss(want, 2).backward()
            _loss(got, 2).backward()
    except Exception as e:
        raise AssertionError(f"fused model raised {type(e).__name__}: {e}{info}") from e
    try:
        compare(got, want, tol, "fused " + ("training" if training else "eval") + " output")
        if training:
            compare(xf.grad, xe.grad, GRAD_TOL[spec.dtype], "gradient of x")
            want_g = {k: p.grad for k, p in model.named_parameters()}
            got_g = {k: p.grad for k, p in fused.named_parameters()}
            for k, g in want_g.items():
                if g is not None:
                    assert got_g.get(k) is not None, f"no gradient for {k}"
                    compare(got_g[k], g, GRAD_TOL[spec.dtype], f"gradient of {k}")
    except AssertionError as e:
        raise AssertionError(f"{e}{info}") from None
    return lines

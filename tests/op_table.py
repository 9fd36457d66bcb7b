"""The table of ops the tests check: for each op, its inputs, its unfused reference and its tolerance.

Adding an op to the test matrix is one entry in OPS: an OpSpec that makes a sample (forward arguments and a
gradient for the outputs), runs a backend's forward and backward ops on it, computes the reference in any dtype,
and says which results are compared and with what floor. tests/test_correctness.py runs every entry on every
backend of tests/backends.py, every dtype and the shapes below; other tests pick entries by name.

Tolerance (helpers.assert_close_to_reference, the flash-attention rule): |ours - fp64 reference| <= 2 x
|PyTorch's own result in the input dtype - fp64 reference| + a floor per dtype. Sums over rows (parameter
gradients) get the floor times the number of rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch

from gpuopt_ops import reference as R

from helpers import FLOORS, assert_close_to_reference, make_inputs, seed_tensor

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# (leading dims, N). Why these points:
#   (4,) x 1      N = 1: zero variance, rstd = 1/sqrt(eps); one element a row
#   (3,) x 7      N < 8 and odd: Philox groups straddle rows, one call per element (the generic RNG path)
#   (5,) x 37     prime N: masked tails in every tile and vector-unfriendly rows
#   (2, 3) x 123  3-D x: the leading dims flatten into M
#   (6,) x 64     N % 8 == 0 and a power of two: one Philox call per 8 elements, 16-byte vectors
#   (0,) x 16     M = 0: empty outputs, zero parameter gradients
#   (8,) x 1000   N % 8 == 0, not a power of two: a partly filled last tile (CUDA: 4 groups a lane, partial)
SHAPES = [((4,), 1), ((3,), 7), ((5,), 37), ((2, 3), 123), ((6,), 64), ((0,), 16), ((8,), 1000)]


@dataclass
class Sample:
    args: dict[str, object]  # the forward op's arguments by schema name
    grad_out: torch.Tensor  # the gradient of the op's main output
    grad_sum: Optional[torch.Tensor] = None  # dropout_add_norm with prenorm: the gradient of its `sum` output

    @property
    def x(self) -> torch.Tensor:
        """The op's main input: x, or gated_act's gate."""
        return self.args["x"] if "x" in self.args else self.args["gate"]

    @property
    def m(self) -> int:
        return self.x.numel() // self.x.shape[-1]


@dataclass(frozen=True)
class Variant:
    name: str
    options: dict[str, object] = field(default_factory=dict)
    dtypes: Optional[Sequence[torch.dtype]] = None  # None: every dtype


@dataclass(frozen=True)
class OpSpec:
    name: str  # the forward op; its backward is `<name>_backward`
    variants: tuple[Variant, ...]
    sample: Callable[..., Sample]  # (prefix, n, dtype, device, **variant options) -> Sample
    run: Callable[..., dict[str, torch.Tensor]]  # (backend, sample) -> named results (outputs and gradients)
    reference: Callable[..., dict[str, torch.Tensor]]  # (sample, compute dtype, low-precision?) -> same names
    check: Callable[..., None]  # (sample, ours, ref64, reference in x's dtype) -> asserts
    # extra backends of tests/backends.py this entry also runs on (newer ops: the emulated CUDA source)
    extra_backends: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------- LayerNorm-dropout-ReLU
def ldr_sample(prefix, n, dtype, device, *, p=0.25, affine=True, param_dtype=None, seed=1234, data_seed=0):
    x, w, b = make_inputs(prefix, n, dtype, device, affine=affine, param_dtype=param_dtype, seed=data_seed)
    g = torch.Generator().manual_seed(data_seed + 1)
    grad_out = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype).to(device)
    return Sample(dict(x=x, weight=w, bias=b, seed=seed_tensor(seed, device), p=p, eps=1e-5), grad_out)


def ldr_run(backend, s: Sample):
    a = s.args
    out, mean, rstd = backend.op("layer_norm_dropout_relu")(a["x"], a["weight"], a["bias"], a["seed"], a["p"], a["eps"])
    gx, gw, gb = backend.op("layer_norm_dropout_relu_backward")(
        s.grad_out, a["x"], a["weight"], a["bias"], mean, rstd, a["seed"], a["p"]
    )
    return dict(out=out, mean=mean, rstd=rstd, grad_x=gx, grad_weight=gw, grad_bias=gb)


def ldr_reference(s: Sample, dtype, low_precision_params=False):
    """The unfused reference computed in `dtype`, and its gradients (autograd through the reference).
    low_precision_params rounds fp32 parameters to `dtype` first: what plain PyTorch does under AMP."""
    a = s.args
    params = [a["weight"], a["bias"]]
    if low_precision_params:
        params = [None if t is None else t.to(dtype) for t in params]
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (a["x"], *params)]
    out, mean, rstd = R.layer_norm_dropout_relu(*leaves, a["seed"], a["p"], a["eps"], compute_dtype=dtype)
    out.backward(s.grad_out.to(dtype))
    gx, gw, gb = (t.grad if t is not None else None for t in leaves)
    return dict(out=out.detach(), mean=mean.detach(), rstd=rstd.detach(), grad_x=gx, grad_weight=gw, grad_bias=gb)


def ldr_check(s: Sample, ours, ref64, low):
    x, w, b = s.args["x"], s.args["weight"], s.args["bias"]
    dtype, m, n = x.dtype, s.m, x.shape[-1]
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert ours["out"].dtype == dtype and ours["out"].shape == x.shape and ours["out"].is_contiguous()
    assert ours["mean"].dtype == acc and ours["mean"].shape == (m,) and ours["rstd"].shape == (m,)
    fl = FLOORS[dtype]
    assert_close_to_reference("out", ours["out"].cpu(), ref64["out"].cpu(), low["out"].cpu(), fl)
    assert_close_to_reference("grad_x", ours["grad_x"].cpu(), ref64["grad_x"].cpu(), low["grad_x"].cpu(), fl)
    for name, param in (("grad_weight", w), ("grad_bias", b)):
        if param is None:
            assert ours[name].numel() == 0, f"{name}: a missing parameter has a (0,) gradient"
            continue
        assert ours[name].dtype == param.dtype and ours[name].shape == (n,), name
        # fp32 parameters with bf16/fp16 x (AMP): PyTorch's own error is that of the rounded parameters
        floor = 1e-2 if param.dtype != dtype else fl * max(1, m)
        assert_close_to_reference(name, ours[name].cpu(), ref64[name].cpu(), low[name].cpu(), floor)


LAYER_NORM_DROPOUT_RELU = OpSpec(
    name="layer_norm_dropout_relu",
    # The kernels' switches are DROPOUT (p > 0) and HAS_W / HAS_B: these variants take each value of each once;
    # their other combinations (weight only, p = 1, random p) are drawn by tests/test_fuzz.py.
    variants=(
        Variant("p0.25-affine", dict(p=0.25)),
        Variant("p0-no-affine", dict(p=0.0, affine=False)),
        Variant("amp-fp32-params", dict(p=0.2, param_dtype=torch.float32), dtypes=(torch.float16, torch.bfloat16)),
    ),
    sample=ldr_sample,
    run=ldr_run,
    reference=ldr_reference,
    check=ldr_check,
)


# ---------------------------------------------------------------------------------------------- norm-dropout
def nd_sample(prefix, n, dtype, device, *, rms=True, relu=False, **options):
    s = ldr_sample(prefix, n, dtype, device, **options)
    s.args.update(rms=rms, relu=relu)
    return s


def nd_run(backend, s: Sample):
    a = s.args
    out, mean, rstd = backend.op("norm_dropout")(*a.values())
    gx, gw, gb = backend.op("norm_dropout_backward")(
        s.grad_out, a["x"], a["weight"], a["bias"], mean, rstd, a["seed"], a["p"], a["rms"], a["relu"]
    )
    res = dict(out=out, mean=mean, rstd=rstd, grad_x=gx, grad_weight=gw, grad_bias=gb)
    if not a["rms"] and a["relu"]:  # LayerNorm + ReLU is layer_norm_dropout_relu, bit for bit, on the same backend
        ldr = ldr_run(backend, Sample({k: a[k] for k in ("x", "weight", "bias", "seed", "p", "eps")}, s.grad_out))
        res.update({f"ldr_{k}": v for k, v in ldr.items()})
    return res


def nd_reference(s: Sample, dtype, low_precision_params=False):
    a = s.args
    params = [a["weight"], a["bias"]]
    if low_precision_params:
        params = [None if t is None else t.to(dtype) for t in params]
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (a["x"], *params)]
    out, mean, rstd = R.norm_dropout(
        *leaves, a["seed"], a["p"], a["eps"], rms=a["rms"], relu=a["relu"], compute_dtype=dtype
    )
    out.backward(s.grad_out.to(dtype))
    gx, gw, gb = (t.grad if t is not None else None for t in leaves)
    return dict(out=out.detach(), mean=mean.detach(), rstd=rstd.detach(), grad_x=gx, grad_weight=gw, grad_bias=gb)


def nd_check(s: Sample, ours, ref64, low):
    a = s.args
    x = a["x"]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    if a["rms"]:  # ldr_check's mean check is LayerNorm's: give it a (M,) stand-in, check the real one here
        assert ours["mean"].dtype == acc and ours["mean"].shape == (0,), "rms: mean is (0,)"
        ours = {**ours, "mean": torch.zeros(s.m, dtype=acc)}
    ldr_check(s, ours, ref64, low)
    if not a["rms"] and a["relu"]:
        for k in ("out", "mean", "rstd", "grad_x", "grad_weight", "grad_bias"):
            assert torch.equal(ours[k].cpu(), ours[f"ldr_{k}"].cpu()), f"{k}: layer_norm_dropout_relu's bits"


NORM_DROPOUT = OpSpec(
    name="norm_dropout",
    # The new switches are rms and relu (the rest is layer_norm_dropout_relu's, covered above): each value of each
    # at least once, with dropout on and off and the parameters present or not.
    variants=(
        Variant("rms-identity-p0.25", dict(rms=True, relu=False, p=0.25)),
        Variant("rms-relu-p0-no-affine", dict(rms=True, relu=True, p=0.0, affine=False)),
        Variant("layer-identity-p0.1", dict(rms=False, relu=False, p=0.1)),
        Variant("layer-relu-is-ldr", dict(rms=False, relu=True, p=0.25), dtypes=(torch.float32, torch.bfloat16)),
    ),
    sample=nd_sample,
    run=nd_run,
    reference=nd_reference,
    check=nd_check,
    extra_backends=("cuda-emulated",),
)


# ---------------------------------------------------------------------------------------------- bias-ReLU
def bias_relu_sample(prefix, n, dtype, device, *, bias_dtype=None, data_seed=0):
    x, _, b = make_inputs(prefix, n, dtype, device, param_dtype=bias_dtype, seed=data_seed)
    g = torch.Generator().manual_seed(data_seed + 1)
    grad_out = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype).to(device)
    return Sample(dict(x=x, bias=b), grad_out)


def bias_relu_run(backend, s: Sample):
    out = backend.op("bias_relu")(s.args["x"], s.args["bias"])
    gx, gb = backend.op("bias_relu_backward")(s.grad_out, out)
    return dict(out=out, grad_x=gx, grad_bias=gb)


def bias_relu_reference(s: Sample, dtype, low_precision_params=False):
    x = s.args["x"].detach().to(dtype).requires_grad_()
    b = s.args["bias"].detach().to(dtype).requires_grad_()
    out = R.bias_relu(x, b)
    out.backward(s.grad_out.to(dtype))
    return dict(out=out.detach(), grad_x=x.grad, grad_bias=b.grad)


def bias_relu_check(s: Sample, ours, ref64, low):
    x = s.args["x"]
    dtype = x.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert ours["out"].dtype == dtype and ours["out"].shape == x.shape and ours["grad_x"].dtype == dtype
    # grad_bias comes back unrounded, in the accumulation dtype (fp32 for bf16/fp16): DESIGN 1.5
    assert ours["grad_bias"].dtype == acc, "grad_bias: the accumulation dtype"
    fl = FLOORS[dtype]
    assert_close_to_reference("out", ours["out"].cpu(), ref64["out"].cpu(), low["out"].cpu(), fl)
    assert_close_to_reference("grad_x", ours["grad_x"].cpu(), ref64["grad_x"].cpu(), low["grad_x"].cpu(), fl)
    assert_close_to_reference(
        "grad_bias", ours["grad_bias"].cpu(), ref64["grad_bias"].cpu(), low["grad_bias"].cpu(), fl * max(1, s.m)
    )
    # element-wise in one dtype: grad_x is exactly grad_out where out > 0 (bit for bit on every backend)
    expect = torch.where(ours["out"].cpu() > 0, s.grad_out.cpu(), torch.zeros((), dtype=dtype))
    assert torch.equal(ours["grad_x"].cpu(), expect)


BIAS_RELU = OpSpec(
    name="bias_relu",
    variants=(
        Variant("same-dtype-bias"),
        Variant("amp-fp32-bias", dict(bias_dtype=torch.float32), dtypes=(torch.float16, torch.bfloat16)),
    ),
    sample=bias_relu_sample,
    run=bias_relu_run,
    reference=bias_relu_reference,
    check=bias_relu_check,
)


# ---------------------------------------------------------------------------------------------- dropout-add-norm
def dan_sample(
    prefix,
    n,
    dtype,
    device,
    *,
    p=0.25,
    rms=False,
    residual=True,
    prenorm=False,
    residual_in_fp32=False,
    params="both",
    param_dtype=None,
    seed=4321,
    data_seed=0,
):
    """params: "both", "weight", "bias" or "none"; prenorm gives a gradient for `sum` (its other users)."""
    x, w, b = make_inputs(prefix, n, dtype, device, param_dtype=param_dtype, seed=data_seed)
    w = w if params in ("both", "weight") else None
    b = b if params in ("both", "bias") else None
    s_dtype = torch.float32 if residual_in_fp32 and dtype in (torch.float16, torch.bfloat16) else dtype
    g = torch.Generator().manual_seed(data_seed + 1)
    r = torch.randn(x.shape, generator=g, dtype=torch.float64).to(s_dtype).to(device) if residual else None
    grad_out = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype).to(device)
    grad_sum = torch.randn(x.shape, generator=g, dtype=torch.float64).to(s_dtype).to(device) if prenorm else None
    args = dict(
        x=x,
        residual=r,
        weight=w,
        bias=b,
        seed=seed_tensor(seed, device),
        p=p,
        eps=1e-5,
        rms=rms,
        residual_in_fp32=residual_in_fp32,
    )
    return Sample(args, grad_out, grad_sum)


def dan_run(backend, s: Sample):
    a = s.args
    out, sm, mean, rstd = backend.op("dropout_add_norm")(*a.values())
    gx, gr, gw, gb = backend.op("dropout_add_norm_backward")(
        s.grad_out,
        s.grad_sum,
        sm,
        a["weight"],
        a["bias"],
        mean,
        rstd,
        a["seed"],
        a["p"],
        a["rms"],
        a["residual"] is not None,
    )
    return dict(out=out, sum=sm, mean=mean, rstd=rstd, grad_x=gx, grad_residual=gr, grad_weight=gw, grad_bias=gb)


def dan_reference(s: Sample, dtype, low_precision_params=False):
    a = s.args
    params = [a["weight"], a["bias"]]
    if low_precision_params:
        params = [None if t is None else t.to(dtype) for t in params]
    leaves = [
        t.detach().clone().requires_grad_(True) if t is not None else None for t in (a["x"], a["residual"], *params)
    ]
    out, sm, mean, rstd = R.dropout_add_norm(
        *leaves, a["seed"], a["p"], a["eps"], a["rms"], a["residual_in_fp32"], compute_dtype=dtype
    )
    outputs, grads = [out], [s.grad_out.to(dtype)]
    if s.grad_sum is not None:
        outputs.append(sm)
        grads.append(s.grad_sum.to(sm.dtype))
    torch.autograd.backward(outputs, grads)
    gx, gr, gw, gb = (t.grad if t is not None else None for t in leaves)
    return dict(
        out=out.detach(),
        sum=sm.detach(),
        mean=mean.detach(),
        rstd=rstd.detach(),
        grad_x=gx,
        grad_residual=gr,
        grad_weight=gw,
        grad_bias=gb,
    )


def dan_expected_sum(s: Sample) -> torch.Tensor:
    """`sum` as the contract computes it: where(keep, x * scale, 0) (+ residual) in the accumulation dtype, rounded
    once to S. Without a residual it is x's dropout alone (x itself at p = 0); with one at p = 0 it is x + residual,
    one rounding."""
    a = s.args
    x, r = a["x"].cpu(), a["residual"]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    s_dtype = torch.float32 if a["residual_in_fp32"] and x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    m, n = s.m, x.shape[-1]
    xa = x.to(acc)
    if R.dropout_threshold(a["p"]) > 0:
        keep = R.dropout_keep_mask(R.seed_value(a["seed"]), m, n, a["p"]).reshape(x.shape)
        xa = torch.where(keep, xa * R.dropout_scale(a["p"], x.dtype), torch.zeros((), dtype=acc))
    return (xa + r.cpu().to(acc) if r is not None else xa).to(s_dtype)


def dan_check(s: Sample, ours, ref64, low):
    a = s.args
    x, w, b, r = a["x"], a["weight"], a["bias"], a["residual"]
    dtype, m, n = x.dtype, s.m, x.shape[-1]
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    s_dtype = torch.float32 if a["residual_in_fp32"] and dtype in (torch.float16, torch.bfloat16) else dtype
    assert ours["out"].dtype == dtype and ours["out"].shape == x.shape and ours["out"].is_contiguous()
    assert ours["sum"].dtype == s_dtype and ours["sum"].shape == x.shape and ours["sum"].is_contiguous()
    assert ours["mean"].dtype == acc and ours["mean"].shape == ((0,) if a["rms"] else (m,))
    assert ours["rstd"].dtype == acc and ours["rstd"].shape == (m,)
    assert ours["grad_x"].dtype == dtype and ours["grad_x"].shape == x.shape
    fl = FLOORS[dtype]
    # sum: bit for bit where the contract leaves one rounding (no residual, or p = 0), else close
    expected = dan_expected_sum(s)
    if r is None or R.dropout_threshold(a["p"]) == 0:
        assert torch.equal(ours["sum"].cpu(), expected), "sum must be dropout(x) + residual rounded once to S"
    else:
        assert_close_to_reference("sum", ours["sum"].cpu(), ref64["sum"].cpu().double(), low["sum"].cpu(), fl)
    for name in ("out", "grad_x"):
        assert_close_to_reference(name, ours[name].cpu(), ref64[name].cpu(), low[name].cpu(), fl)
    if r is None:
        assert ours["grad_residual"].numel() == 0, "no residual: a (0,) grad_residual"
    else:
        assert ours["grad_residual"].dtype == s_dtype and ours["grad_residual"].shape == x.shape
        assert_close_to_reference(
            "grad_residual", ours["grad_residual"].cpu(), ref64["grad_residual"].cpu(), low["grad_residual"].cpu(), fl
        )
    for name, param in (("grad_weight", w), ("grad_bias", b)):
        if param is None:
            assert ours[name].numel() == 0, f"{name}: a missing parameter has a (0,) gradient"
            continue
        assert ours[name].dtype == param.dtype and ours[name].shape == (n,), name
        floor = 1e-2 if param.dtype != dtype else fl * max(1, m)
        assert_close_to_reference(name, ours[name].cpu(), ref64[name].cpu(), low[name].cpu(), floor)


DROPOUT_ADD_NORM = OpSpec(
    name="dropout_add_norm",
    # The kernels' switches: rms, residual, dropout (p > 0), grad_sum (prenorm), S = fp32 (residual_in_fp32),
    # weight / bias each present or not; each value of each is taken at least once.
    variants=(
        Variant("layer-residual-p0.25", dict(p=0.25)),
        Variant(
            "rms-prenorm-no-residual-weight-only", dict(p=0.1, rms=True, residual=False, prenorm=True, params="weight")
        ),
        Variant("layer-p0-prenorm-no-params", dict(p=0.0, prenorm=True, params="none")),
        Variant(
            "rms-bias-only-residual-in-fp32-prenorm",
            dict(p=0.2, rms=True, prenorm=True, residual_in_fp32=True, params="bias", param_dtype=torch.float32),
            dtypes=(torch.float16, torch.bfloat16),
        ),
    ),
    sample=dan_sample,
    run=dan_run,
    reference=dan_reference,
    check=dan_check,
    extra_backends=("cuda-emulated",),
)


# ---------------------------------------------------------------------------------------------- bias-activation
def bias_act_sample(prefix, n, dtype, device, *, act=1, bias_dtype=None, data_seed=0):
    s = bias_relu_sample(prefix, n, dtype, device, bias_dtype=bias_dtype, data_seed=data_seed)
    s.args["act"] = act
    return s


def bias_act_run(backend, s: Sample):
    x, bias, act = s.args["x"], s.args["bias"], s.args["act"]
    out = backend.op("bias_act")(x, bias, act)
    # what autograd saves: the output for relu (mask out > 0), x for the others
    gx, gb = backend.op("bias_act_backward")(s.grad_out, out if act == 0 else x, bias, act)
    res = dict(out=out, grad_x=gx, grad_bias=gb)
    if act == 0:  # relu is bias_relu, bit for bit, on the same backend
        res["bias_relu"] = backend.op("bias_relu")(x, bias)
        res["bias_relu_grad_x"], res["bias_relu_grad_bias"] = backend.op("bias_relu_backward")(s.grad_out, out)
    return res


def bias_act_reference(s: Sample, dtype, low_precision_params=False):
    x = s.args["x"].detach().to(dtype).requires_grad_()
    b = s.args["bias"].detach().to(dtype).requires_grad_()
    out = R.bias_act(x, b, s.args["act"])
    out.backward(s.grad_out.to(dtype))
    return dict(out=out.detach(), grad_x=x.grad, grad_bias=b.grad)


def bias_act_check(s: Sample, ours, ref64, low):
    x, act = s.args["x"], s.args["act"]
    dtype = x.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert ours["out"].dtype == dtype and ours["out"].shape == x.shape and ours["out"].is_contiguous()
    assert ours["grad_x"].dtype == dtype and ours["grad_x"].shape == x.shape
    assert ours["grad_bias"].dtype == acc and ours["grad_bias"].shape == (x.shape[-1],), "the accumulation dtype"
    fl = FLOORS[dtype]
    assert_close_to_reference("out", ours["out"].cpu(), ref64["out"].cpu(), low["out"].cpu(), fl)
    assert_close_to_reference("grad_x", ours["grad_x"].cpu(), ref64["grad_x"].cpu(), low["grad_x"].cpu(), fl)
    assert_close_to_reference(
        "grad_bias", ours["grad_bias"].cpu(), ref64["grad_bias"].cpu(), low["grad_bias"].cpu(), fl * max(1, s.m)
    )
    if act == 0:  # act 0 is bias_relu: the same bits (grad_x is grad_out where out > 0)
        assert torch.equal(ours["out"].cpu(), ours["bias_relu"].cpu()), "act 0: bias_relu's output bits"
        assert torch.equal(ours["grad_x"].cpu(), ours["bias_relu_grad_x"].cpu())
        assert torch.equal(ours["grad_bias"].cpu(), ours["bias_relu_grad_bias"].cpu()), "the same sums in one order"
        expect = torch.where(ours["out"].cpu() > 0, s.grad_out.cpu(), torch.zeros((), dtype=dtype))
        assert torch.equal(ours["grad_x"].cpu(), expect)


BIAS_ACT = OpSpec(
    name="bias_act",
    variants=(
        Variant("relu", dict(act=0)),
        Variant("gelu", dict(act=1)),
        Variant("gelu_tanh", dict(act=2)),
        Variant("silu", dict(act=3)),
        Variant("gelu-amp-fp32-bias", dict(act=1, bias_dtype=torch.float32), dtypes=(torch.float16, torch.bfloat16)),
    ),
    sample=bias_act_sample,
    run=bias_act_run,
    reference=bias_act_reference,
    check=bias_act_check,
)


# ---------------------------------------------------------------------------------------------- gated activation
def gated_sample(prefix, n, dtype, device, *, act=3, p=0.0, packed=False, seed=4321, data_seed=0):
    """n is F, the output's last dimension; packed: one (..., 2F) tensor [gate | up] (up None)."""
    g = torch.Generator().manual_seed(data_seed)
    gate = (1.5 * torch.randn(*prefix, 2 * n if packed else n, generator=g, dtype=torch.float64)).to(dtype).to(device)
    up = None if packed else torch.randn(*prefix, n, generator=g, dtype=torch.float64).to(dtype).to(device)
    grad_out = torch.randn(*prefix, n, generator=g, dtype=torch.float64).to(dtype).to(device)
    return Sample(dict(gate=gate, up=up, seed=seed_tensor(seed, device), p=p, act=act), grad_out)


def gated_run(backend, s: Sample):
    a = s.args
    out = backend.op("gated_act")(a["gate"], a["up"], a["seed"], a["p"], a["act"])
    gg, gu = backend.op("gated_act_backward")(s.grad_out, a["gate"], a["up"], a["seed"], a["p"], a["act"])
    res = dict(out=out, grad_gate=gg, grad_up=gu)
    if a["up"] is None:  # the packed layout gives the two-tensor layout's bits, on the same backend
        n = s.grad_out.shape[-1]
        gate, up = a["gate"][..., :n].contiguous(), a["gate"][..., n:].contiguous()
        res["split_out"] = backend.op("gated_act")(gate, up, a["seed"], a["p"], a["act"])
        res["split_grad_gate"], res["split_grad_up"] = backend.op("gated_act_backward")(
            s.grad_out, gate, up, a["seed"], a["p"], a["act"]
        )
    return res


def gated_reference(s: Sample, dtype, low_precision_params=False):
    a = s.args
    gate = a["gate"].detach().to(dtype).requires_grad_()
    up = None if a["up"] is None else a["up"].detach().to(dtype).requires_grad_()
    out = R.gated_act(gate, up, a["act"], a["seed"], a["p"])
    out.backward(s.grad_out.to(dtype))
    return dict(out=out.detach(), grad_gate=gate.grad, grad_up=None if up is None else up.grad)


def gated_check(s: Sample, ours, ref64, low):
    a = s.args
    gate, up, n = a["gate"], a["up"], s.grad_out.shape[-1]
    dtype = gate.dtype
    out_shape = (*gate.shape[:-1], n)
    assert ours["out"].dtype == dtype and tuple(ours["out"].shape) == out_shape and ours["out"].is_contiguous()
    assert ours["grad_gate"].dtype == dtype and ours["grad_gate"].shape == gate.shape
    if up is None:
        assert ours["grad_up"].shape == (0,), "the packed layout's grad_up is (0,): grad_gate holds both halves"
        gg = ours["grad_gate"].cpu()
        for k, got in (("out", ours["out"].cpu()), ("grad_gate", gg[..., :n]), ("grad_up", gg[..., n:])):
            assert torch.equal(got, ours["split_" + k].cpu()), f"packed layout: {k} differs from the two-tensor bits"
    else:
        assert ours["grad_up"].dtype == dtype and ours["grad_up"].shape == up.shape
    fl = FLOORS[dtype]
    for k in ("out", "grad_gate") if up is None else ("out", "grad_gate", "grad_up"):
        assert_close_to_reference(k, ours[k].cpu(), ref64[k].cpu(), low[k].cpu(), fl)
    if R.dropout_threshold(a["p"]) > 0:  # dropped elements are exact zeros in the output and both gradients
        m = s.m
        keep = R.dropout_keep_mask(R.seed_value(a["seed"]), m, n, a["p"]).reshape(out_shape)
        zero = torch.zeros((), dtype=dtype)
        assert torch.equal(ours["out"].cpu()[~keep], zero.expand(int((~keep).sum())))
        gg = ours["grad_gate"].cpu()
        gu = gg[..., n:] if up is None else ours["grad_up"].cpu()
        assert bool((gg[..., :n][~keep] == 0).all()) and bool((gu[~keep] == 0).all())


GATED_ACT = OpSpec(
    name="gated_act",
    variants=(
        # SwiGLU (LLaMA's) in every dtype and layout; the other activations, whose per-element code is bias_act's
        # (its own table entry runs them in every dtype), in fp32 and bf16
        Variant("silu", dict(act=3)),
        Variant("silu-packed", dict(act=3, packed=True)),
        Variant("silu-dropout", dict(act=3, p=0.25)),
        Variant("gelu", dict(act=1), dtypes=(torch.float32, torch.bfloat16)),
        Variant("gelu_tanh", dict(act=2), dtypes=(torch.float32, torch.bfloat16)),
        Variant("relu", dict(act=0), dtypes=(torch.float32, torch.bfloat16)),
        Variant("gelu_tanh-packed-dropout", dict(act=2, p=0.3, packed=True), dtypes=(torch.float32, torch.bfloat16)),
    ),
    sample=gated_sample,
    run=gated_run,
    reference=gated_reference,
    check=gated_check,
    extra_backends=("cuda-emulated",),
)

OPS = [LAYER_NORM_DROPOUT_RELU, NORM_DROPOUT, BIAS_RELU, DROPOUT_ADD_NORM, BIAS_ACT, GATED_ACT]
OPS_BY_NAME = {op.name: op for op in OPS}


def check_against_reference(op: OpSpec, backend, s: Sample):
    """Runs `op` on `backend` and checks every result against the fp64 reference; returns our results."""
    ours = op.run(backend, s)
    dtype = s.x.dtype
    cpu = Sample(
        {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in s.args.items()},
        s.grad_out.cpu(),
        None if s.grad_sum is None else s.grad_sum.cpu(),
    )
    ref64 = op.reference(cpu, torch.float64)
    low = op.reference(cpu, dtype, low_precision_params=True)
    op.check(cpu, ours, ref64, low)
    return ours

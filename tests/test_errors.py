"""Errors (DESIGN 4): every bad input raises a RuntimeError naming the argument, the expected and the
actual value, with the same first line on every backend and in the fake kernel (torch.compile / export); bad
backend choices say what to do instead.
"""

import importlib
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gpuopt_ops
from gpuopt_ops.backends import resolve_backend

from backends import DEFAULT, backend_params, require_op

ops = torch.ops.gpuopt


def good():
    return dict(
        x=torch.randn(4, 8),
        weight=torch.randn(8),
        bias=torch.randn(8),
        seed=torch.zeros(1, dtype=torch.int64),
        p=0.1,
        eps=1e-5,
    )


LDR_CASES = [
    ("x", dict(x=torch.randint(0, 3, (4, 8))), "x must be float32, float16, bfloat16 or float64, got torch.int64"),
    (
        "x",
        dict(x=torch.ones(4, 8, dtype=torch.bool)),
        "x must be float32, float16, bfloat16 or float64, got torch.bool",
    ),
    (
        "x",
        dict(x=torch.randn(4, 8, dtype=torch.complex64)),
        "x must be float32, float16, bfloat16 or float64, got torch.complex64",
    ),
    ("x", dict(x=torch.tensor(1.0)), "x must have at least 1 dimension"),
    ("x", dict(x=torch.randn(4, 0), weight=None, bias=None), "x must have a non-empty last dimension"),
    ("weight", dict(weight=torch.randn(7)), r"weight must have shape \(8,\)"),
    ("weight", dict(weight=torch.randn(2, 4)), r"weight must have shape \(8,\)"),
    ("weight", dict(weight=torch.randn(8, dtype=torch.float64)), "weight must have dtype torch.float32"),
    ("bias", dict(bias=torch.randn(9)), r"bias must have shape \(8,\)"),
    ("bias", dict(bias=torch.randn(8, dtype=torch.float16)), "bias must have dtype"),
    (
        "bias",
        dict(
            x=torch.randn(4, 8, dtype=torch.bfloat16), weight=torch.randn(8), bias=torch.randn(8, dtype=torch.bfloat16)
        ),
        "bias must have the dtype of weight",
    ),
    ("seed", dict(seed=torch.zeros(1, dtype=torch.int32)), "seed must have dtype torch.int64, got torch.int32"),
    ("seed", dict(seed=torch.zeros(2, dtype=torch.int64)), "seed must have 1 element"),
    ("seed", dict(seed=torch.zeros(1)), "seed must have dtype torch.int64"),
    ("p", dict(p=-0.1), r"p must be in \[0, 1\], got -0.1"),
    ("p", dict(p=1.5), r"p must be in \[0, 1\], got 1.5"),
    ("p", dict(p=float("nan")), r"p must be in \[0, 1\], got nan"),
    ("eps", dict(eps=0.0), "eps must be a finite number > 0"),
    ("eps", dict(eps=-1e-5), "eps must be a finite number > 0"),
    ("eps", dict(eps=float("inf")), "eps must be a finite number > 0"),
]


def _on(kw, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def _raise_first_line(fn, *args):
    with pytest.raises(RuntimeError) as e:
        fn(*args)
    return str(e.value).splitlines()[0].replace("gpuopt.triton_", "gpuopt.")


def _fake(fn):
    def call(*args):
        with FakeTensorMode() as mode:
            return fn(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])

    return call


# ---------------------------------------------------------------------------------------------- op inputs
@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("arg,change,message", LDR_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(LDR_CASES)])
def test_layer_norm_dropout_relu_bad_input(backend, arg, change, message):
    """The message names the argument; the backend's op and the fake kernel say exactly the same."""
    kw = good()
    kw.update(change)
    op = backend.op("layer_norm_dropout_relu")
    args = list(_on(kw, backend.device).values())
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?layer_norm_dropout_relu: " + message):
        op(*args)
    assert _raise_first_line(op, *args) == _raise_first_line(_fake(ops.layer_norm_dropout_relu), *kw.values())


def backward_args(device):
    kw = good()
    out, mean, rstd = ops.layer_norm_dropout_relu(*kw.values())
    return _on(
        dict(
            grad_out=torch.randn_like(out),
            x=kw["x"],
            weight=kw["weight"],
            bias=kw["bias"],
            mean=mean,
            rstd=rstd,
            seed=kw["seed"],
            p=0.1,
        ),
        device,
    )


BWD_CASES = [
    (dict(grad_out=torch.randn(4, 9)), r"grad_out must have shape \(4, 8\) like x"),
    (dict(grad_out=torch.randn(4, 8, dtype=torch.float64)), "grad_out must have dtype torch.float32 like x"),
    (dict(mean=torch.zeros(3)), r"mean must have shape \(4,\)"),
    (dict(rstd=torch.zeros(4, dtype=torch.float64)), "rstd must have dtype torch.float32"),
    (dict(p=2.0), r"p must be in \[0, 1\], got 2"),
    (dict(seed=torch.zeros(1, 1, dtype=torch.int64).expand(1, 2)), "seed must have 1 element"),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("change,message", BWD_CASES)
def test_backward_bad_input(backend, change, message):
    kw = backward_args(backend.device)
    kw.update(_on(change, backend.device))
    op = backend.op("layer_norm_dropout_relu_backward")
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?layer_norm_dropout_relu_backward: " + message):
        op(*kw.values())
    cpu = {**backward_args("cpu"), **change}
    assert _raise_first_line(op, *kw.values()) == _raise_first_line(
        _fake(ops.layer_norm_dropout_relu_backward), *cpu.values()
    )


BIAS_CASES = [
    (dict(x=torch.randint(0, 2, (3, 5))), "x must be float32"),
    (dict(bias=torch.randn(4)), r"bias must have shape \(5,\)"),
    (dict(bias=torch.randn(5, dtype=torch.float64)), "bias must have dtype torch.float32"),
    (dict(x=torch.tensor(2.0)), "x must have at least 1 dimension"),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("change,message", BIAS_CASES)
def test_bias_relu_bad_input(backend, change, message):
    kw = dict(x=torch.randn(3, 5), bias=torch.randn(5))
    kw.update(change)
    op = backend.op("bias_relu")
    args = list(_on(kw, backend.device).values())
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?bias_relu: " + message):
        op(*args)
    assert _raise_first_line(op, *args) == _raise_first_line(_fake(ops.bias_relu), *kw.values())


@pytest.mark.parametrize("backend", backend_params())
def test_bias_relu_backward_bad_input(backend):
    dev = backend.device
    op = backend.op("bias_relu_backward")
    for args, message in [
        ((torch.randn(3, 4), torch.randn(3, 5)), "grad_out must have shape"),
        ((torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5)), "grad_out must have dtype"),
    ]:
        with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?bias_relu_backward: " + message):
            op(*(a.to(dev) for a in args))
        assert _raise_first_line(op, *(a.to(dev) for a in args)) == _raise_first_line(
            _fake(ops.bias_relu_backward), *args
        )


ACT_MESSAGE = r"act must be 0 \(relu\), 1 \(gelu\), 2 \(gelu_tanh\) or 3 \(silu\), got "

BIAS_ACT_CASES = [
    *[(dict(change, act=1), message) for change, message in BIAS_CASES],
    (dict(act=7), ACT_MESSAGE + "7"),
    (dict(act=-1), ACT_MESSAGE + "-1"),
    (dict(act=4), ACT_MESSAGE + "4"),
]


def _emulated():
    from helpers import load_emulated_ops

    return load_emulated_ops()


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("change,message", BIAS_ACT_CASES)
def test_bias_act_bad_input(backend, change, message):
    kw = dict(x=torch.randn(3, 5), bias=torch.randn(5), act=0)
    kw.update(change)
    op = backend.op("bias_act")
    args = list(_on(kw, backend.device).values())
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?bias_act: " + message):
        op(*args)
    assert _raise_first_line(op, *args) == _raise_first_line(_fake(ops.bias_act), *kw.values())


BIAS_ACT_BWD_CASES = [
    (dict(grad_out=torch.randn(3, 4)), r"grad_out must have shape \(3, 5\) like saved"),
    (dict(grad_out=torch.randn(3, 5, dtype=torch.float64)), "grad_out must have dtype torch.float32 like saved"),
    (dict(saved=torch.randint(0, 2, (3, 5)), grad_out=torch.randint(0, 2, (3, 5))), "saved must be float32"),
    (dict(bias=torch.randn(4)), r"bias must have shape \(5,\)"),
    (dict(bias=torch.randn(5, dtype=torch.float16)), "bias must have dtype torch.float32"),
    (dict(act=7), ACT_MESSAGE + "7"),
    (dict(act=-3), ACT_MESSAGE + "-3"),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("change,message", BIAS_ACT_BWD_CASES)
def test_bias_act_backward_bad_input(backend, change, message):
    kw = dict(grad_out=torch.randn(3, 5), saved=torch.randn(3, 5), bias=torch.randn(5), act=2)
    kw.update(change)
    op = backend.op("bias_act_backward")
    args = list(_on(kw, backend.device).values())
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?bias_act_backward: " + message):
        op(*args)
    assert _raise_first_line(op, *args) == _raise_first_line(_fake(ops.bias_act_backward), *kw.values())


@pytest.mark.cuda_emulated
def test_bias_act_bad_act_on_the_emulator():
    """The CUDA backend's glue (torch_ops.h) rejects a bad act code with the same message, before any launch."""
    emu = _emulated()
    x, b = torch.randn(3, 5), torch.randn(5)
    for op, args in (("bias_act", (x, b, 7)), ("bias_act_backward", (x, x, b, 7))):
        with pytest.raises(RuntimeError) as e:
            getattr(emu, op)(*args)
        assert str(e.value).splitlines()[0] == _raise_first_line(getattr(ops, op), *args)
        assert f"gpuopt.{op}: act must be 0 (relu), 1 (gelu), 2 (gelu_tanh) or 3 (silu), got 7" in str(e.value)


# ---------------------------------------------------------------------------------------------- norm_dropout
# norm_dropout shares layer_norm_dropout_relu's checks (under its own name): the same matrix, in both norms.
@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("arg,change,message", LDR_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(LDR_CASES)])
def test_norm_dropout_bad_input(backend, rms, arg, change, message):
    require_op(backend, "norm_dropout")
    kw = {**good(), **change, "rms": rms, "relu": not rms}
    op = backend.op("norm_dropout")
    args = list(_on(kw, backend.device).values())
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?norm_dropout: " + message):
        op(*args)
    assert _raise_first_line(op, *args) == _raise_first_line(_fake(ops.norm_dropout), *kw.values())


def nd_backward_args(device, rms):
    kw = {**good(), "rms": rms, "relu": False}
    out, mean, rstd = ops.norm_dropout(*kw.values())
    args = dict(grad_out=torch.randn_like(out), x=kw["x"], weight=kw["weight"], bias=kw["bias"], mean=mean, rstd=rstd)
    return _on(dict(args, seed=kw["seed"], p=0.1, rms=rms, relu=False), device)


ND_BWD_CASES = [
    *[(False, change, message) for change, message in BWD_CASES],
    (True, dict(mean=torch.zeros(4)), r"mean must have shape \(0,\) when rms is true, got \(4,\)"),
    (True, dict(mean=torch.zeros(0, dtype=torch.float64)), "mean must have dtype torch.float32, got torch.float64"),
    (True, dict(rstd=torch.zeros(3)), r"rstd must have shape \(4,\)"),
    (True, dict(grad_out=torch.randn(4, 8, dtype=torch.float16)), "grad_out must have dtype torch.float32 like x"),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("rms,change,message", ND_BWD_CASES)
def test_norm_dropout_backward_bad_input(backend, rms, change, message):
    require_op(backend, "norm_dropout")
    kw = {**nd_backward_args(backend.device, rms), **_on(change, backend.device)}
    op = backend.op("norm_dropout_backward")
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?norm_dropout_backward: " + message):
        op(*kw.values())
    cpu = {**nd_backward_args("cpu", rms), **change}
    assert _raise_first_line(op, *kw.values()) == _raise_first_line(_fake(ops.norm_dropout_backward), *cpu.values())


def test_norm_dropout_public_api_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"gpuopt.norm_dropout: norm must be one of \('layer', 'rms'\), got 'batch'"):
        gpuopt_ops.norm_dropout(x, norm="batch")
    with pytest.raises(ValueError, match="gpuopt.norm_dropout: activation must be None or 'relu', got 'gelu'"):
        gpuopt_ops.norm_dropout(x, activation="gelu")
    with pytest.raises(ValueError, match="gpuopt.norm_dropout: backend must be one of"):
        gpuopt_ops.norm_dropout(x, backend="tpu")


# ---------------------------------------------------------------------------------------------- dropout_add_norm
def dan_good():
    return dict(
        x=torch.randn(4, 8),
        residual=torch.randn(4, 8),
        weight=torch.randn(8),
        bias=torch.randn(8),
        seed=torch.zeros(1, dtype=torch.int64),
        p=0.1,
        eps=1e-5,
        rms=False,
        residual_in_fp32=False,
    )


H = torch.float16
DAN_CASES = [
    ("x", dict(x=torch.randint(0, 3, (4, 8))), "x must be float32, float16, bfloat16 or float64, got torch.int64"),
    ("x", dict(x=torch.tensor(1.0)), "x must have at least 1 dimension"),
    ("x", dict(x=torch.randn(4, 0), residual=None, weight=None, bias=None), "x must have a non-empty last dimension"),
    ("weight", dict(weight=torch.randn(7)), r"weight must have shape \(8,\) to match the last dimension of x"),
    ("weight", dict(weight=torch.randn(8, dtype=torch.float64)), "weight must have dtype torch.float32"),
    ("bias", dict(bias=torch.randn(9), rms=True), r"bias must have shape \(8,\)"),
    (
        "bias",
        dict(x=torch.randn(4, 8, dtype=H), residual=None, weight=torch.randn(8), bias=torch.randn(8, dtype=H)),
        "bias must have the dtype of weight",
    ),
    ("residual", dict(residual=torch.randn(4, 9)), r"residual must have shape \(4, 8\) like x, got \(4, 9\)"),
    ("residual", dict(residual=torch.randn(32)), r"residual must have shape \(4, 8\) like x, got \(32,\)"),
    (
        "residual",
        dict(residual=torch.randn(4, 8, dtype=torch.float64)),
        "residual must have dtype torch.float32 like x, got torch.float64",
    ),
    (
        "residual",
        dict(x=torch.randn(4, 8, dtype=H), residual=torch.randn(4, 8), weight=None, bias=None),
        r"residual must have dtype torch.float16 like x, got torch.float32 \(an fp32 residual needs "
        r"residual_in_fp32=True\)",
    ),
    (
        "residual",
        dict(
            x=torch.randn(4, 8, dtype=torch.bfloat16),
            residual=torch.randn(4, 8, dtype=torch.bfloat16),
            weight=None,
            bias=None,
            residual_in_fp32=True,
        ),
        r"residual must have dtype torch.float32 \(residual_in_fp32=True with x of dtype torch.bfloat16\), "
        "got torch.bfloat16",
    ),
    ("seed", dict(seed=torch.zeros(1, dtype=torch.int32)), "seed must have dtype torch.int64, got torch.int32"),
    ("seed", dict(seed=torch.zeros(2, dtype=torch.int64)), "seed must have 1 element"),
    ("p", dict(p=-0.1), r"p must be in \[0, 1\], got -0.1"),
    ("p", dict(p=float("nan")), r"p must be in \[0, 1\], got nan"),
    ("eps", dict(eps=0.0), "eps must be a finite number > 0"),
    ("eps", dict(eps=float("inf"), rms=True), "eps must be a finite number > 0"),
]
DAN_BACKENDS = backend_params(*DEFAULT, "cuda-emulated")


@pytest.mark.parametrize("backend", DAN_BACKENDS)
@pytest.mark.parametrize("arg,change,message", DAN_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(DAN_CASES)])
def test_dropout_add_norm_bad_input(backend, arg, change, message):
    """The residual's shape and dtype (naming residual_in_fp32 where it explains the dtype) besides the checks of
    layer_norm_dropout_relu; the backend's op and the fake kernel say exactly the same."""
    require_op(backend, "dropout_add_norm")
    kw = dan_good()
    kw.update(change)
    op = backend.op("dropout_add_norm")
    args = list(_on(kw, backend.device).values())
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?dropout_add_norm: " + message):
        op(*args)
    assert _raise_first_line(op, *args) == _raise_first_line(_fake(ops.dropout_add_norm), *kw.values())


def dan_backward_args(rms=False, dtype=torch.float32, residual_in_fp32=False):
    kw = dan_good()
    kw.update(x=kw["x"].to(dtype), rms=rms, residual_in_fp32=residual_in_fp32, weight=None, bias=None)
    kw["residual"] = kw["residual"].to(torch.float32 if residual_in_fp32 else dtype)
    out, s, mean, rstd = ops.dropout_add_norm(*kw.values())
    return dict(
        grad_out=torch.randn_like(out),
        grad_sum=torch.randn_like(s),
        sum=s,
        weight=torch.randn(8),
        bias=torch.randn(8),
        mean=mean,
        rstd=rstd,
        seed=kw["seed"],
        p=0.1,
        rms=rms,
        has_residual=True,
    )


DAN_BWD_CASES = [
    (
        dict(),
        dict(grad_out=torch.randint(0, 3, (4, 8), dtype=torch.int32)),
        "grad_out must be float32, float16, bfloat16 or",
    ),
    (dict(), dict(sum=torch.randn(4, 9)), r"sum must have shape \(4, 8\) like grad_out, got \(4, 9\)"),
    (
        dict(),
        dict(sum=torch.randn(4, 8, dtype=H)),
        "sum must have dtype torch.float32 like grad_out, got torch.float16",
    ),
    (
        dict(dtype=H),
        dict(sum=torch.randn(4, 8, dtype=torch.float64)),
        r"sum must have dtype torch.float16 \(like grad_out\) or torch.float32 \(residual_in_fp32\), got "
        "torch.float64",
    ),
    (dict(), dict(grad_sum=torch.randn(4, 8, dtype=torch.float64)), "grad_sum must have dtype torch.float32 like sum"),
    (dict(dtype=H, residual_in_fp32=True), dict(grad_sum=torch.randn(4, 8, dtype=H)), "grad_sum must have dtype"),
    (dict(), dict(grad_sum=torch.randn(8)), r"grad_sum must have shape \(4, 8\) like sum, got \(8,\)"),
    (dict(), dict(weight=torch.randn(9)), r"weight must have shape \(8,\) to match the last dimension of grad_out"),
    (dict(), dict(mean=torch.zeros(3)), r"mean must have shape \(4,\) \(one entry per row of grad_out\)"),
    (dict(rms=True), dict(mean=torch.zeros(4)), r"mean must have shape \(0,\) when rms is true, got \(4,\)"),
    (dict(), dict(rstd=torch.zeros(4, dtype=torch.float64)), "rstd must have dtype torch.float32, got torch.float64"),
    (dict(), dict(p=2.0), r"p must be in \[0, 1\], got 2"),
]


@pytest.mark.parametrize("backend", DAN_BACKENDS)
@pytest.mark.parametrize("setup,change,message", DAN_BWD_CASES)
def test_dropout_add_norm_backward_bad_input(backend, setup, change, message):
    require_op(backend, "dropout_add_norm")
    kw = {**dan_backward_args(**setup), **change}
    op = backend.op("dropout_add_norm_backward")
    args = list(_on(kw, backend.device).values())
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?dropout_add_norm_backward: " + message):
        op(*args)
    assert _raise_first_line(op, *args) == _raise_first_line(_fake(ops.dropout_add_norm_backward), *kw.values())


def test_dropout_add_norm_public_api_errors():
    x = torch.randn(2, 8)
    with pytest.raises(
        ValueError, match=r"gpuopt.dropout_add_norm: norm must be one of \('layer', 'rms'\), got 'batch'"
    ):
        gpuopt_ops.dropout_add_norm(x, norm="batch")
    with pytest.raises(ValueError, match="gpuopt.dropout_add_norm: backend must be one of"):
        gpuopt_ops.dropout_add_norm(x, backend="tpu")
    with pytest.raises(RuntimeError, match="residual_in_fp32=True"):
        gpuopt_ops.dropout_add_norm(x.half(), x, residual_in_fp32=False)


@pytest.mark.parametrize("backend", backend_params("cuda", "triton"))
@pytest.mark.parametrize("which", ["residual", "weight", "seed"])
def test_dropout_add_norm_arguments_on_another_device(backend, which):
    require_op(backend, "dropout_add_norm")
    kw = _on(dan_good(), "cuda")
    kw[which] = kw[which].cpu()
    with pytest.raises(RuntimeError, match=f"gpuopt.(triton_)?dropout_add_norm: {which} must be on cuda:0 like x"):
        backend.op("dropout_add_norm")(*kw.values())


@pytest.mark.parametrize("backend", backend_params("cuda", "triton"))
@pytest.mark.parametrize("which", ["weight", "bias", "seed"])
def test_arguments_on_another_device(backend, which):
    kw = _on(good(), "cuda")
    kw[which] = kw[which].cpu()
    with pytest.raises(RuntimeError, match=f"{which} must be on cuda:0 like x, got cpu"):
        backend.op("layer_norm_dropout_relu")(*kw.values())
    with pytest.raises(RuntimeError, match="bias must be on cuda:0 like x, got cpu"):
        backend.op("bias_relu")(torch.randn(3, 5, device="cuda"), torch.randn(5))


# ---------------------------------------------------------------------------------------------- backends
def test_public_api_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="gpuopt.layer_norm_dropout_relu: backend must be one of"):
        gpuopt_ops.layer_norm_dropout_relu(x, 8, backend="tpu")
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA tensor"):
        gpuopt_ops.bias_relu(x, torch.randn(8), backend="cuda")
    with pytest.raises(ValueError, match="normalized_shape"):
        gpuopt_ops.layer_norm_dropout_relu(x, (3,))
    with pytest.raises(
        ValueError, match="gpuopt.bias_act: act must be one of 'relu', 'gelu', 'gelu_tanh', 'silu', got 'tanh'"
    ):
        gpuopt_ops.bias_act(x, torch.randn(8), act="tanh")


def test_resolve_backend_is_the_one_check():
    """One function validates backend= for the functions, the modules, fuse and the training loop."""
    from gpuopt_ops.fuse import fuse
    from gpuopt_ops.modules import FusedBiasReLU

    assert gpuopt_ops.resolve_backend is resolve_backend
    assert gpuopt_ops.BACKENDS == ("auto", "cuda", "cpu", "triton")
    assert [resolve_backend(b) for b in gpuopt_ops.BACKENDS] == list(gpuopt_ops.BACKENDS)  # names only
    assert resolve_backend("auto", "cpu") == "cpu" and resolve_backend("cpu", torch.device("cpu")) == "cpu"
    assert resolve_backend("auto", "meta") == "cpu"
    for make in (
        lambda: resolve_backend("gpu"),
        lambda: FusedBiasReLU(4, backend="gpu"),
        lambda: fuse(torch.nn.Sequential(), backend="gpu"),
    ):
        with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'cuda', 'cpu', 'triton'\), got 'gpu'"):
            make()
    with pytest.raises(ValueError, match="gpuopt.bias_relu: backend='cpu' needs a CPU tensor, got x on meta"):
        resolve_backend("cpu", "meta", "bias_relu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only messages of backend='cuda'")
def test_cuda_backend_without_a_gpu():
    with pytest.raises(
        ValueError, match="backend='cuda' needs a CUDA tensor, got x on cpu; use backend='auto' or 'cpu'"
    ):
        resolve_backend("cuda", "cpu", "layer_norm_dropout_relu")


def test_triton_backend_errors_say_what_to_do(monkeypatch):
    pytest.importorskip("triton")
    from gpuopt_ops import triton_ops

    x = torch.randn(2, 8)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1 before importing triton.*backend='cpu'"):
        gpuopt_ops.layer_norm_dropout_relu(x, 8, backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton_ops, "INTERPRETED", False)  # as if the kernels had been compiled for the GPU
    with pytest.raises(RuntimeError, match="imported before TRITON_INTERPRET=1 was set.*backend='cpu'"):
        gpuopt_ops.bias_relu(x, torch.randn(8), backend="triton")
    with pytest.raises(RuntimeError, match="cannot run on CPU tensors.*TRITON_INTERPRET=1"):
        ops.triton_bias_relu(x, torch.randn(8))


def test_clear_errors_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    with pytest.raises(RuntimeError, match="backend='triton' needs the triton package"):
        resolve_backend("triton", "cpu", "bias_relu")
    monkeypatch.delitem(sys.modules, "gpuopt_ops.triton_ops", raising=False)
    with pytest.raises(ImportError, match="gpuopt_ops.triton_ops needs the `triton` package"):
        importlib.import_module("gpuopt_ops.triton_ops")


# ---------------------------------------------------------------------------------------------- gated_act
GATED_CASES = [
    (dict(act=7), ACT_MESSAGE + "7"),
    (dict(act=-1), ACT_MESSAGE + "-1"),
    (dict(gate=torch.randint(0, 3, (3, 6))), "gate must be float32, float16, bfloat16 or float64, got torch.int64"),
    (dict(gate=torch.tensor(1.0), up=None), "gate must have at least 1 dimension"),
    (dict(gate=torch.randn(3, 0), up=None), "gate must have a non-empty last dimension"),
    (dict(up=torch.randn(3, 5)), r"up must have shape \(3, 6\) like gate, got \(3, 5\)"),
    (dict(up=torch.randn(3, 6, dtype=torch.float64)), "up must have dtype torch.float32 like gate, got torch.float64"),
    (
        dict(gate=torch.randn(3, 7), up=None),
        r"gate must have an even last dimension \(its halves are \[gate \| up\]\) when up is None, got shape \(3, 7\)",
    ),
    (dict(seed=torch.zeros(1, dtype=torch.int32)), "seed must have dtype torch.int64, got torch.int32"),
    (dict(seed=torch.zeros(2, dtype=torch.int64)), "seed must have 1 element"),
    (dict(p=1.5), r"p must be in \[0, 1\], got 1.5"),
    (dict(p=float("nan")), r"p must be in \[0, 1\], got nan"),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("change,message", GATED_CASES)
def test_gated_act_bad_input(backend, change, message):
    require_op(backend, "gated_act")
    kw = dict(gate=torch.randn(3, 6), up=torch.randn(3, 6), seed=torch.zeros(1, dtype=torch.int64), p=0.1, act=3)
    kw.update(change)
    op = backend.op("gated_act")
    args = list(_on(kw, backend.device).values())
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?gated_act: " + message):
        op(*args)
    assert _raise_first_line(op, *args) == _raise_first_line(_fake(ops.gated_act), *kw.values())


GATED_BWD_CASES = [
    *[(change, message) for change, message in GATED_CASES if "gate=" not in str(change)],
    (
        dict(grad_out=torch.randn(3, 5)),
        r"grad_out must have the output's shape \(gate's, last dimension 6\), got \(3, 5\)",
    ),
    (
        dict(gate=torch.randn(3, 12), up=None),  # packed: the output's last dimension is 6, grad_out's is 6: fine
        None,
    ),
    (
        dict(gate=torch.randn(3, 12), up=None, grad_out=torch.randn(3, 12)),
        r"grad_out must have the output's shape \(gate's, last dimension 6\), got \(3, 12\)",
    ),
    (dict(grad_out=torch.randn(2, 6)), r"grad_out must have the output's shape \(gate's, last dimension 6\)"),
    (dict(grad_out=torch.randn(3, 6, dtype=torch.float16)), "grad_out must have dtype torch.float32 like gate"),
    (dict(gate=torch.randn(3, 7), up=None, grad_out=torch.randn(3, 3)), "gate must have an even last dimension"),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("change,message", GATED_BWD_CASES)
def test_gated_act_backward_bad_input(backend, change, message):
    require_op(backend, "gated_act")
    kw = dict(
        grad_out=torch.randn(3, 6),
        gate=torch.randn(3, 6),
        up=torch.randn(3, 6),
        seed=torch.zeros(1, dtype=torch.int64),
        p=0.1,
        act=3,
    )
    kw.update(change)
    op = backend.op("gated_act_backward")
    args = list(_on(kw, backend.device).values())
    if message is None:  # a valid call: the packed layout's grad_gate holds both halves, grad_up is (0,)
        gg, gu = op(*args)
        assert gg.shape == (3, 12) and gu.shape == (0,)
        return
    with pytest.raises(RuntimeError, match=r"gpuopt\.(triton_)?gated_act_backward: " + message):
        op(*args)
    assert _raise_first_line(op, *args) == _raise_first_line(_fake(ops.gated_act_backward), *kw.values())


def test_gated_act_bad_activation_name():
    with pytest.raises(
        ValueError, match="gpuopt.gated_act: act must be one of 'relu', 'gelu', 'gelu_tanh', 'silu', got 'tanh'"
    ):
        gpuopt_ops.gated_act(torch.randn(2, 8), act="tanh")

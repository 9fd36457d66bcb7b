"""Every bad input of DESIGN.md's error rules raises, naming the argument, in the C++ op and the fake kernel."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gpuopt_ops  # noqa: F401

ops = torch.ops.gpuopt


def good():
    return dict(x=torch.randn(4, 8), weight=torch.randn(8), bias=torch.randn(8),
                seed=torch.zeros(1, dtype=torch.int64), p=0.1, eps=1e-5)


LDR_CASES = [
    ("x", dict(x=torch.randint(0, 3, (4, 8))), "x must be float32, float16, bfloat16 or float64, got torch.int64"),
    ("x", dict(x=torch.ones(4, 8, dtype=torch.bool)), "x must be float32, float16, bfloat16 or float64, got torch.bool"),
    ("x", dict(x=torch.randn(4, 8, dtype=torch.complex64)), "x must be float32, float16, bfloat16 or float64, got torch.complex64"),
    ("x", dict(x=torch.tensor(1.0)), "x must have at least 1 dimension"),
    ("x", dict(x=torch.randn(4, 0), weight=None, bias=None), "x must have a non-empty last dimension"),
    ("weight", dict(weight=torch.randn(7)), r"weight must have shape \(8,\)"),
    ("weight", dict(weight=torch.randn(2, 4)), r"weight must have shape \(8,\)"),
    ("weight", dict(weight=torch.randn(8, dtype=torch.float64)), "weight must have dtype torch.float32"),
    ("bias", dict(bias=torch.randn(9)), r"bias must have shape \(8,\)"),
    ("bias", dict(bias=torch.randn(8, dtype=torch.float16)), "bias must have dtype"),
    ("bias", dict(x=torch.randn(4, 8, dtype=torch.bfloat16), weight=torch.randn(8),
                  bias=torch.randn(8, dtype=torch.bfloat16)), "bias must have the dtype of weight"),
    ("seed", dict(seed=torch.zeros(1, dtype=torch.int32)), "seed must have dtype torch.int64, got torch.int32"),
    ("seed", dict(seed=torch.zeros(2, dtype=torch.int64)), "seed must have exactly 1 element"),
    ("seed", dict(seed=torch.zeros(1)), "seed must have dtype torch.int64"),
    ("p", dict(p=-0.1), r"p must be in \[0, 1\], got -0.1"),
    ("p", dict(p=1.5), r"p must be in \[0, 1\], got 1.5"),
    ("p", dict(p=float("nan")), r"p must be in \[0, 1\], got nan"),
    ("eps", dict(eps=0.0), "eps must be a finite number > 0"),
    ("eps", dict(eps=-1e-5), "eps must be a finite number > 0"),
    ("eps", dict(eps=float("inf")), "eps must be a finite number > 0"),
]


def call_forward(kw, fake=False):
    args = (kw["x"], kw["weight"], kw["bias"], kw["seed"], kw["p"], kw["eps"])
    if not fake:
        return ops.layer_norm_dropout_relu(*args)
    with FakeTensorMode() as mode:
        fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        return ops.layer_norm_dropout_relu(*fargs)


@pytest.mark.parametrize("fake", [False, True], ids=["cpu", "fake"])
@pytest.mark.parametrize("arg,change,message", LDR_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(LDR_CASES)])
def test_layer_norm_dropout_relu_bad_input(arg, change, message, fake):
    kw = good()
    kw.update(change)
    with pytest.raises(RuntimeError, match="gpuopt.layer_norm_dropout_relu: " + message):
        call_forward(kw, fake)


def test_same_message_from_cpu_and_fake():
    for _, change, _ in LDR_CASES:
        kw = good()
        kw.update(change)
        msgs = []
        for fake in (False, True):
            with pytest.raises(RuntimeError) as e:
                call_forward(kw, fake)
            msgs.append(str(e.value).splitlines()[0])
        assert msgs[0] == msgs[1]


def backward_args():
    kw = good()
    out, mean, rstd = ops.layer_norm_dropout_relu(*kw.values())
    return dict(grad_out=torch.randn_like(out), x=kw["x"], weight=kw["weight"], bias=kw["bias"], mean=mean,
                rstd=rstd, seed=kw["seed"], p=0.1)


BWD_CASES = [
    (dict(grad_out=torch.randn(4, 9)), r"grad_out must have shape \(4, 8\) like x"),
    (dict(grad_out=torch.randn(4, 8, dtype=torch.float64)), "grad_out must have dtype torch.float32 like x"),
    (dict(mean=torch.zeros(3)), r"mean must have shape \(4,\)"),
    (dict(rstd=torch.zeros(4, dtype=torch.float64)), "rstd must have dtype torch.float32"),
    (dict(p=2.0), r"p must be in \[0, 1\], got 2"),
    (dict(seed=torch.zeros(1, 1, dtype=torch.int64).expand(1, 2)), "seed must have exactly 1 element"),
]


@pytest.mark.parametrize("change,message", BWD_CASES)
def test_backward_bad_input(change, message):
    kw = backward_args()
    kw.update(change)
    with pytest.raises(RuntimeError, match="gpuopt.layer_norm_dropout_relu_backward: " + message):
        ops.layer_norm_dropout_relu_backward(*kw.values())


BIAS_CASES = [
    (dict(x=torch.randint(0, 2, (3, 5))), "x must be float32"),
    (dict(bias=torch.randn(4)), r"bias must have shape \(5,\)"),
    (dict(bias=torch.randn(5, dtype=torch.float64)), "bias must have dtype torch.float32"),
    (dict(x=torch.tensor(2.0)), "x must have at least 1 dimension"),
]


@pytest.mark.parametrize("fake", [False, True], ids=["cpu", "fake"])
@pytest.mark.parametrize("change,message", BIAS_CASES)
def test_bias_relu_bad_input(change, message, fake):
    kw = dict(x=torch.randn(3, 5), bias=torch.randn(5))
    kw.update(change)
    args = (kw["x"], kw["bias"])
    with pytest.raises(RuntimeError, match="gpuopt.bias_relu: " + message):
        if fake:
            with FakeTensorMode() as mode:
                ops.bias_relu(*[mode.from_tensor(a) for a in args])
        else:
            ops.bias_relu(*args)


def test_bias_relu_backward_bad_input():
    with pytest.raises(RuntimeError, match="gpuopt.bias_relu_backward: grad_out must have shape"):
        ops.bias_relu_backward(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(RuntimeError, match="gpuopt.bias_relu_backward: grad_out must have dtype"):
        ops.bias_relu_backward(torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5))


def test_empty_rows_return_empty():
    out, mean, rstd = ops.layer_norm_dropout_relu(torch.randn(0, 8), None, None, torch.zeros(1, dtype=torch.int64),
                                                  0.1, 1e-5)
    assert out.shape == (0, 8) and mean.shape == (0,)
    assert ops.bias_relu(torch.randn(0, 3), torch.randn(3)).shape == (0, 3)


def test_public_api_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="backend must be one of"):
        gpuopt_ops.layer_norm_dropout_relu(x, 8, backend="tpu")
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA tensor"):
        gpuopt_ops.bias_relu(x, torch.randn(8), backend="cuda")
    with pytest.raises(ValueError, match="normalized_shape"):
        gpuopt_ops.layer_norm_dropout_relu(x, (3,))

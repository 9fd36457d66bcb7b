"""Both fused ops, on every C++ backend (CPU here, CUDA on a GPU machine), against the unfused reference."""

import pytest
import torch

import gpuopt_ops

from helpers import (BiasReluLdrBlock, DTYPES, FLOORS, SHAPES, assert_close_to_reference, check_bias_relu_against_reference,
                     check_fp64_dropout_precision, check_grad_bias_is_unrounded_fp32, ldr_reference_and_grads,
                     make_inputs, opcheck_four_ops, seed_tensor)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
ops = torch.ops.gpuopt


def run_ldr(x, w, b, seed, p, eps, grad_out):
    out, mean, rstd = ops.layer_norm_dropout_relu(x, w, b, seed, p, eps)
    gx, gw, gb = ops.layer_norm_dropout_relu_backward(grad_out, x, w, b, mean, rstd, seed, p)
    return out, mean, rstd, gx, gw, gb


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prefix,n", SHAPES)
@pytest.mark.parametrize("p", [0.0, 0.25])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_dropout_relu_matches_reference(device, dtype, prefix, n, p, affine):
    x, w, b = make_inputs(prefix, n, dtype, device, affine=affine)
    seed = seed_tensor(1234, device)
    grad_out = torch.randn(x.shape, dtype=torch.float64, device=device).to(dtype)
    out, mean, rstd, gx, gw, gb = run_ldr(x, w, b, seed, p, 1e-5, grad_out)
    ref64, (rgx, rgw, rgb) = ldr_reference_and_grads(x, w, b, seed, p, 1e-5, grad_out, torch.float64)
    low, (lgx, lgw, lgb) = ldr_reference_and_grads(x, w, b, seed, p, 1e-5, grad_out, dtype)
    assert out.dtype == dtype and out.shape == x.shape
    assert mean.dtype == R_acc(dtype) and mean.shape == (x.numel() // n,)
    fl = FLOORS[dtype]
    assert_close_to_reference("out", out, ref64, low, fl)
    assert_close_to_reference("grad_x", gx, rgx, lgx, fl)
    if affine:
        assert gw.dtype == w.dtype and gb.dtype == b.dtype
        assert_close_to_reference("grad_weight", gw, rgw, lgw, fl * max(1, x.numel() // n))
        assert_close_to_reference("grad_bias", gb, rgb, lgb, fl * max(1, x.numel() // n))
    else:
        assert gw.numel() == 0 and gb.numel() == 0


def R_acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_params_with_low_precision_x(device, dtype):
    """AMP keeps parameters in fp32 while activations are bf16/fp16."""
    x, w, b = make_inputs((9,), 100, dtype, device, param_dtype=torch.float32)
    seed = seed_tensor(3, device)
    g = torch.randn(x.shape, device=device).to(dtype)
    out, _, _, gx, gw, gb = run_ldr(x, w, b, seed, 0.2, 1e-5, g)
    ref64, (rgx, rgw, rgb) = ldr_reference_and_grads(x, w, b, seed, 0.2, 1e-5, g, torch.float64)
    low, (lgx, lgw, lgb) = ldr_reference_and_grads(x, w.to(dtype), b.to(dtype), seed, 0.2, 1e-5, g, dtype)
    assert gw.dtype == torch.float32 and gb.dtype == torch.float32
    assert_close_to_reference("out", out, ref64, low, FLOORS[dtype])
    assert_close_to_reference("grad_x", gx, rgx, lgx, FLOORS[dtype])
    assert_close_to_reference("grad_weight", gw, rgw, lgw, 1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_p0_equals_plain_layer_norm_relu(device):
    x, w, b = make_inputs((32,), 77, torch.float32, device)
    out = gpuopt_ops.layer_norm_dropout_relu(x, 77, w, b, p=0.0)
    ref = torch.relu(torch.nn.functional.layer_norm(x, (77,), w, b, 1e-5))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out_eval = gpuopt_ops.layer_norm_dropout_relu(x, 77, w, b, p=0.5, training=False)
    torch.testing.assert_close(out_eval, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_p1_gives_zeros_and_zero_grads(device):
    x, w, b = make_inputs((16,), 40, torch.float32, device, requires_grad=True)
    out = gpuopt_ops.layer_norm_dropout_relu(x, 40, w, b, p=1.0)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    for t in (x, w, b):
        assert torch.equal(t.grad, torch.zeros_like(t.grad)) and not torch.isnan(t.grad).any()


@pytest.mark.parametrize("device", DEVICES)
def test_public_function_multi_dim_normalized_shape(device):
    x = torch.randn(3, 4, 5, 6, device=device)
    w = torch.randn(5, 6, device=device)
    b = torch.randn(5, 6, device=device)
    out = gpuopt_ops.layer_norm_dropout_relu(x, (5, 6), w, b, p=0.0)
    ref = torch.relu(torch.nn.functional.layer_norm(x, (5, 6), w, b))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_manual_seed_reproduces_public_call():
    x = torch.randn(8, 64)
    torch.manual_seed(0)
    a = gpuopt_ops.layer_norm_dropout_relu(x, 64, p=0.5)
    torch.manual_seed(0)
    b = gpuopt_ops.layer_norm_dropout_relu(x, 64, p=0.5)
    c = gpuopt_ops.layer_norm_dropout_relu(x, 64, p=0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_non_contiguous_input():
    x = torch.randn(40, 24).t()  # (24, 40), transposed
    w, b = torch.randn(40), torch.randn(40)
    seed = seed_tensor(5)
    ours = ops.layer_norm_dropout_relu(x, w, b, seed, 0.3, 1e-5)[0]
    ref = ops.layer_norm_dropout_relu(x.contiguous(), w, b, seed, 0.3, 1e-5)[0]
    assert torch.equal(ours, ref)
    xs = torch.randn(10, 64)[:, ::2]
    torch.testing.assert_close(ops.bias_relu(xs, b[:32]), torch.relu(xs + b[:32]))


def test_deterministic_grads():
    x, w, b = make_inputs((300,), 64, torch.float32)
    seed = seed_tensor(11)
    g = torch.randn(x.shape)
    r1 = run_ldr(x, w, b, seed, 0.1, 1e-5, g)
    r2 = run_ldr(x, w, b, seed, 0.1, 1e-5, g)
    for a, c in zip(r1, r2):
        assert torch.equal(a, c)


# ------------------------------------------------------------------------------------------------ bias_relu
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prefix,n", SHAPES)
def test_bias_relu_matches_reference(device, dtype, prefix, n):
    x, _, b = make_inputs(prefix, n, dtype, device)
    g = torch.randn(x.shape, dtype=torch.float64, device=device).to(dtype)
    out = ops.bias_relu(x, b)
    gx, gb = ops.bias_relu_backward(g, out)

    check_bias_relu_against_reference(x, b, g, out, gx, gb)


def test_bias_relu_autograd_fp32_bias():
    x = torch.randn(10, 33, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(33, requires_grad=True)
    gpuopt_ops.bias_relu(x, b).float().sum().backward()
    assert b.grad.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    ref = (torch.relu(x.detach().float() + b.detach()) > 0).float().sum(0)
    torch.testing.assert_close(b.grad, ref, atol=0.5, rtol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bias_relu_backward_grad_bias_is_unrounded_fp32(device, dtype):
    check_grad_bias_is_unrounded_fp32(ops.bias_relu, ops.bias_relu_backward, device, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_fp64_with_dropout_is_fp64_accurate(device):
    check_fp64_dropout_precision(ops.layer_norm_dropout_relu, ops.layer_norm_dropout_relu_backward, device)


# ------------------------------------------------------------------------------------- gradcheck / opcheck
def test_gradcheck_layer_norm_dropout_relu_fp64_with_dropout():
    x, w, b = make_inputs((4,), 9, torch.float64, requires_grad=True)
    seed = seed_tensor(99)
    fn = lambda x, w, b: ops.layer_norm_dropout_relu(x, w, b, seed, 0.3, 1e-5)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b), eps=1e-6, atol=1e-5)


def test_gradcheck_bias_relu_fp64():
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ops.bias_relu, (x, b))


def opcheck_samples(device):
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for prefix, n in [((3,), 7), ((2, 3), 16)]:
            for affine in (True, False):
                x, w, b = make_inputs(prefix, n, dtype, device, affine=affine, requires_grad=True)
                yield x, w, b, seed_tensor(5, device)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_all_four_ops(device):
    opcheck_four_ops(ops.layer_norm_dropout_relu, ops.layer_norm_dropout_relu_backward, ops.bias_relu,
                     ops.bias_relu_backward, opcheck_samples(device))


def test_compile_fullgraph_dynamic_model_cpu():
    torch._dynamo.reset()

    model = BiasReluLdrBlock(24, ops.bias_relu, ops.layer_norm_dropout_relu)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for m in (5, 9, 13):
        x = torch.randn(m, 24, requires_grad=True)
        seed = seed_tensor(m)
        out = compiled(x, seed)
        out.sum().backward()
        gc = x.grad.clone(), model.w.grad.clone()
        x.grad = None
        model.zero_grad()
        ref = model(x, seed)
        ref.sum().backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(gc[0], x.grad)
        torch.testing.assert_close(gc[1], model.w.grad)
        model.zero_grad()

"""CUDA kernels against the C++ CPU kernels and the reference (run on a GPU machine; skipped elsewhere)."""

import pytest
import torch

import gpuopt_ops  # noqa: F401
from gpuopt_ops import reference as R

from helpers import make_inputs, seed_tensor

pytestmark = pytest.mark.cuda
ops = torch.ops.gpuopt


@pytest.mark.parametrize("m,n", [(3, 7), (5, 8), (64, 1000), (33, 1024), (7, 4096), (4, 12288), (3, 65536),
                                 (2, 65533), (2, 131072), (3, 65544)])
@pytest.mark.parametrize("seed", [0, 99, 2**40 + 7])
def test_cuda_mask_bit_identical_to_cpu(m, n, seed):
    x = torch.randn(m, n)
    w, b = torch.zeros(n), torch.ones(n)
    cpu = ops.layer_norm_dropout_relu(x, w, b, seed_tensor(seed), 0.3, 1e-5)[0] > 0
    cuda = ops.layer_norm_dropout_relu(x.cuda(), w.cuda(), b.cuda(), seed_tensor(seed, "cuda"), 0.3, 1e-5)[0] > 0
    assert torch.equal(cpu.to(torch.int32), cuda.cpu().to(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("n", [1, 37, 256, 768, 1024, 4104, 8192, 16384, 32768, 65536, 131072])
@pytest.mark.parametrize("affine", [True, False])
def test_cuda_matches_cpu(dtype, n, affine):
    x, w, b = make_inputs((6,), n, dtype, affine=affine)
    g = torch.randn(x.shape).to(dtype)
    seed = seed_tensor(4)
    res = []
    for dev in ("cpu", "cuda"):
        args = [t.to(dev) if t is not None else None for t in (x, w, b)]
        out, mean, rstd = ops.layer_norm_dropout_relu(*args, seed.to(dev), 0.1, 1e-5)
        grads = ops.layer_norm_dropout_relu_backward(g.to(dev), args[0], args[1], args[2], mean, rstd,
                                                     seed.to(dev), 0.1)
        res.append([t.cpu().double() for t in (out, mean, rstd, *grads)])
    tol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    for name, a, c in zip(["out", "mean", "rstd", "gx", "gw", "gb"], *res):
        scale = max(1.0, a.abs().max().item()) if a.numel() else 1.0
        assert (a - c).abs().max().item() <= tol * scale if a.numel() else c.numel() == 0, name


@pytest.mark.parametrize("n", [768, 8192, 65544])
def test_cuda_unaligned_views_match_cpu(n):
    """x one element past a 16-byte boundary and weight / bias as unaligned views take the scalar-load path."""
    def shifted(t):
        flat = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
        v = flat[1:1 + t.numel()].view(t.shape)
        v.copy_(t)
        return v

    x, w, b = make_inputs((5,), n, torch.float16)
    seed = seed_tensor(8)
    res = []
    for dev in ("cpu", "cuda"):
        xs, ws, bs = (shifted(t.to(dev)) for t in (x, w, b))
        out, mean, rstd = ops.layer_norm_dropout_relu(xs, ws, bs, seed.to(dev), 0.3, 1e-5)
        res.append((out.cpu() != 0).to(torch.int32))
    assert torch.equal(res[0], res[1])


def test_cuda_many_rows_and_determinism():
    x = torch.randn(70000, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, device="cuda")
    b = torch.randn(64, device="cuda")
    seed = seed_tensor(1, "cuda")
    out, mean, rstd = ops.layer_norm_dropout_relu(x, w, b, seed, 0.2, 1e-5)
    ref, _, _ = R.layer_norm_dropout_relu(x, w, b, seed, 0.2, 1e-5, compute_dtype=torch.float32)
    assert (out.float() - ref).abs().max().item() < 0.1
    g = torch.randn_like(x)
    r1 = ops.layer_norm_dropout_relu_backward(g, x, w, b, mean, rstd, seed, 0.2)
    r2 = ops.layer_norm_dropout_relu_backward(g, x, w, b, mean, rstd, seed, 0.2)
    for a, c in zip(r1, r2):
        assert torch.equal(a, c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 7), (300, 1024), (70000, 40), (3, 65536)])
def test_cuda_bias_relu_matches_cpu(dtype, shape):
    x = torch.randn(shape).to(dtype)
    b = torch.randn(shape[-1]).to(dtype)
    g = torch.randn(shape).to(dtype)
    out_c = ops.bias_relu(x, b)
    gx_c, gb_c = ops.bias_relu_backward(g, out_c)
    out_g = ops.bias_relu(x.cuda(), b.cuda())
    gx_g, gb_g = ops.bias_relu_backward(g.cuda(), out_g)
    assert torch.equal(out_c, out_g.cpu()) and torch.equal(gx_c, gx_g.cpu())
    assert gb_c.dtype == gb_g.dtype == torch.float32  # the accumulation dtype, for bf16 out too
    torch.testing.assert_close(gb_c, gb_g.cpu(), atol=1e-2 * shape[0] ** 0.5, rtol=1e-2)


def test_cuda_device_mismatch_names_argument():
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match="weight must be on cuda:0 like x, got cpu"):
        ops.layer_norm_dropout_relu(x, torch.randn(8), None, seed_tensor(0, "cuda"), 0.1, 1e-5)
    with pytest.raises(RuntimeError, match="seed must be on cuda:0 like x, got cpu"):
        ops.layer_norm_dropout_relu(x, None, None, seed_tensor(0), 0.1, 1e-5)


def test_cuda_opcheck_and_compile():
    x, w, b = make_inputs((4,), 128, torch.float32, "cuda", requires_grad=True)
    seed = seed_tensor(3, "cuda")
    torch.library.opcheck(ops.layer_norm_dropout_relu, (x, w, b, seed, 0.2, 1e-5))
    torch.library.opcheck(ops.bias_relu, (x, b))
    f = torch.compile(lambda x, w, b, s: ops.layer_norm_dropout_relu(ops.bias_relu(x, b), w, b, s, 0.2, 1e-5)[0],
                      fullgraph=True, dynamic=True)
    out = f(x, w, b, seed)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()

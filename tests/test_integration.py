"""The ops inside PyTorch's machinery: torch.compile (dynamic shapes, recompiles), CUDA graphs, torch.export,
autocast, thread-count determinism, the same errors on every backend, and edge inputs (NaN/Inf, huge N, many rows).
"""

import pytest
import torch
from torch import nn

import gpuopt_ops
from gpuopt_ops import reference as R
from gpuopt_ops.modules import FusedLayerNormDropoutReLU, LinearBiasReLU

from backends import backend_params, get_backend
from helpers import (FLOORS, BiasReluLdrBlock, assert_close_to_reference, assert_unrounded_fp32_sum,
                     ldr_reference_and_grads, make_inputs, seed_tensor)
from test_errors import BIAS_CASES, LDR_CASES, good

ops = torch.ops.gpuopt


# ---------------------------------------------------------------------------------------------- torch.compile
class TwoOps(nn.Module):
    def __init__(self, n, backend):
        super().__init__()
        self.lin = LinearBiasReLU(n, n, backend=backend)
        self.norm = FusedLayerNormDropoutReLU(n, p=0.2, backend=backend)

    def forward(self, x):
        return self.norm(self.lin(x))


def _compile_roundtrip(device, backend, sizes=(3, 5, 9, 17, 33)):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = TwoOps(24, backend).to(device)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for m in sizes:
        x = torch.randn(m, 24, device=device, requires_grad=True)
        torch.manual_seed(m)
        out = compiled(x)
        out.square().sum().backward()
        got = (out.detach(), x.grad.clone(), [p.grad.clone() for p in model.parameters()])
        x.grad = None
        model.zero_grad(set_to_none=True)
        torch.manual_seed(m)  # the same dropout seed is drawn inside the compiled graph and in eager
        ref = model(x)
        ref.square().sum().backward()
        torch.testing.assert_close(got[0], ref.detach())
        torch.testing.assert_close(got[1], x.grad)
        for a, p in zip(got[2], model.parameters()):
            torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-4)
        model.zero_grad(set_to_none=True)
    frames = counters["stats"]["unique_graphs"]
    assert frames <= 2, f"{frames} graphs compiled for {len(sizes)} batch sizes (dynamic=True: at most 1 recompile)"
    explain = torch._dynamo.explain(model)(torch.randn(7, 24, device=device))
    assert explain.graph_break_count == 0, explain.break_reasons


def test_compile_dynamic_fullgraph_cpu():
    _compile_roundtrip("cpu", "cpu")


@pytest.mark.cuda
def test_compile_dynamic_fullgraph_cuda():
    _compile_roundtrip("cuda", "cuda")


@pytest.mark.triton_gpu
def test_compile_dynamic_fullgraph_triton():
    _compile_roundtrip("cuda", "triton")


# ---------------------------------------------------------------------------------------------- CUDA graphs
@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=pytest.mark.triton_gpu)])
def test_hand_captured_cuda_graph_draws_a_new_mask_each_replay(backend):
    n = 256
    x = torch.randn(64, n, device="cuda")
    w = torch.ones(n, device="cuda")
    b = torch.ones(n, device="cuda")
    op = ops.layer_norm_dropout_relu if backend == "cuda" else ops.triton_layer_norm_dropout_relu
    static_seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the graph
        op(x, w, b, gpuopt_ops.draw_seed(x.device), 0.5, 1e-5)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_seed.copy_(gpuopt_ops.draw_seed(x.device))
        static_out, _, _ = op(x, w, b, static_seed, 0.5, 1e-5)
    seen = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        eager, _, _ = op(x, w, b, static_seed.clone(), 0.5, 1e-5)
        assert torch.equal(static_out, eager), "a replay must equal an eager run with the seed it drew"
        seen.append((static_seed.item(), (static_out != 0).clone()))
    assert len({s for s, _ in seen}) == 3, "each replay draws a new seed"
    assert not torch.equal(seen[0][1], seen[1][1]), "each replay draws a new mask"


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=pytest.mark.triton_gpu)])
def test_compile_reduce_overhead_cuda_graphs(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoOps(128, backend).cuda()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(32, 128, device="cuda")
    masks = []
    for i in range(4):
        torch.manual_seed(100 + i)
        out = compiled(x).clone()
        torch.manual_seed(100 + i)
        torch.testing.assert_close(out, model(x))
        masks.append(out != 0)
    assert not torch.equal(masks[-1], masks[-2]), "replays draw new masks"


# ---------------------------------------------------------------------------------------------- torch.export
def test_torch_export_runs_and_matches():
    torch.manual_seed(0)
    model = BiasReluLdrBlock(40, ops.bias_relu, ops.layer_norm_dropout_relu, p=0.3)
    x, seed = torch.randn(6, 40), seed_tensor(77)
    batch = torch.export.Dim("batch", min=2, max=1024)
    ep = torch.export.export(model, (x, seed), dynamic_shapes=({0: batch}, None))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("gpuopt.layer_norm_dropout_relu" in t for t in targets), targets
    for m in (6, 11):
        x2 = torch.randn(m, 40)
        assert torch.equal(ep.module()(x2, seed), model(x2, seed))
    # the public module in eval mode (no dropout, no RNG) exports too
    fused = nn.Sequential(LinearBiasReLU(40, 40), FusedLayerNormDropoutReLU(40)).eval()
    ep2 = torch.export.export(fused, (x,))
    torch.testing.assert_close(ep2.module()(x), fused(x))


# ---------------------------------------------------------------------------------------------- autocast
@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16])
def test_autocast_no_rule_the_op_keeps_its_input_dtype(amp_dtype):
    """Decision (README): no autocast rule. The ops run in the dtype they are given: under autocast that is the
    low-precision output of the preceding matmul, and fp32 parameters are accepted as they are."""
    torch.manual_seed(0)
    x, w, b = make_inputs((16,), 96, torch.float32, param_dtype=torch.float32, requires_grad=True)
    lin = nn.Linear(96, 96)
    seed = seed_tensor(5)
    with torch.autocast("cpu", dtype=amp_dtype):
        assert ops.layer_norm_dropout_relu(x, w, b, seed, 0.1, 1e-5)[0].dtype == torch.float32
        y = lin(x)
        assert y.dtype == amp_dtype
        out, _, _ = ops.layer_norm_dropout_relu(y, w, b, seed, 0.1, 1e-5)
    assert out.dtype == amp_dtype
    g = torch.randn_like(out)
    gy, gw, gb = torch.autograd.grad(out, (y, w, b), g)
    assert gw.dtype == torch.float32 and gb.dtype == torch.float32
    ref64, (rgy, rgw, rgb) = ldr_reference_and_grads(y.detach(), w, b, seed, 0.1, 1e-5, g, torch.float64)
    low, (lgy, lgw, lgb) = ldr_reference_and_grads(y.detach(), w.to(amp_dtype), b.to(amp_dtype), seed, 0.1, 1e-5,
                                                   g, amp_dtype)
    fl = FLOORS[amp_dtype]
    assert_close_to_reference("out", out.detach(), ref64, low, fl)
    assert_close_to_reference("grad_x", gy, rgy, lgy, fl)
    assert_close_to_reference("grad_weight", gw, rgw, lgw, fl * 16)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("via", ["bias_relu", "LinearBiasReLU"])
def test_autocast_fp32_bias_gets_the_unrounded_fp32_grad(backend, via):
    """bf16 activations with an fp32 bias (autocast): the bias's .grad is fp32 and the unrounded sum of the
    gradient reaching the op, not that sum rounded to bf16 on the way (assert_unrounded_fp32_sum would catch it)."""
    be = get_backend(backend)
    name = "triton" if backend.startswith("triton") else backend
    torch.manual_seed(0)
    m, n = 256, 48
    if via == "bias_relu":
        bias = (0.1 * torch.randn(n, device=be.device)).requires_grad_()
        out = gpuopt_ops.bias_relu(torch.randn(m, n, device=be.device).to(torch.bfloat16), bias, backend=name)
    else:
        lin = LinearBiasReLU(32, n, backend=name).to(be.device)
        bias = lin.bias
        with torch.autocast(be.device, dtype=torch.bfloat16):
            out = lin(torch.randn(m, 32, device=be.device))
    assert out.dtype == torch.bfloat16 and bias.dtype == torch.float32
    g = torch.randn(m, n, device=be.device)
    (out.float() * g).sum().backward()
    # what reaches the op's output is g rounded to bf16; its masked rows sum to the bias's gradient
    assert_unrounded_fp32_sum("bias.grad", bias.grad, g.to(torch.bfloat16) * (out.detach() > 0), torch.bfloat16)


# ---------------------------------------------------------------------------------------------- determinism
def test_same_bits_for_any_thread_count():
    x, w, b = make_inputs((301,), 130, torch.float32)
    seed = seed_tensor(9)
    g = torch.randn_like(x)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, max(2, before)):
            torch.set_num_threads(threads)
            out, mean, rstd = ops.layer_norm_dropout_relu(x, w, b, seed, 0.3, 1e-5)
            grads = ops.layer_norm_dropout_relu_backward(g, x, w, b, mean, rstd, seed, 0.3)
            o2 = ops.bias_relu(x, b)
            grads2 = ops.bias_relu_backward(g, o2)
            results.append([out, mean, rstd, *grads, o2, *grads2])
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, c in zip(results[0], other):
            assert torch.equal(a, c), "results must not depend on the thread count"


# ---------------------------------------------------------------------------------------------- errors everywhere
def _on(kw, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("idx", range(len(LDR_CASES)))
def test_same_error_on_every_backend(backend, idx):
    arg, change, message = LDR_CASES[idx]
    be = get_backend(backend)
    kw = good()
    kw.update(change)
    kw = _on(kw, be.device)
    with pytest.raises(RuntimeError) as ref:
        ops.layer_norm_dropout_relu(*_on(kw, "cpu").values())
    with pytest.raises(RuntimeError) as got:
        be.ldr(*kw.values())
    assert str(got.value).splitlines()[0].replace("triton_", "") == str(ref.value).splitlines()[0]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("idx", range(len(BIAS_CASES)))
def test_same_bias_relu_error_on_every_backend(backend, idx):
    change, message = BIAS_CASES[idx]
    be = get_backend(backend)
    kw = dict(x=torch.randn(3, 5), bias=torch.randn(5))
    kw.update(change)
    with pytest.raises(RuntimeError) as ref:
        ops.bias_relu(*kw.values())
    with pytest.raises(RuntimeError) as got:
        be.bias_relu(*_on(kw, be.device).values())
    assert str(got.value).splitlines()[0].replace("triton_", "") == str(ref.value).splitlines()[0]


@pytest.mark.cuda
@pytest.mark.parametrize("which", ["weight", "bias", "seed"])
def test_arguments_on_another_device(which):
    kw = _on(good(), "cuda")
    kw[which] = kw[which].cpu()
    with pytest.raises(RuntimeError, match=f"{which} must be on cuda:0 like x, got cpu"):
        ops.layer_norm_dropout_relu(*kw.values())
    with pytest.raises(RuntimeError, match="bias must be on cuda:0 like x, got cpu"):
        ops.bias_relu(torch.randn(3, 5, device="cuda"), torch.randn(5))


# ---------------------------------------------------------------------------------------------- edge inputs
@pytest.mark.parametrize("backend", backend_params())
def test_nan_and_inf_rows_follow_the_reference(backend):
    be = get_backend(backend)
    x, w, b = make_inputs((6,), 40, torch.float32)
    x[1, 3] = float("nan")
    x[2, 0] = float("inf")
    x[3, 5] = -float("inf")
    x[4] = 1e30  # finite but huge: the variance overflows nothing in fp32 two-pass statistics
    seed = seed_tensor(1)
    out, mean, rstd = be.ldr(*(t.to(be.device) for t in (x, w, b, seed)), 0.25, 1e-5)
    ref, _, _ = R.layer_norm_dropout_relu(x, w, b, seed, 0.25, 1e-5, compute_dtype=torch.float32)
    torch.testing.assert_close(out.cpu(), ref, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert out[[0, 5]].isfinite().all(), "a NaN stays in its row"
    xb = torch.tensor([[float("nan"), 1.0, float("inf"), -float("inf")]])
    got = be.bias_relu(xb.to(be.device), torch.zeros(4, device=be.device)).cpu()
    torch.testing.assert_close(got, torch.relu(xb), equal_nan=True)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda),
                                     pytest.param("triton", marks=pytest.mark.triton_gpu)])
@pytest.mark.parametrize("m,n", [(3, 65536), (2, 70001), (70000, 8)])
def test_huge_rows_and_many_rows(backend, m, n):
    be = get_backend(backend)
    x, w, b = make_inputs((m,), n, torch.float32, device=be.device)
    seed = seed_tensor(2**40 + 3, be.device)
    g = torch.randn_like(x)
    out, mean, rstd = be.ldr(x, w, b, seed, 0.1, 1e-5)
    gx, gw, gb = be.ldr_backward(g, x, w, b, mean, rstd, seed, 0.1)
    xs, ws, bs, gs = (t.cpu().double() for t in (x, w, b, g))
    ref64, (rgx, rgw, rgb) = ldr_reference_and_grads(xs, ws, bs, seed.cpu(), 0.1, 1e-5, gs, torch.float64)
    assert (out.cpu().double() - ref64).abs().max() < 1e-4
    assert (gx.cpu().double() - rgx).abs().max() < 1e-3
    assert (gw.cpu().double() - rgw).abs().max() < 1e-5 * m + 1e-3
    assert (gb.cpu().double() - rgb).abs().max() < 1e-5 * m + 1e-3
    keep = R.dropout_keep_mask(2**40 + 3, m, n, 0.1)
    assert torch.equal((out.cpu() != 0) | (ref64 == 0), keep | (ref64 == 0))
    o = be.bias_relu(x, b)
    gx2, gb2 = be.bias_relu_backward(g, o)
    assert torch.equal(o.cpu(), torch.relu(x.cpu() + b.cpu()))
    assert (gb2.cpu().double() - (gs * (o.cpu() > 0)).sum(0)).abs().max() < 1e-5 * m + 1e-3


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=pytest.mark.triton_gpu)])
def test_more_than_2_pow_31_elements_forward(backend):
    be = get_backend(backend)
    m, n = 2**31 // 1024 + 3, 1024  # numel > 2^31: int64 indexing
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    seed = seed_tensor(4, "cuda")
    out, mean, rstd = be.ldr(x, w, torch.zeros_like(w), seed, 0.0, 1e-5)
    tail = x[-5:].float()
    ref = torch.relu(torch.nn.functional.layer_norm(tail, (n,)))
    torch.testing.assert_close(out[-5:].float(), ref, rtol=2e-2, atol=2e-2)
    o = be.bias_relu(x, w)
    torch.testing.assert_close(o[-5:], torch.relu(x[-5:] + w))


@pytest.mark.parametrize("backend", backend_params())
def test_double_backward_raises_instead_of_a_silent_zero(backend):
    be = get_backend(backend)
    x, w, b = make_inputs((4,), 16, torch.float64 if be.fp64 else torch.float32, device=be.device,
                          requires_grad=True)
    seed = seed_tensor(0, be.device)
    out = be.ldr(x, w, b, seed, 0.2, 1e-5)[0]
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        gx.sum().backward()
    o = be.bias_relu(x, b)
    (gb,) = torch.autograd.grad(o.square().sum(), b, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        gb.sum().backward()

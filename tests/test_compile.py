"""The ops inside PyTorch's machinery, on every backend: torch.compile (fullgraph, dynamic shapes, at most one
recompile, gradients equal to eager), torch.export, meta tensors, CUDA graphs (a new mask every replay), and
Inductor seeing into the Triton kernels.
"""

import pytest
import torch
from torch import nn

import gpuopt_ops
from gpuopt_ops.modules import FusedLayerNormDropoutReLU, LinearBiasReLU

from backends import backend_params
from helpers import BiasReluLdrBlock, seed_tensor

EPS = 1e-5


def _raw_block(backend, n, p=0.2):
    return BiasReluLdrBlock(n, backend.op("bias_relu"), backend.op("layer_norm_dropout_relu"), EPS, p)


@pytest.mark.parametrize("backend", backend_params())
def test_raw_ops_compile_fullgraph_dynamic_with_eager_gradients(backend):
    """bias_relu -> layer_norm_dropout_relu through the raw ops (seed as an input): no graph break, one graph for
    three batch sizes, outputs and gradients equal to eager. Under the interpreter the Triton ops stay opaque
    custom ops inside the compiled graph."""
    from torch._dynamo.utils import counters

    dev = backend.device
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = _raw_block(backend, 24).to(dev)
    explain = torch._dynamo.explain(model)(torch.randn(5, 24, device=dev), seed_tensor(5, dev))
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for m in (5, 9, 13):
        x = torch.randn(m, 24, device=dev, requires_grad=True)
        seed = seed_tensor(m, dev)
        out = compiled(x, seed)
        out.sum().backward()
        got = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
        x.grad = None
        model.zero_grad()
        ref = model(x, seed)
        ref.sum().backward()
        torch.testing.assert_close(out, ref)
        for a, c in zip(got, [x.grad] + [p.grad for p in model.parameters()]):
            torch.testing.assert_close(a, c)
        model.zero_grad()


class TwoModules(nn.Module):
    def __init__(self, n, backend):
        super().__init__()
        self.lin = LinearBiasReLU(n, n, backend=backend)
        self.norm = FusedLayerNormDropoutReLU(n, p=0.2, backend=backend)

    def forward(self, x):
        return self.norm(self.lin(x))


@pytest.mark.parametrize("backend", backend_params("cpu", "cuda", "triton"))
def test_modules_compile_dynamic_and_draw_the_eager_seed(backend):
    """The modules draw their dropout seed inside the compiled graph from torch's generator: with the same
    torch.manual_seed, compiled and eager give the same outputs and gradients for five batch sizes, with at most
    one recompile (dynamic=True) and no graph break."""
    from torch._dynamo.utils import counters

    dev = backend.device
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = TwoModules(24, backend.api).to(dev)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    sizes = (3, 5, 9, 17, 33)
    for m in sizes:
        x = torch.randn(m, 24, device=dev, requires_grad=True)
        torch.manual_seed(m)
        out = compiled(x)
        out.square().sum().backward()
        got = (out.detach(), x.grad.clone(), [p.grad.clone() for p in model.parameters()])
        x.grad = None
        model.zero_grad(set_to_none=True)
        torch.manual_seed(m)
        ref = model(x)
        ref.square().sum().backward()
        torch.testing.assert_close(got[0], ref.detach())
        torch.testing.assert_close(got[1], x.grad)
        for a, p in zip(got[2], model.parameters()):
            torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-4)
        model.zero_grad(set_to_none=True)
    frames = counters["stats"]["unique_graphs"]
    assert frames <= 2, f"{frames} graphs compiled for {len(sizes)} batch sizes (dynamic=True: at most 1 recompile)"
    explain = torch._dynamo.explain(model)(torch.randn(7, 24, device=dev))
    assert explain.graph_break_count == 0, explain.break_reasons


@pytest.mark.parametrize("backend", backend_params())
def test_public_functions_compile_without_graph_breaks(backend):
    """The public wrappers' backend checks (resolve_backend: TRITON_INTERPRET, triton import, build capability)
    trace without graph breaks."""

    def f(x, b):
        y = gpuopt_ops.bias_relu(x, b, backend=backend.api)
        return gpuopt_ops.layer_norm_dropout_relu(y, 16, b, b, p=0.0, backend=backend.api)

    torch._dynamo.reset()
    x, b = torch.randn(4, 16, device=backend.device), torch.randn(16, device=backend.device)
    assert torch._dynamo.explain(f)(x, b).graph_break_count == 0
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, b), f(x, b))


@pytest.mark.parametrize("backend", backend_params())
def test_torch_export_runs_and_matches(backend):
    """torch.export with a dynamic batch keeps our op in the graph; the exported program gives eager's bits. The
    modules in eval mode (no dropout, no RNG) export too."""
    dev = backend.device
    torch.manual_seed(0)
    model = _raw_block(backend, 40, p=0.3).to(dev)
    x, seed = torch.randn(6, 40, device=dev), seed_tensor(77, dev)
    batch = torch.export.Dim("batch", min=2, max=1024)
    ep = torch.export.export(model, (x, seed), dynamic_shapes=({0: batch}, None))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any(f"gpuopt.{backend.prefix}layer_norm_dropout_relu" in t for t in targets), targets
    for m in (6, 11):
        x2 = torch.randn(m, 40, device=dev)
        assert torch.equal(ep.module()(x2, seed), model(x2, seed))
    fused = (
        nn.Sequential(LinearBiasReLU(40, 40, backend=backend.api), FusedLayerNormDropoutReLU(40, backend=backend.api))
        .to(dev)
        .eval()
    )
    ep2 = torch.export.export(fused, (x,))
    torch.testing.assert_close(ep2.module()(x), fused(x))


@pytest.mark.parametrize("backend", backend_params())
def test_meta_tensors_give_output_metadata(backend):
    """Shapes and dtypes without data (what tracing sees): mean/rstd and grad_bias in the accumulation dtype."""
    meta = lambda *s, dt=torch.float32: torch.empty(*s, device="meta", dtype=dt)  # noqa: E731
    x, w, seed = meta(5, 3, 40, dt=torch.bfloat16), meta(40), meta(1, dt=torch.int64)
    out, mean, rstd = backend.op("layer_norm_dropout_relu")(x, w, w, seed, 0.1, EPS)
    assert out.shape == x.shape and out.dtype == x.dtype and mean.shape == (15,) and rstd.dtype == torch.float32
    gx, gw, gb = backend.op("layer_norm_dropout_relu_backward")(out, x, w, w, mean, rstd, seed, 0.1)
    assert gx.shape == x.shape and gw.shape == (40,) and gw.dtype == torch.float32
    assert backend.op("bias_relu")(x, w).shape == x.shape
    gx, gb = backend.op("bias_relu_backward")(out, out)
    assert gb.shape == (40,) and gb.dtype == torch.float32


# ---------------------------------------------------------------------------------------------- CUDA graphs
@pytest.mark.parametrize("backend", backend_params("cuda", "triton"))
def test_hand_captured_cuda_graph_draws_a_new_mask_each_replay(backend):
    n = 256
    x = torch.randn(64, n, device="cuda")
    w = torch.ones(n, device="cuda")
    b = torch.ones(n, device="cuda")
    op = backend.op("layer_norm_dropout_relu")
    static_seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the graph
        op(x, w, b, gpuopt_ops.draw_seed(x.device), 0.5, EPS)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_seed.copy_(gpuopt_ops.draw_seed(x.device))
        static_out, _, _ = op(x, w, b, static_seed, 0.5, EPS)
    seen = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        eager, _, _ = op(x, w, b, static_seed.clone(), 0.5, EPS)
        assert torch.equal(static_out, eager), "a replay must equal an eager run with the seed it drew"
        seen.append((static_seed.item(), (static_out != 0).clone()))
    assert len({s for s, _ in seen}) == 3, "each replay draws a new seed"
    assert not torch.equal(seen[0][1], seen[1][1]), "each replay draws a new mask"


_WIDE_FIRST_IN_A_GRAPH = """
import torch, gpuopt_ops
ops = torch.ops.gpuopt
x = torch.randn(64, 12288, device="cuda", dtype=torch.bfloat16)
w, b = torch.randn(12288, device="cuda"), torch.randn(12288, device="cuda")
seed = torch.tensor([3], device="cuda")
out, mean, rstd = ops.layer_norm_dropout_relu(x, w, b, seed, 0.1, 1e-5)
g = torch.randn_like(out)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):  # the wide kernel's first launch: its shared-memory attribute and occupancy query
    static = ops.layer_norm_dropout_relu_backward(g, x, w, b, mean, rstd, seed, 0.1)
graph.replay()
eager = ops.layer_norm_dropout_relu_backward(g, x, w, b, mean, rstd, seed, 0.1)
torch.cuda.synchronize()
assert all(torch.equal(a, e) for a, e in zip(static, eager))
print("ok")
"""


@pytest.mark.parametrize("backend", backend_params("cuda"))
def test_wide_backward_first_launched_inside_a_cuda_graph(backend):
    """The CUDA wide backward (N = 12288) launched for the first time in the process inside a graph capture: setting
    its dynamic shared memory limit and the occupancy query happen there, and the replay equals eager."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _WIDE_FIRST_IN_A_GRAPH], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-2000:] + res.stderr[-4000:]


@pytest.mark.parametrize("backend", backend_params("cuda", "triton"))
def test_compile_reduce_overhead_cuda_graphs_draw_new_masks(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoModules(128, backend.api).cuda()
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


@pytest.mark.parametrize("backend", backend_params("triton"))
def test_inductor_sees_the_triton_kernels(backend):
    """torch.compile with Inductor launches our Triton kernels itself (triton_op decomposition), not an opaque
    extern call."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = _raw_block(backend, 256).cuda()
    x = torch.randn(33, 256, device="cuda")
    _, codes = run_and_get_code(torch.compile(model, fullgraph=True), x, seed_tensor(3, "cuda"))
    code = "\n".join(codes)
    assert "nd_fwd_fused_kernel" in code and "bias_act_fwd_kernel" in code


def test_triton_helpers_are_called_by_their_own_names():
    """Inductor compiles a triton_op's kernels from their source, re-emitting every jit helper a kernel calls as
    `def <helper.__name__>`: a helper called through another name (an import alias) is undefined there, and the
    compiled model fails with a NameError on the GPU only. So every jit function our kernels call must be bound
    under its own name in the caller's module. Static, runs everywhere (also under the interpreter)."""
    pytest.importorskip("triton")
    import importlib
    import pkgutil

    import gpuopt_ops.triton_kernels as tk

    def is_jit(obj):
        return type(obj).__name__ in ("JITFunction", "InterpretedFunction") and callable(getattr(obj, "fn", None))

    checked, bad = 0, []
    for info in pkgutil.iter_modules(tk.__path__):
        mod = importlib.import_module(f"{tk.__name__}.{info.name}")
        for kname, kernel in vars(mod).items():
            if not is_jit(kernel) or kernel.fn.__module__ != mod.__name__:
                continue
            for name in kernel.fn.__code__.co_names:
                helper = kernel.fn.__globals__.get(name)
                if is_jit(helper):
                    checked += 1
                    if helper.fn.__name__ != name:
                        bad.append(f"{mod.__name__}.{kname} calls {helper.fn.__name__} as {name}")
    assert checked > 20, checked  # the kernels do call shared helpers
    assert not bad, bad


def test_backend_checks_trace_as_constants():
    """A module's forward resolves its backend, which asks the dispatcher whether a kernel is registered: under
    torch.compile that is a constant, not a graph break (on a GPU every module forward takes this path)."""
    from gpuopt_ops.backends import has_kernel

    def f(x):
        return x + 1 if has_kernel("bias_relu", "CPU") else x - 1

    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True, backend="eager")(torch.zeros(3))
    assert torch.equal(out, torch.ones(3))


def test_triton_launch_planning_takes_symbolic_sizes():
    """Under dynamic-shape tracing (torch.compile dynamic=True, torch.export, opcheck's aot_dispatch_dynamic) the
    Triton launchers see symbolic sizes; the compiled-kernel facts that size a persistent grid are keyed by the
    sizes' hints (no guard added), and a size without a hint makes the planner fall back, not fail."""
    pytest.importorskip("triton")
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from gpuopt_ops.triton_kernels import common

    env = ShapeEnv()
    m = env.create_symintnode(env.create_symbol(48, ConstantSource("m")), hint=48)
    assert common._spec(m) == common._spec(48) == (False, True, True)
    assert common._concrete(m) == 48 and common._concrete(7) == 7
    with pytest.raises(LookupError):
        common._spec(env.create_unbacked_symint())
    assert not env.guards  # reading the hints added no guard

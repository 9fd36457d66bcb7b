"""The Triton launchers' host path: launch plans kept per call key (triton_kernels/common.py cached_plan).

A repeated call asks no compiled kernel for its facts and allocates only its partial buffer; a call whose key
differs (shape, dtype, device, flags, p, the row limits) plans again; a plan built with knobs (an SM count, a
`facts` hook) is never kept, and its hook is asked on every call; the kept plan launches exactly what a fresh one
does, and the results' bits do not change. Planning
runs on meta (and fake CUDA) tensors with the launches recorded, no GPU needed; the bit checks run the kernels
(under the interpreter on CPU).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import gpuopt_ops.triton_ops  # noqa: E402, F401  (maps the kernels to gpuopt_ops.triton_kernels)
from gpuopt_ops.triton_kernels import bias_act as BR  # noqa: E402
from gpuopt_ops.triton_kernels import common as C  # noqa: E402
from gpuopt_ops.triton_kernels import dropout_add_norm as DAN  # noqa: E402
from gpuopt_ops.triton_kernels import norm_dropout as LDR  # noqa: E402
from gpuopt_ops.triton_kernels import plans as P  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32


class Recorder:
    """A `wrap` hook recording each launch: (kernel name, grid, the kwargs but tensors, tensor args' dtypes)."""

    def __init__(self):
        self.launched = []

    def __call__(self, kernel):
        def at(grid):
            def launch(*args, **kwargs):
                plain = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
                dtypes = tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in args)
                self.launched.append((kernel.__name__, tuple(grid), tuple(sorted(plain.items())), dtypes))

            return launch

        class Grid:
            def __getitem__(self, grid):
                return at(grid)

        return Grid()


@pytest.fixture
def asked(monkeypatch):
    """common.compiled_facts replaced by a counter of its calls (128 registers, no spills), the kept plans cleared
    before and after."""
    calls = []

    def facts(kernel, device, args, kwargs):
        calls.append(kernel.__name__)
        return C.KernelFacts(128, 0, int(kwargs.get("num_warps", 4)))

    C.clear_plans()
    monkeypatch.setattr(C, "compiled_facts", facts)
    yield calls
    C.clear_plans()


def meta(*shape, dt=BF16, device="meta"):
    return torch.empty(shape, device=device, dtype=dt)


def run(launcher: str, m: int, n: int, dt=BF16, p: float = 0.1, device="meta", affine=True, **knobs):
    """One call of a launcher on (m, n) tensors of dt; returns the launches recorded. knobs (sm_count, facts,
    limits): the call runs the plan its module's planner makes with them; without, the launcher's default plan."""
    rec = Recorder()
    x = meta(m, n, dt=dt, device=device)
    w = meta(n, dt=dt, device=device) if affine else None
    acc = torch.float64 if dt == torch.float64 else F32
    stats = meta(m, dt=acc, device=device)
    seed = meta(1, dt=torch.int64, device=device)
    like = lambda: meta(m, n, dt=dt, device=device)  # noqa: E731

    def call(module, direction, *args, **flags):
        plan = getattr(module, f"plan_{direction}")(*args, **flags, **knobs) if knobs else None
        getattr(module, f"launch_{direction}")(*args, **flags, wrap=rec, plan=plan)

    if launcher == "bias_relu_fwd":
        call(BR, "forward", x, meta(n, dt=dt, device=device), like())
    elif launcher == "bias_relu_bwd":
        call(BR, "backward", like(), x, like(), meta(n, dt=acc, device=device))
    elif launcher == "bias_gelu_bwd":
        call(BR, "backward", like(), x, like(), meta(n, dt=acc, device=device), bias=meta(n, dt=dt, device=device),
             act=1)  # fmt: skip
    elif launcher == "ldr_fwd":
        call(LDR, "forward", x, w, w, seed, like(), stats, stats, p, 1e-5)
    elif launcher == "ldr_bwd":
        call(LDR, "backward", like(), x, w, w, stats, stats, seed, like(), w, w, p)
    elif launcher == "nd_rms_bwd":
        call(LDR, "backward", like(), x, w, None, meta(0, dt=acc, device=device), stats, seed, like(), w, None, p,
             rms=True, relu=False)  # fmt: skip
    elif launcher == "dan_fwd":
        call(DAN, "forward", x, like(), w, w, seed, like(), like(), stats, stats, p, 1e-5, False)
    elif launcher == "dan_bwd":
        call(DAN, "backward", like(), like(), x, w, w, stats, stats, seed, like(), like(), w, w, p, False)
    else:
        raise ValueError(launcher)
    return rec.launched


LAUNCHERS = [
    "bias_relu_fwd",
    "bias_relu_bwd",
    "bias_gelu_bwd",
    "ldr_fwd",
    "ldr_bwd",
    "nd_rms_bwd",
    "dan_fwd",
    "dan_bwd",
]
# the launchers whose grids come from the compiled kernels' facts (the bias_act forward's does not)
ASKING = [name for name in LAUNCHERS if name != "bias_relu_fwd"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("n", [1024, 16384])
def test_a_repeated_call_asks_no_compiled_kernel_and_launches_the_same(asked, launcher, n):
    first = run(launcher, 512, n)
    queries = len(asked)
    assert (queries > 0) == (launcher in ASKING), asked
    second = run(launcher, 512, n)
    assert len(asked) == queries, "the second call asked the compiled kernels again"
    assert second == first and first  # the kept plan launches exactly what planning did
    C.clear_plans()  # a fresh plan asks again and plans the same launches
    assert run(launcher, 512, n) == first
    assert len(asked) == 2 * queries


@pytest.mark.parametrize("launcher", ASKING)
def test_a_changed_key_plans_again(asked, launcher):
    """Every part of the key re-plans: M, N, dtype, p (dropout or not), the device, the parameters."""
    run(launcher, 512, 1024)
    changes = [
        dict(m=513),
        dict(n=2048),
        dict(dt=F32),
        dict(device="cpu") if C.INTERPRETED else dict(dt=torch.float16),
    ]
    if launcher.startswith(("ldr", "nd", "dan")):
        changes += [dict(p=0.0), dict(affine=False)]
    for change in changes:
        before = len(asked)
        args = {"m": 512, "n": 1024, **change}
        run(launcher, args.pop("m"), args.pop("n"), **args)
        assert len(asked) > before, f"{launcher}: {change} reused another key's plan"
        before = len(asked)
        args = {"m": 512, "n": 1024, **change}
        run(launcher, args.pop("m"), args.pop("n"), **args)
        assert len(asked) == before, f"{launcher}: {change} was not kept"


def test_the_cuda_device_index_is_part_of_the_key(asked, monkeypatch):
    """Fake CUDA tensors on cuda:0 and cuda:1 (no GPU needed; the device guard mocked): one plan each, each launch
    under its own device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    current = []

    class Guard:
        def __init__(self, device):
            self.device = torch.device(device)

        def __enter__(self):
            current.append(self.device)

        def __exit__(self, *exc):
            current.pop()

    monkeypatch.setattr(torch.cuda, "device", Guard)
    new_queries = []
    with FakeTensorMode():
        for dev in ("cuda:0", "cuda:1", "cuda:0", "cuda:1"):
            before = len(asked)
            launched = run("bias_relu_bwd", 512, 1024, device=dev) + run("ldr_bwd", 512, 1024, device=dev)
            new_queries.append(len(asked) - before)
            assert len(launched) == 4
    assert new_queries == [2, 2, 0, 0] and not current


def test_a_plan_with_knobs_is_never_kept(asked):
    """The compile gate and the performance model plan with knobs (an SM count, a `facts` hook) and pass the plan:
    its hook is asked on every call, the launcher given a plan asks nothing, and no plan is kept or looked up."""
    hooked = []

    def facts(kernel, args, kwargs):
        hooked.append(kernel.__name__)
        return C.KernelFacts(64, 0, kwargs["num_warps"])

    stats = dict(C.PLAN_STATS)
    for _ in range(2):
        run("ldr_bwd", 512, 1024, facts=facts, sm_count=132)
        run("bias_relu_bwd", 512, 1024, facts=facts, sm_count=132)
    assert hooked == ["nd_bwd_fused_kernel", "bias_act_bwd_kernel"] * 2 and not asked
    assert C.PLAN_STATS == stats


def test_changed_limits_plan_again(asked, monkeypatch):
    """The row limits are part of the key: lowering bwd_max_fused_n (as tests do to reach the looped kernels)
    plans the looped kernels at once, and restoring them reuses the single-block plan."""
    fused = run("ldr_bwd", 64, 1024)
    assert [k[0] for k in fused] == ["nd_bwd_fused_kernel", "sum_partials_kernel"]
    default = P.ROW_LIMITS
    monkeypatch.setattr(P, "ROW_LIMITS", P.RowLimits(bwd_max_fused_n=16))
    looped = run("ldr_bwd", 64, 1024)
    assert [k[0] for k in looped] == ["nd_bwd_row_coef_kernel", "nd_bwd_chunk_kernel", "sum_partials_kernel"]
    monkeypatch.setattr(P, "ROW_LIMITS", default)
    queries = len(asked)
    assert run("ldr_bwd", 64, 1024) == fused and len(asked) == queries


@pytest.mark.parametrize("launcher,n,looped", [("bias_relu_bwd", 1024, False), ("ldr_bwd", 1024, False),
                                                ("ldr_bwd", 1024, True), ("dan_bwd", 1024, True)])  # fmt: skip
def test_a_repeated_backward_allocates_one_buffer(asked, monkeypatch, launcher, n, looped):
    """A kept plan's call allocates one buffer: the partial sets (and on the looped path the row coefficients c1,
    c2 after them), no stand-ins for the compiled-kernel query."""
    if looped:
        monkeypatch.setattr(P, "ROW_LIMITS", P.RowLimits(bwd_max_fused_n=16))
    run(launcher, 64, n)
    made = []
    real = torch.empty

    def empty(*args, **kwargs):
        made.append(args)
        return real(*args, **kwargs)

    # the tensors of the call itself are made before the launcher runs
    rec = Recorder()
    x = meta(64, n)
    w = meta(n)
    stats = meta(64, dt=F32)
    outs = [meta(64, n) for _ in range(3)]
    seed = meta(1, dt=torch.int64)
    grad_b = meta(n, dt=F32)
    monkeypatch.setattr(torch, "empty", empty)
    if launcher == "bias_relu_bwd":
        BR.launch_backward(outs[0], x, outs[1], grad_b, wrap=rec)
    elif launcher == "ldr_bwd":
        LDR.launch_backward(outs[0], x, w, w, stats, stats, seed, outs[1], w, w, 0.1, wrap=rec)
    else:
        DAN.launch_backward(outs[0], outs[1], x, w, w, stats, stats, seed, outs[2], x, w, w, 0.1, False, wrap=rec)
    monkeypatch.setattr(torch, "empty", real)
    assert len(made) == 1, made
    assert len(rec.launched) == (3 if looped else 2)


def _op_grads(op: str, dtype, n: int = 96):
    """(outputs, gradients) of a small op call with its backward, on the Triton backend's device."""
    from gpuopt_ops import ops as public

    dev = "cuda" if not C.INTERPRETED else "cpu"
    g = torch.Generator(device="cpu").manual_seed(3)
    x = torch.randn(33, n, generator=g).to(dev, dtype).requires_grad_()
    w = torch.randn(n, generator=g).to(dev, dtype).requires_grad_()
    b = torch.randn(n, generator=g).to(dev, dtype).requires_grad_()
    gen = torch.Generator(device=dev).manual_seed(11)
    if op == "bias_relu":
        y = public.bias_relu(x, b, backend="triton")
        ins = (x, b)
    elif op == "layer_norm_dropout_relu":
        y = public.layer_norm_dropout_relu(x, n, w, b, p=0.25, generator=gen, backend="triton")
        ins = (x, w, b)
    else:
        y = public.dropout_add_norm(x, x.detach() * 0.5, w, b, p=0.25, generator=gen, backend="triton")
        ins = (x, w, b)
    grads = torch.autograd.grad(y, ins, torch.ones_like(y) * 0.5)
    return [y.detach(), *grads]


@pytest.mark.parametrize("op", ["bias_relu", "layer_norm_dropout_relu", "dropout_add_norm"])
def test_a_kept_plan_gives_the_same_bits(op):
    """The same call three times, the plans kept, then cleared: every output and gradient bit for bit the same
    (the dropout mask, the partial sums' order)."""
    C.clear_plans()
    first = _op_grads(op, BF16)
    hits = C.PLAN_STATS["hits"]
    again = _op_grads(op, BF16)
    assert C.PLAN_STATS["hits"] > hits  # the second call ran kept plans
    C.clear_plans()
    fresh = _op_grads(op, BF16)
    for a, b, c in zip(first, again, fresh):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        assert torch.equal(a.view(torch.int16), c.view(torch.int16))


def test_host_cost_parts_of_every_op():
    """benchmarks/host_cost.py --parts: a row per op with every part timed, the launches counted, and no compiled-
    kernel query on a repeated call (the plans kept); the op's own allocations are its outputs and one buffer."""
    from benchmarks import host_cost as HC

    rows = HC.measure_parts([F32], [256], mbytes=0.25, repeat=2)
    assert [r["op"] for r in rows] == [
        "bias_relu", "bias_act_gelu", "layer_norm_dropout_relu", "norm_dropout_rms", "dropout_add_norm"
    ]  # fmt: skip
    outputs = {"bias_relu": 2, "bias_act_gelu": 2, "layer_norm_dropout_relu": 3, "norm_dropout_rms": 3}
    for r in rows:
        assert r["launches"] == 2 and r["facts_calls"] == 0, r
        assert r["allocs"] == outputs.get(r["op"], 4) + 1, r  # dropout_add_norm: grad_x, grad_res, grad_w, grad_b
        assert all(r[k] > 0 for k in ("fwd_op", "bwd_op", "bwd_checks", "bwd_launcher")), r


@pytest.mark.parametrize("name", ["layer_norm_dropout_relu", "triton_layer_norm_dropout_relu"])
def test_the_norm_backward_makes_no_zero_gradients_for_the_statistics(name):
    """The autograd of layer_norm_dropout_relu / norm_dropout (C++ and Triton) makes no zero tensors for the
    gradients of mean and rstd (two allocations and two fill kernels a backward); where only the statistics reach
    the loss, the gradients are those of a zero grad_out, as before: zeros."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    dev = "cuda" if name.startswith("triton") and not C.INTERPRETED else "cpu"
    op = getattr(torch.ops.gpuopt, name)
    x = torch.randn(8, 64, device=dev).requires_grad_()
    w = torch.randn(64, device=dev).requires_grad_()
    b = torch.randn(64, device=dev).requires_grad_()
    seed = torch.tensor([5], device=dev)
    out, mean, rstd = op(x, w, b, seed, 0.2, 1e-5)
    with Ops() as seen:
        gx, gw, gb = torch.autograd.grad(out, (x, w, b), torch.ones_like(out), retain_graph=True)
    assert not [n for n in seen.names if n.startswith(("zeros", "fill", "new_zeros"))], seen.names
    assert gx.abs().sum() > 0
    for g in torch.autograd.grad(mean.sum() + rstd.sum(), (x, w, b)):
        assert torch.equal(g, torch.zeros_like(g))

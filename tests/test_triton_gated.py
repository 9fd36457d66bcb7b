"""gated_act's Triton backend beyond the op table: the launch plans (no GPU needed: the launchers run on meta or fake
tensors with the launch recorded), the plan cache, every launch under the tensors' device, and, under the
interpreter, the one-tensor [gate | up] layout against the two-tensor layout bit for bit across tile and row
boundaries, the dropout mask against the reference's, p = 0 / 1, NaN, and gradcheck in fp64.
"""

import pytest
import torch

from gpuopt_ops import reference as R

from backends import BY_NAME, require_op
from helpers import GuardRecorder, seed_tensor

pytest.importorskip("triton")

INTERP = BY_NAME["triton-interpret"]


def _kernels():
    from gpuopt_ops import triton_ops  # noqa: F401  (makes gpuopt_ops.triton_kernels importable from a source tree)
    from gpuopt_ops.triton_kernels import common
    from gpuopt_ops.triton_kernels import gated_act as ga

    return ga, common


class _Recorder:
    """A launchers' `wrap` that records (kernel name, grid, args, kwargs) instead of launching."""

    def __init__(self):
        self.launched = []

    def __call__(self, kernel):
        rec = self

        class Launch:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    rec.launched.append((kernel.__name__, tuple(grid), args, kwargs))

                return run

        return Launch()


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


# ---------------------------------------------------------------------------------------------- launch plans
def test_triton_gated_tiles_and_grids():
    """The [gate | up] layout's column tile is the power of two that pads F least (F = 11008 = 43 x 256: 256
    columns, not 1024 with 2.3 % masked off), with BLOCK // BLOCK_N rows; the two-tensor layout runs flat in
    4096-element (forward) and 2048-element (backward) blocks, halved for fp64, 16 elements a thread."""
    ga, _ = _kernels()
    assert ga.packed_tile(14336, 4096) == (4, 1024)  # Mistral / LLaMA-3 8B
    assert ga.packed_tile(11008, 4096) == (16, 256)  # LLaMA 7B
    assert ga.packed_tile(13824, 4096) == (8, 512)
    assert ga.packed_tile(8960, 2048) == (8, 256)  # Qwen2 1.5B: 35 x 256
    assert ga.packed_tile(28672, 4096) == (4, 1024)
    assert ga.packed_tile(768, 4096) == (16, 256)
    assert ga.packed_tile(37, 4096) == (256, 16)  # 3 x 16 = 48 columns, where 64 would pad 27
    assert ga.packed_tile(1, 4096) == (4096, 1)
    assert ga.block_elements(torch.bfloat16, False) == 4096 and ga.block_elements(torch.float32, True) == 2048
    assert ga.block_elements(torch.float64, False) == 2048 and ga.block_elements(torch.float64, True) == 1024

    grid, kw = ga.plan(16384, 4096, torch.bfloat16, 3, False, False, False)
    assert grid == (16384 * 4096 // 4096,) and kw["num_warps"] == 8 and (kw["BLOCK_M"], kw["BLOCK_N"]) == (1, 4096)
    assert kw["FAST_RNG"] and not kw["PACKED"] and not kw["DROPOUT"] and kw["ACT"] == 3
    grid, kw = ga.plan(16384, 4096, torch.float32, 1, False, True, True)
    assert grid == (16384 * 4096 // 2048,) and kw["num_warps"] == 4 and kw["DROPOUT"]
    grid, kw = ga.plan(16384, 11008, torch.bfloat16, 3, True, True, False)
    assert grid == (16384 // 16, 43) and kw["num_warps"] == 8 and kw["PACKED"] and kw["FAST_RNG"]
    grid, kw = ga.plan(10, 37, torch.float32, 3, True, True, True)
    assert grid == (1, 3) and (kw["BLOCK_M"], kw["BLOCK_N"]) == (128, 16) and not kw["FAST_RNG"]  # odd F: generic
    grid, kw = ga.plan(5, 37, torch.float32, 3, False, True, True)
    assert grid == (1,) and kw["FAST_RNG"]  # flat blocks start at multiples of 8: the 8-lane Philox for any F


def test_triton_gated_launch_arguments():
    """What the launchers pass: M, F, M * F and the threshold; the [gate | up] layout passes gate as UP and the
    (0,) grad_up as DUP (neither touched: one written tensor); M * F past 2^31 is an int argument (Triton types it
    int64) and the grids hold every element; M = 0 launches nothing."""
    ga, _ = _kernels()
    rec = _Recorder()
    seed = _meta(1, dtype=torch.int64)
    gate, up, out = _meta(64, 4096), _meta(64, 4096), _meta(64, 4096)
    ga.launch_forward(gate, up, seed, out, 0.25, act=3, wrap=rec)
    packed = _meta(64, 8192)
    ga.launch_forward(packed, None, seed, out, 0.0, act=1, wrap=rec)
    grad_up = _meta(0)
    gg = _meta(64, 8192)
    ga.launch_backward(out, packed, None, seed, gg, grad_up, 0.5, act=2, wrap=rec)
    ga.launch_backward(out, gate, up, seed, gate, up, 0.5, act=0, wrap=rec)
    (k0, g0, a0, kw0), (k1, g1, a1, kw1), (k2, g2, a2, kw2), (k3, g3, a3, kw3) = rec.launched
    assert [k0, k1, k2, k3] == ["gated_act_fwd_kernel"] * 2 + ["gated_act_bwd_kernel"] * 2
    assert a0[:4] == (gate, up, seed, out) and a0[4:] == (64, 4096, 64 * 4096, 16384) and g0 == (64,)
    assert a1[1] is packed and a1[4:] == (64, 4096, 64 * 4096, 0) and kw1["PACKED"] and not kw1["DROPOUT"]
    assert g1 == (16, 4)
    assert a2[2] is packed and a2[4] is gg and a2[5] is grad_up and a2[6:] == (64, 4096, 64 * 4096, 32768)
    assert kw2["PACKED"] and kw2["DROPOUT"] and kw2["ACT"] == 2 and g2 == (32, 4)  # 2048-element tiles: 2 x 1024
    assert a3[4] is gate and a3[5] is up and g3 == (128,) and kw3["ACT"] == 0

    rec = _Recorder()
    big = _meta(2**20, 2 * 3000)  # M * F = 3000 * 2^20 > 2^31 elements
    ga.launch_forward(big, None, seed, _meta(2**20, 3000), 0.1, act=3, wrap=rec)
    ga.launch_forward(_meta(2**20, 3000), _meta(2**20, 3000), seed, _meta(2**20, 3000), 0.1, act=3, wrap=rec)
    (_, gp, ap, kwp), (_, gf, af, kwf) = rec.launched
    assert ap[6] == af[6] == 3000 * 2**20 > 2**31
    assert gp[0] * kwp["BLOCK_M"] >= 2**20 and gp[1] * kwp["BLOCK_N"] >= 3000
    assert gf[0] * kwf["BLOCK_N"] >= 3000 * 2**20 and gf[0] < 2**31

    rec = _Recorder()
    ga.launch_forward(_meta(0, 8), None, seed, _meta(0, 4), 0.1, act=3, wrap=rec)
    ga.launch_backward(_meta(0, 4), _meta(0, 8), None, seed, _meta(0, 8), _meta(0), 0.1, act=3, wrap=rec)
    assert rec.launched == []


def test_triton_gated_plan_cache():
    """A repeated call takes its plan from the cache (common.PLAN_STATS); p = 0 and p > 0 are two plans (the
    DROPOUT constexpr), two nonzero p one plan (the threshold is a launch argument); the forward, the backward and
    each layout are their own keys."""
    ga, common = _kernels()
    rec = _Recorder()
    seed = _meta(1, dtype=torch.int64)
    gate, out = _meta(24, 2 * 520), _meta(24, 520)
    common.clear_plans()
    before = dict(common.PLAN_STATS)

    def stats():
        return common.PLAN_STATS["hits"] - before["hits"], common.PLAN_STATS["misses"] - before["misses"]

    ga.launch_forward(gate, None, seed, out, 0.1, act=3, wrap=rec)
    assert stats() == (0, 1)
    ga.launch_forward(gate, None, seed, out, 0.3, act=3, wrap=rec)
    assert stats() == (1, 1)
    ga.launch_forward(gate, None, seed, out, 0.0, act=3, wrap=rec)
    ga.launch_forward(out, out, seed, out, 0.1, act=3, wrap=rec)
    ga.launch_backward(out, gate, None, seed, gate, _meta(0), 0.1, act=3, wrap=rec)
    assert stats() == (1, 4)
    ga.launch_backward(out, gate, None, seed, gate, _meta(0), 0.2, act=3, wrap=rec)
    ga.launch_forward(gate, None, seed, out, 0.0, act=3, wrap=rec)
    assert stats() == (3, 4)
    assert [launch[3]["DROPOUT"] for launch in rec.launched] == [True, True, False, True, True, True, False]
    assert rec.launched[0][2][7] == R.dropout_threshold(0.1) and rec.launched[1][2][7] == R.dropout_threshold(0.3)
    plan = ga.plan_forward(gate, None, seed, out, 0.1, act=3)  # a plan passed: no cache
    ga.launch_forward(gate, None, seed, out, 0.1, act=3, wrap=rec, plan=plan)
    assert stats() == (3, 4) and rec.launched[-1] == rec.launched[0]


def test_triton_gated_launches_run_under_the_tensors_device(monkeypatch):
    """Fake CUDA tensors on cuda:1, torch.cuda.device mocked: both kernels launch with cuda:1 current."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ga, _ = _kernels()
    monkeypatch.setattr(torch.cuda, "device", GuardRecorder)
    launched = []

    def wrap(kernel):
        class Launch:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    launched.append((kernel.__name__, GuardRecorder.current[-1] if GuardRecorder.current else None))

                return run

        return Launch()

    dev = torch.device("cuda:1")
    with FakeTensorMode():
        g = torch.empty(4, 64, device=dev, dtype=torch.bfloat16)
        h = torch.empty(4, 32, device=dev, dtype=torch.bfloat16)
        s = torch.empty(1, device=dev, dtype=torch.int64)
        e = torch.empty(0, device=dev, dtype=torch.bfloat16)
        ga.launch_forward(g, None, s, h, 0.1, act=3, wrap=wrap)
        ga.launch_forward(h, h, s, h, 0.1, act=1, wrap=wrap)
        ga.launch_backward(h, g, None, s, g, e, 0.1, act=3, wrap=wrap)
        ga.launch_backward(h, h, h, s, h, h, 0.0, act=0, wrap=wrap)
    assert [k for k, _ in launched] == ["gated_act_fwd_kernel"] * 2 + ["gated_act_bwd_kernel"] * 2
    assert all(d == dev for _, d in launched), launched
    assert not GuardRecorder.current


# ---------------------------------------------------------------------------------------------- interpreter runs
def _interp():
    if INTERP.skip_reason():
        pytest.skip(INTERP.skip_reason())
    require_op(INTERP, "gated_act")
    return INTERP.op("gated_act"), INTERP.op("gated_act_backward")


def _inputs(m, f, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    packed = (1.5 * torch.randn(m, 2 * f, generator=g, dtype=torch.float64)).to(dtype)
    grad_out = torch.randn(m, f, generator=g, dtype=torch.float64).to(dtype)
    return packed, grad_out


@pytest.mark.parametrize(
    "m,f,dtype,act",
    [
        (3, 1500, torch.float32, 3),  # packed: 3 column tiles of 512, the last partial; flat: 2 blocks
        (2, 100, torch.float32, 3),  # F < 128: 128-column tiles of 16 rows, rows padded
        (40, 37, torch.bfloat16, 1),  # odd F: the packed generic RNG against the flat 8-lane one; 16-column tiles
        (9, 264, torch.float16, 2),  # 264 = 8 x 33: 8-lane RNG in both layouts, padded tiles
        (5, 8, torch.float64, 0),
        (70, 1, torch.float32, 3),  # F = 1: one-column tiles of 4096 rows (generic RNG); flat: one block
    ],
    ids=["f1500-fp32-silu", "f100-fp32-silu", "f37-bf16-gelu", "f264-fp16-gelu_tanh", "f8-fp64-relu", "f1-fp32-silu"],
)
def test_triton_gated_packed_is_two_tensor_bits_and_reference_mask(m, f, dtype, act):
    """Under the interpreter: the [gate | up] layout (2-D tiles) gives the two-tensor layout's (flat blocks) output
    and gradients bit for bit, with dropout; the dropped elements are exactly those of the reference mask at
    linear index r * F + c (exact zeros in the output and both gradients), and the kept ones are close to the
    fp64 reference."""
    fwd, bwd = _interp()
    packed, grad_out = _inputs(m, f, dtype)
    gate, up = packed[:, :f].contiguous(), packed[:, f:].contiguous()
    p, s = 0.3, 987654321
    seed = seed_tensor(s)
    out_p = fwd(packed, None, seed, p, act)
    out_s = fwd(gate, up, seed, p, act)
    assert torch.equal(out_p, out_s)
    gg_p, gu_p = bwd(grad_out, packed, None, seed, p, act)
    gg_s, gu_s = bwd(grad_out, gate, up, seed, p, act)
    assert gu_p.shape == (0,) and gg_p.shape == packed.shape
    assert torch.equal(gg_p[:, :f], gg_s) and torch.equal(gg_p[:, f:], gu_s)
    keep = R.dropout_keep_mask(s, m, f, p).reshape(m, f)
    assert 0 < int(keep.sum()) < m * f
    for t in (out_s, gg_s, gu_s):
        assert bool((t[~keep] == 0).all())
    g64, u64 = gate.double().requires_grad_(), up.double().requires_grad_()
    ref = R.gated_act(g64, u64, act, s, p)
    ref.backward(grad_out.double())
    tol = dict(atol=1e-2, rtol=2e-2) if dtype in (torch.bfloat16, torch.float16) else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_s.double(), ref.detach(), **tol)
    torch.testing.assert_close(gu_s.double(), u64.grad, **tol)
    torch.testing.assert_close(gg_s.double(), g64.grad, **tol)


def test_triton_gated_p0_p1_and_nan():
    """p = 0: act(gate) * up exactly as the C++ CPU op gives it for relu (no rounding but the product's), every
    element kept; p = 1: exact zeros, gradients too; relu: a NaN gate stays NaN in the output, its grad_gate is 0
    (gate > 0 is false), as the CPU op."""
    fwd, bwd = _interp()
    packed, grad_out = _inputs(6, 40, torch.float32, seed=3)
    gate, up = packed[:, :40].contiguous(), packed[:, 40:].contiguous()
    seed = seed_tensor(5)
    out = fwd(gate, up, seed, 0.0, 0)
    assert torch.equal(out, torch.relu(gate) * up)
    one = fwd(packed, None, seed, 1.0, 3)
    assert torch.equal(one, torch.zeros_like(one))
    gg, _ = bwd(grad_out, packed, None, seed, 1.0, 3)
    assert torch.equal(gg, torch.zeros_like(gg))
    gate[0, :3] = float("nan")
    out = fwd(gate, up, seed, 0.0, 0)
    gg, gu = bwd(grad_out, gate, up, seed, 0.0, 0)
    cpu_out = torch.ops.gpuopt.gated_act(gate, up, seed, 0.0, 0)
    cpu_gg, cpu_gu = torch.ops.gpuopt.gated_act_backward(grad_out, gate, up, seed, 0.0, 0)
    assert out[0, :3].isnan().all() and torch.equal(gg[0, :3], torch.zeros(3))
    assert torch.equal(out.isnan(), cpu_out.isnan()) and torch.equal(gg, cpu_gg)
    assert torch.equal(gu.isnan(), cpu_gu.isnan())


# fp64 gradchecks under Triton's interpreter are the slowest cases of this file: the fast lane runs SiLU (SwiGLU) in
# both layouts, the full suite every activation
@pytest.mark.parametrize(
    "act",
    [pytest.param(a, marks=() if a == 3 else pytest.mark.slow) for a in range(4)],
    ids=["relu", "gelu", "gelu_tanh", "silu"],
)
@pytest.mark.parametrize("packed", [False, True], ids=["two", "packed"])
def test_triton_gated_gradcheck_fp64(act, packed):
    """Autograd of the Triton twin (register_gated_act_autograd) in fp64: gradcheck, with dropout."""
    import gpuopt_ops

    _interp()
    g = torch.Generator().manual_seed(act)
    gate = (torch.randn(3, 10 if packed else 5, generator=g, dtype=torch.float64) + 0.05).requires_grad_()
    up = None if packed else torch.randn(3, 5, generator=g, dtype=torch.float64).requires_grad_()
    seed = seed_tensor(77)
    op = torch.ops.gpuopt.triton_gated_act
    inputs = (gate,) if packed else (gate, up)
    # the interpreter's gradcheck (its fast mode: Backend.gradcheck)
    assert INTERP.gradcheck(lambda *t: op(t[0], t[1] if len(t) > 1 else None, seed, 0.25, act), inputs)
    # the public function on the triton backend: the same values as the op
    out = gpuopt_ops.gated_act(gate, up, act=["relu", "gelu", "gelu_tanh", "silu"][act], backend="triton")
    assert torch.equal(out.detach(), op(gate, up, seed, 0.0, act).detach())

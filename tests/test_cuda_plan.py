"""The performance model's CUDA launches come from the CUDA backend's own host planner (tools/cuda_plan.py: the
emulated extension in plan-only mode): a planned op records the launches a real emulated run of it makes, kernel
(with its template arguments), grid, block and dynamic shared memory, on every path (one warp a row, a block a row,
the wide backward, looped, tiled, the column sums, dropout_add_norm, gated_act, bias_act), and the model's launches
(tools/roofline_gpuopt.cuda_launches) are those."""

import re
from pathlib import Path

import pytest
import torch

from tools import cuda_plan as CP
from tools import roofline_gpuopt as G

pytestmark = pytest.mark.cuda_emulated

ROOT = Path(__file__).resolve().parent.parent
SMS, MAX_BLOCKS = 4, 2  # the emulated device of these tests


@pytest.fixture(scope="module")
def planner():
    return CP.Planner(SMS, max_blocks_per_sm=MAX_BLOCKS)


def random(shape, dtype):
    return torch.randn(shape).to(dtype)


def real_run(planner, call) -> list:
    """The launches of a real emulated run of `call` on the planner's device."""
    old = planner.ops.configure(*planner.device)
    try:
        planner.records()
        call(planner.ops)
        return planner.records()
    finally:
        planner.ops.configure(*old)


class PlannedCode:
    """Stands in for roofline_gpuopt.CudaCode: the emulator's occupancy rule, launches as (kernel, grid, block,
    dynamic shared)."""

    def __init__(self, planner):
        self._planner = planner

    def planner(self, sms):
        assert sms == SMS
        return self._planner

    def launch(self, kernel, grid, block, dynamic_shared=0, **terms):
        assert terms["bytes"] >= terms["read_bytes"] >= 0 and terms["trips"] is not None
        return CP.PlannedLaunch(kernel, grid, block, dynamic_shared)


# (M, N): one warp a row, a block a row (N > 1024), the wide backward (16384), the looped kernels (20000), tiled
# (bias_act, the backward past the rows kernels), more rows than one wave, N % 8 != 0
CASES = [(37, 256), (37, 768), (21, 1024), (9, 4096), (5, 8192), (3, 16384), (2, 20000), (70, 24), (9, 1000)]
# gated_act's (M, F): one block, several blocks per SM, a grid-stride loop, F % 8 != 0 (the packed layout's element
# path; two tensors stay on the vector path with a partial last group)
GATED_CASES = [(3, 64), (37, 256), (9, 4096), (5, 11008), (70, 24), (9, 1000), (4, 37)]
SHAPES = [(False, m, n) for m, n in CASES] + [(True, m, f) for m, f in GATED_CASES]


def cases(gated: bool, dtype: str):
    return [(op, d) for op in G.OPS if (op in G.GATED_OPS) == gated and dtype in G.op_dtypes(op) for d in G.DIRECTIONS]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("gated,m,n", SHAPES)
def test_planned_launches_are_a_real_runs(planner, dtype, gated, m, n):
    """Every op of the model's rows: the plan-only launches equal a real emulated run's on random data, and the
    model's launches (cuda_launches) are the plan's."""
    code = PlannedCode(planner)
    for op, direction in cases(gated, dtype):
        planned = planner.plan(G.plan_call(op, direction, dtype, n, m))
        assert planned == real_run(planner, G.plan_call(op, direction, dtype, n, m, new=random)), (op, direction)
        assert G.cuda_launches(code, op, direction, dtype, n, sms=SMS, m=m) == planned, (op, direction)


def test_every_path_is_planned(planner):
    """The shapes above reach every kernel the model has terms for (CUDA_TERMS), and no other."""
    seen = set()
    for dtype in ("bf16", "fp32"):
        for gated, m, n in SHAPES:
            for op, direction in cases(gated, dtype):
                seen |= {p.base for p in planner.plan(G.plan_call(op, direction, dtype, n, m))}
    assert seen == set(G.CUDA_TERMS)


def test_a_64m_element_case_is_planned_without_running(planner):
    """The model's cases: 64M elements, planned in a blink with the occupancy the caller gives."""
    asked = []

    def occupancy(kernel, threads, shared):
        asked.append((kernel, threads, shared))
        return 3

    big = CP.Planner(132, occupancy=occupancy)
    launches = big.plan(G.plan_call("layer_norm_dropout_relu", "backward", "bf16", 16384, G.rows_of(16384)))
    assert [p.base for p in launches] == ["nd_backward_wide_kernel", "column_sum_kernel"]
    assert asked == [(launches[0].kernel, 352, 352 * 37 * 16)]
    # 4096 rows on 3 x 132 resident blocks: 11 rows a block, so ceil(4096 / 11) blocks (the balanced one-wave grid)
    assert launches[0].grid == (373, 1, 1) and launches[0].dynamic_shared == 352 * 37 * 16
    asked.clear()
    assert big.plan(G.plan_call("layer_norm_dropout_relu", "backward", "bf16", 16384, 4096)) and not asked  # cached


def bias_act_grid(m, n, sms, blocks):
    p = CP.Planner(sms, occupancy=lambda *_: blocks).plan(G.plan_call("bias_act_gelu", "forward", "bf16", n, m))
    return p[0].grid[:2], p[0].block[:2]


def test_tiled_plan_fills_its_waves():
    """The tiled CUDA kernels' grid (csrc/cuda/launch_config.h plan_tiled): one wave of row blocks, or two where one
    leaves more than 3 % of the slots idle and the rows allow it."""
    assert bias_act_grid(5461, 12288, 132, 2) == ((48, 11), (32, 8))  # 5 row blocks would fill 240 of 264 slots
    assert bias_act_grid(8192, 8192, 132, 2)[0] == (32, 8)  # 32 x 8 = 256 of 264: one wave
    assert bias_act_grid(16, 12288, 132, 2)[0] == (48, 2)  # held by the rows (2 steps of 8): no second wave
    assert bias_act_grid(24, 1024, 3, 2)[0] == (4, 3)  # 4 tiles on 6 slots: 4 x 3 = 12, two full waves


def wide_plan(n, dtype=torch.bfloat16, aligned=True, shared_per_block=CP.SHARED_PER_BLOCK):
    planner = CP.Planner(132, occupancy=lambda *_: 1, shared_per_block=shared_per_block)
    x = torch.empty(64 * n + 1, dtype=dtype)[(0 if aligned else 1) :][: 64 * n].view(64, n)
    w, b = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    mean, rstd, seed = torch.empty(64, dtype=acc), torch.empty(64, dtype=acc), torch.zeros(1, dtype=torch.int64)
    p = planner.plan(lambda ops: ops.layer_norm_dropout_relu_backward(x, x, w, b, mean, rstd, seed, 0.1))[0]
    if p.base == "nd_backward_row_stats_kernel":
        return "looped"
    return (p.base == "nd_backward_wide_kernel", int(p.args[-1]), p.block[0], p.dynamic_shared)


def test_wide_backward_plan():
    """The backward past 8192 (csrc/cuda/launch_config.h plan_norm_rows): the wide kernel, a block of up to 384
    threads a row with 3, 4 or 6 groups a thread, where the device's shared memory a block (less the kernel's 1 KiB
    of static arrays) holds its sums; else (or fp64, the scalar path, past 6 x 384 groups) the looped kernels."""
    assert wide_plan(8192)[:3] == (False, 4, 256)  # a block a row of 256 threads
    assert wide_plan(8200) == (True, 3, 352, 352 * 19 * 16)  # 3 groups leave 31 slots idle, 4 would leave 127
    assert wide_plan(12288) == (True, 4, 384, 384 * 25 * 16)  # ties with 6 x 256: the more threads
    assert wide_plan(16384) == (True, 6, 352, 352 * 37 * 16)  # 203.5 KiB
    assert wide_plan(18432)[:3] == (True, 6, 384) and wide_plan(18440) == "looped"
    assert wide_plan(16384, dtype=torch.float32)[:3] == (True, 6, 352)  # fp32 x
    assert wide_plan(16384, dtype=torch.float64) == wide_plan(16384, aligned=False) == "looped"
    # a GPU with 164 KiB a block (A100): 12288 fits, 16384 does not
    assert wide_plan(12288, shared_per_block=164 * 1024)[0] is True
    assert wide_plan(16384, shared_per_block=164 * 1024) == "looped"
    assert wide_plan(16384, shared_per_block=1024) == "looped"


def test_kernel_names_of_the_symbol_table():
    name = CP.kernel_name(
        "void gpuopt::dev::nd_forward_rows_kernel<c10::BFloat16, c10::Half, float, true, false, 2>"
        "(gpuopt::dev::NdForwardParams<c10::BFloat16, c10::Half, float>)"
    )
    assert name == "nd_forward_rows_kernel<__nv_bfloat16, __half, float, true, false, 2>"
    assert (
        CP.kernel_name("gpuopt::dev::column_sum_kernel<float, float, 4>(gpuopt::dev::ColumnSumParams<float, float>)")
        == "column_sum_kernel<float, float, 4>"
    )
    assert CP.kernel_name("gpuopt::cuda::plan_tiled(long, long, long)") is None
    launch = CP.PlannedLaunch("gated_act_forward_kernel<float, 3, true, false>", (1, 1, 1), (256, 1, 1))
    assert launch.base == "gated_act_forward_kernel" and launch.args == ["float", "3", "true", "false"]


def test_model_constants_match_the_kernels():
    """Rows (or groups) a thread takes per loop trip, as the kernels define them (the model's trip counts use them)."""
    src = (ROOT / "csrc" / "cuda" / "bias_act_kernels.cuh").read_text()
    assert int(re.search(r"constexpr int kBiasActRows = (\d+);", src).group(1)) == G.BIAS_ACT_ROWS
    src = (ROOT / "csrc" / "cuda" / "norm_looped.cuh").read_text()
    assert int(re.search(r"constexpr int kTiledRows = (\d+);", src).group(1)) == G.TILED_ROWS
    stats = re.search(r"row_stats_groups\(\) \{\s*return (.*?);", src, re.S).group(1)
    assert stats.split() == "!kVec || sizeof(S) == 8 ? 1 : (sizeof(S) == 2 && sizeof(P) == 2 ? 4 : 2)".split()
    assert [G.stats_groups(e, u) for e in (2, 4) for u in (2, 4)] == [4, 2, 2, 2]
    src = (ROOT / "csrc" / "cuda" / "gated_act_kernels.cuh").read_text()
    unroll = re.search(r"constexpr int gated_unroll\(int elem, bool vec\) \{ return (.*?); \}", src).group(1)
    assert unroll.split() == "elem == 8 || !vec ? 1 : 2".split()
    assert [G.gated_unroll(e, v) for e in (2, 4, 8) for v in (True, False)] == [2, 1, 2, 1, 1, 1]

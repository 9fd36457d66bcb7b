"""The performance model (tools/roofline.py): its arithmetic on SASS fixtures (tests/sass_fixtures), wave
efficiency, trip counts; then the gates on the built extension and the Triton kernels, and the calibration
against peers' published measurements."""

from pathlib import Path

import pytest

from tools import roofline as R
from tools import sass as S

FIXTURES = Path(__file__).resolve().parent / "sass_fixtures"
LOOPS = FIXTURES / "loops.sass"
M = 64 * 1024 * 1024  # elements


def copy_launch(grid: int, threads: int, **kw) -> R.KernelLaunch:
    """copy_f4 (a grid-stride loop copying one 16-byte float4 per iteration) over 64M fp32 elements."""
    per_thread = M / (grid * threads)
    return R.KernelLaunch(
        LOOPS,
        "copy_f4",
        (grid, 1, 1),
        (threads, 1, 1),
        elements=M,
        bytes=2 * M * 4,
        read_bytes=M * 4,
        trips=R.structural_trips(per_thread / 4),
        regs=16,
        shared=0,
        **kw,
    )


def test_wave_efficiency():
    # one full wave, evenly split: 1.0; 8 blocks past 132 x 6 slots run as a second wave of a full share each
    assert R.wave_efficiency((792, 1, 1), 6, 132)[0] == pytest.approx(1.0)
    eff, k = R.wave_efficiency((800, 1, 1), 6, 132)
    assert k == 6 and eff == pytest.approx((800 / 792) / 2)
    # a grid stride of 133 rows over 132 blocks: one block does two
    assert R.wave_efficiency((132, 1, 1), 1, 132, stride_units=133)[0] == pytest.approx((133 / 132) / 2)
    # a grid smaller than the SMs: the idle SMs are the latency bound's business, not a wave loss
    assert R.wave_efficiency((96, 1, 1), 2, 132) == (1.0, 1)
    # a 2-D tiled grid striding over axis 1
    eff, _ = R.wave_efficiency((4, 198, 1), 6, 132, stride_units=1000, stride_axis=1)
    assert eff == pytest.approx((1000 / 198) / 6)


def test_copy_kernel_reaches_copy_speed():
    """A full grid of 16-byte copies keeps 32 KB in flight per SM: DRAM-bound, only the launch cost lost."""
    est = R.estimate([copy_launch(132 * 8, 256)], 2 * M * 4, M)
    le = est.main
    assert le.bound == "memory" and le.blocks_per_sm == 8
    assert le.batch_bytes == 16 and le.bytes_in_flight_per_sm == 16 * 2048
    t_dram = 2 * M * 4 / R.H200.copy_bw
    assert est.estimate == pytest.approx(t_dram / (t_dram + R.H200.launch_s))
    # instructions: the loop body x its trips, plus the code outside the loop once per thread
    fn = S.parse_sass(LOOPS.read_text())["copy_f4"]
    (loop,) = S.loops(fn)
    trips = M / (132 * 8 * 256) / 4
    assert le.instr_per_thread == pytest.approx(len(loop.body) * trips + len(fn.instrs) - len(loop.body))


def test_too_few_threads_is_latency_bound():
    """One 64-thread block per SM: 1 KB in flight per SM, far under Little's law's ~14 KB."""
    est = R.estimate([copy_launch(132, 64)], 2 * M * 4, M)
    assert est.main.bound == "latency" and est.main.bytes_in_flight_per_sm == 16 * 64
    need = R.latency_need(M * 4, 2 * M * 4, 1.0)
    assert est.estimate == pytest.approx((16 * 64) / need, rel=0.05)


def test_trips_are_required_and_structural():
    with pytest.raises(ValueError, match="give trips"):
        R.estimate(
            [copy_launch(132, 256, stride_units=None).__class__(**{**copy_launch(132, 256).__dict__, "trips": None})],
            1,
            1,
        )
    # row_sums: the compiler versions the row loop (cols <= 0: a store-only copy, loop 0) around the one with
    # the column loop (loop 1, with loop 2 inside)
    fn = S.parse_sass(LOOPS.read_text())["row_sums"]
    lps = S.loops(fn)
    assert [(lp.depth, lp.parent) for lp in lps] == [(0, None), (0, None), (1, 1)]
    assert R.structural_trips(10, 7, split_unrolled=False)(lps) == {0: 10, 1: 10, 2: 7}
    with pytest.raises(ValueError, match="no trip count"):
        R.structural_trips(10, split_unrolled=False)(lps)


def test_budget_and_need_yardsticks():
    # bf16 forward moves 4 bytes an element: ~33 lane-instructions per element at 4.18 TB/s
    assert R.instruction_budget(4 * M, M) == pytest.approx(R.H200.issue_rate * 4 / R.H200.copy_bw)
    assert 30 < R.instruction_budget(4 * M, M) < 34
    # reads are half the bytes: ~14 KB in flight per SM for 88 % of copy
    assert 13_000 < R.latency_need(1, 2, 0.88) < 15_000

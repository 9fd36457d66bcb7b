"""The performance model's mirror of gated_act's CUDA launches (tools/roofline_gpuopt.py gated_launch) makes the
launches the CUDA source itself makes (csrc/cuda/gated_act_launch.cuh under the emulator): the same kernel, grid
and block, on the emulated device's occupancy rule, for both layouts, the vector path and the element-by-element
one (the [gate | up] layout with F % 8 != 0), both directions."""

from pathlib import Path

import pytest
import torch

import gpuopt_ops  # noqa: F401
from tools import roofline_gpuopt as G

from helpers import load_emulated_ops

pytestmark = pytest.mark.cuda_emulated

ROOT = Path(__file__).resolve().parent.parent
SMS, MAX_BLOCKS = 4, 2  # the emulated device of these tests (as tests/test_roofline_mirror.py's)
DT = {"bf16": torch.bfloat16, "fp32": torch.float32}


@pytest.fixture(scope="module")
def emu():
    ops = load_emulated_ops()
    old = ops.configure(SMS, MAX_BLOCKS)
    ops.take_launches()
    yield ops
    ops.configure(*old)


class EmulatedOccupancy:
    """The emulator's occupancy rule (tools/cuda_emu/emulated_ops.cpp) in place of the cubin's; launches as
    (kernel name without template arguments, grid, block)."""

    def blocks_per_sm(self, name: str, threads: int, dynamic_shared: int = 0) -> int:
        return max(1, min(MAX_BLOCKS, 2048 // max(threads, 1), 32))

    def launch(self, short, grid, block, **kw):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        return (short.split("<")[0], grid, block)


def recorded(ops) -> list[tuple]:
    out = []
    for s in ops.take_launches():
        name, rest = s.split(" grid=(")
        grid, block = rest.split(") block=(")
        out.append((name, tuple(int(v) for v in grid.split(",")), tuple(int(v) for v in block.rstrip(")").split(","))))
    return out


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
# (M, F): one block, several blocks per SM, more work than one wave (a grid-stride loop), F % 8 != 0 (the packed
# layout's element path; two tensors stay on the vector path with a partial last group)
@pytest.mark.parametrize("m,f", [(3, 64), (37, 256), (9, 4096), (5, 11008), (70, 24), (9, 1000), (4, 37)])
def test_gated_mirror_matches_the_launcher(emu, dtype, m, f):
    dt = DT[dtype]
    seed = torch.tensor([5], dtype=torch.int64)
    occ = EmulatedOccupancy()
    for op, (act, packed, dropout) in G.GATED_OPS.items():
        p = G.GATED_P if dropout else 0.0
        gate = torch.randn(m, 2 * f if packed else f).to(dt)
        up = None if packed else torch.randn(m, f).to(dt)
        emu.take_launches()
        emu.gated_act(gate, up, seed, p, act)
        assert recorded(emu) == G.cuda_launches(occ, op, "forward", dtype, f, sms=SMS, m=m), (op, "forward")
        emu.gated_act_backward(torch.randn(m, f).to(dt), gate, up, seed, p, act)
        assert recorded(emu) == G.cuda_launches(occ, op, "backward", dtype, f, sms=SMS, m=m), (op, "backward")


def test_gated_mirror_constants_match_the_kernels():
    """The threads a block and the groups a thread takes per grid stride, as gated_act_kernels.cuh defines them."""
    import re

    src = (ROOT / "csrc" / "cuda" / "gated_act_kernels.cuh").read_text()
    assert int(re.search(r"constexpr int kGatedThreads = (\d+);", src).group(1)) == G.GATED_THREADS
    unroll = re.search(r"constexpr int gated_unroll\(int elem, bool vec\) \{ return (.*?); \}", src).group(1)
    assert unroll.split() == "elem == 8 || !vec ? 1 : 2".split()
    assert [G.gated_unroll(e, v) for e in (2, 4, 8) for v in (True, False)] == [2, 1, 2, 1, 1, 1]

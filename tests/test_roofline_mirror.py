"""The performance model's mirror of the CUDA launcher (tools/roofline_gpuopt.py) makes the launches the CUDA source
itself makes: the same kernels, grids and blocks as the emulated CUDA backend records, on the emulated device's
occupancy rule, for every path (one warp a row, a block a row, the wide backward, looped, tiled, the column sums)."""

from pathlib import Path

import pytest
import torch

import gpuopt_ops  # noqa: F401
from tools import roofline_gpuopt as G

from helpers import load_emulated_ops

pytestmark = pytest.mark.cuda_emulated

ROOT = Path(__file__).resolve().parent.parent
SMS, MAX_BLOCKS = 4, 2  # the emulated device of these tests


@pytest.fixture(scope="module")
def emu():
    ops = load_emulated_ops()
    old = ops.configure(SMS, MAX_BLOCKS)
    ops.take_launches()
    yield ops
    ops.configure(*old)


class EmulatedOccupancy:
    """The emulator's occupancy rule (tools/cuda_emu/emulated_ops.cpp) in place of the cubin's."""

    def blocks_per_sm(self, name: str, threads: int, dynamic_shared: int = 0) -> int:
        by_shared = 228 * 1024 // (dynamic_shared + 1024) if dynamic_shared else 32
        return max(1, min(MAX_BLOCKS, 2048 // max(threads, 1), 32, by_shared))

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


DT = {"bf16": torch.bfloat16, "fp32": torch.float32}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize(
    "m,n",
    [(37, 256), (37, 768), (21, 1024), (9, 4096), (5, 8192), (3, 16384), (2, 20000), (70, 24), (9, 1000)],
)
def test_cuda_mirror_matches_the_launcher(emu, dtype, m, n):
    dt = DT[dtype]
    x = torch.randn(m, n).to(dt)
    w, b = torch.randn(n).to(dt), torch.randn(n).to(dt)
    seed = torch.tensor([5], dtype=torch.int64)
    out, mean, rstd = emu.layer_norm_dropout_relu(x, w, b, seed, 0.2, 1e-5)
    fwd = recorded(emu)
    emu.layer_norm_dropout_relu_backward(torch.randn(m, n).to(dt), x, w, b, mean, rstd, seed, 0.2)
    bwd = recorded(emu)
    y = emu.bias_relu(x, b)
    brf = recorded(emu)
    emu.bias_relu_backward(torch.randn(m, n).to(dt), y)
    brb = recorded(emu)
    emu.bias_act(x, b, 1)
    baf = recorded(emu)
    emu.bias_act_backward(torch.randn(m, n).to(dt), x, b, 1)
    bab = recorded(emu)
    occ = EmulatedOccupancy()
    mirror = {
        (op, d): G.cuda_launches(occ, op, d, dtype, n, sms=SMS, m=m)
        for op in G.OPS
        if dtype in G.op_dtypes(op)
        for d in G.DIRECTIONS
    }
    assert mirror[("layer_norm_dropout_relu", "forward")] == fwd
    assert mirror[("layer_norm_dropout_relu", "backward")] == bwd
    assert mirror[("bias_relu", "forward")] == brf
    assert mirror[("bias_relu", "backward")] == brb
    assert mirror[("bias_act_gelu", "forward")] == baf
    assert mirror[("bias_act_gelu", "backward")] == bab
    # dropout_add_norm, as the model's rows: a residual, weight (and bias for LayerNorm), grad_sum
    for op, (rms, res32) in G.DAN_OPS.items():
        if dtype not in G.op_dtypes(op):
            continue
        sdt = torch.float32 if res32 else dt
        res = torch.randn(m, n).to(sdt)
        _, s, mean, rstd = emu.dropout_add_norm(x, res, w, None if rms else b, seed, 0.2, 1e-5, rms, res32)
        assert recorded(emu) == mirror[(op, "forward")], op
        g = torch.randn(m, n).to(dt)
        emu.dropout_add_norm_backward(g, torch.randn(m, n).to(sdt), s, w, None if rms else b, mean, rstd, seed, 0.2,
                                      rms, True)  # fmt: skip
        assert recorded(emu) == mirror[(op, "backward")], op
    # norm_dropout, as the model's row: RMSNorm, weight only, no ReLU (layer_norm_dropout_relu's launches)
    _, mean, rstd = emu.norm_dropout(x, w, None, seed, 0.2, 1e-5, True, False)
    assert recorded(emu) == mirror[("rms_norm_dropout", "forward")]
    emu.norm_dropout_backward(torch.randn(m, n).to(dt), x, w, None, mean, rstd, seed, 0.2, True, False)
    assert recorded(emu) == mirror[("rms_norm_dropout", "backward")]


def test_mirror_constants_match_the_kernels():
    """Rows a thread takes per loop trip, as the kernels define them (the model's trip counts use them)."""
    import re

    src = (ROOT / "csrc" / "cuda" / "bias_relu_kernels.cuh").read_text()
    assert int(re.search(r"constexpr int kBiasReluRows = (\d+);", src).group(1)) == G.BIAS_RELU_ROWS
    src = (ROOT / "csrc" / "cuda" / "norm_looped.cuh").read_text()
    assert int(re.search(r"constexpr int kLdrTiledRows = (\d+);", src).group(1)) == G.TILED_LDR_ROWS
    stats = re.search(r"ldr_stats_groups\(\) \{\s*return (.*?);", src, re.S).group(1)
    assert stats.split() == "!kVec || sizeof(S) == 8 ? 1 : (sizeof(S) == 2 && sizeof(P) == 2 ? 4 : 2)".split()
    assert G.STATS_GROUPS == {2: 4, 4: 2}
    src = (ROOT / "csrc" / "cuda" / "launch_config.h").read_text()
    assert int(re.search(r"constexpr int kWideThreads = (\d+);", src).group(1)) == G.WIDE_THREADS
    assert int(re.search(r"constexpr int64_t kWideStaticShared = (\d+);", src).group(1)) == G.WIDE_STATIC_SHARED
    assert re.search(r"wide_slots\(int vpt\) \{ return 6 \* vpt \+ 1; \}", src)
    wide = re.search(r"wide_backward_shared\(int vpt, int threads\) \{ return (.*?); \}", src).group(1)
    assert wide == "int64_t(threads) * wide_slots(vpt) * 16"
    assert G.wide_backward_shared(4, 512) == 512 * 25 * 16


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
# (M, F): one block, several blocks per SM, more work than one wave (a grid-stride loop), F % 8 != 0 (the packed
# layout's element path; two tensors stay on the vector path with a partial last group)
@pytest.mark.parametrize("m,f", [(3, 64), (37, 256), (9, 4096), (5, 11008), (70, 24), (9, 1000), (4, 37)])
def test_gated_mirror_matches_the_launcher(emu, dtype, m, f):
    """gated_act's launches (csrc/cuda/gated_act_launch.cuh): both layouts, the vector path and the element-by-element
    one ([gate | up] with F % 8 != 0), both directions, against tools/roofline_gpuopt.py's gated_launch."""
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

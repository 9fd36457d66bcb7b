"""The CUDA backend's own kernel source, run on the CPU under the emulation of the CUDA execution model in
tools/cuda_emu (blocks of fibers, strict barriers and shuffles, poisoned shared memory and outputs, guarded
buffers, checked 16-byte accesses, GPU launch limits). This proves indexing, reductions, masks, bounds and barriers
of csrc/cuda before any GPU runs them; it proves nothing about timing or the memory model.

The shapes are chosen by the path they take (csrc/cuda/launch_config.h). On the emulated 4-SM device, with
groups = ceil(N / 8):
  forward   one warp a row (blockDim (32, 4)) while N <= 1024, VPT = ceil(groups / 32) = 1 .. 4 groups a lane;
            one block a row of ceil(groups / VPT) threads (rounded to warps) up to 512 threads, VPT 4 or 3 (fp32 x
            or parameters: 2 first) (N <= 16384; fp64: 128 threads, N <= 4096); else the looped kernel (512
            threads, grid stride over the row's groups).
  backward  one warp a row while N <= 512; one block a row of ceil(groups / VPT) threads up to 256, VPT 4 or 2
            (fp64 and the scalar path: 2) (N <= 8192; fp64: 128 threads, N <= 2048); then on the 16-byte path of
            16-bit and fp32 x the wide kernel, a block a row of up to 384 threads, VPT 3, 4 or 6, dgamma / dbeta
            and dxhat in dynamic shared memory (N <= 18432); else looped: the row-stats and tiled kernels.
  both      N % 8 == 0: one Philox call per group and, with 16-byte aligned pointers, 16-byte vectors; else one
            call per element and scalar access. dgamma / dbeta: partial rows, then column_sum_kernel.
  bias-ReLU the tiled kernels: TX = the power of two <= 32 covering the groups, TY = 256 / TX, N / (8 TX) column
            tiles (the last one partial unless groups % TX == 0), row blocks while the 8 resident blocks allow.
The fast lane (`-m "not slow"`) runs every path at least once; `slow` marks points that repeat a path of the fast
lane in another dtype, or the longest rows.
"""

import pytest
import torch

import gpuopt_ops  # noqa: F401
from gpuopt_ops import reference as R

from helpers import (
    FLOORS,
    assert_close_to_reference,
    check_bias_relu_against_reference,
    check_fp64_dropout_precision,
    ldr_reference_and_grads,
    load_emulated_ops,
    seed_tensor,
)

pytestmark = pytest.mark.cuda_emulated

cpu = torch.ops.gpuopt

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def emu():
    ops = load_emulated_ops()
    ops.take_launches()
    return ops


@pytest.fixture
def small_device(emu):
    """A 4-SM device with at most 2 resident blocks per SM (the default): grids of at most 8 blocks."""
    old = emu.configure(4, 2)
    yield emu
    emu.configure(*old)


def unaligned(t):
    """A contiguous copy of t whose data pointer is one element past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 8, dtype=t.dtype)
    assert flat.data_ptr() % 16 == 0
    v = flat[1 : 1 + t.numel()].view(t.shape)
    v.copy_(t)
    assert v.is_contiguous() and v.data_ptr() % 16 != 0
    return v


def inputs(m, n, dtype, params="x", seed=0, w_scale=1.0):
    """x (m, n) and weight / bias of dtype x's (`params="x"`), fp32 ("fp32") or none ("none")."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, n, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)
    if params == "none":
        return x, None, None
    pd = torch.float32 if params == "fp32" else dtype
    w = (w_scale * (1 + 0.5 * torch.randn(n, generator=g, dtype=torch.float64))).to(pd)
    b = (0.3 * torch.randn(n, generator=g, dtype=torch.float64)).to(pd)
    return x, w, b


def run_ldr(ops, x, w, b, seed, p, g, eps=1e-5):
    out, mean, rstd = ops.layer_norm_dropout_relu(x, w, b, seed, p, eps)
    gx, gw, gb = ops.layer_norm_dropout_relu_backward(g, x, w, b, mean, rstd, seed, p)
    return out, mean, rstd, gx, gw, gb


def check_ldr(ops, m, n, dtype, params, p, *, x_unaligned=False, params_unaligned=False, seed=1234):
    x, w, b = inputs(m, n, dtype, params, seed=n % 97)
    g = torch.randn(m, n, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(dtype)
    if x_unaligned:
        x, g = unaligned(x), unaligned(g)
    if params_unaligned and w is not None:
        w, b = unaligned(w), unaligned(b)
    s = seed_tensor(seed)
    out, mean, rstd, gx, gw, gb = run_ldr(ops, x, w, b, s, p, g)
    assert out.dtype == dtype and out.shape == x.shape and mean.shape == (m,)
    for name, t in [
        ("out", out),
        ("mean", mean),
        ("rstd", rstd),
        ("grad_x", gx),
        ("grad_weight", gw),
        ("grad_bias", gb),
    ]:
        assert not t.isnan().any(), f"{name} has NaN: a poisoned (never written) element or an out-of-bounds read"
    # the dropout mask is the CPU op's, bit for bit (compared as integers, never through floats)
    ones = torch.ones(n, dtype=w.dtype if w is not None else dtype)
    mask_emu = ops.layer_norm_dropout_relu(x, ones * 0, ones, s, p, 1e-5)[0] != 0
    mask_cpu = cpu.layer_norm_dropout_relu(x, ones * 0, ones, s, p, 1e-5)[0] != 0
    assert torch.equal(mask_emu.to(torch.int32), mask_cpu.to(torch.int32)), "dropout mask differs from the CPU op"
    ref, (rgx, rgw, rgb) = ldr_reference_and_grads(x, w, b, s, p, 1e-5, g, torch.float64)
    low, (lgx, lgw, lgb) = ldr_reference_and_grads(x, w, b, s, p, 1e-5, g, dtype)
    fl = FLOORS[dtype]
    assert_close_to_reference("out", out, ref, low, fl)
    assert_close_to_reference("grad_x", gx, rgx, lgx, fl)
    if w is not None:
        assert gw.dtype == w.dtype and gb.dtype == b.dtype
        assert_close_to_reference("grad_weight", gw, rgw, lgw, fl * m)
        assert_close_to_reference("grad_bias", gb, rgb, lgb, fl * m)
    else:
        assert gw.numel() == 0 and gb.numel() == 0
    return out, gx, gw, gb


def test_schemas_are_the_real_ones(emu):
    names = ["layer_norm_dropout_relu", "bias_relu", "bias_act", "dropout_add_norm", "norm_dropout", "gated_act"]
    for name in names + [f"{n}_backward" for n in names]:
        real = str(getattr(cpu, name).default._schema).replace("gpuopt::", "")
        ours = str(getattr(emu, name).default._schema).replace("gpuopt_emu::", "")
        assert ours == real


# --------------------------------------------------------------------------------------- layer_norm_dropout_relu
# fp32 and bf16, weight / bias of x's dtype, p = 0.3. Forward / backward path of each N (fp32 and bf16):
LDR_N = [
    1,  # warp rows (VPT 1) both ways; one element: variance 0, N % 8 != 0 (scalar, a Philox call an element)
    7,  # warp rows; one partial group
    8,  # warp rows; exactly one whole group, 16-byte vectors
    33,  # warp rows; 5 groups, the last partial
    256,  # warp rows, VPT 1: 32 groups, every lane one
    257,  # warp rows, VPT 2 both ways; N % 8 != 0
    600,  # forward warp rows VPT 3, the 3rd group on lanes 0..10 only; backward a block a row of 64 threads, VPT 2
    768,  # forward warp rows VPT 3, exactly 3 groups a lane; backward a block a row of one warp, VPT 4 (4th absent)
    1000,  # forward warp rows VPT 4, the 4th group on lanes 0..28 only; backward a block a row; N % 8 == 0
    1024,  # forward warp rows, all 4 groups of every lane (the longest warp row); backward one warp, all 4 groups
    1096,  # one block a row both ways: bf16 forward VPT 3 (64 threads), fp32 forward VPT 2 (96), backward VPT 2 (96)
    4104,  # one block a row both ways, N % 8 == 0 but not a power of two: the last warp part-filled
    8192,  # one block a row both ways, backward at its 256-thread bound (the longest backward row)
    8200,  # forward a block a row (288 threads); backward wide (352 threads, 3 groups: the shortest wide row)
    12288,  # forward a block a row; backward wide, 4 groups a thread (384 threads, its bound)
    16384,  # forward a block a row at its 512-thread bound (the longest forward row); backward wide, 6 groups a
    # thread (352 threads)
    16392,  # forward looped (the shortest looped forward, N % 8 == 0); backward wide, 6 groups a thread, a tail:
    # 2049 groups over 352 threads
    131072,  # looped both ways, the longest row: 32 block strides of sums per thread against the fp64 reference
]
# Pruned: 65536 and 65544 took the looped kernels both ways, as 131072 (a power of two) and test_ldr_rows_more_than_
# grid's 40000 (the fast lane's looped rows both ways) do.


def _every_n_params():
    for dtype in (torch.float32, torch.bfloat16):
        for n in LDR_N:
            # bf16 on the block-a-row and looped paths repeats fp32's launches with 16-bit storage, which the
            # fast lane runs there too (test_ldr_dtypes_params_p at 4104); 131072 repeats 40000's kernels
            marks = [slow] if n == 131072 or (dtype == torch.bfloat16 and n >= 4104) else []
            yield pytest.param(n, dtype, marks=marks, id=f"{str(dtype)[6:]}-{n}")


@pytest.mark.parametrize("n,dtype", list(_every_n_params()))
def test_ldr_every_n(small_device, n, dtype):
    m = 3 if n >= 16384 else 9
    check_ldr(small_device, m, n, dtype, "x", 0.3)


# Every dtype x params (none, of x's dtype, fp32) x p (0: no RNG; 0.3; 1: every element dropped) at
#   33    warp rows both ways; N % 8 != 0: scalar access, one Philox call per element
#   768   forward warp rows (3 groups a lane), backward a block a row (one warp, 4 groups a thread; fp64: 64
#         threads, 2 groups)
#   4104  a block a row both ways; fp64: looped both ways (past its 4096 / 2048 bounds)
#   8200  forward a block a row, backward wide (3 groups a thread), for fp32 / fp16 / bf16; slow but for three
#         cases of the wide kernel's parameter paths (none, fp32 with 16-bit x, and p = 1 with fp32 parameters)
# Pruned: 8200 x fp64 took the looped kernels both ways, as 4104 x fp64 does (same params and p).
def _dtypes_params_p():
    for n in (33, 768, 4104, 8200):
        for dtype in DTYPES:
            if n == 8200 and dtype == torch.float64:
                continue
            for params in ("none", "x", "fp32"):
                if params == "fp32" and dtype == torch.float32:
                    continue  # fp32 params of fp32 x are the 'x' case
                for p in (0.0, 0.3, 1.0):
                    fast = n != 8200 or (str(dtype)[6:], params, p) in (
                        ("bfloat16", "none", 0.3),
                        ("bfloat16", "fp32", 0.0),
                        ("float16", "fp32", 1.0),
                    )
                    yield pytest.param(
                        n, dtype, params, p, marks=[] if fast else [slow], id=f"{n}-{str(dtype)[6:]}-{params}-{p}"
                    )


@pytest.mark.parametrize("n,dtype,params,p", list(_dtypes_params_p()))
def test_ldr_dtypes_params_p(small_device, n, dtype, params, p):
    out, gx, gw, gb = check_ldr(small_device, 5, n, dtype, params, p)
    if p == 1.0:
        assert torch.equal(out, torch.zeros_like(out)) and torch.equal(gx, torch.zeros_like(gx))


# Unaligned x / grad_out, then unaligned weight / bias, fp32 and fp16 (one 16-byte vector a group), N % 8 == 0:
#   768    forward warp rows, backward a block a row
#   8192   a block a row both ways (fp16: slow, the same launches as fp32 with 16-bit scalar loads, run at 768)
#   16392  looped both ways (fp16: slow, as 8192)
# Pruned: 1000 took 768's paths; 65544 took 16392's (looped both ways, a tail of groups) at four times the cost.
@pytest.mark.parametrize(
    "n,dtype",
    [
        pytest.param(768, torch.float32, id="float32-768"),
        pytest.param(768, torch.float16, id="float16-768"),
        pytest.param(8192, torch.float32, id="float32-8192"),
        pytest.param(8192, torch.float16, marks=slow, id="float16-8192"),
        pytest.param(16392, torch.float32, id="float32-16392"),
        pytest.param(16392, torch.float16, marks=slow, id="float16-16392"),
    ],
)
def test_ldr_unaligned_views(small_device, n, dtype):
    """x (and grad_out) one element past a 16-byte boundary, and weight / bias as unaligned views: the scalar-load
    path (the emulator aborts on any misaligned 16-byte access) with one Philox call per 8 elements."""
    m = 3 if n > 8192 else 6
    check_ldr(small_device, m, n, dtype, "x", 0.3, x_unaligned=True)
    check_ldr(small_device, m, n, dtype, "x", 0.3, params_unaligned=True)


@pytest.mark.parametrize("m,n", [(1, 768), (3, 768), (77, 256), (70, 1024), (21, 4096), (19, 16384), (10, 40000)])
def test_ldr_rows_more_than_grid(small_device, m, n):
    """M = 1, 3 and more rows than the 8-block persistent grid holds: every grid-stride loop runs several times."""
    check_ldr(small_device, m, n, torch.float32, "x", 0.3)
    launches = small_device.take_launches()
    assert launches and all("grid=(" in s for s in launches)
    grid_x = [int(s.split("grid=(")[1].split(",")[0]) for s in launches if "nd_forward" in s]
    assert max(grid_x) <= 8


def test_ldr_paths_taken(small_device):
    """Short rows take one warp a row, mid rows a block a row in registers, long rows the looped kernels."""

    def kernels(n, dtype=torch.float32):
        small_device.take_launches()
        run_ldr(small_device, *inputs(4, n, dtype), seed_tensor(1), 0.3, torch.ones(4, n, dtype=dtype))
        return [s.split(" ")[0] + " " + s.split("block=")[1] for s in small_device.take_launches()]

    # stage 2 has one row of 32 threads per partial row up to 32 (G = the 4 rows' blocks here, 1 when one block
    # holds them all)
    assert kernels(512) == [
        "nd_forward_rows_kernel (32,4,1)",
        "nd_backward_rows_kernel (32,4,1)",
        "column_sum_kernel (32,1,1)",
    ]
    assert kernels(768) == [
        "nd_forward_rows_kernel (32,4,1)",
        "nd_backward_rows_kernel (32,1,1)",  # a block of one warp a row, 3 groups a thread: none idle
        "column_sum_kernel (32,4,1)",
    ]
    assert kernels(8192) == [
        "nd_forward_rows_kernel (512,1,1)",  # fp32: 2 groups a thread, so its fp32 weight and bias stay in registers
        "nd_backward_rows_kernel (256,1,1)",
        "column_sum_kernel (32,4,1)",
    ]
    assert kernels(8200)[1] == "nd_backward_wide_kernel (352,1,1)"  # 3 groups a thread: 31 idle, 4 would idle 127
    assert kernels(12288)[1] == "nd_backward_wide_kernel (384,1,1)"
    assert kernels(16384, torch.bfloat16)[:2] == [
        "nd_forward_rows_kernel (512,1,1)",
        "nd_backward_wide_kernel (352,1,1)",  # 6 groups a thread
    ]
    assert kernels(18440)[1] == "nd_backward_row_stats_kernel (512,1,1)"  # past 6 x 384 groups
    assert kernels(4096, torch.float64)[:2] == [
        "nd_forward_rows_kernel (128,1,1)",
        "nd_backward_row_stats_kernel (512,1,1)",
    ]
    assert kernels(65536) == [
        "nd_forward_looped_kernel (512,1,1)",
        "nd_backward_row_stats_kernel (512,1,1)",
        "nd_backward_tiled_kernel (32,8,1)",
        "column_sum_kernel (32,1,1)",
    ]


def test_ldr_column_sums_deterministic(small_device):
    for n in [768, 8192, 40000]:
        x, w, b = inputs(40, n, torch.float32)
        g = torch.randn(40, n)
        a = run_ldr(small_device, x, w, b, seed_tensor(5), 0.3, g)
        c = run_ldr(small_device, x, w, b, seed_tensor(5), 0.3, g)
        for u, v in zip(a, c):
            assert torch.equal(u, v)


@pytest.mark.parametrize("n,m", [(1000, 50), (12288, 11)])  # block rows; the wide backward (4 groups a thread)
def test_ldr_block_order_independent(small_device, monkeypatch, n, m):
    """Blocks run in reverse order give the same bits: no kernel depends on the order blocks run in."""
    x, w, b = inputs(m, n, torch.bfloat16, "fp32")
    g = torch.randn(m, n).to(torch.bfloat16)
    a = run_ldr(small_device, x, w, b, seed_tensor(9), 0.3, g)
    monkeypatch.setenv("GPUOPT_EMU_BLOCK_ORDER", "reverse")
    c = run_ldr(small_device, x, w, b, seed_tensor(9), 0.3, g)
    for u, v in zip(a, c):
        assert torch.equal(u, v)


def test_ldr_fp64_dropout_precision(emu):
    check_fp64_dropout_precision(emu.layer_norm_dropout_relu, emu.layer_norm_dropout_relu_backward, "cpu")


def test_ldr_h200_sized_device(emu):
    """The grid an H200 gets (132 SMs): every block of the first wave has rows, the stage-2 sum takes them all."""
    old = emu.configure(132, 8)
    try:
        check_ldr(emu, 600, 256, torch.bfloat16, "fp32", 0.1)
    finally:
        emu.configure(*old)


def test_wide_backward_follows_the_devices_shared_memory(emu):
    """The wide backward only where the device allows its shared memory a block (A100: 163 KiB after the static
    allowance; 8.6 / 8.9 GPUs: 99 KiB), else the looped kernels; the same results either way."""

    def backward_kernel(n, shared):
        old = emu.configure(4, 2, shared)
        try:
            emu.take_launches()
            check_ldr(emu, 3, n, torch.bfloat16, "x", 0.3)
            return [k.split(" ")[0] + " " + k.split("block=")[1] for k in emu.take_launches()][1]
        finally:
            emu.configure(*old)

    assert backward_kernel(12288, 164 * 1024) == "nd_backward_wide_kernel (384,1,1)"  # 150 KiB
    assert backward_kernel(16384, 164 * 1024) == "nd_backward_row_stats_kernel (512,1,1)"  # needs 203.5 KiB
    assert backward_kernel(8200, 99 * 1024) == "nd_backward_row_stats_kernel (512,1,1)"  # needs 104.5 KiB


def test_ldr_empty_rows(emu):
    x = torch.empty(0, 64)
    w, b = torch.ones(64), torch.zeros(64)
    out, mean, rstd, gx, gw, gb = run_ldr(emu, x, w, b, seed_tensor(0), 0.3, torch.empty(0, 64))
    assert out.shape == (0, 64) and mean.shape == (0,) and torch.equal(gw, torch.zeros(64))


# ------------------------------------------------------------------------------------------- dropout_add_norm
def run_dan(ops, x, r, w, b, seed, p, rms, r32, g, gs):
    out, sm, mean, rstd = ops.dropout_add_norm(x, r, w, b, seed, p, 1e-5, rms, r32)
    gx, gr, gw, gb = ops.dropout_add_norm_backward(g, gs, sm, w, b, mean, rstd, seed, p, rms, r is not None)
    return dict(out=out, sum=sm, mean=mean, rstd=rstd, grad_x=gx, grad_residual=gr, grad_weight=gw, grad_bias=gb)


def dan_reference_and_grads(x, r, w, b, seed, p, rms, r32, g, gs, dtype):
    """(out, [grad_x, grad_residual, grad_weight, grad_bias]) of the unfused reference computed in `dtype`."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, r, w, b)]
    out, stored, _, _ = R.dropout_add_norm(*leaves, seed, p, 1e-5, rms, r32, compute_dtype=dtype)
    outs, grads = [out], [g.to(dtype)]
    if gs is not None:
        outs.append(stored)
        grads.append(gs.to(stored.dtype))
    torch.autograd.backward(outs, grads)
    return out.detach(), [t.grad if t is not None else None for t in leaves]


def check_dan(ops, m, n, dtype, *, rms=False, r32=False, params="x", p=0.3, residual=True, grad_sum=True,
              unaligned_rows=False):  # fmt: skip
    """The emulated CUDA op against the CPU op (the sum, hence the dropout mask and the add, bit for bit; grad_x
    exactly 0 where dropped) and against the fp64 reference (every output and gradient)."""
    x, w, b = inputs(m, n, dtype, params, seed=n % 89)
    sdt = torch.float32 if r32 and dtype in (torch.float16, torch.bfloat16) else dtype
    gen = torch.Generator().manual_seed(11)
    r = torch.randn(m, n, generator=gen, dtype=torch.float64).to(sdt) if residual else None
    g = torch.randn(m, n, generator=gen, dtype=torch.float64).to(dtype)
    gs = torch.randn(m, n, generator=gen, dtype=torch.float64).to(sdt) if grad_sum else None
    if unaligned_rows:
        x, g = unaligned(x), unaligned(g)
        r = unaligned(r) if r is not None else None
    s = seed_tensor(1234)
    ours = run_dan(ops, x, r, w, b, s, p, rms, r32, g, gs)
    theirs = run_dan(cpu, x, r, w, b, s, p, rms, r32, g, gs)
    for name, t in ours.items():
        assert not t.isnan().any(), f"{name} has NaN: a poisoned (never written) element or an out-of-bounds read"
        assert t.dtype == theirs[name].dtype and t.shape == theirs[name].shape, name
    assert ours["sum"].dtype == sdt and torch.equal(ours["sum"], theirs["sum"]), "sum differs from the CPU op's"
    keep = R.dropout_keep_mask(1234, m, n, p)
    assert torch.equal(ours["grad_x"][~keep], torch.zeros_like(ours["grad_x"][~keep])), "grad_x where dropped"
    assert ours["mean"].numel() == (0 if rms else m)
    torch.testing.assert_close(ours["rstd"], theirs["rstd"], rtol=1e-5, atol=0)
    if not rms:
        torch.testing.assert_close(ours["mean"], theirs["mean"], rtol=1e-5, atol=1e-6)
    ref, (rgx, rgr, rgw, rgb) = dan_reference_and_grads(x, r, w, b, s, p, rms, r32, g, gs, torch.float64)
    low, (lgx, lgr, lgw, lgb) = dan_reference_and_grads(x, r, w, b, s, p, rms, r32, g, gs, dtype)
    fl = FLOORS[dtype]
    assert_close_to_reference("out", ours["out"], ref, low, fl)
    assert_close_to_reference("grad_x", ours["grad_x"], rgx, lgx, fl)
    if r is not None:
        assert_close_to_reference("grad_residual", ours["grad_residual"], rgr, lgr, fl)
    else:
        assert ours["grad_residual"].numel() == 0
    for name, t, rg, lg in (("grad_weight", w, rgw, lgw), ("grad_bias", b, rgb, lgb)):
        if t is None:
            assert ours[name].numel() == 0
            continue
        floor = 1e-2 if t.dtype != dtype else fl * m
        assert_close_to_reference(name, ours[name], rg, lg, floor)
    return ours


# Paths (the LayerNorm-dropout-ReLU plans at the element size of the wider of x and the sum; rows kernels on the
# 16-byte path of fp16 / bf16 / fp32 only):
#   33     looped both ways (the scalar path: N % 8 != 0)
#   768    forward warp rows (3 groups a lane); backward a block a row (one warp, 3 groups)
#   1000   forward warp rows (4th group on lanes 0..28 only); backward a block a row
#   4104   a block a row both ways, the last warp part-filled
#   8200   forward a block a row; backward wide (352 threads, 3 groups a thread, sums in dynamic shared memory)
#   16392  forward looped; backward wide (6 groups a thread, a tail of groups; with an fp32 sum it reads the
#          sum again after the row sum: the whole row at once with 16-bit parameters)
#   18440  looped both ways (the vector looped backward: past the wide kernel's 6 x 384 groups)
# fp64 takes the looped kernels at every N. Each with LayerNorm and RMSNorm, and for 16-bit x the sum in x's dtype
# and in fp32 (residual_in_fp32); fp16 repeats bf16's launches and runs at three points (16392: the wide kernel
# reads an fp32 sum again two groups at a time with fp16 x, all at once with bf16); at 16392 the fast lane runs
# bf16 and fp16 LayerNorm with an fp32 sum and fp32 RMSNorm (all wide), at 18440 bf16 LayerNorm (slow: the rest).
def _dan_params():
    for n in (33, 768, 1000, 4104, 8200, 16392, 18440):
        for dtype in DTYPES:
            if dtype == torch.float64 and n > 768 or dtype == torch.float16 and n not in (768, 4104, 16392):
                continue
            for rms in (False, True):
                for r32 in (False, True) if dtype in (torch.float16, torch.bfloat16) else (False,):
                    norm = "rms" if rms else "ln"
                    # the longest rows: a few of them in the fast lane
                    fast = n < 16392 or (dtype, rms, r32) in (
                        ((torch.bfloat16, False, True), (torch.float16, False, True), (torch.float32, True, False))
                        if n == 16392
                        else ((torch.bfloat16, False, False),)
                    )
                    yield pytest.param(
                        n,
                        dtype,
                        rms,
                        r32,
                        marks=[] if fast else [slow],
                        id=f"{n}-{str(dtype)[6:]}-{norm}" + ("-r32" if r32 else ""),
                    )


@pytest.mark.parametrize("n,dtype,rms,r32", list(_dan_params()))
def test_dan_paths_dtypes(small_device, n, dtype, rms, r32):
    check_dan(small_device, 3 if n > 8192 else 5, n, dtype, rms=rms, r32=r32)


# The launch's switches: p = 0 (no RNG) and p = 1 (every x dropped); no residual, no grad_sum; parameters none
# or fp32 (AMP); on the rows kernels (768) and the looped ones (33).
@pytest.mark.parametrize("n", [33, 768])
@pytest.mark.parametrize(
    "opts",
    [
        dict(p=0.0, residual=False, grad_sum=False, params="none"),
        dict(p=1.0, params="fp32"),
        dict(p=0.3, residual=False, params="fp32", rms=True),
        dict(p=0.3, grad_sum=False, r32=True),
    ],
    ids=["p0-alone", "p1-fp32-params", "no-residual-rms", "no-grad-sum-r32"],
)
def test_dan_switches(small_device, n, opts):
    ours = check_dan(small_device, 5, n, torch.bfloat16, **opts)
    if opts["p"] == 0.0 and not opts.get("residual", True):
        x = inputs(5, n, torch.bfloat16, "none", seed=n % 89)[0]
        assert torch.equal(ours["sum"], x), "p = 0 without a residual: sum is x bit for bit"
    if opts["p"] == 1.0:
        assert torch.equal(ours["grad_x"], torch.zeros_like(ours["grad_x"]))


@pytest.mark.parametrize("n,dtype,r32", [(12288, torch.bfloat16, True), (16384, torch.bfloat16, False)])
def test_dan_wide_rows(small_device, n, dtype, r32):
    """The wide backward at 4 groups a thread (N = 12288, 384 threads) and 6 (16384, 352 threads), more rows than
    the grid's blocks (one an SM: 150 and 204 KiB of shared memory): each block adds several rows into its sums.
    (6 groups with an fp32 sum: 16392 in test_dan_paths_dtypes; fp32 x reads the sum again after the row sum.)"""
    small_device.take_launches()
    check_dan(small_device, 9, n, dtype, r32=r32)
    wide = [k for k in small_device.take_launches() if k.startswith("dan_backward_wide_kernel")]
    assert len(wide) == 1 and int(wide[0].split("grid=(")[1].split(",")[0]) < 9, wide


@pytest.mark.parametrize("n,dtype", [(768, torch.float32), (8200, torch.bfloat16)])
def test_dan_unaligned_rows(small_device, n, dtype):
    """x, grad_out and the residual one element past a 16-byte boundary: the looped kernels' scalar path."""
    check_dan(small_device, 3, n, dtype, r32=dtype == torch.bfloat16, unaligned_rows=True)


def test_dan_paths_taken(small_device):
    def kernels(n, dtype=torch.bfloat16, r32=False, params="x"):
        small_device.take_launches()
        check_dan(small_device, 4, n, dtype, r32=r32, params=params)
        return [k.split(" ")[0] + " " + k.split("block=")[1] for k in small_device.take_launches()]

    assert kernels(768)[:2] == ["dan_forward_rows_kernel (32,4,1)", "dan_backward_rows_kernel (32,1,1)"]
    assert kernels(8192)[:2] == ["dan_forward_rows_kernel (256,1,1)", "dan_backward_rows_kernel (256,1,1)"]
    # residual_in_fp32: the plans of fp32 rows (2 groups a thread forward)
    assert kernels(8192, r32=True)[:2] == ["dan_forward_rows_kernel (512,1,1)", "dan_backward_rows_kernel (256,1,1)"]
    assert kernels(8200)[1] == "dan_backward_wide_kernel (352,1,1)"
    assert kernels(16384, torch.float32)[1] == "dan_backward_wide_kernel (352,1,1)"  # 6 groups, the sum read again
    # 16-bit x with an fp32 sum at 6 groups a thread: wide with 16-bit parameters (the sum's row read again at
    # once), the looped kernels with fp32 ones (launch_config.h dan_wide_allowed)
    assert kernels(16384, r32=True)[1] == "dan_backward_wide_kernel (352,1,1)"
    assert kernels(16384, r32=True, params="fp32")[1] == "dan_backward_row_stats_kernel (512,1,1)"
    assert kernels(18440)[1:3] == ["dan_backward_row_stats_kernel (512,1,1)", "dan_backward_tiled_kernel (32,8,1)"]
    looped = ["dan_forward_looped_kernel (512,1,1)", "dan_backward_row_stats_kernel (512,1,1)"]
    assert kernels(768, torch.float64)[:2] == looped


def test_dan_deterministic_and_block_order_independent(small_device, monkeypatch):
    x, w, b = inputs(50, 1000, torch.bfloat16, "fp32")
    r, g, gs = (torch.randn(50, 1000).to(torch.bfloat16) for _ in range(3))
    s = seed_tensor(9)
    a = run_dan(small_device, x, r, w, b, s, 0.3, False, False, g, gs)
    monkeypatch.setenv("GPUOPT_EMU_BLOCK_ORDER", "reverse")
    c = run_dan(small_device, x, r, w, b, s, 0.3, False, False, g, gs)
    for k in a:
        assert torch.equal(a[k], c[k]), k


# ---------------------------------------------------------------------------------------------------- bias_relu
# fp32, the tiled kernels: TX x TY threads, column tiles of 8 TX columns.
BIAS_RELU_N = [
    1,  # TX 1, TY 256: one element a row, scalar
    7,  # TX 1: one partial group
    8,  # TX 1: one whole group, vectors
    33,  # TX 8: 5 groups, the last partial, scalar
    256,  # TX 32: exactly one column tile
    257,  # two column tiles, the second with one partial group
    768,  # 3 whole tiles, several row blocks (8 resident blocks / 3 tiles)
    1000,  # 4 tiles, the last part-filled (125 groups)
    1024,  # 4 whole tiles
    4104,  # 17 tiles, the last with one group: more tiles than resident blocks, one row block
    8192,  # 32 whole tiles
    8200,  # 33 tiles, the last with one group
]
# Pruned: 16384, 65536, 65544 and 131072: more column tiles of the same tiled launch (TX 32, one row block), whole
# (8192) or with a one-group last tile (4104, 8200); the row length enters no sum of bias-ReLU.


@pytest.mark.parametrize("n", BIAS_RELU_N)
def test_bias_relu_every_n(small_device, n):
    m = 3 if n >= 16384 else 11
    check_bias_relu(small_device, m, n, torch.float32, torch.float32)


# Every dtype x bias dtype x aligned / unaligned views at 7 (TX 1, a partial group: scalar), 768 (TX 32, whole
# tiles, several row blocks: vectors when aligned) and 8200 (33 tiles, the last with one group, one row block).
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_dtype", ["x", "fp32"])
@pytest.mark.parametrize("n", [7, 768, 8200])
@pytest.mark.parametrize("aligned", [True, False])
def test_bias_relu_dtypes(small_device, dtype, bias_dtype, n, aligned):
    if bias_dtype == "fp32" and dtype == torch.float32:
        pytest.skip("an fp32 bias of fp32 x is the 'x' case")
    check_bias_relu(small_device, 37, n, dtype, torch.float32 if bias_dtype == "fp32" else dtype, aligned=aligned)


def check_bias_relu(ops, m, n, dtype, bias_dtype, aligned=True):
    g0 = torch.Generator().manual_seed(n)
    x = torch.randn(m, n, generator=g0, dtype=torch.float64).to(dtype)
    b = torch.randn(n, generator=g0, dtype=torch.float64).to(bias_dtype)
    g = torch.randn(m, n, generator=g0, dtype=torch.float64).to(dtype)
    if not aligned:
        x, b, g = unaligned(x), unaligned(b), unaligned(g)
    out = ops.bias_relu(x, b)
    assert torch.equal(out, cpu.bias_relu(x, b)), "bias_relu forward is elementwise: bit-identical to the CPU op"
    if not aligned:
        out = unaligned(out)
    gx, gb = ops.bias_relu_backward(g, out)
    assert torch.equal(gx, cpu.bias_relu_backward(g, out)[0])
    check_bias_relu_against_reference(x, b, g, out, gx, gb)
    gx2, gb2 = ops.bias_relu_backward(g, out)
    assert torch.equal(gb, gb2), "dbias is deterministic"


def test_bias_relu_grid_takes_two_full_waves(emu):
    """A 3-SM device with 2 blocks an SM: N = 1024 is 4 column tiles, so one wave would hold 4 of its 6 slots;
    the plan takes 3 row blocks (12 blocks: two full waves), and the results stay right and deterministic."""
    old = emu.configure(3, 2)
    try:
        emu.take_launches()
        check_bias_relu(emu, 24, 1024, torch.float32, torch.float32)
        launches = emu.take_launches()
        grids = [s.split("grid=")[1].split(" ")[0] for s in launches if s.startswith("bias_act_backward_kernel")]
        assert grids and set(grids) == {"(4,3,1)"}, grids
    finally:
        emu.configure(*old)


@pytest.mark.parametrize("act", [1, 2, 3])
def test_bias_act_unaligned_and_deterministic(small_device, act):
    """Unaligned views take the scalar path; the column sums are deterministic; names the launches."""
    m, n = 37, 768
    g0 = torch.Generator().manual_seed(act)
    x = torch.randn(m, n, generator=g0, dtype=torch.float64).to(torch.bfloat16)
    b = torch.randn(n, generator=g0, dtype=torch.float64).to(torch.float32)
    g = torch.randn(m, n, generator=g0, dtype=torch.float64).to(torch.bfloat16)
    small_device.take_launches()
    out = small_device.bias_act(unaligned(x), unaligned(b), act)
    gx, gb = small_device.bias_act_backward(unaligned(g), unaligned(x), unaligned(b), act)
    launches = small_device.take_launches()
    assert [entry.split()[0] for entry in launches] == [
        "bias_act_forward_kernel",
        "bias_act_backward_kernel",
        "column_sum_kernel",
    ]
    out2 = small_device.bias_act(x, b, act)
    gx2, gb2 = small_device.bias_act_backward(g, x, b, act)
    torch.testing.assert_close(out, out2, rtol=0, atol=0)  # scalar and vector paths: the same per-element math
    torch.testing.assert_close(gx, gx2, rtol=0, atol=0)
    gx3, gb3 = small_device.bias_act_backward(g, x, b, act)
    assert torch.equal(gb2, gb3), "dbias is deterministic"


# ------------------------------------------------------------------------------------------------------ errors
def test_missing_arch_message(emu):
    """The CUDA backend's error for a GPU outside the build's TORCH_CUDA_ARCH_LIST (csrc/cuda/arch_message.h;
    cuda_launcher.h raises it when the runtime finds no kernel image): names the capability, the build's list, and
    both ways out."""
    msg = emu.missing_arch_message(7, 5, 1, "Tesla T4", "8.0;9.0+PTX")
    assert "no CUDA code for compute capability 7.5 (cuda:1, Tesla T4)" in msg
    assert 'built with TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX"' in msg
    assert 'TORCH_CUDA_ARCH_LIST="7.5" pip install --no-build-isolation .' in msg
    assert 'backend="triton"' in msg


# ---------------------------------------------------------------------------------------------------- gated_act
# gated_act_kernels.cuh: groups of 8 consecutive OUTPUT elements (the Philox groups), a thread taking groups t, t + T,
# ... of a persistent grid of 256-thread blocks, U = 2 a grid stride on the 16-byte path (fp64: 1) and 1 element by
# element. The 16-byte path: every buffer 16-byte aligned, and two tensors (one flat row: only the last group of
# the whole problem can be partial, taken element by element after the loop) or packed with F % 8 == 0. Otherwise
# element by element, the walk into the [gate | up] rows wrapping at each row end (several times a group at F < 8).
# A 1-SM, 1-block device gives a grid stride of 256 threads (512 or 256 groups), so these shapes take many strides.
@pytest.fixture
def one_block_device(emu):
    old = emu.configure(1, 1)
    yield emu
    emu.configure(*old)


def gated_inputs(m, f, dtype, packed, seed=0):
    g0 = torch.Generator().manual_seed(seed)
    gate = (1.5 * torch.randn(m, 2 * f if packed else f, generator=g0, dtype=torch.float64)).to(dtype)
    up = None if packed else torch.randn(m, f, generator=g0, dtype=torch.float64).to(dtype)
    grad_out = torch.randn(m, f, generator=g0, dtype=torch.float64).to(dtype)
    return gate, up, grad_out


def run_gated(ops, gate, up, grad_out, seed, p, act):
    out = ops.gated_act(gate, up, seed, p, act)
    gg, gu = ops.gated_act_backward(grad_out, gate, up, seed, p, act)
    return out, gg, gu


def split_packed(gate):
    f = gate.shape[-1] // 2
    return gate[..., :f].contiguous(), gate[..., f:].contiguous()


@pytest.mark.parametrize("act", [0, 1, 2, 3])
def test_gated_act_unaligned_and_deterministic(one_block_device, act):
    """Unaligned views take the element-by-element kernels and give the 16-byte path's bits (the same per-element
    math, the same keep bits); a second run gives the same bits; the launches are one kernel a direction."""
    ops = one_block_device
    m, f = 37, 200  # 7400 elements: 925 groups, two grid strides of the 16-byte path, four element by element
    gate, up, go = gated_inputs(m, f, torch.bfloat16, packed=False, seed=act)
    s = seed_tensor(17)
    ops.take_launches()
    vec = run_gated(ops, gate, up, go, s, 0.3, act)
    assert [e.split()[0] for e in ops.take_launches()] == ["gated_act_forward_kernel", "gated_act_backward_kernel"]
    scalar = run_gated(ops, unaligned(gate), unaligned(up), unaligned(go), s, 0.3, act)
    for name, a, b in zip(("out", "grad_gate", "grad_up"), vec, scalar):
        assert not a.isnan().any(), f"{name}: a never-written (poisoned) element"
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{name}: scalar path differs from vectors"
    again = run_gated(ops, gate, up, go, s, 0.3, act)
    for a, b in zip(vec, again):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


# F: 1 and 3 (a group spans several rows), 7 and 13 (a row end inside most groups), 8 and 64 (the 16-byte path),
# 1000 (the 16-byte path, rows longer than a grid stride's share of a row).
@pytest.mark.parametrize("f", [1, 3, 7, 8, 13, 64, 1000])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, pytest.param(torch.float64, marks=slow)], ids=lambda d: str(d)[6:]
)
def test_gated_act_packed_equals_two_tensors(one_block_device, f, dtype):
    """The [gate | up] layout gives the two-tensor layout's bits (out, and grad_gate / grad_up as the halves of
    the one gradient), aligned or not, and both match the fp64 reference."""
    ops = one_block_device
    m = max(3, 3000 // f)
    gate, _, go = gated_inputs(m, f, dtype, packed=True, seed=f)
    s = seed_tensor(3)
    g, u = split_packed(gate)
    for act, p in ((3, 0.0), (2, 0.25)):
        packed = run_gated(ops, gate, None, go, s, p, act)
        two = run_gated(ops, g, u, go, s, p, act)
        assert packed[2].shape == (0,) and packed[1].shape == gate.shape
        assert torch.equal(packed[0], two[0]), "out"
        assert torch.equal(packed[1][:, :f], two[1]) and torch.equal(packed[1][:, f:], two[2]), "grad halves"
        moved = run_gated(ops, unaligned(gate), None, unaligned(go), s, p, act)
        for a, b in zip(packed, moved):
            assert torch.equal(a, b), "unaligned packed buffers"
        ref = R.gated_act(g.double(), u.double(), act, s, p)
        low = R.gated_act(g, u, act, s, p)
        fl = FLOORS[dtype]
        assert_close_to_reference("out", two[0], ref, low, fl)


@pytest.mark.parametrize("packed", [False, True], ids=["two", "packed"])
@pytest.mark.parametrize("f", [5, 24, 100])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_gated_act_keep_bits_are_the_reference_mask(one_block_device, packed, f, p):
    """relu(1) * 1 = 1 before the dropout: out is the scale exactly where the reference mask (DESIGN
    2.2, at the output's linear index r F + c) keeps, an exact 0 elsewhere; grad_up (= g * scale * relu(1)) and
    grad_gate are 0 exactly where dropped, nonzero where kept."""
    ops = one_block_device
    m = 41
    gate = torch.ones(m, 2 * f if packed else f)
    up = None if packed else torch.ones(m, f)
    go = torch.ones(m, f)
    s = seed_tensor(1234567)
    out, gg, gu = run_gated(ops, gate, up, go, s, p, 0)
    keep = R.dropout_keep_mask(R.seed_value(s), m, f, p)
    t = R.dropout_threshold(p)
    scale = torch.tensor(65536.0 / (65536 - t), dtype=torch.float64).to(torch.float32)
    assert torch.equal(out != 0, keep) and torch.equal(out[keep], scale.expand(int(keep.sum())))
    grad_up = gg[:, f:] if packed else gu
    grad_gate = gg[:, :f] if packed else gg
    assert torch.equal(grad_up != 0, keep) and torch.equal(grad_gate != 0, keep)


@pytest.mark.parametrize("packed", [False, True], ids=["two", "packed"])
def test_gated_act_p1_exact_zeros(one_block_device, packed):
    """p = 1 drops everything through the select: out is +0 exactly even where act(gate) * up is inf or NaN, and
    both gradients are exact zeros (finite inputs: 0 * act(gate) is 0)."""
    ops = one_block_device
    m, f = 9, 40
    s = seed_tensor(2)
    for move in (lambda t: t, lambda t: None if t is None else unaligned(t)):  # 16-byte path; element by element
        gate, up, go = gated_inputs(m, f, torch.float32, packed)
        _, gg, gu = run_gated(ops, move(gate), move(up), move(go), s, 1.0, 3)
        assert torch.equal(gg, torch.zeros_like(gg)) and torch.equal(gu, torch.zeros_like(gu))
        gate[0, 0], gate[1, 1] = float("inf"), float("nan")
        out = ops.gated_act(move(gate), move(up), s, 1.0, 3)
        assert torch.equal(out.view(torch.int32), torch.zeros(m, f, dtype=torch.int32)), "+0 everywhere"


def test_gated_act_block_order_independent(small_device, monkeypatch):
    """Blocks run in reverse order give the same bits (every element is written once, by one thread)."""
    gate, _, go = gated_inputs(50, 1000, torch.bfloat16, packed=True)
    a = run_gated(small_device, gate, None, go, seed_tensor(9), 0.3, 1)
    monkeypatch.setenv("GPUOPT_EMU_BLOCK_ORDER", "reverse")
    c = run_gated(small_device, gate, None, go, seed_tensor(9), 0.3, 1)
    for u, v in zip(a, c):
        assert torch.equal(u, v)


def test_gated_act_empty_rows_launch_nothing(emu):
    """M = 0: empty outputs of the right shapes, no kernel launched."""
    emu.take_launches()
    s = seed_tensor(1)
    out, gg, gu = run_gated(emu, torch.empty(0, 16), torch.empty(0, 16), torch.empty(0, 16), s, 0.5, 3)
    assert out.shape == (0, 16) and gg.shape == (0, 16) and gu.shape == (0, 16)
    out, gg, gu = run_gated(emu, torch.empty(2, 0, 32), None, torch.empty(2, 0, 16), s, 0.5, 3)
    assert out.shape == (2, 0, 16) and gg.shape == (2, 0, 32) and gu.shape == (0,)
    assert emu.take_launches() == []


def test_gated_act_fp64_and_fp16(one_block_device):
    """fp64 (one group a thread on the 16-byte path) and fp16 against the fp64 reference, both layouts, odd F."""
    for dtype in (torch.float64, torch.float16):
        for packed, f in ((False, 77), (True, 24), (True, 9)):
            gate, up, go = gated_inputs(13, f, dtype, packed, seed=f)
            s = seed_tensor(8)
            out, gg, gu = run_gated(one_block_device, gate, up, go, s, 0.2, 1)
            g, u = split_packed(gate) if packed else (gate, up)
            gr, ur = (t.detach().double().clone().requires_grad_() for t in (g, u))
            ref = R.gated_act(gr, ur, 1, s, 0.2)
            ref.backward(go.double())
            gl, ul = (t.detach().clone().requires_grad_() for t in (g, u))
            low = R.gated_act(gl, ul, 1, s, 0.2)
            low.backward(go)
            grad_gate, grad_up = (gg[:, :f], gg[:, f:]) if packed else (gg, gu)
            fl = FLOORS[dtype]
            assert_close_to_reference("out", out, ref.detach(), low.detach(), fl)
            assert_close_to_reference("grad_gate", grad_gate, gr.grad, gl.grad, fl)
            assert_close_to_reference("grad_up", grad_up, ur.grad, ul.grad, fl)


# The walk's index arithmetic past 2^31 (no emulated tensor is that large): the gate-layout offset of output
# element i is (i // row) * ld + i % row, for every group a thread visits, at the grid stride of an H100 wave.
@pytest.mark.parametrize(
    "n,row,ld",
    [
        (2**33 + 8 * 3, 28672, 2 * 28672),  # packed, F = 28672: M F past 2^33
        (3 * 2**31 + 40, 3 * 2**31 + 40, 3 * 2**31 + 40),  # two tensors: one flat row past 2^32
        (2**32 + 96, 12, 24),  # packed, F = 12 (element by element: row ends inside groups)
        (2**32 + 5, 1, 2),  # packed, F = 1: a group spans 8 rows
    ],
)
def test_gated_act_walk_offsets_past_2_31(emu, n, row, ld):
    step = 132 * 8 * 256 * 8  # 132 SMs x 8 blocks x 256 threads, 8 elements a group
    for first in (0, 8 * 1234, step - 8):
        count = (n - 1 - first) // step + 1  # every group of this thread: the whole walk, to the end of n
        got = emu.gated_walk_offsets(n, row, ld, step, first, count)
        visited = range(first, first + count * step, step)
        assert visited[-1] < n <= visited[-1] + step
        assert got == [(i // row) * ld + i % row for i in visited] and got[-1] > 2**32


def test_gated_act_paths_taken(small_device):
    """The path shows in the grid: 12288 output elements are 1536 groups, 3 blocks of 256 threads at 2 groups a
    thread (the 16-byte path of 16-bit and fp32) and 6 at 1 (fp64, and every element-by-element grid), within the
    8 resident blocks of the emulated device."""
    s = seed_tensor(4)

    def grid_of(gate, up, dtype):
        go = torch.randn(gate.shape[0], gate.shape[-1] // (1 if up is not None else 2), dtype=torch.float64)
        small_device.take_launches()
        run_gated(small_device, gate, up, go.to(dtype), s, 0.1, 3)
        grids = {e.split()[1] for e in small_device.take_launches()}
        assert len(grids) == 1, grids  # forward and backward: the same plan
        return grids.pop()

    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        vec = "grid=(6,1,1)" if dtype == torch.float64 else "grid=(3,1,1)"
        gate, up, _ = gated_inputs(96, 128, dtype, packed=False)
        assert grid_of(gate, up, dtype) == vec, dtype  # two tensors, aligned
        assert grid_of(unaligned(gate), up, dtype) == "grid=(6,1,1)", dtype  # one buffer unaligned
        gate, _, _ = gated_inputs(192, 64, dtype, packed=True)
        assert grid_of(gate, None, dtype) == vec, dtype  # [gate | up], F % 8 == 0
        gate, _, _ = gated_inputs(1024, 12, dtype, packed=True)
        assert grid_of(gate, None, dtype) == "grid=(6,1,1)", dtype  # [gate | up], F = 12: row ends inside groups

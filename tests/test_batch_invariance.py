"""Batch invariance: a row's results do not depend on the batch it is launched in.

For the row ops (layer_norm_dropout_relu, norm_dropout with LayerNorm and RMSNorm, dropout_add_norm with LayerNorm
and RMSNorm, with and without a residual) a row's out, sum, mean, rstd, grad_x and grad_residual are the same bits
whatever the number of rows M in the launch, the row's position among them, the size of the grid (CUDA: devices of
1 to 1056 resident blocks, so persistent grids from 1 block to a block a row, blocks in either order; Triton: 1 to 8
persistent programs; CPU: any tiling) and the number of CPU threads; the element-wise ops (bias_act, gated_act)
the same for out, grad_x, grad_gate and grad_up. The column sums (grad_weight, grad_bias) are the same bits on a
rerun at the same M on every backend, and on the CPU at any thread count; on other CUDA grids they are close, not
the same bits.

The kernel a row takes (CUDA warp rows, block rows, wide or looped; Triton single-block, wide or looped) is a
function of N, the dtypes and the device, never of M. Two kernels for the same row (reached here by changing the
emulated device's shared memory or the Triton limits) agree within tolerance but not in bits: strict xfails below.

Dropout keys the mask by the element's linear index in the (M, N) view: a row moved to another position gets
another mask, so the invariance over M and position is checked at p = 0; at p > 0 a row keeps its bits when only
rows after it change (rows appended at the end).

Every comparison is of bits (integer views), never through floats. The backends: the C++ CPU kernels, the Triton
kernels under the interpreter, and the CUDA source under tools/cuda_emu (and the GPU backends where there is a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from gpuopt_ops import reference as R
from gpuopt_ops.ops import ACTIVATIONS

from backends import DEFAULT, backend_params, require_op
from helpers import load_emulated_ops, seed_tensor

EPS = 1e-5
SEED = 2**40 + 77
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
ALL = backend_params(*DEFAULT, "cuda-emulated")


# --------------------------------------------------------------------------------------------------- the ops
@dataclass(frozen=True)
class RowOp:
    name: str  # the gpuopt op
    rms: bool = False
    relu: bool = False  # norm_dropout's flag
    residual: bool = False  # dropout_add_norm with a residual (and a grad_sum in the backward)
    fp32_residual: bool = False  # dropout_add_norm's residual_in_fp32 (an fp32 residual and sum for 16-bit x)

    def __repr__(self) -> str:
        return self.name


ROW_OPS = {
    "ldr": RowOp("layer_norm_dropout_relu"),
    "nd-layer": RowOp("norm_dropout"),
    "nd-rms": RowOp("norm_dropout", rms=True),
    "dan-layer-res": RowOp("dropout_add_norm", residual=True),
    "dan-rms-res": RowOp("dropout_add_norm", rms=True, residual=True),
    "dan-layer": RowOp("dropout_add_norm"),
    "dan-rms": RowOp("dropout_add_norm", rms=True),
    "dan-rms-res-f32": RowOp("dropout_add_norm", rms=True, residual=True, fp32_residual=True),
}


def row_op_params(*names):
    return [pytest.param(ROW_OPS[k], id=k) for k in (names or ROW_OPS)]


def bank(m, n, dtype, salt=0):
    """m distinct rows of every per-row input (x, grad_out, residual, grad_sum), each row with its own scale and
    offset (statistics far from 0 and 1), and the parameters."""
    g = torch.Generator().manual_seed(1000 * n + m + salt)
    scale = torch.rand(m, 1, generator=g, dtype=torch.float64) * 3 + 0.1
    x = (torch.randn(m, n, generator=g, dtype=torch.float64) * scale + 4 * torch.randn(m, 1, generator=g)).to(dtype)
    rows = dict(
        x=x,
        grad_out=torch.randn(m, n, generator=g).to(dtype),
        residual=torch.randn(m, n, generator=g).to(dtype),
        grad_sum=torch.randn(m, n, generator=g).to(dtype),
    )
    params = dict(
        weight=(1 + 0.5 * torch.randn(n, generator=g)).to(dtype),
        bias=(0.3 * torch.randn(n, generator=g)).to(dtype),
    )
    return rows, params


def run_row_op(backend, op: RowOp, rows, params, p):
    """(per-row results, column sums) of op's forward and backward on `rows` (dict of (M, N) tensors)."""
    dev = backend.device
    x, g = rows["x"].to(dev), rows["grad_out"].to(dev)
    w, b = params["weight"].to(dev), params["bias"].to(dev)
    seed = seed_tensor(SEED, dev)
    fwd, bwd = backend.op(op.name), backend.op(op.name + "_backward")
    if op.name == "layer_norm_dropout_relu":
        out, mean, rstd = fwd(x, w, b, seed, p, EPS)
        gx, gw, gb = bwd(g, x, w, b, mean, rstd, seed, p)
        per_row = dict(out=out, mean=mean, rstd=rstd, grad_x=gx)
    elif op.name == "norm_dropout":
        out, mean, rstd = fwd(x, w, b, seed, p, EPS, op.rms, op.relu)
        gx, gw, gb = bwd(g, x, w, b, mean, rstd, seed, p, op.rms, op.relu)
        per_row = dict(out=out, rstd=rstd, grad_x=gx, **({} if op.rms else dict(mean=mean)))
    else:
        wide = torch.float32 if op.fp32_residual and x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        r = rows["residual"].to(dev, wide) if op.residual else None
        gs = rows["grad_sum"].to(dev, wide) if op.residual else None
        out, s, mean, rstd = fwd(x, r, w, b, seed, p, EPS, op.rms, op.fp32_residual)
        gx, gr, gw, gb = bwd(g, gs, s, w, b, mean, rstd, seed, p, op.rms, op.residual)
        per_row = dict(out=out, sum=s, rstd=rstd, grad_x=gx, **({} if op.rms else dict(mean=mean)))
        if op.residual:
            per_row["grad_residual"] = gr
    return {k: v.cpu() for k, v in per_row.items()}, dict(grad_weight=gw.cpu(), grad_bias=gb.cpu())


# bias_act's four activations and gated_act's two layouts (separate gate and up; one [gate | up] tensor)
ELEMENTWISE = ["bias_act-relu", "bias_act-gelu", "bias_act-gelu_tanh", "bias_act-silu", "gated_act", "gated_act-packed"]
ACT = ACTIVATIONS  # the act codes


def elementwise_bank(m, n, dtype, salt=0):
    g = torch.Generator().manual_seed(77 * n + m + salt)
    rows = dict(
        x=(2 * torch.randn(m, n, generator=g)).to(dtype),
        up=torch.randn(m, n, generator=g).to(dtype),
        grad_out=torch.randn(m, n, generator=g).to(dtype),
    )
    return rows, dict(bias=(0.5 * torch.randn(n, generator=g)).to(dtype))


def run_elementwise(backend, kind, rows, params, p):
    dev = backend.device
    x, g = rows["x"].to(dev), rows["grad_out"].to(dev)
    if kind.startswith("bias_act"):
        act = ACT[kind.split("-", 1)[1]]
        bias = params["bias"].to(dev)
        out = backend.op("bias_act")(x, bias, act)
        gx, gb = backend.op("bias_act_backward")(g, out if act == 0 else x, bias, act)
        return dict(out=out.cpu(), grad_x=gx.cpu()), dict(grad_bias=gb.cpu())
    seed = seed_tensor(SEED, dev)
    up = rows["up"].to(dev)
    if kind == "gated_act-packed":  # row r of [gate | up]: the same row's gate and up side by side
        gate, up = torch.cat([x, up], -1), None
    else:
        gate = x
    out = backend.op("gated_act")(gate, up, seed, p, ACT["silu"])
    gg, gu = backend.op("gated_act_backward")(g, gate, up, seed, p, ACT["silu"])
    per_row = dict(out=out.cpu(), grad_gate=gg.cpu())
    if up is not None:
        per_row["grad_up"] = gu.cpu()
    return per_row, {}


# ------------------------------------------------------------------------------------------------- checking
def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])


def assert_rows_equal(name, got, want, where):
    """got[i] and want[i] are the same bits for every i (rows of a (M, N) result or elements of a (M,) one)."""
    gb, wb = bits(got), bits(want)
    assert gb.shape == wb.shape, f"{name} {where}: shape {tuple(gb.shape)} != {tuple(wb.shape)}"
    same = gb == wb
    if same.all():
        return
    bad = (~same).reshape(same.shape[0], -1).any(-1).nonzero().flatten()
    i = int(bad[0])
    diff = (got[i].double() - want[i].double()).abs().max().item()
    raise AssertionError(f"{name} {where}: {bad.numel()} rows differ in bits, first row {i} (max |diff| {diff:.3e})")


def first_dropped(m, n, p):
    """DESIGN 2's dropped elements of the first rows of an (m, n) batch (2048 elements and more; the Python
    reference's Philox is slow on a whole batch)."""
    r = min(m, 2048 // n + 1)
    dropped = ~R.dropout_keep_mask(SEED, r, n, p)
    assert 0.2 < dropped.float().mean().item() < 0.4
    return r, dropped


def assert_dropout_applied(op, rows, got, p):
    """The elements the mask drops are dropped in the first rows: out 0; dropout_add_norm: sum = the residual (0
    without one)."""
    r, dropped = first_dropped(*got["out"].shape, p)
    if op.name == "dropout_add_norm":
        dt = got["sum"].dtype  # the residual's, exactly (an fp32 sum holds a bf16 residual's values)
        want = rows["residual"][:r][dropped].to(dt) if op.residual else torch.zeros(int(dropped.sum()), dtype=dt)
        assert torch.equal(got["sum"][:r][dropped], want), "sum where dropped"
    else:
        assert (got["out"][:r][dropped] == 0).all(), "out where dropped"


def assert_close_sums(got, want):
    """Column sums of the same terms added in another order: fp32 within 1e-5 (relative), 16-bit parameters'
    sums (rounded to their dtype at the end) within torch's tolerance of that dtype (an ulp: 2^-8 for bf16)."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    else:
        torch.testing.assert_close(got, want)


def take(results, ids):
    return {k: v[ids] for k, v in results.items()}


def check_rows(got, want, where):
    assert got.keys() == want.keys()
    for k in got:
        assert_rows_equal(k, got[k], want[k], where)


def check_same(got, want, where):
    """Every result (per-row results and column sums) the same bits."""
    assert got.keys() == want.keys()
    for k in got:
        assert torch.equal(bits(got[k]), bits(want[k])), f"{k} {where}: bits differ"


# --------------------------------------------------------------------------------------------- the batch sizes
def big_m(backend, n):
    """Rows enough that the batch crosses the backend's scheduling units: the CPU's ~16K-element scheduling tiles
    (twice) and its row blocks of the column sums (16 rows and more); the interpreter's row tiles (64 rows forward
    and 32 backward at N = 37, 4 and 2 at N = 1000: 2 and 3 tiles, the last one partial; its persistent programs
    loop over the tiles in test_triton_rows_do_not_depend_on_the_programs); the persistent grid of 2 blocks of the
    emulated device, twice and more (4 rows a block while a warp holds a row, else 1); a GPU a grid's worth of rows
    for every SM of the largest part, and more."""
    if backend.gpu:
        return 5000 + 3
    if backend.name == "cpu":
        r = max(1, 2048 // n)
        tile = max(r, 16384 // n // r * r)
        return max(2 * tile, 48) + 3
    if backend.interpreted:
        return max(1, min(64, 4096 // (1 << (n - 1).bit_length()))) + 3
    return 2 * 2 * (4 if n <= 1024 else 1) + 3  # cuda-emulated (DEVICES['1x2']): forward warp rows to N = 1024


@pytest.fixture(autouse=True)
def emulated_device(request):
    """Tests given the emulated CUDA backend run on DEVICES["1x2"], whose persistent grids of 2 blocks loop over
    the rows of a small batch. (Where the emulator cannot be built, the test reports why: require_op.)"""
    callspec = getattr(request.node, "callspec", None)
    backend = callspec.params.get("backend") if callspec else None
    ops = None
    if backend is not None and backend.namespace == "gpuopt_emu":
        try:
            ops = load_emulated_ops()
        except Exception:
            ops = None
    if ops is None:
        yield
        return
    old = ops.configure(*DEVICES["1x2"])
    yield
    ops.configure(*old)


def shuffled_ids(m, rows):
    """m row ids over `rows` bank rows: each bank row at many positions, first and last included, and next to
    every other one."""
    return torch.tensor([(i * 5 + i // rows) % rows for i in range(m)])


# N: 37 (N % 8 != 0: scalar paths, a Philox call an element; CPU tiles of 440 rows; Triton 64-row and 32-row
# tiles; CUDA warp rows), 1000 (CUDA forward warp rows, backward a block a row; Triton single-block, 4-row tiles),
# 8200 (CUDA forward a block a row, backward the wide kernel; the CPU one row a tile). The interpreter runs 37 only
# (1000 costs it half a second a call, 8200 seconds); its other plans: the Triton tests below.
N_VALUES = [37, 1000, 8200]


def n_params(backend_param_list, n_values=N_VALUES, only=None):
    """(backend, n) params; only: {backend name: the N it runs, where fewer}."""
    only = {"triton-interpret": [37], **(only or {})}
    out = []
    for bp in backend_param_list:
        backend = bp.values[0]
        for n in n_values:
            if n in only.get(backend.name, [n]):
                out.append(pytest.param(backend, n, id=f"{backend.name}-{n}", marks=bp.marks))
    return out


def matrix(n_values=N_VALUES, only=None, alternating=("cuda-emulated",)):
    """(backend, n, op, dtype) params of every row op on every backend at its N (n_params) in fp32 and bf16; the
    backends in `alternating` (the emulated CUDA source: a few hundred ms a case) take the two dtypes in turn over
    ops x N, so every op meets each dtype at some N, at half the cost."""
    out = []
    for bp in n_params(ALL, n_values, only):
        backend, n = bp.values
        i = n_values.index(n)
        for j, k in enumerate(ROW_OPS):
            for dtype in DTYPES:
                dt = dtype.values[0]
                if backend.name in alternating and dt != (torch.float32, torch.bfloat16)[(i + j) % 2]:
                    continue
                out.append(pytest.param(backend, n, ROW_OPS[k], dt, id=f"{bp.id}-{k}-{dtype.id}", marks=bp.marks))
    return out


def alternate_dtypes(ops, n_values=(None,)):
    """(n, op, dtype) params taking fp32 and bf16 in turn over ops x n_values: each dtype on every op and N
    somewhere, at half the cost of both everywhere (where a test's point is the plan, not the dtype)."""
    out = []
    for i, n in enumerate(n_values):
        for j, k in enumerate(ops):
            dtype = (torch.float32, torch.bfloat16)[(i + j) % 2]
            name = f"{n}-{k}-{'fp32' if dtype == torch.float32 else 'bf16'}" if n else f"{k}-{str(dtype)[6:]}"
            out.append(pytest.param(n, ROW_OPS[k], dtype, id=name))
    return out


_SHARED = {}


def shared(key, make):
    """make()'s result, computed once per key in this process: an xfail test of bits and the test of what holds
    beside it read the same launches."""
    if key not in _SHARED:
        _SHARED[key] = make()
    return _SHARED[key]


# ----------------------------------------------------------------------------------------------- row ops: M
@pytest.mark.parametrize("backend,n,op,dtype", matrix())
def test_row_results_do_not_depend_on_m_or_position(backend, n, op, dtype):
    """p = 0: four rows launched alone (M = 4), one of them alone (M = 1), and all four repeated at many positions
    of a batch that crosses the backend's scheduling units: every occurrence of a row has its bits."""
    require_op(backend, op.name)
    rows, params = bank(4, n, dtype)
    want, _ = run_row_op(backend, op, rows, params, 0.0)
    one, _ = run_row_op(backend, op, {k: v[2:3] for k, v in rows.items()}, params, 0.0)
    check_rows(one, take(want, [2]), "M = 1")
    ids = shuffled_ids(big_m(backend, n), 4)
    got, _ = run_row_op(backend, op, take(rows, ids), params, 0.0)
    check_rows(got, take(want, ids), f"M = {len(ids)}")


@pytest.mark.parametrize("backend,n,op,dtype", matrix(only={"cuda-emulated": [37, 1000]}))
def test_row_results_with_dropout_keep_their_bits_when_rows_are_appended(backend, n, op, dtype):
    """p = 0.3: the mask of element (r, c) is keyed by r * N + c, so the first rows of a batch keep their bits when
    more rows follow them (M = 3, then M = the large batch with the same first three rows). At one N a backend, the
    large batch again: every result, grad_weight and grad_bias included, the same bits (the column sums are
    deterministic at a given M)."""
    require_op(backend, op.name)
    m = big_m(backend, n)
    rows, params = bank(m, n, dtype, salt=1)
    got, sums = run_row_op(backend, op, rows, params, 0.3)
    assert_dropout_applied(op, rows, got, 0.3)
    head, _ = run_row_op(backend, op, {k: v[:3] for k, v in rows.items()}, params, 0.3)
    check_rows(take(got, slice(0, 3)), head, f"rows 0..2 of M = {m} against M = 3")
    if n == (37 if backend.interpreted else 1000):
        again, sums_again = run_row_op(backend, op, rows, params, 0.3)
        check_same({**again, **sums_again}, {**got, **sums}, f"a rerun at M = {m}")


# ------------------------------------------------------------------------------------------ CPU: thread counts
@pytest.fixture
def threads():
    """set_num_threads, the count restored after the test."""
    saved = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(saved)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", row_op_params())
@pytest.mark.parametrize("n", N_VALUES)
@pytest.mark.parametrize("backend", backend_params("cpu"))
def test_cpu_results_do_not_depend_on_the_thread_count(backend, threads, n, op, dtype):
    """1, 2 and 3 intra-op threads: every result, grad_weight and grad_bias included, the same bits (the column
    sums' row blocks are a function of M only, csrc/cpu/row_blocks.h), with and without dropout."""
    require_op(backend, op.name)
    m = big_m(backend, n)
    rows, params = bank(m, n, dtype, salt=3)
    for p in (0.0, 0.3):
        results = []
        for k in (1, 2, 3):
            threads(k)
            per_row, sums = run_row_op(backend, op, rows, params, p)
            results.append({**per_row, **sums})
        check_same(results[1], results[0], f"2 threads against 1, p = {p}")
        check_same(results[2], results[0], f"3 threads against 1, p = {p}")


# ---------------------------------------------------------------------------------- emulated CUDA: the plans
@pytest.fixture(scope="module")
def emu():
    ops = load_emulated_ops()
    ops.take_launches()
    return ops


# (SMs, resident blocks an SM, shared memory a block): one block at a time; 2 blocks at a time (the device of the
# tests here that take the emulated backend); tests/test_emulator.py's 4-SM device (the emulator's default); an
# H200's grid (132 SMs, 8 blocks); a device without the wide kernels' shared memory (99 KiB a block, as 8.6 / 8.9
# parts)
DEVICES = {
    "1x1": (1, 1, 232448),
    "1x2": (1, 2, 232448),
    "4x2": (4, 2, 232448),
    "132x8": (132, 8, 232448),
    "99KiB": (4, 2, 99 * 1024),
}


def emulated_results(backend, emu, op, rows, params, devices):
    """{device: (per-row results, column sums, the backward's first kernel)} of op at p = 0 on each device."""
    out = {}
    for name in devices:
        old = emu.configure(*DEVICES[name])
        emu.take_launches()
        try:
            per_row, sums = run_row_op(backend, op, rows, params, 0.0)
            launches = emu.take_launches()
        finally:
            emu.configure(*old)
        out[name] = per_row, sums, [k.split(" ")[0] for k in launches if "backward" in k][0]
    return out


# The plans of N (fp32 / bf16) on the 232 KiB devices: 37 warp rows both ways (scalar); 1000 forward warp rows,
# backward a block a row; 8200 forward a block a row, backward wide (3 groups a thread).
@pytest.mark.parametrize(
    "n,op,dtype", alternate_dtypes(["ldr", "nd-rms", "dan-layer-res", "dan-rms"], (37, 1000, 8200))
)
@pytest.mark.parametrize("backend", backend_params("cuda-emulated"))
def test_emulated_cuda_rows_do_not_depend_on_the_grid(backend, emu, monkeypatch, n, op, dtype):
    """A row's bits are the same on devices of 1, 2 and 1056 resident blocks (grids of 1 block, 2, and a block a
    row or a warp-row block of 4: each row in another block, another place of its block, after another number of
    rows of its block) and with the blocks run in reverse order; the column sums the same bits in reverse order."""
    rows, params = bank(big_m(backend, n), n, dtype, salt=4)
    got = emulated_results(backend, emu, op, rows, params, ("1x1", "1x2", "132x8"))
    for name in ("1x1", "132x8"):
        check_rows(got[name][0], got["1x2"][0], f"device {name} against 1x2")
        assert got[name][2] == got["1x2"][2]  # the same backward kernel, another grid
    monkeypatch.setenv("GPUOPT_EMU_BLOCK_ORDER", "reverse")
    rev = emulated_results(backend, emu, op, rows, params, ("1x2",))["1x2"]
    check_rows(rev[0], got["1x2"][0], "blocks in reverse order")
    check_same(rev[1], got["1x2"][1], "column sums, blocks in reverse order")
    for k in got["1x2"][1]:  # other devices sum the same terms in another grouping (G partial rows): close
        assert_close_sums(got["132x8"][1][k], got["1x2"][1][k])


WIDE_DIFFERS = (
    "the wide backward ({wide}) and the looped one ({looped}) add up a row's c1 = mean(dxhat * xhat) and "
    "c2 = mean(dxhat) in other orders and write grad_x in another, algebraically equal form (the wide one from "
    "rs * c1 and rs * c2, the looped one as rs * (dxhat - xhat * c1 - c2)), so fp32 grad_x differs in the last "
    "bits of some elements (within 1e-5 relative: the _agree test); the backward's plan is a function of "
    "(N, dtypes, the device), never of M"
)
EMU_WIDE_DIFFERS = WIDE_DIFFERS.format(
    wide="ldr/dan_backward_wide_kernel", looped="ldr/dan_backward_row_stats_kernel + _tiled_kernel"
)
EMU_WIDE = [pytest.param(n, ROW_OPS[k], id=f"{n}-{k}") for n in (8200, 16392) for k in ("ldr", "dan-layer-res")]


def emulated_wide_and_looped(backend, emu, n, op):
    """fp32 rows on the 232 KiB device (the wide backward: 3 groups a thread at 8200, 6 at 16392) and on the
    99 KiB one (the wide kernel's shared memory does not fit: the looped backward)."""
    rows, params = bank(3, n, torch.float32, salt=7)
    return shared(("emu-wide", n, op), lambda: emulated_results(backend, emu, op, rows, params, ("4x2", "99KiB")))


@pytest.mark.parametrize("n,op", EMU_WIDE)
@pytest.mark.parametrize("backend", backend_params("cuda-emulated"))
def test_emulated_cuda_wide_and_looped_backward_agree(backend, emu, n, op):
    """The wide and the looped backward: the same forward bits (one forward plan), grad_x within 1e-5."""
    got = emulated_wide_and_looped(backend, emu, n, op)
    assert "wide" in got["4x2"][2] and "wide" not in got["99KiB"][2], (got["4x2"][2], got["99KiB"][2])
    wide, looped = got["4x2"][0], got["99KiB"][0]
    for k in wide:
        if k.startswith("grad"):
            torch.testing.assert_close(wide[k], looped[k], rtol=1e-5, atol=1e-6)
        else:
            assert_rows_equal(k, wide[k], looped[k], "(one forward plan)")


@pytest.mark.xfail(strict=True, reason=EMU_WIDE_DIFFERS)
@pytest.mark.parametrize("n,op", EMU_WIDE)
@pytest.mark.parametrize("backend", backend_params("cuda-emulated"))
def test_emulated_cuda_wide_and_looped_backward_bits(backend, emu, n, op):
    got = emulated_wide_and_looped(backend, emu, n, op)
    check_rows(got["4x2"][0], got["99KiB"][0], "wide backward against looped")


# --------------------------------------------------------------------------------------- Triton: the plans
@pytest.fixture
def triton_plan(monkeypatch):
    """use(programs, looped, wide) plans the Triton launches that follow with `programs` persistent programs on the
    interpreter (common.INTERPRETER_ROW_GROUPS), the looped kernels for rows longer than 16 (looped: 16-column
    chunks, as tests/conftest.py's triton_looped) and without the wide backward (wide=False: N = 12288 and 16384
    take the looped one); a fresh plan store each time (its keys do not hold the number of programs)."""
    pytest.importorskip("triton")
    import dataclasses

    from gpuopt_ops.triton_kernels import common, plans

    default_limits = plans.ROW_LIMITS
    default_programs = common.INTERPRETER_ROW_GROUPS

    def use(programs=default_programs, looped=False, wide=True):
        monkeypatch.setattr(common, "INTERPRETER_ROW_GROUPS", programs)
        monkeypatch.setattr(common, "_PLANS", {})
        limits = default_limits.capped(16) if looped else default_limits
        monkeypatch.setattr(plans, "ROW_LIMITS", limits if wide else dataclasses.replace(limits, wide_bwd_n=()))

    return use


@pytest.mark.parametrize("n,op,dtype", alternate_dtypes(["ldr", "dan-layer-res"], (37,)))
@pytest.mark.parametrize("backend", backend_params("triton-interpret"))
def test_triton_rows_do_not_depend_on_the_programs(backend, triton_plan, n, op, dtype):
    """1, 3 and 8 persistent programs (1 and 3 loop over the row tiles: each row in another program, after another
    number of tiles), p = 0.3: the same bits; the column sums (G = the programs partial rows) close."""
    m = 2 * 64 + 3  # 3 forward tiles of 64 rows, 5 backward ones of 32
    rows, params = bank(m, n, dtype, salt=6)
    got = {}
    for programs in (1, 3, 8):
        triton_plan(programs)
        got[programs] = run_row_op(backend, op, rows, params, 0.3)
    for programs in (1, 3):
        check_rows(got[programs][0], got[8][0], f"{programs} programs against 8")
        for k, v in got[programs][1].items():
            assert_close_sums(v, got[8][1][k])


LOOPED_DIFFERS = (
    "the looped Triton kernels (16-column chunks here) add up a row's mean and variance (and the backward's c1, c2) "
    "chunk by chunk, the single-block ones across the whole row at once: other orders of fp32 additions, so mean, "
    "rstd, out and grad_x differ by an ulp in some rows; the plan is a function of (N, dtype, the device), never of M"
)
TRITON_LOOPED = alternate_dtypes(["ldr", "dan-layer-res"], (37,))


def triton_single_block_and_looped(backend, triton_plan, op, dtype):
    """N = 37, p = 0.3: the single-block kernels, then the looped ones (limits lowered to 16 columns)."""
    rows, params = bank(9, 37, dtype, salt=8)

    def make():
        triton_plan(looped=False)
        fused = run_row_op(backend, op, rows, params, 0.3)[0]
        triton_plan(looped=True)
        return fused, run_row_op(backend, op, rows, params, 0.3)[0]

    return shared(("triton-looped", op, dtype), make)


@pytest.mark.parametrize("n,op,dtype", TRITON_LOOPED)
@pytest.mark.parametrize("backend", backend_params("triton-interpret"))
def test_triton_single_block_and_looped_agree(backend, triton_plan, n, op, dtype):
    """The same dropout mask (out / sum zero in the same places) and values within the dtype's tolerance."""
    fused, looped = triton_single_block_and_looped(backend, triton_plan, op, dtype)
    for k in fused:
        torch.testing.assert_close(looped[k], fused[k])
    key = "sum" if op.name == "dropout_add_norm" else "out"
    assert torch.equal(fused[key] == 0, looped[key] == 0)


@pytest.mark.xfail(strict=True, reason=LOOPED_DIFFERS)
@pytest.mark.parametrize("n,op,dtype", TRITON_LOOPED)
@pytest.mark.parametrize("backend", backend_params("triton-interpret"))
def test_triton_single_block_and_looped_bits(backend, triton_plan, n, op, dtype):
    fused, looped = triton_single_block_and_looped(backend, triton_plan, op, dtype)
    check_rows(looped, fused, "looped against single-block")


def triton_wide_and_looped(backend, triton_plan):
    """fp32 N = 12288, p = 0: the wide backward, then the looped one (the row limits' wide_bwd_n emptied)."""
    op = ROW_OPS["ldr"]
    rows, params = bank(3, 12288, torch.float32, salt=7)

    def make():
        triton_plan(wide=True)
        wide = run_row_op(backend, op, rows, params, 0.0)[0]
        triton_plan(wide=False)
        return wide, run_row_op(backend, op, rows, params, 0.0)[0]

    return shared("triton-wide", make)


@pytest.mark.parametrize("backend", backend_params("triton-interpret"))
def test_triton_wide_and_looped_backward_agree(backend, triton_plan):
    """The same forward bits (one forward plan), grad_x within 1e-5."""
    wide, looped = triton_wide_and_looped(backend, triton_plan)
    for k in ("out", "mean", "rstd"):
        assert_rows_equal(k, wide[k], looped[k], "(one forward plan)")
    torch.testing.assert_close(wide["grad_x"], looped["grad_x"], rtol=1e-5, atol=1e-6)


@pytest.mark.xfail(
    strict=True,
    reason=WIDE_DIFFERS.format(wide="nd_bwd_wide_kernel", looped="nd_bwd_row_coef_kernel + nd_bwd_chunk_kernel"),
)
@pytest.mark.parametrize("backend", backend_params("triton-interpret"))
def test_triton_wide_and_looped_backward_bits(backend, triton_plan):
    wide, looped = triton_wide_and_looped(backend, triton_plan)
    check_rows(wide, looped, "wide backward against looped")


# ------------------------------------------------------------------------------------------ element-wise ops
def elementwise_params():
    return [pytest.param(k, id=k) for k in ELEMENTWISE]


def require_elementwise(backend, kind):
    require_op(backend, kind.split("-", 1)[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", elementwise_params())
@pytest.mark.parametrize("backend,n", n_params(ALL, [37, 1000], only={"cuda-emulated": [37]}))
def test_elementwise_rows_do_not_depend_on_m_or_position(backend, n, kind, dtype):
    """bias_act (each activation) and gated_act (both layouts) at p = 0: every row's out and gradients are its
    bits alone (M = 4), in a batch of 1 and at many positions of a large batch (the CPU's 8192-element gated
    tiles and ~16K-element bias tiles crossed off a row boundary); grad_bias the same bits on a rerun."""
    require_elementwise(backend, kind)
    rows, params = elementwise_bank(4, n, dtype)
    want, _ = run_elementwise(backend, kind, rows, params, 0.0)
    one, _ = run_elementwise(backend, kind, {k: v[1:2] for k, v in rows.items()}, params, 0.0)
    check_rows(one, take(want, [1]), "M = 1")
    ids = shuffled_ids(big_m(backend, n), 4)
    got, sums = run_elementwise(backend, kind, take(rows, ids), params, 0.0)
    check_rows(got, take(want, ids), f"M = {len(ids)}")
    if sums:
        check_same(run_elementwise(backend, kind, take(rows, ids), params, 0.0)[1], sums, "rerun")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["gated_act", "gated_act-packed"])
@pytest.mark.parametrize("backend,n", n_params(ALL, [37, 1000]))
def test_gated_act_with_dropout_keeps_its_bits_when_rows_are_appended(backend, n, kind, dtype):
    """p = 0.3: output element (r, c) is keyed by r * F + c, so the first rows keep their bits (out, grad_gate,
    grad_up) when rows follow them."""
    require_elementwise(backend, kind)
    m = big_m(backend, n)
    rows, params = elementwise_bank(m, n, dtype, salt=1)
    got, _ = run_elementwise(backend, kind, rows, params, 0.3)
    head, _ = run_elementwise(backend, kind, {k: v[:3] for k, v in rows.items()}, params, 0.3)
    check_rows(take(got, slice(0, 3)), head, f"rows 0..2 of M = {m} against M = 3")
    r, dropped = first_dropped(m, n, 0.3)
    assert (got["out"][:r][dropped] == 0).all(), "out where dropped"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", elementwise_params())
@pytest.mark.parametrize("backend", backend_params("cpu"))
def test_cpu_elementwise_results_do_not_depend_on_the_thread_count(backend, threads, kind, dtype):
    """1, 2 and 3 threads: out, the gradients and grad_bias the same bits (gated_act at p = 0.3)."""
    require_elementwise(backend, kind)
    n = 1000
    m = big_m(backend, n)
    rows, params = elementwise_bank(m, n, dtype, salt=2)
    results = []
    for k in (1, 2, 3):
        threads(k)
        per_row, sums = run_elementwise(backend, kind, rows, params, 0.3)
        results.append({**per_row, **sums})
    check_same(results[1], results[0], "2 threads against 1")
    check_same(results[2], results[0], "3 threads against 1")

"""The launches gpuopt's ops make, for the performance model (tools.roofline).

CUDA: the launches the backend's own host code plans (csrc/cuda/launch.cuh, launch_config.h), read through the
emulated extension's plan-only mode (tools.cuda_plan), with each kernel's occupancy from the registers and shared
memory of the built extension; the model adds each kernel's bytes and loop trips (CUDA_TERMS).
Triton: the real launchers of gpuopt_ops.triton_kernels run on meta tensors (tools.triton_resources records
their launches) and each launch is compiled for sm_90.

Each case returns the launches in order, the op's ideal bytes (every input read once, every output written
once) and its element count.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

from tools import cuda_resources as CR
from tools.roofline import KernelLaunch, compiled_triton_launch, structural_trips

OPS_BIAS_ACT = ("bias_act_gelu", "bias_act_gelu_tanh", "bias_act_silu")
# bias_act's rows: acts 1-3 (act 0, relu, is the bias_relu row: the same kernels)
ACT_CODE = {"bias_relu": 0, "bias_act_gelu": 1, "bias_act_gelu_tanh": 2, "bias_act_silu": 3}
# dropout_add_norm's rows: (norm, sum dtype) variants with a residual, weight and bias (LayerNorm) or weight
# (RMSNorm), p > 0, and grad_sum in the backward (the prenorm residual stream's gradient); "_res32": the sum in fp32
# (residual_in_fp32), bf16 x only.
DAN_OPS = {  # op label -> (rms, residual_in_fp32)
    "dropout_add_norm": (False, False),
    "dropout_add_rms_norm": (True, False),
    "dropout_add_norm_res32": (False, True),
    "dropout_add_rms_norm_res32": (True, True),
}
# norm_dropout's row: RMSNorm, no ReLU, a weight and no bias, p > 0. Its CUDA launches are layer_norm_dropout_relu's
# kernels (rms and relu are launch arguments) without the mean and the bias.
ND_OPS = ("rms_norm_dropout",)
# gated_act's rows: op label -> (act code, packed, p > 0). Two (M, F) tensors gate and up, or one (M, 2F) tensor
# [gate | up] ("_packed"); SwiGLU (silu) and GeGLU (gelu, erf: the costliest activation) without dropout, as
# LLaMA-style MLPs run it, and SwiGLU with p > 0 ("_dropout": the Philox work). N is F, the output's last
# dimension; M = 64M / F. bf16 and fp32.
GATED_OPS = {
    "gated_act_silu": (3, False, False),
    "gated_act_silu_packed": (3, True, False),
    "gated_act_gelu": (1, False, False),
    "gated_act_silu_dropout": (3, False, True),
}
GATED_P = 0.1  # p of the "_dropout" rows
OPS = ("layer_norm_dropout_relu", "bias_relu", *OPS_BIAS_ACT, *DAN_OPS, *ND_OPS, *GATED_OPS)
TRITON_OPS = OPS  # every op has Triton launches in the model
DIRECTIONS = ("forward", "backward")
DTYPES = ("bf16", "fp16", "fp32")
NS = (768, 1024, 2048, 4096, 8192, 12288, 16384)
# the gated rows' F: LLaMA-style intermediate sizes (11008 LLaMA-2 7B, 14336 Mistral / LLaMA-3 8B, 28672 LLaMA-3 70B)
GATED_NS = (2048, 4096, 11008, 14336, 28672)
GATED_DTYPES = ("bf16", "fp32")
ELEMENTS = 64 * 1024 * 1024  # M * N of every case
ELEM = {"bf16": 2, "fp16": 2, "fp32": 4}
ACC = 4  # fp32 accumulation for the 16- and 32-bit dtypes


def rows_of(n: int) -> int:
    return ELEMENTS // n


def op_dtypes(op: str) -> tuple:
    """The dtypes the model has rows for: residual_in_fp32 only matters for 16-bit x (bf16 rows); gated_act: bf16
    and fp32."""
    if op in GATED_OPS:
        return GATED_DTYPES
    return ("bf16",) if op in DAN_OPS and DAN_OPS[op][1] else DTYPES


def op_ns(op: str) -> tuple:
    """The N of an op's rows (gated_act: its F)."""
    return GATED_NS if op in GATED_OPS else NS


def dan_sizes(op: str, dtype: str) -> tuple:
    """(x's element size, the sum's, rms) of a dropout_add_norm row."""
    rms, res32 = DAN_OPS[op]
    e = ELEM[dtype]
    return e, (4 if res32 else e), rms


def dan_ideal_bytes(op: str, direction: str, dtype: str, m: int, n: int) -> int:
    e, u, rms = dan_sizes(op, dtype)
    stats = (1 if rms else 2) * m * ACC  # rstd (and mean)
    params = (1 if rms else 2) * n * e  # weight (and bias)
    if direction == "forward":  # x, residual in; out, sum, stats out; params in
        return m * n * (2 * e + 2 * u) + stats + params
    # grad_out, sum, grad_sum, stats, weight in; grad_x, grad_residual, dweight (and dbias) out
    return m * n * (2 * e + 3 * u) + stats + n * e + params


def ideal_bytes(op: str, direction: str, dtype: str, n: int, m: Optional[int] = None) -> int:
    m = rows_of(n) if m is None else m
    e = ELEM[dtype]
    if op in DAN_OPS:
        return dan_ideal_bytes(op, direction, dtype, m, n)
    if op in GATED_OPS:  # gate, up in, out (forward); grad_out, gate, up in, grad_gate, grad_up out (backward)
        return (3 if direction == "forward" else 5) * m * n * e
    if op == "layer_norm_dropout_relu" or op in ND_OPS:
        k = 1 if op in ND_OPS else 2  # statistics (rstd, mean) and parameters (weight, bias)
        if direction == "forward":  # x in, out, mean and rstd out, weight and bias in
            return 2 * m * n * e + k * m * ACC + k * n * e
        return 3 * m * n * e + k * m * ACC + 2 * k * n * e  # dy, x in, dx out, mean, rstd in, w, b in, dw, db out
    if direction == "forward":
        return 2 * m * n * e + n * e
    if op == "bias_relu":
        return 3 * m * n * e + n * ACC  # dy, out in, dx out, dbias out
    return 3 * m * n * e + n * e + n * ACC  # dy, x in, dx out, bias in, dbias out


# ----------------------------------------------------------------------------------------------------------------
# CUDA: the real host planner (tools.cuda_plan) on the sm_90 kernels of the built extension
GROUP = 8
# rows (or groups) a thread takes per trip of its loop, all loads first (the kernels' constants; the model's trip
# counts use them, tests/test_roofline.py reads them from the kernel source)
BIAS_ACT_ROWS = 4  # kBiasActRows, bias_act_kernels.cuh
TILED_ROWS = 2  # kTiledRows, norm_looped.cuh
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
P = 0.1  # p of the rows with a dropout
EPS = 1e-5


def stats_groups(e: int, u: int) -> int:
    """Groups of 8 a thread of the row-statistics kernels takes per trip (row_stats_groups, norm_looped.cuh): 4 when
    the row and the parameters are 16-bit, else 2."""
    return 4 if e == 2 and u == 2 else 2


def gated_unroll(elem: int, vec: bool) -> int:
    """Groups of 8 a thread of the gated_act kernels takes per grid stride, all loads first (gated_unroll)."""
    return 1 if elem == 8 or not vec else 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class CudaCode:
    """The sm_90 kernels of one built extension: symbol and resources per kernel name. so_path: the extension, or
    several ELF files (the extension and, say, an `nvcc -c` object of a kernel file built since), each kernel read
    from the first file that has it."""

    def __init__(self, so_path):
        paths = [so_path] if isinstance(so_path, (str, os.PathLike)) else list(so_path)
        self.path = paths[0]
        self.paths = paths
        self.rows: dict[str, CR.Row] = {}
        self.where: dict[str, object] = {}  # kernel -> the file it is read from
        self.planners: dict[int, object] = {}  # SM count -> tools.cuda_plan.Planner on this code's occupancy
        for path in paths:
            _, rows = CR.analyze(path, arch="sm_90")
            for r in rows:
                if r.kind == "kernel" and r.kernel not in self.rows:
                    self.rows[r.kernel], self.where[r.kernel] = r, path

    def kernel(self, short: str) -> CR.Row:
        if short not in self.rows:
            close = [k for k in self.rows if k.split("<")[0] == short.split("<")[0]]
            raise CR.ToolError(
                f"no kernel {short} in {', '.join(map(str, self.paths))}; the build has: {close or 'none of that name'}"
            )
        return self.rows[short]

    def blocks_per_sm(self, short: str, threads: int, dynamic_shared: int = 0) -> int:
        r = self.kernel(short)
        return CR.occupancy(r.regs, threads, static_shared=r.shared, dynamic_shared=dynamic_shared).blocks_per_sm

    def planner(self, sms: int):
        """The CUDA backend's host planner on an `sms`-SM device with this code's occupancy."""
        if sms not in self.planners:
            from tools.cuda_plan import Planner

            self.planners[sms] = Planner(sms, occupancy=self.blocks_per_sm)
        return self.planners[sms]

    def launch(self, short: str, grid, block, **kw) -> KernelLaunch:
        r = self.kernel(short)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        return KernelLaunch(self.where[short], r.mangled, grid, block, regs=r.regs, shared=r.shared, label=short, **kw)


def plan_call(op: str, direction: str, dtype: str, n: int, m: int, new=None):
    """The op call of a model row, for tools.cuda_plan.Planner.plan: a contiguous (M, N) input (gated_act: N is F),
    weight and bias of x's dtype, a one-element seed, p > 0 (gated_act: GATED_OPS), tensors made by
    `new(shape, dtype)` (default torch.empty: a plan never touches them)."""
    import torch

    def empty(shape, dtype):
        return torch.empty(shape, dtype=dtype)

    new = new or empty
    dt = getattr(torch, TORCH_DTYPE[dtype])
    seed = torch.zeros(1, dtype=torch.int64)
    rows = new((m, n), dt)
    vec = new((n,), dt)
    fwd = direction == "forward"
    if op in GATED_OPS:
        act, packed, dropout = GATED_OPS[op]
        gate, up = (new((m, 2 * n), dt), None) if packed else (rows, new((m, n), dt))
        p = GATED_P if dropout else 0.0
        return lambda ops: (
            ops.gated_act(gate, up, seed, p, act) if fwd else ops.gated_act_backward(rows, gate, up, seed, p, act)
        )
    if op in ACT_CODE:
        act = ACT_CODE[op]
        if fwd:
            return lambda ops: ops.bias_act(rows, vec, act) if act else ops.bias_relu(rows, vec)
        return lambda ops: ops.bias_act_backward(rows, rows, vec, act) if act else ops.bias_relu_backward(rows, rows)
    rms = op in ND_OPS or (op in DAN_OPS and DAN_OPS[op][0])
    mean = new((0 if rms else m,), torch.float32)
    rstd = new((m,), torch.float32)
    bias = None if rms else vec
    if op in DAN_OPS:
        sums = new((m, n), torch.float32 if DAN_OPS[op][1] else dt)
        if fwd:
            return lambda ops: ops.dropout_add_norm(rows, sums, vec, bias, seed, P, EPS, rms, DAN_OPS[op][1])
        return lambda ops: ops.dropout_add_norm_backward(rows, sums, sums, vec, bias, mean, rstd, seed, P, rms, True)
    if op in ND_OPS:  # RMSNorm, no ReLU
        if fwd:
            return lambda ops: ops.norm_dropout(rows, vec, None, seed, P, EPS, True, False)
        return lambda ops: ops.norm_dropout_backward(rows, rows, vec, None, mean, rstd, seed, P, True, False)
    if fwd:
        return lambda ops: ops.layer_norm_dropout_relu(rows, vec, vec, seed, P, EPS)
    return lambda ops: ops.layer_norm_dropout_relu_backward(rows, rows, vec, vec, mean, rstd, seed, P)


@dataclass
class CudaCase:
    """A model row's sizes: x's element size e, the sum's u (dropout_add_norm; else e), k row statistics (rstd, and
    mean for LayerNorm) and parameters (weight, and bias), the partial rows' stride ldp."""

    m: int
    n: int
    e: int
    u: int
    k: int

    @property
    def mn(self) -> int:
        return self.m * self.n

    @property
    def ldp(self) -> int:
        return _cdiv(self.n, GROUP) * GROUP

    @property
    def st(self) -> int:
        return self.k * self.m * ACC

    @property
    def pb(self) -> int:
        return self.k * self.n * self.e

    @classmethod
    def of(cls, op: str, dtype: str, n: int, m: int) -> CudaCase:
        if op in DAN_OPS:
            e, u, rms = dan_sizes(op, dtype)
            return cls(m, n, e, u, 1 if rms else 2)
        return cls(m, n, ELEM[dtype], ELEM[dtype], 1 if op in ND_OPS else 2)


def _terms(elements, nbytes, read, units, trips, axis=0, reread=0, reuse=0, partials=0) -> dict:
    return dict(
        elements=elements,
        bytes=nbytes,
        read_bytes=read,
        stride_units=units,
        trips=trips,
        stride_axis=axis,
        reread_bytes=reread,
        reuse_unit_bytes=reuse,
        partials=partials,
    )


# The model's terms of each kernel the planner launches: (case, launch, partial rows of the launch before) -> the
# bytes it moves by design, its loads, re-reads, work split and loop trips (KernelLaunch), and the partial rows (of
# dgamma, dbeta, dbias) it writes for the column sums after it.
def _rows(c: CudaCase, p, nbytes: int, read: int, partials: int = 0, reread: int = 0, reuse: int = 0) -> dict:
    """A rows kernel's persistent launch: a block of block.y rows per step; `partials` partial-row buffers of G
    rows."""
    needed, g = _cdiv(c.m, p.block[1]), p.grid[0]
    return _terms(
        c.mn,
        nbytes + partials * g * c.ldp * ACC,
        read,
        needed,
        structural_trips(needed / g),
        reread=reread,
        reuse=reuse,
        partials=g if partials else 0,
    )


def _looped(c: CudaCase, p, nbytes: int, read: int, reread: int, groups_a_trip: int = 1) -> dict:
    """A block a row, a grid stride over the rows, the row's groups `groups_a_trip` a thread per trip."""
    g = p.grid[0]
    loops = structural_trips(c.m / g, _cdiv(_cdiv(c.n, GROUP), groups_a_trip * p.block[0]))
    return _terms(c.mn, nbytes, read, c.m, loops, reread=reread, reuse=c.n * c.u if reread else 0)


def _tiled(c: CudaCase, p, nbytes: int, read: int, rows_a_trip: int, partials: int = 0) -> dict:
    """A tiled launch: column tiles along x, row blocks along y striding over the rows block.y at a time."""
    steps, rb = max(1, _cdiv(c.m, p.block[1])), p.grid[1]
    trips = structural_trips(math.ceil(steps / rb / rows_a_trip))
    return _terms(
        c.mn, nbytes + partials * rb * c.ldp * ACC, read, steps, trips, axis=1, partials=rb if partials else 0
    )


def _dan_rows(c: CudaCase, p, forward: bool) -> dict:
    mn, e, u = c.mn, c.e, c.u
    if forward:  # reads x, residual, params; writes sum, out, stats
        return _rows(c, p, 2 * mn * (e + u) + c.pb + c.st, mn * (e + u) + c.pb)
    # reads grad_out, sum, grad_sum, stats, weight; writes grad_x, grad_residual, the partials (the wide kernel at
    # 6 groups a thread with an fp32 sum reads the sum again after the row sum)
    reread = mn * u if p.base == "dan_backward_wide_kernel" and int(p.args[-1]) > 4 and u == 4 else 0
    read = mn * (e + 2 * u) + c.st + c.n * e + reread
    return _rows(c, p, read + mn * (e + u), read, c.k, reread, c.n * u if reread else 0)


def _nd_backward_rows(c: CudaCase, p, _) -> dict:
    return _rows(c, p, 3 * c.mn * c.e + c.st + c.pb, 2 * c.mn * c.e + c.st + c.pb, c.k)


def _column_sum(c: CudaCase, p, g: int) -> dict:
    out_elem = ACC if p.args[1] == "float" else c.e
    sums = p.grid[1]
    loads = sums * g * c.ldp * ACC
    return _terms(0, loads + sums * c.n * out_elem, loads, None, structural_trips(g / p.block[1]))


def _gated(c: CudaCase, p, _) -> dict:
    vec, backward = p.args[2] == "true", "backward" in p.base
    threads, g, u = p.block[0], p.grid[0], gated_unroll(c.e, vec)
    needed = _cdiv(_cdiv(c.mn, GROUP), threads * u)
    groups = c.mn // GROUP if vec else _cdiv(c.mn, GROUP)  # the vector path's partial last group: after the loop
    reads, writes = (3, 2) if backward else (2, 1)  # grad_out, gate, up / grad_gate, grad_up
    trips = structural_trips(groups / (u * g * threads))
    return _terms(c.mn, (reads + writes) * c.mn * c.e, reads * c.mn * c.e, needed, trips)


def _bias_act_backward(c: CudaCase, p, _) -> dict:
    bias = c.n * c.e if int(p.args[-1]) else 0  # bias_act's backward reads the bias (acts 1-3; bias_relu: act 0)
    return _tiled(c, p, 3 * c.mn * c.e + bias, 2 * c.mn * c.e + bias, BIAS_ACT_ROWS, partials=1)


# stats: the row statistics (mean and) rstd; pb: the parameters weight (and bias); c1, c2: the row coefficients
CUDA_TERMS = {
    "nd_forward_rows_kernel": lambda c, p, _: _rows(c, p, 2 * c.mn * c.e + c.st + c.pb, c.mn * c.e + c.pb),
    # x read three times (RMSNorm: twice): the later passes over a block's row
    "nd_forward_looped_kernel": lambda c, p, _: _looped(
        c, p, (c.k + 2) * c.mn * c.e + c.st + c.pb, (c.k + 1) * c.mn * c.e + c.pb, c.k * c.mn * c.e
    ),
    "nd_backward_rows_kernel": _nd_backward_rows,
    "nd_backward_wide_kernel": _nd_backward_rows,
    "nd_backward_row_stats_kernel": lambda c, p, _: _looped(  # + c1, c2 out
        c, p, 2 * c.mn * c.e + c.st + 2 * c.m * ACC + c.pb, 2 * c.mn * c.e + c.st + c.pb, 0, stats_groups(c.e, c.e)
    ),
    "nd_backward_tiled_kernel": lambda c, p, _: _tiled(
        c,
        p,
        3 * c.mn * c.e + c.st + 2 * c.m * ACC + c.pb,
        2 * c.mn * c.e + c.st + 2 * c.m * ACC + c.pb,
        TILED_ROWS,
        c.k,
    ),
    "dan_forward_rows_kernel": lambda c, p, _: _dan_rows(c, p, True),
    "dan_backward_rows_kernel": lambda c, p, _: _dan_rows(c, p, False),
    "dan_backward_wide_kernel": lambda c, p, _: _dan_rows(c, p, False),
    # the sum read back: the output pass (and LayerNorm's centred pass)
    "dan_forward_looped_kernel": lambda c, p, _: _looped(
        c,
        p,
        c.mn * (2 * c.e + 2 * c.u) + c.k * c.mn * c.u + c.st + c.pb,
        c.mn * (c.e + c.u) + c.k * c.mn * c.u + c.pb,
        c.k * c.mn * c.u,
    ),
    "dan_backward_row_stats_kernel": lambda c, p, _: _looped(
        c,
        p,
        c.mn * (c.e + c.u) + c.st + 2 * c.m * ACC + c.n * c.e,
        c.mn * (c.e + c.u) + c.st + c.n * c.e,
        0,
        stats_groups(c.e, c.u),
    ),
    "dan_backward_tiled_kernel": lambda c, p, _: _tiled(
        c,
        p,
        c.mn * (2 * c.e + 3 * c.u) + c.st + 2 * c.m * ACC + c.n * c.e,
        c.mn * (c.e + 2 * c.u) + c.st + 2 * c.m * ACC + c.n * c.e,
        TILED_ROWS,
        c.k,
    ),
    "bias_act_forward_kernel": lambda c, p, _: _tiled(
        c, p, 2 * c.mn * c.e + c.n * c.e, c.mn * c.e + c.n * c.e, BIAS_ACT_ROWS
    ),
    "bias_act_backward_kernel": _bias_act_backward,
    "gated_act_forward_kernel": _gated,
    "gated_act_backward_kernel": _gated,
    "column_sum_kernel": _column_sum,
}


def cuda_launches(
    code: CudaCode, op: str, direction: str, dtype: str, n: int, sms: int = 132, m: Optional[int] = None
) -> list[KernelLaunch]:
    """The launches the CUDA backend's host code plans for a model row (plan_call; M = 64M / N by default) on an
    `sms`-SM device with `code`'s occupancy, each with the model's terms (CUDA_TERMS) and `code`'s kernel."""
    m = rows_of(n) if m is None else m
    case = CudaCase.of(op, dtype, n, m)
    out, partials = [], 0
    for p in code.planner(sms).plan(plan_call(op, direction, dtype, n, m)):
        terms = CUDA_TERMS[p.base](case, p, partials)
        partials = terms.pop("partials")
        out.append(code.launch(p.kernel, p.grid, p.block, dynamic_shared=p.dynamic_shared, **terms))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Triton: the real launchers on meta tensors, each launch compiled for sm_90
# Per kernel: how its loops run. "rows": a persistent loop over row tiles (program axis `axis`), with chunk
# loops of BLOCK_N columns inside it when BLOCK_N < N; "chunks": passes over one row's BLOCK_N-column chunks;
# "partials": a loop over the whole BLOCK_G steps of the G partial rows (then the partial last step, once).
# The two norm families, nd_* (layer_norm_dropout_relu, norm_dropout) and dan_* (dropout_add_norm), have the
# same kernels, with the same loops.
_NORM_KERNEL_LOOPS = {
    "fwd_fused": ("rows", 0),
    "fwd_looped": ("chunks", 0),
    "bwd_fused": ("rows", 0),
    "bwd_wide": ("rows", 0),  # its chunks unrolled (static_range)
    "bwd_row_coef": ("chunks", 0),
    "bwd_chunk": ("rows", 1),
}
TRITON_LOOPS = {
    **{f"{family}_{k}_kernel": loops for family in ("nd", "dan") for k, loops in _NORM_KERNEL_LOOPS.items()},
    "sum_partials_kernel": ("partials", 0),
    "bias_act_fwd_kernel": ("rows", 0),
    "bias_act_bwd_kernel": ("rows", 1),
    # gated_act: one program a tile, no loop (the trips are not needed; a loop in their code raises)
    "gated_act_fwd_kernel": ("none", 0),
    "gated_act_bwd_kernel": ("none", 0),
}


def _triton_bytes(kernel: str, a: dict, m: int, n: int, e: int) -> tuple:
    """(bytes, read bytes[, re-read bytes, reuse unit bytes]) each Triton kernel moves by its design."""
    mn = m * n
    params = n * e * (int(bool(a.get("HAS_W"))) + int(bool(a.get("HAS_B"))))
    sums = int(bool(a.get("HAS_W"))) + int(bool(a.get("HAS_B")))
    k = 1 if a.get("RMS") else 2  # row statistics: rstd (RMSNorm, norm_dropout) or mean and rstd; c1 (and c2)
    if kernel == "nd_fwd_fused_kernel":
        return 2 * mn * e + k * m * ACC + params, mn * e + params
    if kernel == "nd_fwd_looped_kernel":  # x read twice: the output pass re-reads the program's row
        return 3 * mn * e + k * m * ACC + params, 2 * mn * e + params, mn * e, n * e
    if kernel in ("nd_bwd_fused_kernel", "nd_bwd_wide_kernel", "nd_bwd_chunk_kernel"):
        one_pass = kernel != "nd_bwd_chunk_kernel"  # the parameters' reloads per row: L1 hits
        groups = a["_grid"][0] if one_pass else a["_grid"][1]
        stats = k * m * ACC if one_pass else 2 * k * m * ACC
        partials = sums * groups * n * ACC
        rr = _wide_reread(kernel, a, mn * e)
        if rr:  # the wide kernel's pass 2 reads the chunks of x it does not hold again
            return 3 * mn * e + rr + stats + params + partials, 2 * mn * e + rr + stats + params, rr, n * e
        return 3 * mn * e + stats + params + partials, 2 * mn * e + stats + params
    if kernel == "nd_bwd_row_coef_kernel":
        return 2 * mn * e + 2 * k * m * ACC + params, 2 * mn * e + k * m * ACC + params
    if kernel == "sum_partials_kernel":  # grid (column blocks, 1 or 2 outputs): G partial rows each
        sets, g = a["_grid"][1], int(a["G"])
        return sets * (g * n * ACC + n * int(a["OUT"].element_size())), sets * g * n * ACC
    if kernel == "bias_act_fwd_kernel":
        return 2 * mn * e + n * e, mn * e + n * e
    if kernel == "bias_act_bwd_kernel":  # acts 1-3 read the bias too
        bias = n * e if a.get("ACT", 0) else 0
        return 3 * mn * e + bias + a["_grid"][1] * n * ACC, 2 * mn * e + bias
    if kernel.startswith("dan_"):
        return _dan_bytes(kernel, a, m, n, e)
    if kernel == "gated_act_fwd_kernel":  # n is F: gate, up in, out
        return 3 * mn * e, 2 * mn * e
    if kernel == "gated_act_bwd_kernel":  # grad_out, gate, up in, grad_gate, grad_up out
        return 5 * mn * e, 3 * mn * e
    raise KeyError(f"tools.roofline_gpuopt: no byte declaration for the Triton kernel {kernel}; add one")


def _wide_reread(kernel: str, a: dict, row_bytes: int) -> int:
    """Bytes a wide backward reads twice: of row_bytes (x, or dropout_add_norm's sum, over all rows), the chunks
    it does not hold (CHUNKS - HOLD of CHUNKS). Served by L2 in the model (the reuse unit: one row)."""
    if not kernel.endswith("_bwd_wide_kernel"):
        return 0
    chunks = int(a["CHUNKS"])
    return row_bytes * (chunks - int(a["HOLD"])) // chunks


def _dan_bytes(kernel: str, a: dict, m: int, n: int, e: int) -> tuple:
    """dropout_add_norm's kernels: x / grad_out / out / grad_x in x's dtype (e), the residual, sum, grad_sum and
    grad_residual in the sum's dtype."""
    mn = m * n
    es = int((a.get("SUM") if "SUM" in a else a["S"]).element_size())
    has_r, has_gs = int(bool(a.get("HAS_R"))), int(bool(a.get("HAS_GS")))
    stats = (1 if a.get("RMS") else 2) * m * ACC
    if kernel in ("dan_fwd_fused_kernel", "dan_fwd_looped_kernel"):
        params = n * e * (int(bool(a.get("HAS_W"))) + int(bool(a.get("HAS_B"))))
        read = mn * (e + has_r * es) + params
        nbytes = read + mn * (es + e) + stats
        if kernel == "dan_fwd_fused_kernel":
            return nbytes, read
        return nbytes + mn * es, read + mn * es, mn * es, n * es  # pass 2 re-reads the program's stored row
    params = n * e * int(bool(a.get("HAS_W")))
    if kernel == "dan_bwd_row_coef_kernel":  # grad_out, sum, statistics and weight in; c1, c2 out
        return mn * (e + es) + stats + params + 2 * m * ACC, mn * (e + es) + stats + params
    sums = int(bool(a.get("HAS_W"))) + int(bool(a.get("HAS_B")))
    one_pass = kernel in ("dan_bwd_fused_kernel", "dan_bwd_wide_kernel")
    groups = a["_grid"][0] if one_pass else a["_grid"][1]
    stats += 0 if one_pass else 2 * m * ACC  # c1, c2
    read = mn * (e + es + has_gs * es) + stats + params
    nbytes = read + mn * (e + has_r * es) + sums * groups * n * ACC
    rr = _wide_reread(kernel, a, mn * es)
    if rr:  # the wide kernel's pass 2 reads the chunks of the sum it does not hold again
        return nbytes + rr, read + rr, rr, n * es
    return nbytes, read


def _triton_trips(kernel: str, a: dict, grid: tuple, m: int, n: int):
    if kernel not in TRITON_LOOPS:
        raise KeyError(f"tools.roofline_gpuopt: no loop description for the Triton kernel {kernel}; add one")
    kind, axis = TRITON_LOOPS[kernel]
    if kind == "none":
        return None, None, 0
    block_n = int(a.get("BLOCK_N", n))
    chunks = _cdiv(n, block_n) if block_n < n else None
    if kind == "rows":
        tiles = _cdiv(m, int(a.get("BLOCK_M", 1)))
        outer = tiles / grid[axis]
        return structural_trips(outer, chunks, split_unrolled=False), (tiles if grid[axis] < tiles else None), axis
    if kind == "chunks":
        return structural_trips(float(_cdiv(n, block_n)), split_unrolled=False), None, 0
    g = int(a["G"])  # the loop takes the whole BLOCK_G steps; a partial last step runs once after it
    return structural_trips(float(g // int(a["BLOCK_G"])), split_unrolled=False), None, 0


_TRITON_OP = {
    ("layer_norm_dropout_relu", "forward"): "ldr_fwd",
    ("layer_norm_dropout_relu", "backward"): "ldr_bwd",
    ("bias_relu", "forward"): "bias_relu_fwd",
    ("bias_relu", "backward"): "bias_relu_bwd",
    **{
        (op, d): f"bias_act{code}_{short}"
        for op, code in ACT_CODE.items()
        if code
        for d, short in (("forward", "fwd"), ("backward", "bwd"))
    },
    **{
        (op, d): ("dan_rms_" if rms else "dan_") + short
        for op, (rms, _) in DAN_OPS.items()
        for d, short in (("forward", "fwd"), ("backward", "bwd"))
    },
    ("rms_norm_dropout", "forward"): "nd_rms_fwd",
    ("rms_norm_dropout", "backward"): "nd_rms_bwd",
    **{
        (op, d): f"gated_act{code}{'_packed' if packed else ''}_{short}"
        for op, (code, packed, _) in GATED_OPS.items()
        for d, short in (("forward", "fwd"), ("backward", "bwd"))
    },
}


def _launcher_kwargs(op: str) -> dict:
    """tools.triton_resources.launches' keyword arguments of an op's rows beyond (op, dtype, N)."""
    if DAN_OPS.get(op, (False, False))[1]:
        return {"residual_in_fp32": True}
    if op in GATED_OPS:
        return {"p": GATED_P if GATED_OPS[op][2] else 0.0}
    return {}


def triton_cases(cases, sms: int = 132, jobs: int = 1, rows: Optional[dict] = None) -> dict[tuple, list[KernelLaunch]]:
    """{(op, direction, dtype, N): the launches the Triton launcher makes for a contiguous (M, N) input with
    weight and bias, p > 0 (dropout_add_norm: with a residual, and grad_sum in the backward; the `_res32` rows: bf16
    x with residual_in_fp32; gated_act: N = F, p = 0 but in the `_dropout` rows), each launch compiled for sm_90
    as tools.triton_resources compiles them (all cases recorded first, then compiled once each, `jobs` at a time).
    rows: M per case where it is not 64M / N (a measurement's shapes)."""
    rows = rows or {}
    import torch

    from tools import triton_resources as TR

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    comp = TR.Compiler()

    def record(facts: bool) -> dict:
        return {
            (op, direction, dtype, n): TR.launches(
                comp,
                _TRITON_OP[(op, direction)],
                tdt[dtype],
                n,
                sms,
                m=rows.get((op, direction, dtype, n), rows_of(n)),
                facts=facts,
                **_launcher_kwargs(op),
            )
            for op, direction, dtype, n in cases
        }

    # as on a GPU, the persistent grids come from the compiled kernels: a planning pass compiles every kernel,
    # then the launchers run again with those facts (and what only they launch, stage 2 at the real G, compiles)
    record(False)
    TR.compile_pending([comp], jobs=jobs)
    comp.launches.clear()
    recorded = record(True)
    TR.compile_pending([comp], jobs=jobs)
    out = {}
    for (op, direction, dtype, n), launches in recorded.items():
        m = rows.get((op, direction, dtype, n), rows_of(n))
        out[(op, direction, dtype, n)] = [_triton_launch(comp, launch, m, n, dtype) for launch in launches]
    return out


def _triton_launch(comp, launch, m: int, n: int, dtype: str) -> KernelLaunch:
    v = comp.variant(launch)
    name = launch.kernel.__name__
    args = dict(launch.args)
    args["_grid"] = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    nbytes, read, *reread = _triton_bytes(name, args, m, n, ELEM[dtype])
    reread_bytes, unit = reread if reread else (0, 0)
    trips, units, axis = _triton_trips(name, args, args["_grid"], m, n)
    return compiled_triton_launch(
        v,
        args["_grid"],
        elements=0 if name == "sum_partials_kernel" else m * n,
        bytes=nbytes,
        read_bytes=read,
        reread_bytes=reread_bytes,
        reuse_unit_bytes=unit,
        trips=trips,
        stride_units=units,
        stride_axis=axis,
        label=name,
    )

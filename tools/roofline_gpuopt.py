"""The launches gpuopt's ops make, for the performance model (tools.roofline).

CUDA: the planners of csrc/cuda/launch_config.h and the kernel choice of csrc/cuda/launch.cuh, mirrored here
(tests/test_roofline.py checks the mirror against the launches the CUDA source itself makes under the
emulator), with each kernel's occupancy from the registers and shared memory of the built extension.
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
from tools.roofline import KernelLaunch, structural_trips

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
CUDA_TYPE = {"bf16": "__nv_bfloat16", "fp16": "__half", "fp32": "float"}
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
# CUDA: the planners of launch_config.h
GROUP = 8
WARP = 32
MAX_GRID_Y = 65535
LOOPED_THREADS = 512
TILED_THREADS = 256
COLUMN_SUM_TILE = 32
# rows (or groups) a thread takes per trip of its loop, all loads first (the kernels' constants)
BIAS_RELU_ROWS = 4  # kBiasReluRows, bias_relu_kernels.cuh
TILED_LDR_ROWS = 2  # kLdrTiledRows, ldr_kernels.cuh
STATS_GROUPS = {2: 4, 4: 2}  # ldr_stats_groups: groups per trip by element size (16-bit: 4, 32-bit: 2)
GATED_THREADS = 256  # kGatedThreads, gated_act_kernels.cuh


def gated_unroll(elem: int, vec: bool) -> int:
    """Groups of 8 a thread of the gated_act kernels takes per grid stride, all loads first (gated_unroll)."""
    return 1 if elem == 8 or not vec else 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def ldr_rows_forward_max_threads(warp_row: bool, elem: int) -> int:
    return 128 if warp_row or elem > 4 else 512


def ldr_rows_backward_max_threads(warp_row: bool, elem: int) -> int:
    return 128 if warp_row or elem == 8 else 256


WIDE_THREADS = 384  # kWideThreads
WIDE_STATIC_SHARED = 1024  # kWideStaticShared
SHARED_PER_BLOCK = 227 * 1024  # an H100 / H200 block's shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin)


def wide_backward_shared(vpt: int, threads: int) -> int:
    return threads * (6 * vpt + 1) * 16  # wide_slots(vpt) 16-byte slots a thread


@dataclass
class RowsPlan:
    rows: bool = False
    warp_row: bool = False
    wide: bool = False
    shared: int = 0
    vpt: int = 0
    threads_x: int = 0
    rows_per_block: int = 1
    max_threads: int = 0
    blocks_needed: int = 0


def plan_ldr_rows(
    m: int, n: int, elem: int, param_elem: int, backward: bool, vec: bool, max_shared: int = 0
) -> RowsPlan:
    groups = _cdiv(n, GROUP)
    max_vpt = 2 if backward else 4
    p = RowsPlan()
    if groups <= WARP * max_vpt:
        p.vpt = _cdiv(groups, WARP)
        p.threads_x = WARP
        p.rows_per_block = 4
        p.warp_row = True
    else:
        bound = ldr_rows_backward_max_threads(False, elem) if backward else ldr_rows_forward_max_threads(False, elem)
        vpts = (4, 3)
        if not backward and elem != 8 and (elem == 4 or param_elem == 4):
            vpts = (2, 4, 3)
        if backward:
            vpts = (2,) if elem == 8 or not vec else (4, 3, 2)
        idle = 0

        def consider(v: int, max_t: int, fewest_idle: bool, fits=lambda v, t: True) -> None:
            nonlocal idle
            t = _cdiv(_cdiv(groups, v), WARP) * WARP
            if (
                t <= max_t
                and (v - 1) * t <= groups
                and fits(v, t)
                and (p.vpt == 0 or (fewest_idle and t * v - groups < idle))
            ):
                p.vpt, p.threads_x, idle = v, t, t * v - groups

        for v in vpts:
            consider(v, bound, backward)
        if p.vpt == 0 and backward and vec and elem != 8:  # the wide backward
            for v in (3, 4, 6):
                consider(v, WIDE_THREADS, True, lambda v, t: wide_backward_shared(v, t) <= max_shared)
            if p.vpt:
                p.wide, p.shared, p.rows = True, wide_backward_shared(p.vpt, p.threads_x), True
                p.max_threads, p.blocks_needed = WIDE_THREADS, m
                return p
        if p.vpt == 0:
            return RowsPlan()
    p.rows = True
    p.max_threads = (
        ldr_rows_backward_max_threads(p.warp_row, elem) if backward else ldr_rows_forward_max_threads(p.warp_row, elem)
    )
    p.blocks_needed = _cdiv(m, p.rows_per_block)
    return p


def balanced_grid(steps: int, max_blocks: int) -> int:
    steps, max_blocks = max(steps, 1), max(max_blocks, 1)
    return steps if steps <= max_blocks else _cdiv(steps, _cdiv(steps, max_blocks))


def persistent_grid(blocks_needed: int, blocks_per_sm: int, sm_count: int) -> int:
    return balanced_grid(blocks_needed, max(blocks_per_sm, 1) * max(sm_count, 1))


@dataclass
class TilePlan:
    tx: int
    ty: int
    col_tiles: int
    row_blocks: int


def plan_tiled(m: int, n: int, resident: int) -> TilePlan:
    groups = _cdiv(n, GROUP)
    tx = 1
    while tx < WARP and tx < groups:
        tx *= 2
    ty = TILED_THREADS // tx
    col_tiles = _cdiv(groups, tx)
    steps = max(1, _cdiv(m, ty))
    resident = max(resident, 1)
    per_wave = max(1, min(resident // col_tiles, MAX_GRID_Y))
    row_blocks = balanced_grid(steps, per_wave)
    if row_blocks == per_wave and col_tiles * per_wave * 100 < resident * 97:  # csrc/cuda/launch_config.h
        for rb in range(per_wave + 1, min(2 * resident // col_tiles, MAX_GRID_Y) + 1):
            rows = balanced_grid(steps, rb)
            if col_tiles * rows * 100 >= _cdiv(col_tiles * rows, resident) * resident * 97:
                row_blocks = rows
                break
    return TilePlan(tx, ty, col_tiles, row_blocks)


def partial_stride(n: int) -> int:
    return _cdiv(n, GROUP) * GROUP


# ----------------------------------------------------------------------------------------------------------------
# CUDA: kernels of the built extension
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

    def launch(self, short: str, grid, block, **kw) -> KernelLaunch:
        r = self.kernel(short)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        return KernelLaunch(self.where[short], r.mangled, grid, block, regs=r.regs, shared=r.shared, label=short, **kw)


def cuda_launches(
    code: CudaCode, op: str, direction: str, dtype: str, n: int, sms: int = 132, m: Optional[int] = None
) -> list[KernelLaunch]:
    """The launches of csrc/cuda/launch.cuh for a contiguous (M, N) input (M = 64M / N by default), weight and
    bias of x's dtype, p > 0. `code` gives each kernel's blocks per SM and builds the launch (CudaCode)."""
    m = rows_of(n) if m is None else m
    e = ELEM[dtype]
    s = CUDA_TYPE[dtype]
    mn = m * n
    ldp = partial_stride(n)
    out: list[KernelLaunch] = []

    def column_sums(g: int, sums: int, out_elem: int) -> None:
        # column_sum_cols: a 16-byte vector of columns a thread where that still gives every SM a block
        cols = 16 // ACC if _cdiv(n, COLUMN_SUM_TILE * 16 // ACC) * sums >= sms else 1
        name = f"column_sum_kernel<float, {s if out_elem == e else 'float'}, {cols}>"
        tiles = _cdiv(n, COLUMN_SUM_TILE * cols)
        out.append(
            code.launch(
                name,
                (tiles, sums),
                (COLUMN_SUM_TILE, max(1, min(g, COLUMN_SUM_TILE))),
                elements=0,
                bytes=sums * (g * ldp * ACC + n * out_elem),
                read_bytes=sums * g * ldp * ACC,
                trips=structural_trips(g / max(1, min(g, COLUMN_SUM_TILE))),
            )
        )

    if op in DAN_OPS:
        dan_launches(code, op, direction, dtype, n, sms, m, out, column_sums)
        return out

    if op in GATED_OPS:
        out.append(gated_launch(code, op, direction, dtype, n, sms, m))
        return out

    if op == "layer_norm_dropout_relu" or op in ND_OPS:
        k = 1 if op in ND_OPS else 2  # RMSNorm without bias: rstd alone, the weight alone
        plan = plan_ldr_rows(
            m, n, e, e, backward=direction == "backward", vec=True, max_shared=SHARED_PER_BLOCK - WIDE_STATIC_SHARED
        )
        flags = f"true, {'true' if plan.warp_row else 'false'}"  # the 16-byte path; one warp a row

        def rows_kernel(which: str, nbytes: int, read: int, partials: int = 0) -> int:
            """The rows kernel's persistent launch (`partials` partial-row buffers of G rows); returns G."""
            name = f"ldr_{which}_rows_kernel<{s}, {s}, float, {flags}, {plan.vpt}>"
            if plan.wide:
                name = f"ldr_backward_wide_kernel<{s}, {s}, float, {plan.vpt}>"
            threads = plan.threads_x * plan.rows_per_block
            g = persistent_grid(plan.blocks_needed, code.blocks_per_sm(name, threads, plan.shared), sms)
            out.append(
                code.launch(
                    name,
                    (g,),
                    (plan.threads_x, plan.rows_per_block),
                    elements=mn,
                    bytes=nbytes + partials * g * ldp * ACC,
                    read_bytes=read,
                    stride_units=plan.blocks_needed,
                    trips=structural_trips(plan.blocks_needed / g),
                    dynamic_shared=plan.shared,
                )
            )
            return g

        if direction == "forward":
            if plan.rows:
                rows_kernel("forward", 2 * mn * e + k * m * ACC + k * n * e, mn * e + k * n * e)
            else:
                name = f"ldr_forward_looped_kernel<{s}, {s}, float>"
                g = persistent_grid(m, code.blocks_per_sm(name, LOOPED_THREADS), sms)
                out.append(
                    code.launch(
                        name,
                        (g,),
                        (LOOPED_THREADS,),
                        elements=mn,
                        bytes=(k + 2) * mn * e + k * m * ACC + k * n * e,  # x read three times (RMSNorm: twice)
                        read_bytes=(k + 1) * mn * e + k * n * e,
                        reread_bytes=k * mn * e,  # the later passes over a block's row
                        reuse_unit_bytes=n * e,
                        stride_units=m,
                        trips=structural_trips(m / g, _cdiv(_cdiv(n, GROUP), LOOPED_THREADS)),
                    )
                )
            return out
        st, pb = k * m * ACC, k * n * e  # the row statistics (mean and) rstd, the parameters weight (and bias)
        if plan.rows:  # + the dgamma / dbeta partial rows, G of each
            g = rows_kernel("backward", 3 * mn * e + st + pb, 2 * mn * e + st + pb, k)
        else:
            stats = f"ldr_backward_row_stats_kernel<{s}, {s}, float, true>"
            sg = persistent_grid(m, code.blocks_per_sm(stats, LOOPED_THREADS), sms)
            tiled = f"ldr_backward_tiled_kernel<{s}, {s}, float, true>"
            t = plan_tiled(m, n, code.blocks_per_sm(tiled, TILED_THREADS) * sms)
            g = t.row_blocks
            out.append(
                code.launch(
                    stats,
                    (sg,),
                    (LOOPED_THREADS,),
                    elements=mn,
                    bytes=2 * mn * e + st + 2 * m * ACC + pb,  # + c1, c2 out
                    read_bytes=2 * mn * e + st + pb,
                    stride_units=m,
                    trips=structural_trips(m / sg, _cdiv(_cdiv(n, GROUP), STATS_GROUPS[e] * LOOPED_THREADS)),
                )
            )
            steps = max(1, _cdiv(m, t.ty))
            out.append(
                code.launch(
                    tiled,
                    (t.col_tiles, t.row_blocks),
                    (t.tx, t.ty),
                    elements=mn,
                    bytes=3 * mn * e + st + 2 * m * ACC + pb + k * g * ldp * ACC,
                    read_bytes=2 * mn * e + st + 2 * m * ACC + pb,
                    stride_units=steps,
                    stride_axis=1,
                    trips=structural_trips(math.ceil(steps / t.row_blocks / TILED_LDR_ROWS)),
                )
            )
        column_sums(g, k, e)
        return out

    # bias_relu = bias_act with act 0; bias_act's backward reads the bias (acts 1-3)
    act = ACT_CODE[op]
    bias_bytes = n * e if act else 0
    if direction == "forward":
        name = f"bias_act_forward_kernel<{s}, {s}, true, {act}>"
        t = plan_tiled(m, n, code.blocks_per_sm(name, TILED_THREADS) * sms)
        steps = max(1, _cdiv(m, t.ty))
        out.append(
            code.launch(
                name,
                (t.col_tiles, t.row_blocks),
                (t.tx, t.ty),
                elements=mn,
                bytes=2 * mn * e + n * e,
                read_bytes=mn * e + n * e,
                stride_units=steps,
                stride_axis=1,
                trips=structural_trips(math.ceil(steps / t.row_blocks / BIAS_RELU_ROWS)),
            )
        )
        return out
    name = f"bias_act_backward_kernel<{s}, {s}, true, {act}>"
    t = plan_tiled(m, n, code.blocks_per_sm(name, TILED_THREADS) * sms)
    steps = max(1, _cdiv(m, t.ty))
    out.append(
        code.launch(
            name,
            (t.col_tiles, t.row_blocks),
            (t.tx, t.ty),
            elements=mn,
            bytes=3 * mn * e + bias_bytes + t.row_blocks * ldp * ACC,
            read_bytes=2 * mn * e + bias_bytes,
            stride_units=steps,
            stride_axis=1,
            trips=structural_trips(math.ceil(steps / t.row_blocks / BIAS_RELU_ROWS)),
        )
    )
    column_sums(t.row_blocks, 1, ACC)
    return out


def gated_launch(code, op: str, direction: str, dtype: str, n: int, sms: int, m: int) -> KernelLaunch:
    """gated_act's one launch (run_gated_act / run_gated_act_backward of gated_act_launch.cuh) for contiguous,
    16-byte aligned buffers (fresh tensors): the vector path (two tensors, or packed with F % 8 == 0) with the
    RNG code only where p > 0 (kDrop), else the element-by-element path (keep bits at run time); a persistent
    one-wave grid of 256-thread blocks over the groups of 8 output elements, U groups a thread a grid stride
    (plan_gated). n is F; the output has m x F elements."""
    act, packed, dropout = GATED_OPS[op]
    e = ELEM[dtype]
    mn = m * n
    vec = not packed or n % GROUP == 0
    drop = dropout or not vec

    def flag(b: bool) -> str:
        return "true" if b else "false"

    name = f"gated_act_{direction}_kernel<{CUDA_TYPE[dtype]}, {act}, {flag(vec)}, {flag(drop)}>"
    u = gated_unroll(e, vec)
    needed = _cdiv(_cdiv(mn, GROUP), GATED_THREADS * u)
    g = persistent_grid(needed, code.blocks_per_sm(name, GATED_THREADS), sms)
    groups = mn // GROUP if vec else _cdiv(mn, GROUP)  # the vector path's partial last group: after the loop
    reads, writes = (3, 2) if direction == "backward" else (2, 1)  # grad_out, gate, up / grad_gate, grad_up
    return code.launch(
        name,
        (g,),
        (GATED_THREADS,),
        elements=mn,
        bytes=(reads + writes) * mn * e,
        read_bytes=reads * mn * e,
        stride_units=needed,
        trips=structural_trips(groups / (u * g * GATED_THREADS)),
    )


def dan_launches(code, op: str, direction: str, dtype: str, n: int, sms: int, m: int, out: list, column_sums) -> None:
    """dropout_add_norm's launches (run_dan_forward / run_dan_backward of launch.cuh) for the 16-byte vector
    path: the rows kernels at plan_ldr_rows(elem = the wider of x and the sum), else the looped kernels."""
    e, u, rms = dan_sizes(op, dtype)
    s = CUDA_TYPE[dtype]
    us = "float" if u == 4 else s
    mn = m * n
    ldp = partial_stride(n)
    stats = (1 if rms else 2) * m * ACC
    params = (1 if rms else 2) * n * e
    sums = 1 if rms else 2  # dweight (and dbias) partial rows
    backward = direction == "backward"
    plan = plan_ldr_rows(
        m, n, max(e, u), e, backward=backward, vec=True, max_shared=SHARED_PER_BLOCK - WIDE_STATIC_SHARED
    )
    # (dan_wide_allowed sends 16-bit x with an fp32 sum and fp32 parameters at 6 groups a thread to the looped
    # kernels; the model's rows take the parameters in x's dtype, so their wide plans all stand)
    types = f"{s}, {us}, {s}, float"
    if plan.rows:
        name = f"dan_{direction}_rows_kernel<{types}, {'true' if plan.warp_row else 'false'}, {plan.vpt}>"
        if plan.wide:
            name = f"dan_backward_wide_kernel<{types}, {plan.vpt}>"
        threads = plan.threads_x * plan.rows_per_block
        g = persistent_grid(plan.blocks_needed, code.blocks_per_sm(name, threads, plan.shared), sms)
        reread = 0
        if backward:  # reads grad_out, sum, grad_sum, stats, weight; writes grad_x, grad_residual, the partials
            # (the wide kernel at 6 groups a thread with an fp32 sum reads the sum again after the row sum)
            reread = mn * u if plan.wide and plan.vpt > 4 and u == 4 else 0
            read = mn * (e + 2 * u) + stats + n * e + reread
            nbytes = read + mn * (e + u) + sums * g * ldp * ACC
        else:  # reads x, residual, params; writes sum, out, stats
            read = mn * (e + u) + params
            nbytes = read + mn * (e + u) + stats
        out.append(
            code.launch(
                name,
                (g,),
                (plan.threads_x, plan.rows_per_block),
                elements=mn,
                bytes=nbytes,
                read_bytes=read,
                reread_bytes=reread,
                reuse_unit_bytes=n * u if reread else 0,
                stride_units=plan.blocks_needed,
                trips=structural_trips(plan.blocks_needed / g),
                dynamic_shared=plan.shared,
            )
        )
        if backward:
            column_sums(g, sums, e)
        return
    if not backward:
        name = f"dan_forward_looped_kernel<{types}>"
        g = persistent_grid(m, code.blocks_per_sm(name, LOOPED_THREADS), sms)
        rereads = 1 if rms else 2  # the sum read back: the output pass (and LayerNorm's centred pass)
        out.append(
            code.launch(
                name,
                (g,),
                (LOOPED_THREADS,),
                elements=mn,
                bytes=mn * (2 * e + 2 * u) + rereads * mn * u + stats + params,
                read_bytes=mn * (e + u) + rereads * mn * u + params,
                reread_bytes=rereads * mn * u,
                reuse_unit_bytes=n * u,
                stride_units=m,
                trips=structural_trips(m / g, _cdiv(_cdiv(n, GROUP), LOOPED_THREADS)),
            )
        )
        return
    stats_name = f"dan_backward_row_stats_kernel<{types}, true>"
    sg = persistent_grid(m, code.blocks_per_sm(stats_name, LOOPED_THREADS), sms)
    tiled = f"dan_backward_tiled_kernel<{types}, true>"
    t = plan_tiled(m, n, code.blocks_per_sm(tiled, TILED_THREADS) * sms)
    g = t.row_blocks
    stats_groups = STATS_GROUPS[2] if u == 2 and e == 2 else STATS_GROUPS[4]  # ldr_stats_groups<U, P, true>
    out.append(
        code.launch(
            stats_name,
            (sg,),
            (LOOPED_THREADS,),
            elements=mn,
            bytes=mn * (e + u) + stats + 2 * m * ACC + n * e,
            read_bytes=mn * (e + u) + stats + n * e,
            stride_units=m,
            trips=structural_trips(m / sg, _cdiv(_cdiv(n, GROUP), stats_groups * LOOPED_THREADS)),
        )
    )
    steps = max(1, _cdiv(m, t.ty))
    read = mn * (e + 2 * u) + stats + 2 * m * ACC + n * e
    out.append(
        code.launch(
            tiled,
            (t.col_tiles, t.row_blocks),
            (t.tx, t.ty),
            elements=mn,
            bytes=read + mn * (e + u) + sums * g * ldp * ACC,
            read_bytes=read,
            stride_units=steps,
            stride_axis=1,
            trips=structural_trips(math.ceil(steps / t.row_blocks / TILED_LDR_ROWS)),
        )
    )
    column_sums(g, sums, e)


# ----------------------------------------------------------------------------------------------------------------
# Triton: the real launchers on meta tensors, each launch compiled for sm_90
# Per kernel: how its loops run. "rows": a persistent loop over row tiles (program axis `axis`), with chunk
# loops of BLOCK_N columns inside it when BLOCK_N < N; "chunks": passes over one row's BLOCK_N-column chunks;
# "partials": a loop over the whole BLOCK_G steps of the G partial rows (then the partial last step, once).
TRITON_LOOPS = {
    "ldr_fwd_fused_kernel": ("rows", 0),
    "ldr_fwd_looped_kernel": ("chunks", 0),
    "ldr_bwd_fused_kernel": ("rows", 0),
    "ldr_bwd_wide_kernel": ("rows", 0),  # its chunks unrolled (static_range)
    "ldr_bwd_row_coef_kernel": ("chunks", 0),
    "ldr_bwd_chunk_kernel": ("rows", 1),
    "sum_partials_kernel": ("partials", 0),
    "bias_relu_fwd_kernel": ("rows", 0),
    "bias_relu_bwd_kernel": ("rows", 1),
    "dan_fwd_fused_kernel": ("rows", 0),
    "dan_fwd_looped_kernel": ("chunks", 0),
    "dan_bwd_fused_kernel": ("rows", 0),
    "dan_bwd_wide_kernel": ("rows", 0),
    "dan_bwd_row_coef_kernel": ("chunks", 0),
    "dan_bwd_chunk_kernel": ("rows", 1),
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
    if kernel == "ldr_fwd_fused_kernel":
        return 2 * mn * e + k * m * ACC + params, mn * e + params
    if kernel == "ldr_fwd_looped_kernel":  # x read twice: the output pass re-reads the program's row
        return 3 * mn * e + k * m * ACC + params, 2 * mn * e + params, mn * e, n * e
    if kernel in ("ldr_bwd_fused_kernel", "ldr_bwd_wide_kernel", "ldr_bwd_chunk_kernel"):
        one_pass = kernel != "ldr_bwd_chunk_kernel"  # the parameters' reloads per row: L1 hits
        groups = a["_grid"][0] if one_pass else a["_grid"][1]
        stats = k * m * ACC if one_pass else 2 * k * m * ACC
        partials = sums * groups * n * ACC
        rr = _wide_reread(kernel, a, mn * e)
        if rr:  # the wide kernel's pass 2 reads the chunks of x it does not hold again
            return 3 * mn * e + rr + stats + params + partials, 2 * mn * e + rr + stats + params, rr, n * e
        return 3 * mn * e + stats + params + partials, 2 * mn * e + stats + params
    if kernel == "ldr_bwd_row_coef_kernel":
        return 2 * mn * e + 2 * k * m * ACC + params, 2 * mn * e + k * m * ACC + params
    if kernel == "sum_partials_kernel":  # grid (column blocks, 1 or 2 outputs): G partial rows each
        sets, g = a["_grid"][1], int(a["G"])
        return sets * (g * n * ACC + n * int(a["OUT"].element_size())), sets * g * n * ACC
    if kernel == "bias_relu_fwd_kernel":
        return 2 * mn * e + n * e, mn * e + n * e
    if kernel == "bias_relu_bwd_kernel":  # acts 1-3 read the bias too
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
    return KernelLaunch(
        v.cubin,
        v.name,
        args["_grid"],
        (32 * v.num_warps, 1, 1),
        elements=0 if name == "sum_partials_kernel" else m * n,
        bytes=nbytes,
        read_bytes=read,
        reread_bytes=reread_bytes,
        reuse_unit_bytes=unit,
        trips=trips,
        stride_units=units,
        stride_axis=axis,
        regs=v.regs,
        shared=v.shared,
        label=name,
    )

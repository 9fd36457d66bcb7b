"""Compile-time resource table of the Triton kernels for sm_90 (H100/H200), and compile checks, made without a GPU:
`python -m tools.triton_resources [--markdown | --summary | --json] [--quick] [--checks] [--sm-count 132] [--jobs N]`.

How: the project's own planners and launchers (gpuopt_ops.triton_kernels ... plan_forward / launch_forward,
plan_backward / launch_backward) run on *meta* tensors with `wrap=` replaced by a hook that, instead of launching,
records the launch; every distinct specialization is then compiled with Triton's toolchain for
GPUTarget("cuda", 90, 32) (bundled ptxas; no device needed), --jobs at a time in forked worker processes. The hook
builds the signature, constexprs and the specialization attributes (pointer 16-byte alignment, integer
divisibility by 16, == 1) with Triton's own binder and JITFunction._pack_args, i.e. exactly as a real launch does
(a meta tensor's data_ptr() is 0, and torch's CUDA allocations are 512-byte aligned, so "16-byte aligned" is what
a launch on fresh tensors gets).

The table: OPS x DTYPES x NS, plus a few norm_dropout cases (ND_TABLE: layer_norm_dropout_relu's kernels with
RMS=True, RELU=False; ops nd_*) and gated_act's (GATED_TABLE: SwiGLU and GeGLU, both layouts, bf16 and fp32;
ops gated_act{act}[_packed]_{fwd|bwd}, N = F). Recorded per compiled variant: registers per thread, spill bytes
and stack frame from `ptxas -v` (Triton runs ptxas with -v; the log is captured), shared memory from the kernel
metadata, num_warps, the grid the launcher chose, and the blocks per SM those registers/warps/shared memory allow
(tools.cuda_resources.occupancy: 65536 registers and 64 warps per SM, 32 blocks per SM, 228 KiB shared per SM).
All figures are compile-time facts; none is a measured speed.

The persistent grids: on a GPU the launchers size them from the compiled kernel's own facts (n_regs, shared memory,
warps; triton_kernels.common.programs_per_sm). Here each launcher runs the plan its op's planner (plan_forward /
plan_backward) makes with the same facts from this sm_90 compile (the `facts` knob: a planning pass records every
kernel, they compile in parallel, then the planners run again and size their grids from the results), so the
table's grids are the ones an H100/H200 launch picks. The gate fails if the launchers' rule
(common.resident_programs_per_sm) and the occupancy model above ever disagree.

--checks adds checks of what the interpreter (the only way the kernels run without a GPU) cannot see:
  unhinted   a few launches (single-block and looped paths, fp16/bf16/fp32/fp64, the 8-lane and the generic RNG,
             no affine, p = 0, 3-chunk rows, bias-ReLU) compiled WITHOUT the specialization attributes, as a
             launch on an unaligned view or odd shape compiles (scalar loads): no spills, no stack frame. The
             fused N = 8192 backward and the wide backwards (N = 12288, 16384) are left out: unhinted they
             spill (308 B; 552 B bf16, 60 B fp32 at 12288, with triton 3.8); the table checks their hinted
             variants, which a launch on fresh (aligned) tensors compiles.
  inductor   Inductor's TTIR mutation analysis (torch.compile's view of a user Triton kernel) on every kernel,
             with the arguments of a real launch with every feature on (weight, bias, dropout, 8-lane RNG): each
             kernel writes exactly its output pointers (otherwise torch.compile clones every input first);
             and each kernel with float arguments (eps) compiled with them typed fp64, as Inductor types them.

Gate (exit status 1): any table variant that spills or needs more than 227 KiB of shared memory per block, and
with --checks any failed check. Needs the triton package with its NVIDIA backend (ships with Linux CUDA builds of
torch); TRITON_INTERPRET must not be set when triton is imported (the script clears it; a process that already
imported the kernels interpreted cannot use this module).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Optional

os.environ.pop("TRITON_INTERPRET", None)
# A private cache: a cache hit would skip ptxas, and its -v log is where registers and spills come from.
# The process that makes it removes it at exit (worker processes inherit the variable and make none).
if "TRITON_CACHE_DIR" not in os.environ:
    _PRIVATE_CACHE = tempfile.mkdtemp(prefix="gpuopt-triton-resources-")
    os.environ["TRITON_CACHE_DIR"] = _PRIVATE_CACHE
    atexit.register(shutil.rmtree, _PRIVATE_CACHE, ignore_errors=True)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tools.cuda_resources import SM90, kept_result, occupancy  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SHARED_LIMIT = SM90.shared_per_block  # 227 KiB per block on sm_90
DEFAULT_SM_COUNT = 132  # H100 SXM / H200
NS = (768, 1024, 2048, 4096, 8192, 16384)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ROWS = 16384  # rows of the meta launches (only the grids depend on it)
_DTYPE_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


def _kernels():
    import gpuopt_ops.triton_ops  # noqa: F401  (makes gpuopt_ops.triton_kernels importable from a source tree)
    from gpuopt_ops.triton_kernels import bias_act as BR
    from gpuopt_ops.triton_kernels import common as C
    from gpuopt_ops.triton_kernels import norm_dropout as L

    if C.INTERPRETED:
        raise RuntimeError(
            "tools.triton_resources: the Triton kernels were imported with TRITON_INTERPRET=1 "
            "in this process; run the script in a fresh process without it"
        )
    return L, BR, C


@dataclass
class Variant:
    kernel: str
    num_warps: int
    constexprs: str
    regs: int
    spill_stores: int
    spill_loads: int
    stack: int  # bytes of stack frame (spills and local arrays)
    shared: int
    blocks_per_sm: int
    limited_by: str
    launcher_blocks_per_sm: int = 0  # the launchers' rule (triton_kernels.common.resident_programs_per_sm)
    cubin: bytes = b""  # the sm_90 code (the performance model reads its SASS)
    name: str = ""  # the kernel's symbol in the cubin


@dataclass
class Row:
    op: str
    dtype: str
    n: int
    kernel: str
    grid: str
    num_warps: int
    regs: int
    spills: int  # spill stores + loads, bytes
    shared: int
    blocks_per_sm: int
    limited_by: str
    programs_per_sm: float  # the launcher's grid / SM count (the grid's first axis times the others)
    stack: int = 0
    launcher_blocks_per_sm: int = 0  # blocks/SM by the launchers' rule: must equal blocks_per_sm


@dataclass
class Launch:
    key: tuple  # what is compiled: kernel, signature, constexprs, attributes, options
    kernel: object  # the JITFunction
    grid: tuple[int, ...]
    args: dict[str, object]  # kernel parameter name -> value, as launched


_PTXAS_RE = re.compile(r"Used (\d+) registers")
_SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK_RE = re.compile(r"(\d+) bytes stack frame")


class Compiler:
    """Records launches instead of running them (`wrap`); compile_pending() then compiles every distinct one for
    sm_90. hints=False drops the specialization attributes (pointer alignment, integer divisibility): the code a
    launch on unaligned or oddly sized tensors gets."""

    def __init__(self, hints: bool = True):
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        self.hints = hints
        self.backend = make_backend(TARGET)
        self._binders = {}
        self._make_binder = create_function_from_signature
        self.cache: dict[tuple, Variant] = {}
        self.pending: dict[tuple, tuple] = {}  # key -> (kernel, signature, constexprs, attrs, options, tile text)
        self.launches: list[Launch] = []

    def _binder(self, kernel):
        if kernel not in self._binders:
            self._binders[kernel] = self._make_binder(kernel.signature, kernel.params, self.backend)
        return self._binders[kernel]

    def record(self, kernel, grid, args, kwargs) -> Launch:
        kwargs = dict(kwargs)
        kwargs.setdefault("debug", False)
        bound, specialization, options = self._binder(kernel)(*args, **kwargs)
        opts, signature, constexprs, attrs = kernel._pack_args(self.backend, kwargs, bound, specialization, options)
        if not self.hints:
            attrs = {}
        key = (
            kernel.__name__,
            repr(sorted(signature.items())),
            repr(sorted(constexprs.items())),
            repr(sorted(attrs.items())),
            repr(sorted(opts.__dict__.items())),
        )
        if key not in self.cache and key not in self.pending:
            consts = ",".join(
                f"{kernel.arg_names[k[0]]}={v}"
                for k, v in sorted(constexprs.items())
                if kernel.arg_names[k[0]].startswith("BLOCK")
            )
            self.pending[key] = (kernel, signature, constexprs, attrs, opts.__dict__, consts)
        named = dict(zip(kernel.arg_names, args))
        named.update({k: v for k, v in kwargs.items() if k in kernel.arg_names})
        launch = Launch(key, kernel, tuple(int(d) for d in grid), named)
        self.launches.append(launch)
        return launch

    def facts(self, kernel, args, kwargs):
        """The launchers' `facts` hook: the kernel's sm_90 compile (registers, shared memory, warps, spills) with the
        specialization of this launch, compiled now if it was not yet (the same key its launch then records)."""
        _, _, C = _kernels()
        launch = self.record(kernel, (1,), args, kwargs)
        self.launches.pop()  # a query, not a launch
        if launch.key not in self.cache:
            job = self.pending.pop(launch.key)
            self.cache[launch.key] = _variant(job, _compile(job))
        v = self.cache[launch.key]
        return C.KernelFacts(v.regs, v.shared, v.num_warps, v.spill_stores + v.spill_loads)

    def wrap(self, kernel):
        compiler = self

        class _Launch:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    compiler.record(kernel, grid(kwargs) if callable(grid) else tuple(grid), args, kwargs)

                return launch

        return _Launch()

    def variant(self, launch: Launch) -> Variant:
        return self.cache[launch.key]


_JOBS: list[tuple] = []  # the compile jobs; forked workers inherit them (nothing is pickled but an index)


def _compile_job(i: int) -> tuple[int, int, int, int, int, int, bytes, str]:
    return _compile(_JOBS[i])


# GPUOPT_TRITON_STORE=<folder>: a store of compile results (below) shared by the processes that name the same folder,
# e.g. the Triton gate and the performance model, which compile many of the same variants, within one test run and
# from one run to the next (scripts/run_tests.sh keeps it in build/triton-store). An entry is named by everything its
# compile reads (_store_path), so an edited kernel, another triton or other options compile afresh.
STORE_ENV = "GPUOPT_TRITON_STORE"


def _canonical(v):
    """repr-able form of an option value that is the same in every process (sets sorted)."""
    if isinstance(v, (set, frozenset)):
        return sorted(repr(_canonical(x)) for x in v)
    if isinstance(v, dict):
        return sorted((repr(k), _canonical(x)) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return [_canonical(x) for x in v]
    return v


def _store_path(job) -> Optional[str]:
    """Where the compile result of `job` is kept under $GPUOPT_TRITON_STORE (None without it): the file name
    hashes the kernel's source and dependencies (JITFunction.cache_key), the signature, constexprs, specialization
    attributes, options, the target and the triton version, i.e. everything the compile reads."""
    folder = os.environ.get(STORE_ENV)
    if not folder:
        return None
    kernel, signature, constexprs, attrs, options = job[:5]
    ident = repr(
        (
            kernel.cache_key,
            _canonical(signature),
            _canonical(constexprs),
            _canonical(attrs),
            _canonical(options),
            repr(TARGET),
            triton.__version__,
        )
    )
    return os.path.join(folder, f"{kernel.__name__}-{hashlib.sha256(ident.encode()).hexdigest()[:40]}.pkl")


def _compile(job) -> tuple[int, int, int, int, int, int, bytes, str]:
    """Compiles a job (or takes its result from $GPUOPT_TRITON_STORE); returns (registers, spill stores, spill
    loads, stack frame, shared bytes, num_warps, cubin, kernel symbol)."""
    return kept_result(_store_path(job), lambda: _compile_now(job))


def _compile_now(job) -> tuple[int, int, int, int, int, int, bytes, str]:
    from triton import knobs

    kernel, signature, constexprs, attrs, options = job[:5]
    log = io.StringIO()
    old = knobs.nvidia.dump_ptxas_log
    knobs.nvidia.dump_ptxas_log = True
    try:
        with contextlib.redirect_stdout(log):
            ck = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=TARGET, options=options)
    finally:
        knobs.nvidia.dump_ptxas_log = old
    text = log.getvalue()
    regs, spills, stack = _PTXAS_RE.findall(text), _SPILL_RE.findall(text), _STACK_RE.findall(text)
    if not regs or not spills or not stack:
        raise RuntimeError(f"no ptxas -v figures for {kernel.__name__} (cached compile?):\n{text}")
    return (
        int(regs[-1]),
        int(spills[-1][0]),
        int(spills[-1][1]),
        int(stack[-1]),
        int(ck.metadata.shared),
        int(ck.metadata.num_warps),
        bytes(ck.asm["cubin"]),
        str(ck.metadata.name),
    )


def default_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def compile_pending(compilers: Sequence[Compiler], jobs: int = 1) -> None:
    """Compiles what the compilers recorded and have not compiled yet: one compile per distinct key, `jobs` at a
    time in forked worker processes (serially when jobs == 1 or fork is unavailable)."""
    global _JOBS
    keys: dict[tuple, tuple] = {}
    for c in compilers:
        for key, job in c.pending.items():
            keys.setdefault(key, job)  # the same code twice would be a Triton cache hit: no ptxas log
    order = list(keys)
    _JOBS = [keys[k] for k in order]
    try:
        if jobs > 1 and len(order) > 1 and "fork" in multiprocessing.get_all_start_methods():
            with multiprocessing.get_context("fork").Pool(min(jobs, len(order))) as pool:
                results = pool.map(_compile_job, range(len(order)), chunksize=1)
        else:
            results = [_compile_job(i) for i in range(len(order))]
    finally:
        _JOBS = []
    done = {key: _variant(keys[key], result) for key, result in zip(order, results)}
    for c in compilers:
        for key in c.pending:
            c.cache[key] = done[key]
        c.pending.clear()


def _variant(job, result) -> Variant:
    _, _, C = _kernels()
    regs, st, ld, stack, shared, num_warps, cubin, name = result
    occ = occupancy(regs, 32 * num_warps, static_shared=shared)
    return Variant(
        job[0].__name__,
        num_warps,
        job[5],
        regs,
        st,
        ld,
        stack,
        shared,
        occ.blocks_per_sm,
        "+".join(occ.limited_by),
        C.resident_programs_per_sm(C.KernelFacts(regs, shared, num_warps)),
        cubin,
        name,
    )


def _meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


@dataclass(frozen=True)
class _Call:
    """One launcher call of the table: meta tensors of an (M, N) case in `dtype` (x and the outputs), `pd` (the
    parameters) and `acc` (the statistics); `affine`: with a weight and a bias."""

    m: int
    n: int
    dtype: torch.dtype
    pd: torch.dtype
    acc: torch.dtype
    affine: bool

    def rows(self, dtype: Optional[torch.dtype] = None):
        return _meta((self.m, self.n), dtype or self.dtype)

    def cols(self, dtype: Optional[torch.dtype] = None):
        return _meta((self.n,), dtype or self.pd)

    def param(self):
        return self.cols() if self.affine else None


def _norm_call(c: _Call, op: str, p: float) -> tuple:
    """(module, direction, arguments, flags) of layer_norm_dropout_relu's launchers, and of norm_dropout's
    (nd_{ln|rms}[_relu]_*: the same launchers with its flags; RMSNorm with a weight and no bias)."""
    L, _, _ = _kernels()
    mean, rstd, seed = _meta((c.m,), c.acc), _meta((c.m,), c.acc), _meta((1,), torch.int64)
    w = c.param()
    b = w  # the bias (and its gradient): like the weight
    flags = {}
    if op in ND_OPS:
        flags = {"rms": "_rms" in op, "relu": "_relu" in op}
        if flags["rms"]:
            mean, b = _meta((0,), c.acc), None
        op = "ldr_" + op.rsplit("_", 1)[1]
    if op == "ldr_fwd":
        return L, "forward", (c.rows(), w, b, seed, c.rows(), mean, rstd, p, 1e-5), flags
    gw = c.param()
    args = (c.rows(), c.rows(), w, b, mean, rstd, seed, c.rows(), gw, gw if b is not None else None, p)
    return L, "backward", args, flags


def _dan_call(c: _Call, op: str, p: float, residual_in_fp32: bool) -> tuple:
    """(module, direction, arguments, flags) of dropout_add_norm's launchers (dan_* LayerNorm, dan_rms_* RMSNorm),
    with a residual and, in the backward, grad_sum; residual_in_fp32: the sum (and the residual, grad_sum,
    grad_residual) in fp32."""
    from gpuopt_ops.triton_kernels import dropout_add_norm as DAN

    rms = op.startswith("dan_rms")
    sd = torch.float32 if residual_in_fp32 and c.dtype in (torch.float16, torch.bfloat16) else c.dtype
    mu, rstd, seed = _meta((0,) if rms else (c.m,), c.acc), _meta((c.m,), c.acc), _meta((1,), torch.int64)
    w = c.param()
    if op.endswith("_fwd"):
        return DAN, "forward", (c.rows(), c.rows(sd), w, w, seed, c.rows(), c.rows(sd), mu, rstd, p, 1e-5, rms), {}
    gw = c.param()
    args = (c.rows(), c.rows(sd), c.rows(sd), w, w, mu, rstd, seed, c.rows(), c.rows(sd), gw, gw, p, rms)
    return DAN, "backward", args, {}


def _bias_call(c: _Call, op: str) -> tuple:
    """(module, direction, arguments, flags) of bias_relu's launchers (bias_act{1,2,3}_*: with act)."""
    _, BR, _ = _kernels()
    act = {} if op.startswith("bias_relu") else {"act": int(op[len("bias_act")])}
    if op.endswith("_fwd"):
        return BR, "forward", (c.rows(), c.cols(), c.rows()), act
    bias = {"bias": c.cols()} if act else {}
    return BR, "backward", (c.rows(), c.rows(), c.rows(), c.cols(c.acc)), {**act, **bias}


def _gated_call(c: _Call, op: str, p: float) -> tuple:
    """(module, direction, arguments, flags) of gated_act's launchers: N is F, the output's last dimension;
    packed: gate (M, 2F) = [gate | up]."""
    from gpuopt_ops.triton_kernels import gated_act as GA

    code, packed = int(op[len("gated_act")]), "_packed" in op
    gate = _meta((c.m, 2 * c.n if packed else c.n), c.dtype)
    up = None if packed else c.rows()
    seed = _meta((1,), torch.int64)
    if op.endswith("_fwd"):
        return GA, "forward", (gate, up, seed, c.rows(), p), {"act": code}
    grad_up = _meta((0,), c.dtype) if packed else c.rows()
    return GA, "backward", (c.rows(), gate, up, seed, _meta(tuple(gate.shape), c.dtype), grad_up, p), {"act": code}


def launches(
    compiler: Compiler,
    op: str,
    dtype: torch.dtype,
    n: int,
    sm_count: int,
    m: int = ROWS,
    param_dtype: Optional[torch.dtype] = None,
    p: float = 0.1,
    affine: bool = True,
    max_fused_n: Optional[int] = None,
    facts: bool = False,
    residual_in_fp32: bool = False,
) -> list[Launch]:
    """Runs one launcher on meta tensors with the plan its module's planner makes for sm_count SMs; returns the
    launches it made (recorded in `compiler`, not compiled).
    max_fused_n (ldr, nd, dan) caps the longest row of the single-block kernels (plans.RowLimits.capped), to reach
    the looped ones.
    The nd ops (norm_dropout: layer_norm_dropout_relu's kernels with the RMS / RELU constexprs) are named
    nd_{ln|rms}[_relu]_{fwd|bwd}; nd_ln_relu_* is layer_norm_dropout_relu itself.
    The dan ops (dropout_add_norm: dan_* LayerNorm, dan_rms_* RMSNorm) run with a residual and, in the
    backward, grad_sum; residual_in_fp32 makes the sum (and residual, grad_sum, grad_residual) fp32.
    facts: the persistent grids come from the compiled kernels (compiler.facts, as the launchers on a GPU take
    them from the loaded kernel); otherwise from the launchers' planning rule, and nothing is compiled here."""
    from gpuopt_ops.triton_kernels.plans import ROW_LIMITS

    acc = torch.float64 if dtype == torch.float64 else torch.float32
    c = _Call(m, n, dtype, param_dtype or dtype, acc, affine)
    knobs = {"sm_count": sm_count, "facts": compiler.facts if facts else None}
    rows = {**knobs, "limits": None if max_fused_n is None else ROW_LIMITS.capped(max_fused_n)}
    if op in ND_OPS or op in ("ldr_fwd", "ldr_bwd"):
        call, knobs = _norm_call(c, op, p), rows
    elif op in DAN_OPS:
        call, knobs = _dan_call(c, op, p, residual_in_fp32), rows
    elif op.startswith("bias_relu") or op in BIAS_ACT_OPS:
        call = _bias_call(c, op)
        knobs = knobs if op.endswith("_bwd") else {}  # the forward sizes nothing from the device
    elif op in GATED_OPS:
        call, knobs = _gated_call(c, op, p), {}  # nothing sized from the device
    else:
        raise ValueError(op)
    module, direction, args, flags = call
    start = len(compiler.launches)
    plan = getattr(module, f"plan_{direction}")(*args, **flags, **knobs)
    getattr(module, f"launch_{direction}")(*args, **flags, wrap=compiler.wrap, plan=plan)
    return compiler.launches[start:]


# bias_act{1,2,3}: bias_act with gelu, gelu_tanh, silu (the bias-ReLU kernels with ACT = 1, 2, 3)
BIAS_ACT_OPS = tuple(f"bias_act{act}_{d}" for act in (1, 2, 3) for d in ("fwd", "bwd"))
DAN_OPS = ("dan_fwd", "dan_bwd", "dan_rms_fwd", "dan_rms_bwd")
# gated_act{0..3}[_packed]_{fwd|bwd}: gated_act with act 0-3 (relu, gelu, gelu_tanh, silu); _packed: the one-tensor
# [gate | up] layout (2-D tiles), else two tensors (flat); N is F, the output's last dimension
GATED_OPS = tuple(
    f"gated_act{act}{layout}_{d}" for act in (0, 1, 2, 3) for layout in ("", "_packed") for d in ("fwd", "bwd")
)
# norm_dropout: nd_{ln|rms}[_relu]_{fwd|bwd}, the ldr kernels with the RMS / RELU constexprs
ND_OPS = tuple(f"nd_{norm}{act}_{d}" for norm in ("ln", "rms") for act in ("", "_relu") for d in ("fwd", "bwd"))
OPS = ("ldr_fwd", "ldr_bwd", "bias_relu_fwd", "bias_relu_bwd", *BIAS_ACT_OPS, *DAN_OPS)
# The table's norm_dropout variants, few (every compile costs CI seconds): RMSNorm (weight, no bias) without ReLU,
# the flags' other
# corner from layer_norm_dropout_relu's (RMS=False, RELU=True), whose table covers the same kernels; bf16 and fp32
# at 3-chunk rows (768), 1024, the widest single-block rows (8192: 4-chunk forward, fused backward) and the looped
# forward / chunked backward (16384), those of the N in the table.
ND_TABLE = tuple(
    (op, dtype, n)
    for op in ("nd_rms_fwd", "nd_rms_bwd")
    for dtype in (torch.bfloat16, torch.float32)
    for n in (768, 1024, 8192, 16384)
)
# The table's gated_act variants: SwiGLU (act 3) and GeGLU (act 1), both layouts, bf16 and fp32, every N of the
# table (the flat kernels compile once per dtype: no specialization depends on N there)
GATED_TABLE = tuple(
    (f"gated_act{act}{layout}_{d}", dtype, n)
    for act in (3, 1)
    for layout in ("", "_packed")
    for d in ("fwd", "bwd")
    for dtype in (torch.bfloat16, torch.float32)
    for n in NS
)


def record_table(
    compiler: Compiler,
    ns=NS,
    dtypes=DTYPES,
    ops=OPS,
    sm_count: int = DEFAULT_SM_COUNT,
    m: int = ROWS,
    facts: bool = False,
    extra=ND_TABLE + GATED_TABLE,
) -> list[tuple[str, torch.dtype, int, Launch]]:
    """The launches of every (op, dtype, N) of ops x dtypes x ns, then of the `extra` (op, dtype, N) cases whose
    N is in ns (the norm_dropout and gated_act variants)."""
    cases = [(op, dtype, n) for op in ops for dtype in dtypes for n in ns]
    cases += [(op, dtype, n) for op, dtype, n in extra if n in ns]
    return [
        (op, dtype, n, launch)
        for op, dtype, n in cases
        for launch in launches(compiler, op, dtype, n, sm_count, m, facts=facts)
    ]


def record_table_with_facts(
    compiler: Compiler, jobs: int, others: Sequence[Compiler] = (), **kw
) -> list[tuple[str, torch.dtype, int, Launch]]:
    """The table's launches with the persistent grids the launchers choose from the compiled kernels' facts:
    a planning pass records every kernel, all of them (and what `others` recorded) compile `jobs` at a time,
    then the real pass asks compiler.facts (cached now) and records the launches; what only it launched
    (stage 2 at the new G) compiles last."""
    record_table(compiler, **kw)
    compile_pending([compiler, *others], jobs)
    compiler.launches.clear()
    recorded = record_table(compiler, facts=True, **kw)
    compile_pending([compiler], jobs)
    return recorded


def table_rows(compiler: Compiler, recorded, sm_count: int = DEFAULT_SM_COUNT) -> list[Row]:
    rows = []
    for op, dtype, n, launch in recorded:
        v = compiler.variant(launch)
        programs = 1
        for d in launch.grid:
            programs *= d
        rows.append(
            Row(
                op,
                _DTYPE_NAME[dtype],
                n,
                f"{v.kernel}[{v.constexprs}]",
                "x".join(map(str, launch.grid)),
                v.num_warps,
                v.regs,
                v.spill_stores + v.spill_loads,
                v.shared,
                v.blocks_per_sm,
                v.limited_by,
                round(programs / sm_count, 2),
                v.stack,
                v.launcher_blocks_per_sm,
            )
        )
    return rows


def table(
    ns=NS,
    dtypes=DTYPES,
    ops=OPS,
    sm_count: int = DEFAULT_SM_COUNT,
    compiler: Optional[Compiler] = None,
    m: int = ROWS,
    jobs: int = 1,
) -> list[Row]:
    compiler = compiler or Compiler()
    recorded = record_table_with_facts(compiler, jobs, ns=ns, dtypes=dtypes, ops=ops, sm_count=sm_count, m=m)
    return table_rows(compiler, recorded, sm_count)


def failures(rows: list[Row]) -> list[str]:
    bad = []
    for r in rows:
        if r.spills:
            bad.append(f"{r.op} {r.dtype} N={r.n} {r.kernel}: {r.spills} bytes of spills")
        if r.shared > SHARED_LIMIT:
            bad.append(f"{r.op} {r.dtype} N={r.n} {r.kernel}: shared {r.shared} B > {SHARED_LIMIT} B")
        if r.blocks_per_sm < 1:
            bad.append(f"{r.op} {r.dtype} N={r.n} {r.kernel}: does not fit an SM ({r.limited_by})")
        if r.launcher_blocks_per_sm != r.blocks_per_sm:
            bad.append(
                f"{r.op} {r.dtype} N={r.n} {r.kernel}: the launchers' rule gives {r.launcher_blocks_per_sm} "
                f"programs/SM, the occupancy model {r.blocks_per_sm}"
            )
    return bad


# --------------------------------------------------------------------------------------------- --checks
# The unhinted launches: (what the case covers, op launches as keyword arguments of launches()). M is small: the
# grid does not change the code.
UNHINTED_CASES = [
    (
        "single block, 8-lane RNG, fp32 params of bf16 x",
        dict(m=64, n=1000, dtype=torch.bfloat16, param_dtype=torch.float32),
    ),
    ("generic RNG (N % 8 != 0), no weight / bias", dict(m=8, n=37, dtype=torch.float16, affine=False)),
    (
        "single-block forward of 4 chunks; looped backward (the fused N = 8192 backward spills unhinted)",
        dict(m=2, n=8192, dtype=torch.float32, bwd_max_fused_n=4096),
    ),
    ("fp64, looped, generic RNG", dict(m=2, n=65533, dtype=torch.float64)),
    ("p = 0: no RNG", dict(m=4, n=4096, dtype=torch.float32, p=0.0)),
    ("3-chunk rows (N = 3 x 256)", dict(m=16, n=768, dtype=torch.float16)),
]
UNHINTED_BIAS_RELU = [
    (
        "bias-ReLU forward, bf16 x, fp32 bias",
        "bias_relu_fwd",
        dict(m=8, n=300, dtype=torch.bfloat16, param_dtype=torch.float32),
    ),
    ("bias-ReLU backward, fp32", "bias_relu_bwd", dict(m=8, n=300, dtype=torch.float32)),
    (
        "bias-GELU forward, fp64",
        "bias_act1_fwd",
        dict(m=8, n=300, dtype=torch.float64),
    ),
    (
        "bias-GELU-tanh backward, bf16 x, fp32 bias",
        "bias_act2_bwd",
        dict(m=8, n=300, dtype=torch.bfloat16, param_dtype=torch.float32),
    ),
    ("bias-SiLU backward, fp16", "bias_act3_bwd", dict(m=8, n=300, dtype=torch.float16)),
]


def _both(case: str, op: str, kw: dict) -> tuple:
    """An unhinted case of both directions of `op`: (what the case covers, (op_fwd, op_bwd), launches() keyword
    arguments kw)."""
    return case, (f"{op}_fwd", f"{op}_bwd"), kw


# dropout_add_norm (with a residual and grad_sum), norm_dropout and gated_act: (what the case covers, its ops,
# launches() keyword arguments)
BF16, FP16 = torch.bfloat16, torch.float16
UNHINTED_DAN = [
    _both(
        "dropout-add-LayerNorm, 8-lane RNG, bf16 x with residual_in_fp32 and fp32 params",
        "dan",
        dict(m=64, n=1000, dtype=BF16, param_dtype=torch.float32, residual_in_fp32=True),
    ),
    _both("dropout-add-RMSNorm, generic RNG, no weight / bias", "dan_rms", dict(m=8, n=37, dtype=FP16, affine=False)),
    _both("dropout-add-RMSNorm, 3-chunk rows (N = 3 x 256)", "dan_rms", dict(m=16, n=768, dtype=FP16)),
    _both("dropout-add-LayerNorm, fp64, looped, generic RNG", "dan", dict(m=2, n=65533, dtype=torch.float64)),
]
UNHINTED_ND = [_both("norm_dropout, RMSNorm without ReLU, generic RNG, bf16", "nd_rms", dict(m=8, n=37, dtype=BF16))]
UNHINTED_GATED = [
    _both(
        "gated SwiGLU, [gate | up] layout, odd F: generic RNG, unaligned up half, bf16",
        "gated_act3_packed",
        dict(m=8, n=37, dtype=BF16),
    ),
    _both("gated GeGLU, two tensors, odd element count, fp64", "gated_act1", dict(m=3, n=37, dtype=torch.float64)),
    _both(
        "gated GeGLU-tanh, [gate | up] layout, p = 0: no RNG, fp16",
        "gated_act2_packed",
        dict(m=4, n=300, dtype=FP16, p=0.0),
    ),
    _both("gated ReGLU, two tensors, fp32", "gated_act0", dict(m=4, n=300, dtype=torch.float32)),
]

# What each kernel may write (its output pointers); anything else written makes torch.compile clone that input.
EXPECTED_WRITES = {
    "nd_fwd_fused_kernel": {"OUT", "MEAN", "RSTD"},
    "nd_fwd_looped_kernel": {"OUT", "MEAN", "RSTD"},
    "nd_bwd_fused_kernel": {"DX", "PDW", "PDB"},
    "nd_bwd_wide_kernel": {"DX", "PDW", "PDB"},
    "nd_bwd_row_coef_kernel": {"C1", "C2"},
    "nd_bwd_chunk_kernel": {"DX", "PDW", "PDB"},
    "sum_partials_kernel": {"OUT", "OUT2"},
    "bias_act_fwd_kernel": {"OUT"},
    "bias_act_bwd_kernel": {"DX", "PDB"},
    "dan_fwd_fused_kernel": {"OUT", "SUM", "MEAN", "RSTD"},
    "dan_fwd_looped_kernel": {"OUT", "SUM", "MEAN", "RSTD"},
    "dan_bwd_fused_kernel": {"DX", "DRES", "PDW", "PDB"},
    "dan_bwd_wide_kernel": {"DX", "DRES", "PDW", "PDB"},
    "dan_bwd_row_coef_kernel": {"C1", "C2"},
    "dan_bwd_chunk_kernel": {"DX", "DRES", "PDW", "PDB"},
    "gated_act_fwd_kernel": {"OUT"},
    "gated_act_bwd_kernel": {"DGATE", "DUP"},
    # the [gate | up] layout: grad_up goes into grad_gate's second half; DUP is never written (no two outputs
    # that torch.compile would clone and write back separately)
    "gated_act_fwd_kernel[PACKED]": {"OUT"},
    "gated_act_bwd_kernel[PACKED]": {"DGATE"},
}


@dataclass
class UnhintedRow:
    case: str
    op: str
    dtype: str
    n: int
    kernel: str
    num_warps: int
    regs: int
    spills: int
    stack: int


def record_unhinted(
    compiler: Compiler, sm_count: int = DEFAULT_SM_COUNT
) -> list[tuple[str, str, torch.dtype, int, Launch]]:
    recorded = []
    for case, kw in UNHINTED_CASES:
        kw = dict(kw)
        m, n, dtype = kw.pop("m"), kw.pop("n"), kw.pop("dtype")
        bwd_max = kw.pop("bwd_max_fused_n", None)
        for op, extra in (("ldr_fwd", {}), ("ldr_bwd", {"max_fused_n": bwd_max} if bwd_max else {})):
            for launch in launches(compiler, op, dtype, n, sm_count, m, **kw, **extra):
                recorded.append((case, op, dtype, n, launch))
    for case, op, kw in UNHINTED_BIAS_RELU:
        kw = dict(kw)
        m, n, dtype = kw.pop("m"), kw.pop("n"), kw.pop("dtype")
        for launch in launches(compiler, op, dtype, n, sm_count, m, **kw):
            recorded.append((case, op, dtype, n, launch))
    for case, ops, kw in UNHINTED_DAN + UNHINTED_ND + UNHINTED_GATED:
        kw = dict(kw)
        m, n, dtype = kw.pop("m"), kw.pop("n"), kw.pop("dtype")
        for op in ops:
            for launch in launches(compiler, op, dtype, n, sm_count, m, **kw):
                recorded.append((case, op, dtype, n, launch))
    return recorded


def unhinted_rows(compiler: Compiler, recorded) -> list[UnhintedRow]:
    rows = []
    for case, op, dtype, n, launch in recorded:
        v = compiler.variant(launch)
        rows.append(
            UnhintedRow(
                case,
                op,
                _DTYPE_NAME[dtype],
                n,
                f"{v.kernel}[{v.constexprs}]",
                v.num_warps,
                v.regs,
                v.spill_stores + v.spill_loads,
                v.stack,
            )
        )
    return rows


def analysis_launches(sm_count: int = DEFAULT_SM_COUNT, rec: Optional[Compiler] = None) -> list[Launch]:
    """One launch of every kernel with every feature on (weight, bias, dropout, 8-lane RNG; fp32), recorded, not
    compiled: N = 1000 takes the single-block kernels, max_fused_n = 16 the looped ones, and the backward at N = 12288
    the wide ones."""
    rec = rec if rec is not None else Compiler()
    for fused in (None, 16):
        for op in ("ldr_fwd", "ldr_bwd", "dan_fwd", "dan_bwd"):
            launches(rec, op, torch.float32, 1000, sm_count, 64, max_fused_n=fused)
    for op in ("ldr_bwd", "dan_bwd"):  # N = 12288: the wide single-block backwards
        launches(rec, op, torch.float32, 12288, sm_count, 64)
    for op in ("bias_relu_fwd", "bias_relu_bwd", "bias_act1_fwd", "bias_act1_bwd"):
        launches(rec, op, torch.float32, 1000, sm_count, 64)
    for op in ("gated_act3_fwd", "gated_act3_bwd", "gated_act3_packed_fwd", "gated_act3_packed_bwd"):
        launches(rec, op, torch.float32, 1000, sm_count, 64)
    return rec.launches


def analysis_name(launch: Launch) -> str:
    """The name a launch's analysis is reported under: the kernel's, with "[PACKED]" for gated_act's one-tensor
    layout (its writes differ: one output tensor)."""
    return launch.kernel.__name__ + ("[PACKED]" if launch.args.get("PACKED") else "")


def first_analysis_launches(sm_count: int = DEFAULT_SM_COUNT) -> tuple[Compiler, dict[str, Launch]]:
    """The first of analysis_launches() of each kernel, by analysis_name, and the Compiler that recorded them (its
    pending jobs hold each launch's signature): what the Inductor checks look at."""
    rec = Compiler()
    first: dict[str, Launch] = {}
    for launch in analysis_launches(sm_count, rec):
        first.setdefault(analysis_name(launch), launch)
    return rec, first


def inductor_writes(sm_count: int = DEFAULT_SM_COUNT) -> list[dict[str, object]]:
    """Inductor's TTIR analysis of each kernel at the arguments of analysis_launches(): the pointers it writes."""
    from triton.runtime import driver

    try:
        from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors
    except ImportError:  # older torch (2.11): only the mutation analysis, a list of the written argument names
        from torch._higher_order_ops.triton_kernel_wrap import identify_mutated_tensors as identify_accessed_tensors

    class FakeDriver:  # the analysis asks the active driver for its target
        def get_current_target(self):
            return TARGET

    _, first = first_analysis_launches(sm_count)
    old = getattr(driver, "_active", None)
    driver.set_active(FakeDriver())
    results = []
    try:
        for name, launch in first.items():
            # tensors as Inductor passes them to the analysis (it replaces its fake tensors by small real ones)
            kwargs = {
                k: torch.empty(2, dtype=v.dtype) if isinstance(v, torch.Tensor) else v for k, v in launch.args.items()
            }
            accesses = identify_accessed_tensors(launch.kernel, kwargs, {})
            if isinstance(accesses, (list, tuple, set)):
                written = set(accesses)
            else:
                rw = getattr(accesses, "read_writes", accesses)
                written = {d.name for d in rw.writes}
            expected = EXPECTED_WRITES.get(name)
            results.append(
                {
                    "kernel": name,
                    "written": sorted(written),
                    "expected": sorted(expected) if expected is not None else None,
                }
            )
    finally:
        driver._active = old  # set_active(None) would not do: the next `active` then creates the real driver
    return results


def inductor_float_args(sm_count: int = DEFAULT_SM_COUNT) -> list[dict[str, object]]:
    """Each kernel with float scalar arguments (eps) compiled with them typed fp64, as Inductor types a Python
    float argument of a user kernel (to keep its precision), where a plain Triton launch types it fp32: the
    kernel must compile either way (a kernel that only compiles with fp32 scalars fails under torch.compile on
    a GPU only). Returns one entry per such kernel: its float arguments and the compile error, if any."""
    rec, first = first_analysis_launches(sm_count)
    results = []
    for name, launch in first.items():
        kernel, signature, constexprs, attrs, options = rec.pending[launch.key][:5]
        floats = sorted(k for k, v in signature.items() if v in ("fp16", "bf16", "fp32"))
        if not floats:
            continue
        sig = {k: ("fp64" if k in floats else v) for k, v in signature.items()}
        error = None
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                triton.compile(ASTSource(kernel, sig, constexprs, attrs), target=TARGET, options=options)
        except Exception as err:  # noqa: BLE001  (reported as a check failure)
            lines = [ln for ln in str(err).splitlines() if ln.strip()]
            error = f"{type(err).__name__}: {' | '.join(lines[-3:])}"
        results.append({"kernel": name, "float_args": floats, "error": error})
    return results


def check_failures(
    unhinted: list[UnhintedRow], inductor: list[dict[str, object]], floats: Optional[list[dict[str, object]]] = None
) -> list[str]:
    bad = []
    for r in floats or []:
        if r["error"]:
            bad.append(f"inductor: {r['kernel']} fails to compile with {r['float_args']} as fp64: {r['error']}")
    for r in unhinted:
        if r.spills or r.stack:
            bad.append(
                f"unhinted {r.op} {r.dtype} N={r.n} {r.kernel} ({r.case}): {r.spills} B of spills, {r.stack} B of stack"
            )
    analysed = {r["kernel"] for r in inductor}
    for name in sorted(set(EXPECTED_WRITES) - analysed):
        bad.append(f"inductor: {name} was not launched by any analysed launcher call")
    for r in inductor:
        if r["expected"] is None:
            bad.append(f"inductor: {r['kernel']} has no entry in EXPECTED_WRITES (its output pointers)")
        elif r["written"] != r["expected"]:
            bad.append(f"inductor: {r['kernel']} writes {r['written']}, expected exactly {r['expected']}")
    return bad


# ----------------------------------------------------------------------------------------------- output
def markdown(rows: list[Row], sm_count: int) -> str:
    out = [
        f"Triton {triton.__version__}, torch {torch.__version__}, target sm_90, M = {ROWS} rows, "
        f"SM count {sm_count}; registers/spills from ptxas -v, blocks/SM from registers, warps and shared "
        "memory (65536 regs, 64 warps, 32 blocks, 228 KiB per SM). Compile-time facts, not timings.",
        "",
        "| op | dtype | N | kernel [tile] | grid | warps | regs | spill B | shared B | blocks/SM (limit) "
        "| programs/SM |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.op} | {r.dtype} | {r.n} | {r.kernel} | {r.grid} | {r.num_warps} | {r.regs} | {r.spills} "
            f"| {r.shared} | {r.blocks_per_sm} ({r.limited_by}) | {r.programs_per_sm} |"
        )
    variants = {(r.kernel, r.dtype, r.n, r.num_warps, r.regs) for r in rows}
    out.append("")
    out.append(
        f"{len(rows)} launches, {len(variants)} distinct (kernel, dtype, N) compiles; max registers "
        f"{max(r.regs for r in rows)}, spilling launches {sum(1 for r in rows if r.spills)}, max shared "
        f"{max(r.shared for r in rows)} B."
    )
    return "\n".join(out)


def summary_markdown(rows: list[Row], sm_count: int) -> str:
    """One line per (op, N, kernel): registers as fp16 / bf16 / fp32, the worst spill and shared memory."""
    groups: dict[tuple[str, int, str], dict[str, Row]] = {}
    for r in rows:
        groups.setdefault((r.op, r.n, r.kernel.split("[")[0]), {})[r.dtype] = r
    out = [
        f"Triton {triton.__version__}, sm_90, M = {ROWS}, {sm_count} SMs. regs, blocks/SM and programs/SM as "
        "fp16 / bf16 / fp32.",
        "",
        "| op | N | kernel | warps | regs | spill B | shared B (max) | blocks/SM | programs/SM |",
        "|---|---:|---|---:|---|---:|---:|---|---|",
    ]

    def trio(d, f):
        return " / ".join(str(f(d[k])) if k in d else "-" for k in ("fp16", "bf16", "fp32"))

    for (op, n, kernel), d in groups.items():
        out.append(
            f"| {op} | {n} | {kernel} | {trio(d, lambda r: r.num_warps)} | {trio(d, lambda r: r.regs)} "
            f"| {max(r.spills for r in d.values())} | {max(r.shared for r in d.values())} "
            f"| {trio(d, lambda r: r.blocks_per_sm)} | {trio(d, lambda r: r.programs_per_sm)} |"
        )
    out.append("")
    out.append(
        f"max registers {max(r.regs for r in rows)}, spilling launches {sum(1 for r in rows if r.spills)}, "
        f"max shared {max(r.shared for r in rows)} B (limit {SHARED_LIMIT} B)."
    )
    return "\n".join(out)


def checks_text(unhinted: list[UnhintedRow], inductor: list[dict[str, object]]) -> str:
    out = [f"unhinted compiles (no alignment / divisibility hints): {len(unhinted)} launches"]
    for r in unhinted:
        out.append(
            f"  {r.op:14s} {r.dtype} N={r.n:<6d} {r.kernel:55s} w={r.num_warps:<2d} regs={r.regs:<3d} "
            f"spill={r.spills:<4d} stack={r.stack:<4d} ({r.case})"
        )
    out.append(f"Inductor TTIR analysis: {len(inductor)} kernels")
    for r in inductor:
        ok = "ok" if r["written"] == r["expected"] else f"EXPECTED {r['expected']}"
        out.append(f"  {r['kernel']:26s} writes {', '.join(r['written'])}: {ok}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.triton_resources",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fmt = ap.add_mutually_exclusive_group()  # the output format: one of these flags, or none (plain text)
    for flag, text in (
        ("--markdown", "markdown table (default: plain text)"),
        ("--json", 'JSON object: {"rows": [...]}, with --checks also "unhinted", "inductor", "failures"'),
        ("--summary", "markdown, one line per (op, N, kernel)"),
    ):
        fmt.add_argument(flag, action="store_true", help=text)
    ap.add_argument("--sm-count", type=int, default=DEFAULT_SM_COUNT, help="SMs of the target GPU (132: H100/H200)")
    ap.add_argument("--quick", action="store_true", help="N in {1024, 8192} only")
    ap.add_argument(
        "--checks", action="store_true", help="also the unhinted compiles and Inductor's TTIR analysis (see above)"
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        help="compiles at a time, in forked processes (default: the CPU count, at most 8)",
    )
    args = ap.parse_args(argv)
    ns = (1024, 8192) if args.quick else NS

    compiler = Compiler()
    unhinted_compiler = Compiler(hints=False)
    unhinted_recorded = record_unhinted(unhinted_compiler, args.sm_count) if args.checks else []
    recorded = record_table_with_facts(compiler, args.jobs, [unhinted_compiler], ns=ns, sm_count=args.sm_count)
    rows = table_rows(compiler, recorded, args.sm_count)
    bad = failures(rows)
    unhinted, inductor, floats = [], [], []
    if args.checks:
        unhinted = unhinted_rows(unhinted_compiler, unhinted_recorded)
        inductor = inductor_writes(args.sm_count)
        floats = inductor_float_args(args.sm_count)
        bad += check_failures(unhinted, inductor, floats)

    if args.json:
        doc = {
            "triton": triton.__version__,
            "torch": torch.__version__,
            "sm_count": args.sm_count,
            "rows": [asdict(r) for r in rows],
        }
        if args.checks:
            doc.update(unhinted=[asdict(r) for r in unhinted], inductor=inductor, fp64_floats=floats, failures=bad)
        print(json.dumps(doc, indent=1))
    else:
        if args.summary:
            print(summary_markdown(rows, args.sm_count))
        elif args.markdown:
            print(markdown(rows, args.sm_count))
        else:
            for r in rows:
                print(
                    f"{r.op:14s} {r.dtype} N={r.n:<6d} {r.kernel:55s} grid={r.grid:>10s} w={r.num_warps:<2d} "
                    f"regs={r.regs:<3d} spill={r.spills:<4d} smem={r.shared:<6d} blocks/SM={r.blocks_per_sm} "
                    f"({r.limited_by}) programs/SM={r.programs_per_sm}"
                )
        if args.checks:
            print()
            print(checks_text(unhinted, inductor))
    for b in bad:
        print("FAIL:", b, file=sys.stderr)
    return 1 if bad else 0


# ----------------------------------------------------------------------------------------------- one kernel
@dataclass(frozen=True)
class CompiledInfo:
    """One launch's kernel compiled for sm_90: the cubin and the compile-time facts the performance model needs."""

    cubin: bytes
    name: str  # the kernel's symbol in the cubin
    regs: int  # registers per thread (ptxas -v)
    shared: int  # shared memory bytes per block (Triton's metadata: the static + the kernel's scratch)
    num_warps: int
    spills: int  # spill stores + spill loads, bytes (ptxas -v)


_COMPILED: dict[tuple, CompiledInfo] = {}


def compile_cubin(kernel, grid, args: Sequence[object], kwargs: dict[str, object], hints: bool = True) -> CompiledInfo:
    """Compiles the kernel that `kernel[grid](*args, **kwargs)` would launch, for sm_90, without a GPU: tensors
    are passed as meta tensors (their data_ptr() is 0, so pointers get the 16-byte alignment attribute a launch on
    fresh allocations gets; hints=False drops the attributes). Specialization, constexprs and options come from
    Triton's own binder, as in Compiler.record. Cached per process by the compile key: a second compile of the
    same code would be a Triton cache hit, without the ptxas log the registers come from."""
    compiler = Compiler(hints=hints)
    launch = compiler.record(kernel, grid, tuple(args), dict(kwargs))
    if launch.key not in _COMPILED:
        compile_pending([compiler], jobs=1)
        v = compiler.variant(launch)
        _COMPILED[launch.key] = CompiledInfo(
            v.cubin, v.name, v.regs, v.shared, v.num_warps, v.spill_stores + v.spill_loads
        )
    return _COMPILED[launch.key]


if __name__ == "__main__":
    sys.exit(main())

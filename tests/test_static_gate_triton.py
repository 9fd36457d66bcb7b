"""The Triton kernels compiled for sm_90 without a GPU (tools/triton_resources.py), as a CI gate.

One subprocess runs `python -m tools.triton_resources --json --checks` (the kernels must be decorated without
TRITON_INTERPRET, which conftest sets for the other tests) and every test here reads its output:

- the table: the project's launchers run on meta tensors with each launch compiled by triton.compile for
  GPUTarget("cuda", 90, 32) (bundled ptxas) with the specialization a real launch gets (16-byte pointer alignment,
  divisibility hints), over fp16/bf16/fp32 x N in {768, ..., 16384}, forward, backward, bias-ReLU and gated_act:
  no spills, shared memory within 227 KiB, N = 8192 takes the fused backward, and the persistent grids, sized from
  the compiled kernels' facts, are one full wave;
- the unhinted compiles: launches of every path compiled WITHOUT alignment / divisibility hints (what a launch on
  an unaligned view compiles; the interpreter accepts code the compiler rejects): no spills, no stack;
- Inductor's TTIR mutation analysis: each kernel writes exactly its output pointers (otherwise torch.compile
  would clone every input before each kernel);
- Inductor's typing of float arguments (fp64): the kernels with float arguments compile with it too.

Marked slow (~15 s: about 90 compiles, two at a time on 2 cores): run it after editing triton_kernels/ (this file,
or `python -m tools.triton_resources --checks`); the whole suite and CI run it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PERSISTENT = (
    "nd_fwd_fused_kernel",
    "nd_bwd_fused_kernel",
    "nd_bwd_wide_kernel",
    "nd_bwd_chunk_kernel",
    "bias_act_bwd_kernel",
    "dan_fwd_fused_kernel",
    "dan_bwd_fused_kernel",
    "dan_bwd_wide_kernel",
    "dan_bwd_chunk_kernel",
)
# grid (G,): exactly SMs x programs per SM
ONE_AXIS = (
    "nd_fwd_fused_kernel",
    "nd_bwd_fused_kernel",
    "nd_bwd_wide_kernel",
    "dan_fwd_fused_kernel",
    "dan_bwd_fused_kernel",
    "dan_bwd_wide_kernel",
)
# the wide backwards (N = 12288, 16384) hold the raw row in registers: compiled without alignment hints (scalar
# loads) they spill, as the fused N = 8192 backward does, so the unhinted checks leave them out
WIDE = {"nd_bwd_wide_kernel", "dan_bwd_wide_kernel"}
KERNELS = WIDE | {
    "nd_fwd_fused_kernel",
    "nd_fwd_looped_kernel",
    "nd_bwd_fused_kernel",
    "nd_bwd_row_coef_kernel",
    "nd_bwd_chunk_kernel",
    "sum_partials_kernel",
    "bias_act_fwd_kernel",
    "bias_act_bwd_kernel",
    "dan_fwd_fused_kernel",
    "dan_fwd_looped_kernel",
    "dan_bwd_fused_kernel",
    "dan_bwd_row_coef_kernel",
    "dan_bwd_chunk_kernel",
    "gated_act_fwd_kernel",
    "gated_act_bwd_kernel",
}
# gated_act's one-tensor [gate | up] layout, analysed on its own (tools.triton_resources.analysis_name): its
# backward writes grad_up into grad_gate's second half, so it must write one tensor only
PACKED_ANALYSIS = {"gated_act_fwd_kernel[PACKED]", "gated_act_bwd_kernel[PACKED]"}


@pytest.fixture(scope="module")
def gate(triton_store):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["GPUOPT_TRITON_STORE"] = str(triton_store)
    res = subprocess.run(
        [sys.executable, "-m", "tools.triton_resources", "--json", "--checks"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-6000:]
    return json.loads(res.stdout), res.returncode, res.stderr


def test_table_covers_every_op_dtype_and_n(gate):
    rows = gate[0]["rows"]
    seen = {(r["op"], r["dtype"], r["n"]) for r in rows}
    ops = ("ldr_fwd", "ldr_bwd", "bias_relu_fwd", "bias_relu_bwd", "dan_fwd", "dan_bwd", "dan_rms_fwd", "dan_rms_bwd")
    for op in ops + tuple(f"bias_act{act}_{d}" for act in (1, 2, 3) for d in ("fwd", "bwd")):
        for dtype in ("fp16", "bf16", "fp32"):
            for n in (768, 1024, 2048, 4096, 8192, 16384):
                assert (op, dtype, n) in seen, (op, dtype, n)
    # norm_dropout: the RMSNorm-without-ReLU corner of layer_norm_dropout_relu's kernels (tools.triton_resources'
    # ND_TABLE), 3-chunk, single-block, widest single-block and looped / chunked rows
    for op in ("nd_rms_fwd", "nd_rms_bwd"):
        for dtype in ("bf16", "fp32"):
            for n in (768, 1024, 8192, 16384):
                assert (op, dtype, n) in seen, (op, dtype, n)
    # gated_act (tools.triton_resources' GATED_TABLE): SwiGLU and GeGLU, both layouts, bf16 and fp32, every N
    for act in (3, 1):
        for layout in ("", "_packed"):
            for d in ("fwd", "bwd"):
                for dtype in ("bf16", "fp32"):
                    for n in (768, 1024, 2048, 4096, 8192, 16384):
                        assert (f"gated_act{act}{layout}_{d}", dtype, n) in seen, (act, layout, d, dtype, n)
    assert all(r["regs"] > 0 for r in rows)


def test_no_spills_and_shared_memory_within_the_sm90_limit(gate):
    doc, rc, err = gate
    rows = doc["rows"]
    spilling = [(r["op"], r["dtype"], r["n"], r["kernel"], r["spills"]) for r in rows if r["spills"]]
    assert not spilling
    assert max(r["shared"] for r in rows) <= 227 * 1024
    assert all(r["blocks_per_sm"] >= 1 for r in rows)
    assert rc == 0 and not doc["failures"], err  # the gate's exit status: the table and the checks


def test_n8192_takes_the_fused_backward(gate):
    rows = gate[0]["rows"]
    for op, prefix in (("ldr_bwd", "nd"), ("dan_bwd", "dan"), ("dan_rms_bwd", "dan"), ("nd_rms_bwd", "nd")):
        for dtype in ("fp16", "bf16", "fp32") if op != "nd_rms_bwd" else ("bf16", "fp32"):
            kernels = [r["kernel"] for r in rows if r["op"] == op and r["dtype"] == dtype and r["n"] == 8192]
            assert any(k.startswith(f"{prefix}_bwd_fused_kernel") for k in kernels), kernels
            assert not any(k.startswith(f"{prefix}_bwd_row_coef_kernel") for k in kernels), kernels


def test_persistent_grids_fill_their_waves(gate):
    """The grid of each persistent kernel (SMs x programs per SM from the compiled kernel's registers, warps and
    shared memory, which the launchers take through their `facts` hook here) fits what the compiled kernel allows
    on an SM, or fills two waves of it (the 2-D grids whose one wave would leave slots idle); the 1-D grids
    (M = 16384 rows: more tiles than programs) fill it exactly. The launchers' rule
    and the gate's occupancy model agree on every compiled variant."""
    rows = gate[0]["rows"]
    checked = 0
    for r in rows:
        assert r["launcher_blocks_per_sm"] == r["blocks_per_sm"], r
        name = r["kernel"].split("[")[0]
        if name in PERSISTENT:
            per_sm, fit = r["programs_per_sm"], r["blocks_per_sm"]
            # one wave, or two full ones (common.column_groups: where one wave would leave > 3 % of it idle)
            assert per_sm <= fit or (per_sm <= 2 * fit and per_sm / (2 * fit) >= 0.97), r
            if name in ONE_AXIS:
                assert r["programs_per_sm"] == r["blocks_per_sm"], r
            checked += 1
    # dtypes x (forward N <= 8192, backward fused or chunk, bias-ReLU; dropout_add_norm's two norms, the same)
    assert checked >= 3 * (5 + 6 + 6) + 3 * 2 * (5 + 6)


def test_unhinted_launches_compile_without_spills(gate):
    """Without a GPU the kernels only ever run under the interpreter, which accepts code the compiler rejects. The
    launches of the real launchers (single-block and looped paths, fp16/bf16/fp32/fp64, 8-lane and generic RNG,
    no affine, p = 0, 3-chunk rows, bias-ReLU) compile for sm_90 without alignment hints and use no stack (no
    spills)."""
    unhinted = gate[0]["unhinted"]
    assert len(unhinted) >= 22 + 10 + 8
    bad = [r for r in unhinted if r["spills"] or r["stack"]]
    assert not bad, bad
    assert {r["kernel"].split("[")[0] for r in unhinted} == KERNELS - WIDE
    assert {r["dtype"] for r in unhinted} == {"fp16", "bf16", "fp32", "fp64"}


def test_inductor_sees_only_output_stores(gate):
    """Inductor's TTIR mutation analysis finds exactly the output pointers written by each of the 17 kernels (and
    by gated_act's in its one-tensor layout: grad_gate alone)."""
    inductor = gate[0]["inductor"]
    assert {r["kernel"] for r in inductor} == KERNELS | PACKED_ANALYSIS
    for r in inductor:
        assert r["written"] == r["expected"], r


def test_kernels_compile_with_inductor_typed_float_arguments(gate):
    """Inductor types a Python float argument of a user kernel fp64 where a plain launch types it fp32: the
    kernels with float arguments (the forward kernels' eps) compile both ways (seen failing on an H200 under
    torch.compile before the kernels converted eps to their accumulation dtype)."""
    floats = gate[0]["fp64_floats"]
    assert {r["kernel"] for r in floats} == {
        "nd_fwd_fused_kernel",
        "nd_fwd_looped_kernel",
        "dan_fwd_fused_kernel",
        "dan_fwd_looped_kernel",
    }
    for r in floats:
        assert r["float_args"] == ["eps_hi", "eps_lo"] and r["error"] is None, r


STORE_CHECK = r"""
import sys
from tools import triton_resources as TR

class Kernel:
    __name__ = "k"
    cache_key = "source-hash"

calls = []
TR._compile_now = lambda job: calls.append(job) or (40, 0, 0, 0, 0, 4, b"cubin", "k")
job = (Kernel(), {"x": "*fp32"}, {(1,): 128}, {}, {"flags": frozenset("abcdefgh")})
other = (Kernel(), {"x": "*fp32"}, {(1,): 256}, {}, {"flags": frozenset("abcdefgh")})
assert TR._store_path(job) is None and TR._compile(job) == TR._compile(job) and len(calls) == 2  # no store
TR.os.environ[TR.STORE_ENV] = sys.argv[1]
first = TR._compile(job)
assert TR._compile(job) == first and len(calls) == 3, calls  # the second from the store
assert TR._store_path(other) != TR._store_path(job)
print(TR._store_path(job))
"""


# the environment less a store the suite keeps (scripts/run_tests.sh): the check names its own
STORELESS_ENV = {k: v for k, v in os.environ.items() if k != "GPUOPT_TRITON_STORE"}


def test_compile_store_returns_a_result_once_compiled(tmp_path):
    """$GPUOPT_TRITON_STORE: a job compiles once per store; another constexpr is another entry; the path does not
    depend on the process's set ordering (two processes with different hash seeds name the same file)."""
    paths = set()
    for seed in ("1", "2"):
        res = subprocess.run(
            [sys.executable, "-c", STORE_CHECK, str(tmp_path / seed)],
            cwd=ROOT,
            env={**STORELESS_ENV, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        paths.add(Path(res.stdout.strip()).name)
    assert len(paths) == 1

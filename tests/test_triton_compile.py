"""The Triton kernels compiled for sm_90 without a GPU (benchmarks/triton_resources.py), as a CI gate.

The script runs the project's launchers on meta tensors with the launch replaced by triton.compile for
GPUTarget("cuda", 90, 32) (bundled ptxas), with the specialization a real launch gets (16-byte pointer
alignment, divisibility hints). Checked here over fp16/bf16/fp32 x N in {768, ..., 16384}, forward, backward and
bias-ReLU: no spills, shared memory within 227 KiB, N = 8192 takes the fused backward, and the persistent
backward grids never ask for more programs per SM than the compiled registers allow (one wave). Runs in a
subprocess: the kernels must be decorated without TRITON_INTERPRET (conftest sets it for the other tests).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

ROOT = Path(__file__).resolve().parent.parent
PERSISTENT = ("ldr_bwd_fused_kernel", "ldr_bwd_chunk_kernel", "bias_relu_bwd_kernel")


@pytest.fixture(scope="module")
def table():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-m", "benchmarks.triton_resources", "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-6000:]
    return json.loads(res.stdout), res.returncode, res.stderr


def test_table_covers_every_op_dtype_and_n(table):
    rows, _, _ = table
    seen = {(r["op"], r["dtype"], r["n"]) for r in rows}
    for op in ("ldr_fwd", "ldr_bwd", "bias_relu_fwd", "bias_relu_bwd"):
        for dtype in ("fp16", "bf16", "fp32"):
            for n in (768, 1024, 2048, 4096, 8192, 16384):
                assert (op, dtype, n) in seen, (op, dtype, n)
    assert all(r["regs"] > 0 for r in rows)


def test_no_spills_and_shared_memory_within_the_sm90_limit(table):
    rows, rc, err = table
    assert rc == 0, err
    spilling = [(r["op"], r["dtype"], r["n"], r["kernel"], r["spills"]) for r in rows if r["spills"]]
    assert not spilling
    assert max(r["shared"] for r in rows) <= 227 * 1024
    assert all(r["blocks_per_sm"] >= 1 for r in rows)


def test_n8192_takes_the_fused_backward(table):
    rows, _, _ = table
    for dtype in ("fp16", "bf16", "fp32"):
        kernels = [r["kernel"] for r in rows if r["op"] == "ldr_bwd" and r["dtype"] == dtype and r["n"] == 8192]
        assert any(k.startswith("ldr_bwd_fused_kernel") for k in kernels), kernels
        assert not any(k.startswith("ldr_bwd_row_coef_kernel") for k in kernels), kernels


def test_persistent_grids_are_one_wave(table):
    """The grid of each persistent kernel (SMs x programs per SM from the launcher's register budget) fits what
    the compiled registers/warps/shared memory allow on an SM, and fills at least one program per SM."""
    rows, _, _ = table
    checked = 0
    for r in rows:
        if r["kernel"].split("[")[0] in PERSISTENT:
            assert r["programs_per_sm"] <= r["blocks_per_sm"], r
            checked += 1
    assert checked >= 3 * 6 * 2

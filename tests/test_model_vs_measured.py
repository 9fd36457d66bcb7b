"""The performance model (tools/roofline.py) against every committed GPU measurement (docs/measurements/*.json).

For each measured row of a backend the model covers (CUDA, Triton), the model runs on the current build's kernels
at the measured shape, on the GPU the file names, with the copy bandwidth measured in that run as the yardstick,
and must land within MODEL_BOUND (0.10) of the measurement: of the kernel-time fraction where the file has it, else
of the eager wall-time fraction, to which the model adds the call's host time (roofline.host_time). Rows the model
does not reach are listed in KNOWN_OFF with the reason; a listed row that comes within the bound fails the test, so
the list only shrinks. The floors of tests/test_roofline.py gate the rows this test finds within the bound.
"""

import json
from pathlib import Path

import pytest

from tools import roofline as R

ROOT = Path(__file__).resolve().parent.parent
MEASUREMENTS = sorted((ROOT / "docs" / "measurements").glob("*.json"))
REQUIRED = {"gpu", "commit", "date", "versions", "copy_bytes_per_s", "source", "rows"}
ROW_FIELDS = {
    "op",
    "direction",
    "backend",
    "dtype",
    "n",
    "m",
    "kernel_us",
    "kernels",
    "replay_us",
    "eager_us",
    "host_us",
    "bytes",
    "kernel_frac",
    "replay_frac",
    "eager_frac",
    "model_frac",
}


def row_key(path_or_stem, c: dict) -> tuple:
    stem = Path(path_or_stem).stem
    return (stem, c["backend"], c["op"], c["direction"], c["dtype"], int(c["n"]))


def test_measurement_files_are_well_formed():
    """Every file has the fields benchmarks/gpu_measure.py writes, its CUDA and Triton rows name ops the model
    knows (tools.roofline.MEASURED_OPS), and each row has a measured fraction (kernel or eager)."""
    assert MEASUREMENTS, "no measurement files under docs/measurements/"
    for path in MEASUREMENTS:
        doc = json.loads(path.read_text())
        assert REQUIRED <= set(doc), (path.name, REQUIRED - set(doc))
        assert doc["copy_bytes_per_s"] > 1e11, path.name
        R.gpu_named(doc["gpu"])  # the model has a description of the GPU
        assert doc["rows"], path.name
        for r in doc["rows"]:
            assert ROW_FIELDS <= set(r), (path.name, ROW_FIELDS - set(r))
            assert r["direction"] in ("fwd", "bwd"), r
            assert r["op"] in R.MEASURED_OPS or r["backend"] not in ("cuda", "triton"), r
            assert r["kernel_frac"] is not None or r["eager_frac"] is not None, r
            for f in ("kernel_frac", "replay_frac", "eager_frac"):
                assert r[f] is None or 0 < r[f] <= 1.2, r


@pytest.fixture(scope="module")
def compared(roofline_run):
    """{file stem: the model beside each row}, from the one model run of the test process (tests/conftest.py's
    roofline_run, shared with tests/test_roofline.py)."""
    return {Path(f).stem: comps for f, comps in roofline_run["measured"].items()}


# Rows the model does not reach (|model - measured| > 0.10), each with its reason. Keys: (measurement file stem,
# backend, op as benchmarks/run.py names it, direction, dtype, N). The 2026-12-04 H200 file measured the kernels of
# f5132bd, the model reads the current build's; its eager figure is a wall time that includes host work and
# whatever the kernels did not show statically, so most reasons here name what a kernel-time measurement
# (benchmarks/gpu_measure.py: profiler kernel times, CUDA-graph replay) is to split.
H200_0 = "2026-12-04-h200-f5132bd"


def _rows(reason: str, backend: str, op: str, direction: str, cells) -> dict[tuple, str]:
    return {(H200_0, backend, op, direction, dtype, n): reason for dtype, n in cells}


_TRITON_FWD = (
    "Triton forward: the run's kernels came from triton 3.6, the model's from the triton installed here (3.8), "
    "which differ by up to 0.24 a row (docs/internals/performance_model.md); the measured wall fraction swings with "
    "N where the kernel code does "
    "not (bias-ReLU bf16 0.97 at N = 1024, 0.41 at 65536; LayerNorm-dropout-ReLU bf16 0.16 at 1024, 0.42 at 4096), "
    "which neither the kernel terms nor one host term a call follow; kernel time unmeasured"
)
_CUDA_BWD = (
    "CUDA backward wall time: the one host term a call (200 us, fitted) matches the LayerNorm-dropout-ReLU rows; "
    "dropout-add-norm, add-RMSNorm, bias-ReLU and bias-GELU backwards measured faster (0.47-0.92) than that term "
    "allows, and unevenly in N; host vs rows kernel vs column-sum pass unmeasured (review of the H200 run, Gap 3)"
)
_FP32_BIAS_ACT_FWD = (
    "CUDA bias-act forward fp32: measured 0.69-0.77 flat in N where bf16 reaches 0.89-0.95 on the same tiled "
    "kernel; the model finds it memory-bound (~117 KB in flight per SM, issue far under budget) and has no term "
    "that loses a quarter: unexplained (an ncu DRAM-throughput reading is the check)"
)
_WARP_ROW_1024 = (
    "one-warp-a-row forward at N = 1024: the chain term gives dropout-add-norm 0.69 (measured 0.88; add-RMSNorm "
    "0.96 at p = 0, where the model still walks the dropout code): the in-order walk puts dan's Philox on the "
    "critical path where the GPU overlaps it with the load wait (review, Gap 1); kernel times a kernel are to "
    "refit the chain"
)
_LDR_FWD_REWRITTEN = (
    "CUDA LayerNorm-dropout-ReLU forward: the rows kernel was rewritten after this run (30d8301, 3dd3bd4: the row "
    "loop software-pipelined, the x of the next rows in flight through a row's reductions, same bits); the run "
    "measured f5132bd's one-row-in-flight loop (0.50-0.61 in bf16), the model reads the new one (0.80-0.91): not "
    "the same kernel, so a new measurement (benchmarks/gpu_measure.py) decides"
)
_LOOPED_65536 = (
    "N = 65536, the looped forward (x read two or three times, the re-reads partly from L2 in the model): the model "
    "is issue-bound at 0.22-0.37 where the run measured 0.37-0.66; its instruction count takes both sides of every "
    "branch in the chunk loops (an upper bound)"
)
_LDR_BWD_4096 = (
    "CUDA LayerNorm-dropout-ReLU backward bf16 at N = 4096 measured 0.52, faster than at 1024 (0.33) and 16384 "
    "(0.39) with the same rows kernel and host path; the fitted host term, set by those, gives 0.30"
)


def _cells(bf16=(), fp32=()) -> list[tuple]:
    return [("bf16", n) for n in bf16] + [("fp32", n) for n in fp32]


ALL_N = (256, 1024, 4096, 16384, 65536)
KNOWN_OFF: dict[tuple, str] = {
    **_rows(_LDR_FWD_REWRITTEN, "cuda", "ldr", "fwd", _cells(bf16=(256, 1024, 4096, 16384), fp32=(256, 4096, 16384))),
    **_rows(_LOOPED_65536, "cuda", "ldr", "fwd", _cells(bf16=(65536,))),
    **_rows(_LDR_BWD_4096, "cuda", "ldr", "bwd", _cells(bf16=(4096,))),
    **_rows(_WARP_ROW_1024, "cuda", "dan_ln", "fwd", _cells(bf16=(1024,))),
    **_rows(_LOOPED_65536, "cuda", "dan_ln", "fwd", _cells(bf16=(65536,))),
    **_rows(_WARP_ROW_1024, "cuda", "add_rms", "fwd", _cells(bf16=(1024,))),
    **_rows(_LOOPED_65536, "cuda", "add_rms", "fwd", _cells(bf16=(65536,))),
    **_rows(_FP32_BIAS_ACT_FWD, "cuda", "bias_relu", "fwd", _cells(fp32=ALL_N)),
    **_rows(_FP32_BIAS_ACT_FWD, "cuda", "bias_gelu", "fwd", _cells(fp32=(256, 1024, 4096, 16384))),
    **_rows(_CUDA_BWD, "cuda", "bias_relu", "bwd", _cells(bf16=(256, 4096), fp32=(256, 1024, 4096, 16384))),
    **_rows(_CUDA_BWD, "cuda", "dan_ln", "bwd", _cells(bf16=(256, 1024, 4096, 65536), fp32=(256, 1024, 4096))),
    **_rows(
        _CUDA_BWD, "cuda", "add_rms", "bwd", _cells(bf16=(1024, 4096, 16384, 65536), fp32=(256, 1024, 4096, 16384))
    ),
    **_rows(_CUDA_BWD, "cuda", "bias_gelu", "bwd", _cells(bf16=(1024, 4096, 65536), fp32=(1024, 4096, 65536))),
    **_rows(_TRITON_FWD, "triton", "ldr", "fwd", _cells(bf16=ALL_N, fp32=ALL_N)),
    **_rows(_TRITON_FWD, "triton", "bias_relu", "fwd", _cells(bf16=(256, 1024, 16384, 65536), fp32=(256, 4096, 16384))),
    **_rows(_TRITON_FWD, "triton", "dan_ln", "fwd", _cells(bf16=(16384,), fp32=(256, 16384, 65536))),
    **_rows(_TRITON_FWD, "triton", "add_rms", "fwd", _cells(bf16=(16384,), fp32=(256, 1024, 16384, 65536))),
    **_rows(_TRITON_FWD, "triton", "bias_gelu", "fwd", _cells(bf16=(256, 1024, 4096, 16384), fp32=(256, 65536))),
}


def _off(compared) -> dict[tuple, dict]:
    return {
        row_key(stem, c): c
        for stem, comps in compared.items()
        for c in comps
        if c["model"] is not None and abs(c["delta"]) > R.MODEL_BOUND
    }


@pytest.mark.slow
def test_model_table(compared):
    """Prints the model beside every measured row (pytest -s shows it); rows of backends the model does not cover
    (peers) are listed as not modelled; every cuda and triton row has a model figure."""
    for stem, comps in compared.items():
        print(f"\n{stem}:\n" + R.measured_markdown(comps))
        skipped = sorted({(c["backend"], c["op"], c["direction"]) for c in comps if c["model"] is None})
        print(f"not modelled (peers): {skipped}")
        assert all(c["model"] is not None for c in comps if c["backend"] in ("cuda", "triton"))
        assert all(0 < c["model"] <= 1.2 for c in comps if c["model"] is not None)


@pytest.mark.slow
def test_model_within_bound_of_measurements(compared):
    """|model - measured| <= 0.10 for every modelled row, except the rows of KNOWN_OFF, which must still be off
    (or leave the list)."""
    off = _off(compared)
    new = [
        f"{k}: model {c['model']:.2f} vs measured {c['measured']:.2f} ({c['quantity']})"
        for k, c in off.items()
        if k not in KNOWN_OFF
    ]
    assert not new, f"{len(new)} rows off the measurements by > {R.MODEL_BOUND}:\n" + "\n".join(new)
    stems = set(compared)
    fixed = [k for k in KNOWN_OFF if k[0] in stems and k not in off]
    assert not fixed, (
        f"these rows are now within {R.MODEL_BOUND} of the measurement: remove them from KNOWN_OFF: {fixed}"
    )
    stale = [k for k in KNOWN_OFF if k[0] not in stems]
    assert not stale, f"KNOWN_OFF names measurement files that are not committed: {sorted({k[0] for k in stale})}"


def test_host_term_only_in_eager_figures():
    """The host term adds only what does not hide behind the benchmark's cache clear, and never to kernel time."""
    assert R.host_time("cuda", "fwd") == max(0.0, R.HOST_S[("cuda", "forward")] - R.HOST_HIDDEN_S)
    assert all(R.host_time(b, d) >= 0 for b, d in R.HOST_S)
    assert R.gpu_named("NVIDIA H200") is R.H200 and R.gpu_named("NVIDIA H100 80GB HBM3") is R.H100
    with pytest.raises(KeyError):
        R.gpu_named("NVIDIA A100-SXM4-80GB")

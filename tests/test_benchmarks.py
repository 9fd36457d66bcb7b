"""Smoke test of the benchmark tools on tiny CPU shapes (no timed asserts: only shapes of the output)."""

import csv
import math
from pathlib import Path

import pytest
import torch

from benchmarks import memory as BM
from benchmarks import run as BR

pytest.importorskip("matplotlib")


def read_rows(path):
    with open(path) as fh:
        lines = [ln for ln in fh if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def test_bytes_model():
    m, n = 3, 8
    assert BR.bytes_moved("ldr", "fwd", m, n, torch.float32) == 2 * m * n * 4 + 2 * n * 4 + 2 * m * 4
    assert BR.bytes_moved("ldr", "bwd", m, n, torch.bfloat16) == 3 * m * n * 2 + 4 * n * 2 + 2 * m * 4
    assert BR.bytes_moved("bias_relu", "fwd+bwd", m, n, torch.float32) == 5 * m * n * 4 + 2 * n * 4
    assert BR.bytes_moved("copy", "fwd", m, n, torch.float16) == 2 * m * n * 2
    assert BR.rows_for(1024, torch.float32, 1.0) == 128


@pytest.mark.slow  # fresh interpreters or external tools: CI runs it, the fast lane between edits does not
def test_quick_run_csv_and_plot(tmp_path):
    out = tmp_path / "bench"
    before = torch.get_num_threads()
    try:
        _quick_run(out)
    finally:
        torch.set_num_threads(before)
    _check_quick_run(tmp_path, out)


def _quick_run(out):
    BR.main(
        [
            "--device",
            "cpu",
            "--quick",
            "--ns",
            "256",
            "--mbytes",
            "0.25",
            "--providers",
            "cpu,eager,copy",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )


def _check_quick_run(tmp_path, out):
    path = out / "bench_cpu.csv"
    header = path.read_text().splitlines()
    for key in ("# device:", "# torch:", "# triton:", "# cuda:", "# date:"):
        assert any(line.startswith(key) for line in header), key
    rows = read_rows(path)
    assert set(BR.COLUMNS) <= set(rows[0].keys())
    # every op x 3 modes x 1 N, each with the cpu, eager and copy providers
    assert len(rows) == len(BR.OPS) * 3 * 1 * 3
    assert {r["provider"] for r in rows} == {"cpu", "eager", "copy"}
    assert {r["mode"] for r in rows} == {"fwd", "bwd", "fwd+bwd"}
    for r in rows:
        for k in ("ms_median", "ms_p20", "ms_p80", "gbps", "ratio_copy"):
            v = float(r[k])
            assert v > 0 and math.isfinite(v), (k, r)
        assert int(r["M"]) > 0 and int(r["N"]) == 256
        if r["provider"] != "copy":
            assert float(r["speedup_vs_eager"]) > 0
            assert r["speedup_vs_compile"] == ""  # compile did not run
    from benchmarks import plot as BP

    pngs = BP.plot(str(path), str(tmp_path / "png"))
    assert len(pngs) == len(BR.OPS) * 3  # one per op and mode
    for p in pngs:
        assert Path(p).is_file() and Path(p).stat().st_size > 1000


def test_time_budget_stops_cleanly(tmp_path):
    before = torch.get_num_threads()
    try:
        BR.main(["--device", "cpu", "--quick", "--time-budget", "0", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(before)
    text = (tmp_path / "bench_cpu.csv").read_text()
    assert "time budget of 0 s spent: ran 0 of" in text
    assert read_rows(tmp_path / "bench_cpu.csv") == []


def test_memory_saved_ratio():
    rows = BM.measure("cpu", m=64, n=256, dtypes=("fp32", "bf16"))
    ldr = [r for r in rows if r["op"] == "ldr"]
    assert len(ldr) == 2
    for r in ldr:
        assert r["fused_saved"] > 0 and r["saved_ratio"] <= BM.TARGET, r


def test_gpu_check_dry_run_lists_every_step(tmp_path):
    """benchmarks/gpu_check.sh (the GPU machine's one script) in dry-run mode: every step, in order, with its
    command and time limit, and nothing run."""
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    res = subprocess.run(
        ["bash", str(root / "benchmarks" / "gpu_check.sh"), str(tmp_path)],
        cwd=root,
        env={**os.environ, "GPU_CHECK_DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    summary = (tmp_path / "summary.txt").read_text()
    steps = [line.split()[0] for line in summary.splitlines()[1:] if " dry run " in line]
    assert steps == [
        "env",
        "build",
        "import",
        "resources",
        "tests",
        "san_memcheck",
        "san_racecheck",
        "san_initcheck",
        "memory",
        "measure",
        "ncu",
        "bench_compile",
        "plots",
    ], summary
    assert "setup.py build_ext --inplace" in summary and "-m tools.cuda_resources --json" in summary
    assert summary.count("tools/cuda_sanitize.py") == 3  # memcheck, racecheck, initcheck
    assert not (tmp_path / "build.log").exists()  # nothing ran


def test_gpu_check_dry_run_with_a_prebuilt_wheel(tmp_path):
    """With GPU_CHECK_WHEEL the GPU machine installs the carried wheel instead of building."""
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    wheel = tmp_path / "gpuopt-0.2.0-cp310-abi3-linux_x86_64.whl"
    res = subprocess.run(
        ["bash", str(root / "benchmarks" / "gpu_check.sh"), str(tmp_path / "out")],
        cwd=root,
        env={**os.environ, "GPU_CHECK_DRY_RUN": "1", "GPU_CHECK_WHEEL": str(wheel)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    steps = [line.split()[0] for line in summary.splitlines()[1:] if " dry run " in line]
    assert steps[:3] == ["env", "install", "import"], summary
    assert "build_ext" not in summary
    assert f"pip install --no-deps --no-index --upgrade --target {tmp_path / 'out' / 'site'} {wheel}" in summary


def test_host_cost_times_every_launcher():
    """benchmarks/host_cost.py: one row per op x direction, each launcher called and its kernels counted, the host
    time measured (positive) and the GPU time at copy speed from the op's ideal bytes."""
    pytest.importorskip("triton")
    from benchmarks import host_cost as HC

    rows = HC.measure([torch.float32], [256], mbytes=1.0, repeat=2, gbps=1000.0)
    assert [(r["op"], r["direction"]) for r in rows] == [
        (op, d) for op in ("layer_norm_dropout_relu", "dropout_add_norm", "bias_relu") for d in ("fwd", "bwd")
    ]
    m = (1 << 20) // (256 * 4)
    ideal = {"layer_norm_dropout_relu": (2, 3), "dropout_add_norm": (4, 5), "bias_relu": (2, 3)}
    for r in rows:
        assert r["launches"] >= 1 and r["host_us"] > 0, r
        k = ideal[r["op"]][r["direction"] == "bwd"]
        assert r["gpu_us_at_copy"] == pytest.approx(k * 4 * m * 256 / 1e6), r


def test_graph_timing_is_a_gpu_option(capsys):
    """--graphs (CUDA-graph replays, the kernels without the host's launch cost) is refused on the CPU, clearly."""
    from benchmarks import run as BR

    with pytest.raises(SystemExit):
        BR.parse_args(["--device", "cpu", "--graphs"])
    assert "--graphs times CUDA graphs: it needs --device cuda" in capsys.readouterr().err
    assert not BR.parse_args(["--device", "cpu"]).graphs

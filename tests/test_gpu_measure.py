"""benchmarks/gpu_measure.py and its measure_*.py modules, the prepared device run, on the CPU: its plan and time
budget, the arithmetic of its rows (fractions, profiler-event aggregation, ncu parsing), its files, and its
measuring loop as a CPU smoke run (the C++ CPU kernels; no kernel or replay times without a GPU)."""

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from benchmarks import gpu_measure as GM
from benchmarks import measure_machine as MM
from benchmarks import measure_ncu as MN
from benchmarks import measure_plan as MP
from benchmarks import measure_results as MR

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------------- the plan
def test_default_plan_covers_every_row_once_in_group_order():
    plan = MP.build_plan(peers=MP.PEER_BACKENDS)
    keys = [r.key for r in plan]
    assert len(keys) == len(set(keys))
    row_ops = tuple(o for o in MP.OPS if o not in MP.GATED_OPS)
    ours = [r for r in plan if r.op in row_ops]
    assert len(ours) == 6 * 2 * 2 * 2 * 6  # op x direction x backend x dtype x N
    assert {(r.op, r.direction, r.backend, r.dtype, r.n) for r in ours} == {
        (o, d, b, t, n) for o in row_ops for d in MP.DIRECTIONS for b in MP.BACKENDS for t in MP.DTYPES for n in MP.NS
    }
    # the gated ops at their own F: SwiGLU on two tensors at 4096 (the packed layout and other F when asked)
    assert MP.DEFAULT_OPS == (*row_ops, "gated_silu")
    gated = {(r.op, r.direction, r.backend, r.dtype, r.n) for r in plan if r.op in MP.GATED_OPS}
    assert gated == {("gated_silu", d, b, t, 4096) for d in MP.DIRECTIONS for b in MP.BACKENDS for t in MP.DTYPES}
    assert sum(r.op == "copy" for r in plan) == 12  # one yardstick per (dtype, N) group
    assert [(r.backend, r.n) for r in plan if r.op == "ln"] == [
        (p, n) for n in (1024, 4096, 16384) for p in MP.PEER_BACKENDS if n in MP.PEER_NS[p] for _ in MP.DIRECTIONS
    ]
    # Liger's SwiGLU beside the gated_silu rows, bf16
    assert [(r.backend, r.dtype, r.n, r.direction) for r in plan if r.op == "swiglu"] == [
        ("liger", "bf16", 4096, d) for d in MP.DIRECTIONS
    ]
    groups = [g for g, _ in MP.groups_of(plan)]
    assert groups[:6] == [("bf16", 1024), ("fp32", 1024), ("bf16", 4096), ("fp32", 4096), ("bf16", 16384),
                          ("fp32", 16384)]  # fmt: skip
    assert {n for _, n in groups[6:]} == {768, 2048, 8192}
    for r in plan:  # M x N = 2^26 (768 leaves a remainder, as in the model: M = 2^26 // N)
        assert r.m == (1 << 26) // r.n


def test_gated_plan_follows_its_own_f():
    """--gated-ns sets the gated ops' F (their groups join or add to the others'); without a gated op, no such
    group; the peers' SwiGLU only beside gated_silu rows."""
    plan = MP.build_plan(ops=("ldr", "gated_silu", "gated_silu_packed"), backends=("cuda",), dtypes=("bf16",),
                         ns=(1024,), peers=("liger",), gated_ns={op: (1024, 11008) for op in MP.GATED_OPS})  # fmt: skip
    assert [(r.op, r.n) for r in plan if r.direction == "fwd"] == [
        ("copy", 1024), ("ldr", 1024), ("gated_silu", 1024), ("gated_silu_packed", 1024), ("ln", 1024),
        ("copy", 11008), ("gated_silu", 11008), ("gated_silu_packed", 11008),
    ]  # fmt: skip
    assert {g for g, _ in MP.groups_of(MP.build_plan(ops=("ldr",), ns=(1024,)))} == {("bf16", 1024), ("fp32", 1024)}
    # Liger's SwiGLU at PEER_SWIGLU_NS (4096, 14336) where gated_silu runs
    plan = MP.build_plan(ops=("gated_silu",), dtypes=("bf16",), peers=("liger",), gated_ns={"gated_silu": (2048, 4096)})
    assert [(r.op, r.backend, r.n) for r in plan if r.backend == "liger"] == [("swiglu", "liger", 4096)] * 2
    a = GM.parse_args(["--gated-ns", "2048,28672", "--ops", "gated_silu_packed"])
    assert a.gated_ns == {op: (2048, 28672) for op in MP.GATED_OPS} and a.ops == ("gated_silu_packed",)


def test_ideal_bytes_are_the_models():
    from tools import roofline_gpuopt as G

    r = MP.Row("dan_ln", "bwd", "cuda", "bf16", 4096)
    assert MP.ideal_bytes(r) == G.ideal_bytes("dropout_add_norm", "backward", "bf16", 4096)
    # gated_act: gate, up in, out (3 tensors of M x F); grad_out, gate, up in, grad_gate, grad_up out (5); Liger's
    # SwiGLU is charged the same bytes
    m = (1 << 26) // 14336
    for op in ("gated_silu", "gated_silu_packed"):
        assert MP.ideal_bytes(MP.Row(op, "fwd", "cuda", "bf16", 14336)) == 3 * m * 14336 * 2
        assert MP.ideal_bytes(MP.Row(op, "bwd", "triton", "fp32", 14336)) == 5 * m * 14336 * 4
    assert MP.ideal_bytes(MP.Row("swiglu", "bwd", "liger", "bf16", 14336)) == 5 * m * 14336 * 2
    assert MR.new_record(MP.Row("swiglu", "fwd", "liger", "bf16", 4096))["model_op"] is None
    assert MR.new_record(MP.Row("gated_silu", "fwd", "cuda", "bf16", 4096))["model_op"] == "gated_act_silu"
    m = (1 << 26) // 1024
    assert MP.ideal_bytes(MP.Row("copy", "fwd", "torch", "fp32", 1024)) == 2 * m * 1024 * 4
    assert MP.ideal_bytes(MP.Row("ldr", "fwd", "triton", "bf16", 1024)) == 2 * m * 1024 * 2 + 2 * m * 4 + 2 * 1024 * 2


def test_row_phase_arithmetic():
    """Each phase's estimate is calls x the time of a call (bytes / bandwidth, at least the host time) plus the
    fixed costs the assumptions name."""
    a = MP.Assumptions(bandwidth=2e9, triton_bwd_bandwidth=1e9, host_s=0.0, flush_s=0.0, row_overhead_s=0.0,
                       capture_s=0.0, cache_load_s=0.5)  # fmt: skip
    row = MP.Row("bias_relu", "bwd", "triton", "fp32", 8192)
    t = MP.ideal_bytes(row) / 1e9  # a Triton backward at its own (measured slower) bandwidth
    cuda = MP.Row("bias_relu", "bwd", "cuda", "fp32", 8192)
    assert MP.call_seconds(cuda, a) == pytest.approx(MP.ideal_bytes(cuda) / 2e9)
    s = MP.row_seconds(row, a)
    assert s["profile"] == pytest.approx(MP.PROFILE_CALLS * t)
    assert s["replay"] == pytest.approx((1 + MP.REPLAY_TIMES) * MP.REPLAY_CALLS * t)
    assert s["eager"] == pytest.approx(5 * t + (MP.EAGER_WARMUP_MS + MP.EAGER_REP_MS) * 1e-3)
    assert s["warm"] == pytest.approx(2 * t + 3 * 0.5)  # 3 variants: backward at N >= 8192
    host_bound = MP.Assumptions(bandwidth=1e15, triton_bwd_bandwidth=1e15, host_s=1e-3)
    assert MP.call_seconds(row, host_bound) == 1e-3
    assert a.variants(MP.Row("ldr", "fwd", "cuda", "bf16", 1024)) == 0
    assert a.variants(MP.Row("ldr", "bwd", "triton", "bf16", 1024)) == 2
    assert a.variants(MP.Row("gated_silu", "bwd", "triton", "bf16", 14336)) == 1  # one kernel, no column sums
    assert a.variants(MP.Row("swiglu", "bwd", "liger", "bf16", 14336)) == 1


def test_compile_phase_spreads_variants_over_workers():
    a = MP.Assumptions(compile_s=2.0, worker_start_s=10.0)
    plan = MP.build_plan(ops=("ldr",), dtypes=("bf16",), ns=(1024, 16384))
    variants = sum(a.variants(r) for r in plan)
    assert variants == (1 + 2) + (1 + 3)
    assert MP.compile_phase_seconds(plan, 0, a) == variants * 2.0
    assert MP.compile_phase_seconds(plan, 4, a) == 10.0 + 2 * 2.0
    assert MP.compile_phase_seconds(MP.build_plan(backends=("cuda",)), 8, a) == 0.0


def test_default_plan_fits_the_budget():
    b = MP.budget(MP.build_plan(peers=MP.PEER_BACKENDS))
    assert b["total"] == pytest.approx(sum(b["phases"].values()))
    assert b["total"] <= MP.BUDGET_S
    assert b["phases"]["compile"] > 0 and b["variants"] > 0


def _dry_run(*args):
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_measure", "--dry-run", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _total(text):
    line = next(ln for ln in text.splitlines() if ln.startswith("total estimated "))
    return float(line.split()[2]), line


def test_dry_run_prints_a_plan_that_fits_300_s():
    """`python -m benchmarks.gpu_measure --dry-run` as CI runs it: every row listed, the phases, the verdict."""
    out = _dry_run()
    total, line = _total(out)
    assert total <= 300 and line.endswith("of budget 300 s: fits"), line
    for phase in ("startup", "compile", "warm", "profile", "eager", "replay", "groups", "write"):
        assert any(ln.split()[:1] == [phase] for ln in out.splitlines()), phase
    rows = [ln for ln in out.splitlines() if " N=" in ln and ln.strip()[:1].isdigit()]
    assert len(rows) == len(MP.build_plan(peers=MP.PEER_BACKENDS))
    assert any("ldr bwd triton fp32 N=16384" in ln for ln in rows)


def test_dry_run_trims_and_says_when_a_plan_does_not_fit():
    small, _ = _total(_dry_run("--ns", "1024", "--ops", "ldr", "--no-peers"))
    full, _ = _total(_dry_run())
    assert small < full / 4
    _, line = _total(_dry_run("--budget", "20"))
    assert line.endswith("of budget 20 s: DOES NOT FIT"), line


# ---------------------------------------------------------------------------------------------------- arithmetic
def test_fraction_of_copy():
    # a row moving 3 GB in 1 ms against a copy moving 2 GB in 0.5 ms: 3 TB/s over 4 TB/s
    assert MR.fraction(3_000_000_000, 1000.0, 2_000_000_000, 500.0) == pytest.approx(0.75)
    for args in ((1, None, 1, 1.0), (1, 1.0, 1, None), (1, 0.0, 1, 1.0), (1, 1.0, None, 1.0)):
        assert MR.fraction(*args) is None


def test_profiler_events_split_at_markers_and_aggregate_per_call():
    m = MP.MARKER + "(long)"
    events = [
        ("warm_up_noise", 0.0, 5.0),  # before the first marker: dropped
        (m, 1.0, 0.5),
        *[(k, 2.0 + i, d) for i, (k, d) in enumerate([("rows", 10.0), ("sum", 2.0)] * 3)],
        (m, 20.0, 0.5),
        ("copy", 21.0, 7.0),
        ("copy", 22.0, 9.0),
        (m, 30.0, 0.5),
        ("after", 31.0, 1.0),  # after the last marker: dropped
    ]
    chunks = MR.split_at_markers(list(reversed(events)))  # time order comes from the start times
    assert chunks == [[("rows", 10.0), ("sum", 2.0)] * 3, [("copy", 7.0), ("copy", 9.0)]]
    us, kernels = MR.aggregate_kernels(chunks[0], calls=3)
    assert us == pytest.approx(12.0)
    assert kernels == [{"name": "rows", "us": 10.0, "per_call": 1.0}, {"name": "sum", "us": 2.0, "per_call": 1.0}]
    # the same sequence every call: the median of the calls' sums, each launch position listed (a kernel launched
    # twice a call twice)
    seq = [("rows", 10.0), ("sum", 1.0), ("sum", 3.0), ("rows", 12.0), ("sum", 1.0), ("sum", 3.0), ("rows", 30.0),
           ("sum", 1.0), ("sum", 5.0)]  # fmt: skip
    us, kernels = MR.aggregate_kernels(seq, calls=3)
    assert us == pytest.approx(16.0)  # sums 14, 16, 36
    assert [(k["name"], k["us"]) for k in kernels] == [("rows", 12.0), ("sum", 1.0), ("sum", 3.0)]
    # calls that differ: per name, the median duration times its launches a call
    us, kernels = MR.aggregate_kernels([("a", 1.0), ("a", 3.0), ("a", 2.0), ("a", 2.0), ("b", 4.0)], calls=2)
    assert us == pytest.approx(2.0 * 2 + 4.0 * 0.5)
    assert [k["per_call"] for k in kernels] == [2.0, 0.5]
    assert MR.aggregate_kernels([], calls=20) == (None, [])


def _records():
    recs = []
    for op, kernel, replay, eager, host in (("copy", 100.0, 100.0, 110.0, 5.0), ("ldr", 80.0, 90.0, None, 30.0)):
        rec = MR.new_record(MP.Row(op, "fwd", "cuda" if op != "copy" else "torch", "bf16", 4096))
        rec.update(kernel_us=kernel, replay_us=replay, eager_us=eager, host_us=host)
        recs.append(rec)
    skipped = MR.new_record(MP.Row("ldr", "bwd", "cuda", "bf16", 4096))
    skipped["status"] = "skipped"
    return recs + [skipped]


def test_group_bookkeeping_fractions_and_status():
    recs = _records()
    MR.finish_group(recs)
    copy, ldr, skipped = recs
    assert copy["kernel_frac"] == pytest.approx(1.0) and copy["status"] == "measured"
    ratio = ldr["bytes"] / copy["bytes"]
    assert ldr["kernel_frac"] == pytest.approx(ratio * 100 / 80)
    assert ldr["replay_frac"] == pytest.approx(ratio * 100 / 90)
    assert ldr["eager_frac"] is None and ldr["status"] == "partial"  # no eager time
    assert skipped["status"] == "skipped" and skipped["kernel_frac"] is None
    assert MR.copy_bandwidth(recs) == pytest.approx(copy["bytes"] / 100e-6)


def test_measurement_file_schema_and_summary(tmp_path):
    recs = _records()
    MR.finish_group(recs)
    meta = {"gpu": "NVIDIA H200", "commit": "abc1234", "date": "2026-12-05", "versions": {"torch": "2.11"},
            "machine": {"sms": 132}, "notes": ["a note"]}  # fmt: skip
    doc = MR.document(meta, recs)
    stem = MR.output_stem(meta["date"], meta["gpu"], meta["commit"])
    assert stem == "2026-12-05-h200-abc1234"
    paths = MR.write_outputs(doc, [str(tmp_path / "a"), str(tmp_path / "b")], stem)
    assert sorted(Path(p).name for p in paths) == [stem + ".json", stem + ".json", stem + ".md", stem + ".md"]
    back = json.loads((tmp_path / "a" / (stem + ".json")).read_text())
    for key in ("gpu", "commit", "date", "versions", "copy_bytes_per_s", "rows"):
        assert key in back, key
    assert back["copy_bytes_per_s"] == pytest.approx(recs[0]["bytes"] / 100e-6)
    for row in back["rows"]:
        assert set(MR.ROW_FIELDS) <= set(row), set(MR.ROW_FIELDS) - set(row)
    md = (tmp_path / "b" / (stem + ".md")).read_text()
    assert md.startswith("# Measured on NVIDIA H200, 2026-12-05, commit abc1234")
    assert "| ldr | fwd | cuda | bf16 | 4096 | 80.0 |" in md and "note: a note" in md
    assert not list(tmp_path.glob("*/*.tmp"))


def test_gpu_names_in_file_names():
    assert MR.slug("NVIDIA H100 80GB HBM3") == "h100"
    assert MR.slug("NVIDIA H200") == "h200"
    assert MR.slug("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"
    assert MR.slug("CPU") == "cpu"


def test_ncu_raw_csv_parsing():
    text = "\n".join(
        [
            "==PROF== Connected to process 1",
            '"ID","Kernel Name","dram__throughput.avg.pct_of_peak_sustained_elapsed",'
            '"sm__warps_active.avg.pct_of_peak_sustained_active","smsp__inst_executed.sum",'
            '"lts__t_sector_hit_rate.pct","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
            '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
            '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",'
            '"smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"',
            '"","","%","%","inst","%","ratio","ratio","ratio","ratio"',
            '"0","ldr_forward_rows","61.5","48.2","1,048,576","12.5","9.5","0.5","1.25","0.1"',
            '"1","column_sum","30","90","2048","80","1","3","2","0.2"',
        ]
    )
    ks = MN.parse_ncu_csv(text, elements=1 << 20)
    assert [k["name"] for k in ks] == ["ldr_forward_rows", "column_sum"]
    k = ks[0]
    assert k["dram_throughput_pct"] == 61.5 and k["achieved_occupancy_pct"] == 48.2
    assert k["inst_executed"] == 1048576 and k["inst_per_element"] == 1.0 and k["l2_hit_rate_pct"] == 12.5
    assert [s["value"] for s in k["top_stalls"]] == [9.5, 1.25, 0.5]
    assert "long_scoreboard" in k["top_stalls"][0]["metric"]
    assert MN.parse_ncu_csv("==ERROR== ncu failed", elements=1) == []


def test_ncu_results_join_the_runs_file(tmp_path):
    """The ncu step adds its counters to the measurement file of the same run (key "ncu"), or writes one with no
    rows; the markdown gets a table of them."""
    meta = {"gpu": "NVIDIA H100 80GB HBM3", "commit": "abc1234", "date": "2026-12-05", "versions": {}}
    stem = MR.output_stem(meta["date"], meta["gpu"], meta["commit"])
    recs = _records()
    MR.finish_group(recs)
    MR.write_outputs(MR.document(meta, recs), [str(tmp_path / "run")], stem)
    kernel = {"name": "ldr_bwd_rows", "dram_throughput_pct": 52.0, "achieved_occupancy_pct": 40.0,
              "inst_executed": 2.0e8, "inst_per_element": 3.0, "l2_hit_rate_pct": 9.0, "duration": 1.0e5,
              "top_stalls": [{"metric": "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
                              "value": 7.5}]}  # fmt: skip
    results = [
        {"row": asdict(MN.NCU_TARGETS[1]), "status": "measured", "kernels": [kernel]},
        {"row": asdict(MN.NCU_TARGETS[4]), "status": "ncu exited 1: ERR_NVGPUCTRPERM", "kernels": []},
    ]
    MN.merge_ncu(results, meta, [str(tmp_path / "run"), str(tmp_path / "alone")], stem)
    joined = json.loads((tmp_path / "run" / (stem + ".json")).read_text())
    assert joined["ncu"] == results and len(joined["rows"]) == 3
    alone = json.loads((tmp_path / "alone" / (stem + ".json")).read_text())
    assert alone["ncu"] == results and alone["rows"] == [] and alone["copy_bytes_per_s"] is None
    md = (tmp_path / "run" / (stem + ".md")).read_text()
    assert "| ldr bwd cuda bf16 N=1024 | ldr_bwd_rows | 52.0 | 40.0 | 3.00 | 9.0 | long_scoreboard 7.50 |" in md
    assert "| ldr bwd triton bf16 N=4096 | ncu exited 1: ERR_NVGPUCTRPERM |" in md


def test_ncu_command_filters_the_range_and_keeps_the_clocks():
    cmd = MN.ncu_command("/usr/bin/ncu", 3)
    assert cmd[:3] == ["/usr/bin/ncu", "--clock-control", "none"]
    assert f"{MN.NCU_RANGE}/" in cmd and cmd[-2:] == ["--ncu-target", "3"]
    assert len(MN.NCU_TARGETS) == 6
    assert sum(t.backend == "triton" for t in MN.NCU_TARGETS) == 1


def test_attach_model_joins_on_the_models_row_names():
    recs = _records()
    peer = MR.new_record(MP.Row("ln", "fwd", "liger", "bf16", 4096))
    doc = {"rows": recs + [peer]}
    seen = []

    def estimate(rows):
        seen.extend(rows)
        return {("layer_norm_dropout_relu", "forward", "cuda", "bf16", 4096): 0.9}

    assert GM.attach_model(doc, estimate) == 1
    assert recs[1]["model_frac"] == 0.9 and recs[2]["model_frac"] is None  # bwd: no estimate given
    assert recs[0]["model_frac"] is None and peer["model_frac"] is None  # the copy and the peers have no model row
    assert {r["op"] for r in seen} == {"ldr"}
    assert GM.model_gpu("NVIDIA H200").name == "H200" and GM.model_gpu("NVIDIA H100 80GB HBM3").name.startswith("H100")


def test_clock_and_group_fit():
    now = [100.0]
    clock = GM.Clock(300.0, 3.0, now=lambda: now[0])
    assert clock.left() == pytest.approx(297.0)
    now[0] = 250.0
    assert clock.elapsed() == pytest.approx(150.0) and clock.left() == pytest.approx(147.0)
    assert GM.fits(100.0, 1.0, clock) and not GM.fits(100.0, 1.5, clock)
    assert GM.fits(140.0, 0.5, clock)  # a scale under 1 never shrinks the estimate


def test_the_wheel_is_unpacked_first_on_sys_path(tmp_path, monkeypatch):
    import zipfile

    wheel = tmp_path / "gpuopt-0.0.0-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("gpuopt_probe_pkg/__init__.py", "WHERE = 'wheel'\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    d = MM.unpack_wheel(str(wheel))
    assert sys.path[0] == d and (Path(d) / "gpuopt_probe_pkg" / "__init__.py").read_text() == "WHERE = 'wheel'\n"


def test_child_processes_find_the_wheel_before_the_checkout():
    env = MM.child_env("/tmp/wheel", {"PYTHONPATH": "/site:" + str(ROOT)})
    assert env["PYTHONPATH"].split(os.pathsep) == ["/tmp/wheel", "/site", str(ROOT)]
    assert env["PYTHONSAFEPATH"] == "1"
    assert MM.child_env(None, {})["PYTHONPATH"] == str(ROOT)


# ---------------------------------------------------------------------------------------------------- the loop
def test_cpu_smoke_run_writes_every_row(tmp_path):
    """The measuring loop end to end on the C++ CPU kernels at tiny shapes: every planned row in the file, eager
    and host times measured, fractions against the group's copy; no kernel or replay times without a GPU."""
    pytest.importorskip("gpuopt_ops")
    rc = GM.main(["--device", "cpu", "--elements", "4096", "--ns", "256", "--dtypes", "fp32", "--ops",
                  "ldr,dan_ln,bias_relu", "--out-dir", str(tmp_path), "--commit", "abc1234"])  # fmt: skip
    assert rc == 0
    (path,) = tmp_path.glob("*-cpu-abc1234.json")
    doc = json.loads(path.read_text())
    assert doc["gpu"] == "CPU" and doc["commit"] == "abc1234" and doc["versions"]["torch"]
    rows = doc["rows"]
    assert [(r["op"], r["direction"]) for r in rows] == [("copy", "fwd")] + [
        (op, d) for op in ("ldr", "dan_ln", "bias_relu") for d in ("fwd", "bwd")
    ]
    for r in rows:
        assert r["m"] == 16 and r["n"] == 256 and r["backend"] in ("cpu", "torch")
        assert r["eager_us"] > 0 and r["host_us"] > 0 and r["eager_frac"] > 0, r
        assert r["kernel_us"] is None and r["replay_us"] is None and r["status"] == "partial", r
    assert (tmp_path / path.name.replace(".json", ".md")).is_file()


def test_cpu_smoke_run_of_the_gated_rows(tmp_path):
    """The gated rows through the same loop on the CPU kernels: both layouts (the packed one's (M, 2F) input made
    once a group), at --gated-ns, timed against the group's copy."""
    pytest.importorskip("gpuopt_ops")
    args = ["--device", "cpu", "--elements", "4096", "--ns", "128", "--gated-ns", "128", "--dtypes", "fp32"]
    rc = GM.main([*args, "--ops", "gated_silu,gated_silu_packed", "--out-dir", str(tmp_path), "--commit", "abc1234"])
    assert rc == 0
    (path,) = tmp_path.glob("*-cpu-abc1234.json")
    rows = json.loads(path.read_text())["rows"]
    assert [(r["op"], r["direction"], r["n"]) for r in rows] == [("copy", "fwd", 128)] + [
        (op, d, 128) for op in ("gated_silu", "gated_silu_packed") for d in ("fwd", "bwd")
    ]
    for r in rows:
        assert r["m"] == 32 and r["eager_us"] > 0 and r["host_us"] > 0 and r["eager_frac"] > 0, r
        assert r["status"] == "partial" and not r["notes"], r
    assert [r["model_op"] for r in rows[1:]] == ["gated_act_silu"] * 2 + ["gated_act_silu_packed"] * 2


def test_a_spent_budget_skips_rows_and_still_writes_the_file(tmp_path):
    rc = GM.main(["--device", "cpu", "--elements", "4096", "--ns", "256,512", "--dtypes", "fp32", "--ops", "ldr",
                  "--budget", "0", "--out-dir", str(tmp_path), "--commit", "abc1234"])  # fmt: skip
    assert rc == 0
    (path,) = tmp_path.glob("*.json")
    doc = json.loads(path.read_text())
    assert len(doc["rows"]) == 2 * 3 and {r["status"] for r in doc["rows"]} == {"skipped"}
    assert any("skipped" in note for note in doc["notes"])


# ---------------------------------------------------------------------------------------------------- gpu_check.sh
@pytest.mark.parametrize("measure_only", [False, True])
def test_gpu_check_dry_run_has_the_measure_step(tmp_path, measure_only):
    """benchmarks/gpu_check.sh's speed steps are this script (measure, then ncu), its dry run prints the plan's
    verdict; GPU_CHECK_MEASURE_ONLY=1 keeps only the set-up and speed steps."""
    env = {**os.environ, "GPU_CHECK_DRY_RUN": "1", "GPU_CHECK_COMMIT": "abc1234"}
    if measure_only:
        env["GPU_CHECK_MEASURE_ONLY"] = "1"
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    summary = (tmp_path / "summary.txt").read_text()
    steps = [ln.split()[0] for ln in summary.splitlines()[1:] if " dry run " in ln]
    assert steps[-4 if not measure_only else -2 :] == (
        ["measure", "ncu", "bench_compile", "plots"] if not measure_only else ["measure", "ncu"]
    ), summary
    if measure_only:
        assert steps == ["env", "build", "import", "measure", "ncu"], summary
    measure = next(ln for ln in summary.splitlines() if ln.startswith("measure "))
    assert "-m benchmarks.gpu_measure --budget" in measure and "--commit abc1234" in measure
    assert f"--out-dir {tmp_path / 'measurements'}" in measure and "docs/measurements" in measure
    assert "-m benchmarks.gpu_measure --ncu" in next(ln for ln in summary.splitlines() if ln.startswith("ncu "))
    plan = next(ln for ln in summary.splitlines() if ln.startswith("measure plan: "))
    assert plan.endswith(": fits"), plan
    assert not (tmp_path / "measurements").exists()  # nothing ran


@pytest.mark.slow  # fresh interpreters (about 90 s here): CI runs it, the fast lane between edits does not
def test_compile_workers_warm_the_triton_rows(tmp_path):
    """The compile workers (run before measuring so that Triton's compiles run side by side) on the CPU: each gets
    its share of the Triton rows, runs each call, logs it, and the run goes on to measure."""
    pytest.importorskip("gpuopt_ops")
    logs = tmp_path / "logs"
    rc = GM.main(["--device", "cpu", "--elements", "4096", "--ns", "256", "--dtypes", "fp32", "--ops", "bias_relu",
                  "--backends", "cpu,triton", "--compile-workers", "2", "--log-dir", str(logs), "--out-dir",
                  str(tmp_path / "out"), "--commit", "abc1234"])  # fmt: skip
    assert rc == 0
    specs = sorted(logs.glob("warm_*.json"))
    assert [len(json.loads(p.read_text())) for p in specs] == [1, 1]  # fwd and bwd of the one Triton row pair
    text = "".join(p.read_text() for p in sorted(logs.glob("warm_*.log")))
    assert "warm bias_relu fwd triton fp32 N=256" in text and "warm bias_relu bwd triton fp32 N=256" in text, text
    assert "failed" not in text, text
    (path,) = (tmp_path / "out").glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["compile_s"] > 0 and not doc["notes"], doc["notes"]
    assert {r["backend"] for r in doc["rows"]} == {"torch", "cpu", "triton"}
    assert all(r["eager_us"] for r in doc["rows"]), doc["rows"]

"""The performance model (tools/roofline.py): its arithmetic on SASS fixtures (tests/sass_fixtures), wave
efficiency, trip counts; then the gates on the built extension and the Triton kernels, and the calibration
against peers' published measurements."""

from pathlib import Path

import pytest

from tools import roofline as R
from tools import roofline_gpuopt as G
from tools import sass as S

FIXTURES = Path(__file__).resolve().parent / "sass_fixtures"
LOOPS = FIXTURES / "loops.sass"
M = 64 * 1024 * 1024  # elements


def copy_launch(grid: int, threads: int, **kw) -> R.KernelLaunch:
    """copy_f4 (a grid-stride loop copying one 16-byte float4 per iteration) over 64M fp32 elements."""
    per_thread = M / (grid * threads)
    return R.KernelLaunch(
        LOOPS,
        "copy_f4",
        (grid, 1, 1),
        (threads, 1, 1),
        elements=M,
        bytes=2 * M * 4,
        read_bytes=M * 4,
        trips=R.structural_trips(per_thread / 4),
        regs=16,
        shared=0,
        **kw,
    )


def test_wave_efficiency():
    # one full wave, evenly split: 1.0; 8 blocks past 132 x 6 slots run as a second wave of a full share each
    assert R.wave_efficiency((792, 1, 1), 6, 132)[0] == pytest.approx(1.0)
    eff, k = R.wave_efficiency((800, 1, 1), 6, 132)
    assert k == 6 and eff == pytest.approx((800 / 792) / 2)
    # a grid stride of 133 rows over 132 blocks: one block does two
    assert R.wave_efficiency((132, 1, 1), 1, 132, stride_units=133)[0] == pytest.approx((133 / 132) / 2)
    # a grid smaller than the SMs: the idle SMs are the latency bound's business, not a wave loss
    assert R.wave_efficiency((96, 1, 1), 2, 132) == (1.0, 1)
    # a 2-D tiled grid striding over axis 1
    eff, _ = R.wave_efficiency((4, 198, 1), 6, 132, stride_units=1000, stride_axis=1)
    assert eff == pytest.approx((1000 / 198) / 6)


def test_copy_kernel_reaches_copy_speed():
    """A full grid of 16-byte copies keeps 32 KB in flight per SM: DRAM-bound, only the launch cost lost."""
    est = R.estimate([copy_launch(132 * 8, 256)], 2 * M * 4, M)
    le = est.main
    assert le.bound == "memory" and le.blocks_per_sm == 8
    assert le.batch_bytes == 16 and le.bytes_in_flight_per_sm == 16 * 2048
    t_dram = 2 * M * 4 / R.H200.copy_bw
    # the three bounds combine as their p-norm (GPU.overlap): the issue and latency times, far under DRAM's, add
    # almost nothing
    assert le.t_dram == pytest.approx(t_dram)
    combined = R.combine([le.t_dram, le.t_issue, le.t_latency], R.H200.overlap)
    assert t_dram < combined < 1.001 * t_dram
    assert est.estimate == pytest.approx(t_dram / (combined + R.H200.launch_s))
    # instructions: the loop body x its trips, plus the code outside the loop once per thread
    fn = S.parse_sass(LOOPS.read_text())["copy_f4"]
    (loop,) = S.loops(fn)
    trips = M / (132 * 8 * 256) / 4
    assert le.instr_per_thread == pytest.approx(len(loop.body) * trips + len(fn.instrs) - len(loop.body))


def test_too_few_threads_is_latency_bound():
    """One 64-thread block per SM: 1 KB in flight per SM, far under Little's law's ~14 KB."""
    est = R.estimate([copy_launch(132, 64)], 2 * M * 4, M)
    assert est.main.bound == "latency" and est.main.bytes_in_flight_per_sm == 16 * 64
    # the cycle a wait: the memory latency, then the short chain of the copy (store, address arithmetic) to the
    # next load
    assert R.H200.latency_s < est.main.cycle_s < R.H200.latency_s + 0.2e-6
    need = R.latency_need(M * 4, 2 * M * 4, 1.0, cycle_s=est.main.cycle_s)
    assert est.estimate == pytest.approx((16 * 64) / need, rel=0.05)


def _code(*lines: str) -> list:
    return [S.parse_instr(16 * i, t) for i, t in enumerate(lines)]


def test_chain_after_loads():
    """The cycles from a load wait to the next load's issue: in order, one instruction a cycle, each no earlier
    than its sources are ready (RESULT_CYCLES after their producer)."""
    body = _code(
        "LDG.E.128 R4, desc[UR4][R2.64]",
        "FADD R8, R4, R5",  # the wait: ready at once, issues at its cycle
        "SHFL.BFLY PT, R9, R8, 0x1, 0x1f",  # FADD's result after 5 cycles
        "FADD R10, R9, R8",  # SHFL's after 24
        "STG.E [R2.64], R10",  # FADD's after 5
        "IADD3 R2, R2, 0x10, RZ",
    )
    # wait at cycle w: FADD at w, SHFL at w + 5, FADD at w + 29, STG at w + 34, IADD3 at w + 35; the loop comes
    # round to the LDG, which reads R2 (IADD3's, ready at w + 40): issued at w + 40
    assert R.chain_after_loads(body) == 40
    # straight-line code: the chain runs to the end (IADD3 issues at w + 35, the walk ends a cycle later)
    assert R.chain_after_loads(body, steady_state=False) == 36
    # independent work between the load and its first use overlaps the load: not part of the chain
    assert R.chain_after_loads(body[:1] + _code("IMAD R20, R21, R22, R23") * 3 + body[1:]) == 40


def test_combine_and_gpus():
    assert R.combine([3.0, 1.0, 0.0], float("inf")) == 3.0
    assert R.combine([1.0, 1.0], 2.0) == pytest.approx(2**0.5)
    assert R.combine([2.0, 1.0, 1.0], 6.0) == pytest.approx((64 + 1 + 1) ** (1 / 6))
    # the GPU descriptions: the H200's copy yardstick is the one measured in its run (3.9 TB/s), the H100's the
    # calibration's share of its peak; both carry the fitted terms
    assert R.H200.copy_bw == pytest.approx(3.9e12)
    assert R.H100.copy_bw == pytest.approx(0.87 * 3.35e12)
    for g in (R.H100, R.H200):
        assert (g.latency_s, g.chain_scale, g.overlap) == (R.FIT["latency_s"], R.FIT["chain_scale"], R.FIT["overlap"])


def test_trips_are_required_and_structural():
    with pytest.raises(ValueError, match="give trips"):
        R.estimate(
            [copy_launch(132, 256, stride_units=None).__class__(**{**copy_launch(132, 256).__dict__, "trips": None})],
            1,
            1,
        )
    # row_sums: the compiler versions the row loop (cols <= 0: a store-only copy, loop 0) around the one with
    # the column loop (loop 1, with loop 2 inside)
    fn = S.parse_sass(LOOPS.read_text())["row_sums"]
    lps = S.loops(fn)
    assert [(lp.depth, lp.parent) for lp in lps] == [(0, None), (0, None), (1, 1)]
    assert R.structural_trips(10, 7, split_unrolled=False)(lps) == {0: 10, 1: 10, 2: 7}
    with pytest.raises(ValueError, match="no trip count"):
        R.structural_trips(10, split_unrolled=False)(lps)


def test_gate_names_each_criterion():
    """The rows the review found (a partial second wave of the old rounded-up tiled grid: 800 blocks on 792
    slots; a backward at 167 instructions an element; 6 KB in flight) fail the gate, each criterion by name."""
    row = R.Row(
        "bias_relu", "forward", "cuda", "bf16", 4096, "k", 0.45, 6.5, 32.1, 14_000, 13_600, 6,
        R.wave_efficiency((16, 50, 1), 6, 132)[0], 1.0, "memory",
    )  # fmt: skip
    (wave,) = [f for f in R.gate_failures([row]) if "wave" in f]
    assert "0.5" in wave and len(R.gate_failures([row])) == 2  # and the estimate under 0.88
    # a row no measurement confirms: the floor (and the bytes in flight it needs) do not gate it, the wave does
    assert R.gate_failures([row], gated=set()) == [wave]
    assert len(R.gate_failures([row], gated={R.row_key(row)})) == 2
    bwd = R.Row(
        "layer_norm_dropout_relu", "backward", "cuda", "bf16", 4096, "k", 0.27, 167.0, 48.1, 6_271, 16_500, 2,
        0.985, 1.04, "issue",
    )  # fmt: skip
    fails = R.gate_failures([bwd])
    assert len(fails) == 3
    assert [any(w in f for f in fails) for w in ("estimate 0.270 < 0.82", "instructions/element", "in flight")] == [
        True
    ] * 3


def test_floor_gated_rows():
    """A row is floor-gated where a measurement of its backend, op, direction, dtype and N confirms the model's
    kernel time: within 0.10 of a kernel-time figure, or of an eager figure whose host time hides (CUDA forward);
    every row once the model is within 0.10 of every measured row."""
    rows = [
        R.Row(op, d, b, "bf16", 4096, "k", 0.9, 1, 30, 1, 1, 1, 1.0, 1.0, "memory")
        for op, d, b in (
            ("layer_norm_dropout_relu", "forward", "cuda"),
            ("bias_relu", "backward", "cuda"),
            ("bias_relu", "backward", "triton"),
        )
    ]

    def cmp(op, d, b, delta, quantity="eager"):
        return dict(backend=b, op=op, direction=d, dtype="bf16", n=4096, quantity=quantity, model=0.5, delta=delta)

    near = [
        cmp("ldr", "fwd", "cuda", 0.05),
        cmp("bias_relu", "bwd", "cuda", 0.05),
        cmp("bias_relu", "bwd", "triton", 0.3),
    ]
    # the CUDA backward's eager figure carries host time: it confirms nothing of the kernel
    assert R.floor_gated(rows, near) == {R.row_key(rows[0])}
    near[2] = cmp("bias_relu", "bwd", "triton", 0.3, "kernel")
    assert R.floor_gated(rows, near) == {R.row_key(rows[0])}
    near[2] = cmp("bias_relu", "bwd", "triton", -0.08, "kernel")
    assert R.floor_gated(rows, near) == {R.row_key(r) for r in rows}  # all within: every row


def test_budget_and_need_yardsticks():
    # bf16 forward moves 4 bytes an element: ~34 lane-instructions per element at 3.9 TB/s
    assert R.instruction_budget(4 * M, M) == pytest.approx(R.H200.issue_rate * 4 / R.H200.copy_bw)
    assert 33 < R.instruction_budget(4 * M, M) < 35
    # reads are half the bytes: 88 % of copy needs ~7.8 KB in flight per SM over the bare latency (0.6 us), ~39 KB
    # over a 3 us cycle (a row's loads, then its reductions and stores)
    assert 7_000 < R.latency_need(1, 2, 0.88) < 8_500
    assert 37_000 < R.latency_need(1, 2, 0.88, cycle_s=3e-6) < 41_000


# ---------------------------------------------------------------------------------------------------------------
# The gates, on the installed extension and the Triton kernels (one `python -m tools.roofline --json --measured`
# run: Triton compiles need a process without TRITON_INTERPRET, which conftest sets here). The floors gate the rows
# that the GPU measurements of docs/measurements/ confirm (tools.roofline.floor_gated; every row once the model is
# within 0.10 of every measured row, tests/test_model_vs_measured.py); the other criteria gate every row.
ROOT = Path(__file__).resolve().parent.parent
MEASUREMENTS = sorted((ROOT / "docs" / "measurements").glob("*.json"))


@pytest.fixture(scope="module")
def model(roofline_run):
    return roofline_run  # tests/conftest.py: one model run, shared with tests/test_model_vs_measured.py


# Rows the kernels do not reach yet, and why (docs/RESULTS.md has their estimates). The gate fails on any other
# row that misses a criterion, and on a listed row that meets them all: the list only shrinks. The floors gate only
# rows a GPU measurement confirms, so each row here is a shortfall both measured and modelled.
_ROW_LOOP = (
    "measured on the H200 (wheel of f5132bd) and modelled alike: the rows kernel keeps one row's loads in flight "
    "per block (~32 KB per SM) and then runs the row's dependent chain (two reductions, Philox, stores) before the "
    "next row's loads, a ~3 us cycle a row; the fix is the next row's loads before this row's reductions (issue 35, "
    "item 4). Measured / model: "
)
KNOWN_SHORT: dict[tuple, str] = {
    ("cuda", "dropout_add_norm", "forward", "bf16", 16384): _ROW_LOOP + "0.79 / 0.87 (x and residual in flight)",
    ("cuda", "dropout_add_rms_norm", "forward", "bf16", 16384): _ROW_LOOP + "0.90 (p = 0) / 0.87",
}
# Rows out of every gate, and why: printed by test_gate, not evaluated. The 11 Triton backward rows at N = 16384
# (two kernels reading x and grad_out twice; a wave efficiency of 0.86 on their chunk grid) left the gate with
# issue 35: the measured Triton backward is 0.12-0.34 at every N, so these rows are not where it is slow.
OUT_OF_GATE: dict[tuple, str] = {
    ("triton", op, "backward", dt, 16384): (
        "Triton backward at N = 16384: out of the gate (issue 35), the measured Triton backward is slow at every N"
    )
    for op in ("layer_norm_dropout_relu", *G.DAN_OPS)
    for dt in G.op_dtypes(op)
}


def _gated(model) -> set:
    return {tuple(k) for k in model["floor_gated"]}


def _failing(model, backend: str) -> dict[tuple, list[str]]:
    out: dict[tuple, list[str]] = {}
    for r in model["rows"]:
        if r["backend"] != backend or (r["backend"], r["op"], r["direction"], r["dtype"], r["N"]) in OUT_OF_GATE:
            continue
        bad = R.gate_failures([R.Row(**r)], _gated(model))
        if bad:
            out[(r["backend"], r["op"], r["direction"], r["dtype"], r["N"])] = bad
    return out


@pytest.mark.slow
def test_model_covers_every_case(model):
    keys = {(r["backend"], r["op"], r["direction"], r["dtype"], r["N"]) for r in model["rows"]}
    want = {
        (b, op, d, dt, n)
        for b in ("cuda", "triton")
        for op in ("layer_norm_dropout_relu", "bias_relu", "bias_act_gelu", "bias_act_gelu_tanh", "bias_act_silu")
        for d in ("forward", "backward")
        for dt in ("bf16", "fp16", "fp32")
        for n in (768, 1024, 2048, 4096, 8192, 12288, 16384)
    }
    # dropout_add_norm: CUDA and Triton rows, LayerNorm and RMSNorm with a residual; residual_in_fp32 for bf16
    want |= {
        (backend, op + sfx, d, dt, n)
        for backend in ("cuda", "triton")
        for op in ("dropout_add_norm", "dropout_add_rms_norm")
        for sfx, dts in (("", ("bf16", "fp16", "fp32")), ("_res32", ("bf16",)))
        for d in ("forward", "backward")
        for dt in dts
        for n in (768, 1024, 2048, 4096, 8192, 12288, 16384)
    }
    # norm_dropout: RMSNorm → dropout (weight only, no ReLU), on layer_norm_dropout_relu's kernels in both backends
    want |= {
        (backend, "rms_norm_dropout", d, dt, n)
        for backend in ("cuda", "triton")
        for d in ("forward", "backward")
        for dt in ("bf16", "fp16", "fp32")
        for n in (768, 1024, 2048, 4096, 8192, 12288, 16384)
    }
    # gated_act: SwiGLU (two tensors, the [gate | up] layout, with dropout), GeGLU; bf16, fp32; N = F
    want |= {
        (backend, op, d, dt, n)
        for backend in ("cuda", "triton")
        for op in ("gated_act_silu", "gated_act_silu_packed", "gated_act_gelu", "gated_act_silu_dropout")
        for d in ("forward", "backward")
        for dt in ("bf16", "fp32")
        for n in (2048, 4096, 11008, 14336, 28672)
    }
    assert keys == want
    for r in model["rows"]:
        assert 0 < r["estimate"] <= 1 and 0 < r["wave_efficiency"] <= 1 and r["bytes_ratio"] >= 0.99, r


@pytest.mark.slow
def test_sass_is_read_in_one_pass(model):
    """Every Triton cubin's SASS came from the one-pass disassembly (none fell back to a disassembler run of its
    own, about 0.3 s of CPU each), and its listing of the largest cubin matched `cuobjdump -sass`; so did the
    extension's kernels that the model reads, by name (the extension's whole sm_90 code through cuobjdump took
    half a minute), the largest checked against `cuobjdump -sass -fun`."""
    reads = model["sass_reads"]
    assert reads["cubins"] > 200 and reads["alone"] == 0 and reads["checked"], reads
    assert reads["named"] > 100 and reads["named_alone"] == 0 and "_kernel" in reads["named_checked"], reads


def test_kept_sass_is_read_once_a_store(tmp_path, monkeypatch):
    """The SASS the model reads is kept under $GPUOPT_TOOL_STORE by what it was read from: the same parts are read
    once and taken from the store after (counted in SASS_READS["kept"], with the counts of the read that stored
    them), other parts are read afresh."""
    try:
        S.find_nvdisasm(S.find_cuobjdump())  # the entry's name includes the disassembler's
    except S.ToolError as e:
        pytest.skip(str(e))
    monkeypatch.setenv("GPUOPT_TOOL_STORE", str(tmp_path))
    monkeypatch.setattr(R, "SASS_READS", dict.fromkeys(R.SASS_READS, 0) | {"named_checked": ""})
    calls = []

    def read():
        calls.append(1)
        return {"functions": {"f": S.Function("f", [])}, "named": 1, "named_checked": "f"}

    first = R._kept_reads("sass-named", [b"code", b"f"], read)
    again = R._kept_reads("sass-named", [b"code", b"f"], read)
    other = R._kept_reads("sass-named", [b"other code", b"f"], read)
    assert len(calls) == 2 and first == again == other and len(list(tmp_path.glob("sass-named-*.pkl"))) == 2
    assert R.SASS_READS["kept"] == 1 and R.SASS_READS["named"] == 3 and R.SASS_READS["named_checked"] == "f"


@pytest.mark.slow
# ids other than the bare backend names: conftest skips any test keyed `cuda` on a machine without a GPU
@pytest.mark.parametrize("backend", ["cuda", "triton"], ids=["cuda-kernels", "triton-kernels"])
def test_gate(model, backend):
    """Every row: no partial second wave (wave efficiency >= 0.95), instructions per element <= 0.85 x the issue
    budget. The rows a measurement confirms (floor_gated; the others are printed): the floor (LayerNorm-dropout-ReLU
    forward 0.88, backward 0.82; bias-ReLU 0.88; bias_act with gelu, gelu_tanh, silu forward 0.88, backward 0.82)
    and bytes in flight >= what the floor needs. Except the rows of KNOWN_SHORT, which must still miss (or leave
    the list)."""
    gated = _gated(model)
    ungated = [
        f"{r['backend']} {r['op']} {r['direction']} {r['dtype']} N={r['N']}: estimate {r['estimate']:.2f}"
        for r in model["rows"]
        if r["backend"] == backend and (r["backend"], r["op"], r["direction"], r["dtype"], r["N"]) not in gated
    ]
    print(f"\n{backend}: {len(ungated)} rows not gated by the floors (no measurement confirms them):")
    print("\n".join("  " + u for u in ungated))
    out = [k for k in OUT_OF_GATE if k[0] == backend]
    print(f"{backend}: {len(out)} rows out of every gate: " + "; ".join(f"{k}: {OUT_OF_GATE[k]}" for k in out))
    assert not set(OUT_OF_GATE) & set(KNOWN_SHORT)
    failing = _failing(model, backend)
    new = [f for key, fs in failing.items() if key not in KNOWN_SHORT for f in fs]
    assert not new, f"{len(new)} gate failures; python -m tools.roofline for the table:\n" + "\n".join(new)
    fixed = [key for key in KNOWN_SHORT if key[0] == backend and key not in failing]
    assert not fixed, f"these rows now pass every gate: remove them from KNOWN_SHORT: {fixed}"


# The gated MLP activation's targets (issue 37): forward >= 0.90, backward >= 0.85 of copy, every F of the model
# (2048 ... 28672, M x F = 64M), bf16 and fp32, both backends, on the estimates themselves. They are also its FLOORS
# (tools.roofline), which gate the rows a measurement confirms like every op's (floor_gated); no GPU has measured
# gated_act yet, so this test holds the targets on every gated row meanwhile. Rows the kernels do not reach yet are
# listed with the model's reason; a listed row that reaches its target fails the test: the list only shrinks.
GATED_TARGETS = {"forward": 0.90, "backward": 0.85}
GATED_SHORT: dict[tuple, str] = {}


def _gated_rows(model) -> list[dict]:
    return [r for r in model["rows"] if r["op"] in G.GATED_OPS]


@pytest.mark.slow
def test_gated_act_targets(model):
    """Every gated_act row's estimate reaches the issue's target (GATED_TARGETS, the same as its FLOORS), except
    those of GATED_SHORT, which must still miss; the rows are printed with their main kernel and bound."""
    rows = _gated_rows(model)
    assert {(r["op"], r["direction"]) for r in rows} == {(op, d) for op in G.GATED_OPS for d in G.DIRECTIONS}
    for d, target in GATED_TARGETS.items():
        assert all(R.FLOORS[(op, d)] == target for op in G.GATED_OPS)
    print("\ngated_act estimates (fraction of copy, H200):")
    short, fixed = [], []
    for r in rows:
        key = (r["backend"], r["op"], r["direction"], r["dtype"], r["N"])
        target = GATED_TARGETS[r["direction"]]
        print(f"  {key}: estimate {r['estimate']:.3f} (target {target}), {r['kernel']}, {r['bound']}-bound")
        if r["estimate"] < target and key not in GATED_SHORT:
            short.append(f"{key}: estimate {r['estimate']:.3f} < {target} ({r['kernel']}, {r['bound']}-bound)")
        if r["estimate"] >= target and key in GATED_SHORT:
            fixed.append(key)
    assert not short, f"{len(short)} gated rows under their target:\n" + "\n".join(short)
    assert not fixed, f"these rows now reach their target: remove them from GATED_SHORT: {fixed}"
    assert set(GATED_SHORT) <= {(r["backend"], r["op"], r["direction"], r["dtype"], r["N"]) for r in rows}


@pytest.mark.slow
def test_gated_peer_rows(model):
    """Liger's SwiGLU on the same model beside the gated_act_silu rows (printed; estimates of a peer, not gated)."""
    peers = model["peers"]
    assert {(p["peer"], p["op"], p["direction"], p["dtype"], p["N"]) for p in peers} == {
        ("liger_swiglu", "gated_act_silu", d, "bf16", n) for d in G.DIRECTIONS for n in R.PEER_NS
    }
    ours = {(r["backend"], r["direction"], r["dtype"], r["N"]): r["estimate"] for r in _gated_rows(model)
            if r["op"] == "gated_act_silu"}  # fmt: skip
    print("\nLiger's SwiGLU beside gated_act_silu (estimates):")
    for p in peers:
        assert 0 < p["estimate"] <= 1 and "_swiglu_" in p["kernel"], p
        k = (p["direction"], p["dtype"], p["N"])
        print(f"  {k}: liger {p['estimate']:.3f}, cuda {ours[('cuda', *k)]:.3f}, triton {ours[('triton', *k)]:.3f}")


@pytest.mark.slow
def test_calibration_against_published_measurements(model):
    """The model on peers' kernels lands within 0.15 of each published H100 figure and ranks them as measured."""
    cal = model["calibration"]
    assert {(c["kernel"], c["direction"]) for c in cal} == {
        ("liger", "forward"),
        ("liger", "backward"),
        ("torch", "forward"),
        ("torch", "backward"),
    }
    bad = R.calibration_failures(cal)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_floors_gate_measured_rows(model):
    """The floors are not a no-op: a measurement confirms some rows (or the model agrees with every measured row,
    and the floors gate all rows); the gated rows are rows of the table, and are printed."""
    gated = _gated(model)
    keys = {(r["backend"], r["op"], r["direction"], r["dtype"], r["N"]) for r in model["rows"]}
    assert MEASUREMENTS and gated, "no row is confirmed by a measurement: the floors gate nothing"
    assert gated <= keys
    print(f"\nthe floors gate {len(gated)} of {len(keys)} rows:")
    print("\n".join(f"  {k}" for k in sorted(gated)))

"""tools/sass.py on SASS fixtures (tests/sass_fixtures: the .cu sources, and their SASS as cuobjdump printed it for
sm_90; each .cu names the command that regenerates its .sass). No tool runs here except in the last test, which
reads the built extension with cuobjdump and is skipped without them."""

import glob
import os
from pathlib import Path

import pytest

from tools import sass as S
from tools.cuda_resources import ToolError, find_installed_extension

FIXTURES = Path(__file__).resolve().parent / "sass_fixtures"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lp() -> dict[str, S.Function]:
    return S.parse_sass((FIXTURES / "loops.sass").read_text())


@pytest.fixture(scope="module")
def bt() -> dict[str, S.Function]:
    return S.parse_sass((FIXTURES / "batching.sass").read_text())


def at(fn: S.Function, addr: int) -> S.Instr:
    return next(i for i in fn.instrs if i.addr == addr)


def test_functions_and_padding(lp):
    assert sorted(lp) == ["axpy_one", "copy_f4", "row_sums"]
    ax = lp["axpy_one"]
    assert len(ax.instrs) == 21  # 0x000 .. 0x140: the NOPs and the self-branch after EXIT are dropped
    assert ax.instrs[-1].text == "EXIT" and ax.instrs[-1].addr == 0x140
    assert all(i.base != "NOP" for f in lp.values() for i in f.instrs)


def test_instruction_fields(lp):
    cp = lp["copy_f4"]
    ld = at(cp, 0x1B0)  # LDG.E.128.CONSTANT R4, desc[UR6][R2.64]
    assert (ld.opcode, ld.base, ld.pred, ld.target) == ("LDG.E.128.CONSTANT", "LDG", None, None)
    assert ld.dsts == ("R4", "R5", "R6", "R7")
    assert set(ld.srcs) == {"UR6", "UR7", "R2", "R3"}
    st = at(cp, 0x260)  # STG.E.128 desc[UR6][R2.64], R4
    assert st.dsts == () and {"R4", "R5", "R6", "R7", "R2", "R3"} <= set(st.srcs)
    br = at(cp, 0x270)  # @!P0 BRA 0x190
    assert (br.text, br.pred, br.base, br.target, br.srcs) == ("@!P0 BRA 0x190", "@!P0", "BRA", 0x190, ("P0",))
    setp = at(cp, 0x220)  # ISETP.GE.AND.EX P0, PT, R13, UR11, PT, P0
    assert setp.dsts == ("P0",) and setp.srcs == ("R13", "UR11", "P0")
    add = at(cp, 0x1D0)  # IADD3 R8, P1, R8, UR8, RZ: the carry is a result
    assert add.dsts == ("R8", "P1") and add.srcs == ("R8", "UR8")
    wide = at(lp["axpy_one"], 0xD0)  # IMAD.WIDE R2, R9, 0x4, R2
    assert wide.dsts == ("R2", "R3") and wide.srcs == ("R9", "R2", "R3")


@pytest.mark.parametrize(
    "text, dsts, srcs",
    [
        ("LDG.E.64 R2, desc[UR4][R6.64+0x8]", ("R2", "R3"), ("UR4", "UR5", "R6", "R7")),
        ("@P1 LDS.128 R8, [R3+0x10]", ("R8", "R9", "R10", "R11"), ("R3", "P1")),
        ("DADD R4, R2, R6", ("R4", "R5"), ("R2", "R3", "R6", "R7")),
        ("SHFL.BFLY PT, R5, R4, 0x10, 0x1f", ("R5",), ("R4",)),
        ("LDC.64 R6, c[0x0][0x230]", ("R6", "R7"), ()),
        ("STS.64 [R5+0x8], R12", (), ("R5", "R12", "R13")),
        ("HADD2.F32 R19, -RZ, R20.reuse.H0_H0", ("R19",), ("R20",)),
        ("@!PT LDS RZ, [RZ]", (), ()),
        ("P2R R5, PR, RZ, 0x10", ("R5",), tuple(f"P{i}" for i in range(7))),
        ("BRA.DIV UR6, 0x1b850", (), ("UR6",)),
    ],
)
def test_operands(text, dsts, srcs):
    ins = S.parse_instr(0x10, text)
    assert ins.dsts == dsts and ins.srcs == srcs


def test_loops_and_nesting(lp):
    assert S.loops(lp["axpy_one"]) == []
    (copy,) = S.loops(lp["copy_f4"])
    assert (copy.head, copy.tail, copy.depth, copy.parent, len(copy.body)) == (0x190, 0x270, 0, None, 15)
    zero, outer, inner = S.loops(lp["row_sums"])  # cols <= 0: stores only; rows; columns inside rows
    assert [(x.index, x.head, x.tail, x.depth, x.parent) for x in (zero, outer, inner)] == [
        (0, 0xF0, 0x130, 0, None),
        (1, 0x160, 0x300, 0, None),
        (2, 0x200, 0x280, 1, 1),
    ]
    assert len(outer.body) == 27 and len(inner.body) == len(inner.own) == 9
    assert len(outer.own) == 18 and not {i.addr for i in outer.own} & {i.addr for i in inner.own}


def test_label_targets_match_addresses(lp):
    """The same cubin disassembled with label branch targets (`BRA `(.L_x_3)`) parses to the same code."""
    labelled = S.parse_sass((FIXTURES / "loops_labels.sass").read_text())
    assert sorted(labelled) == sorted(lp)
    for name, fn in lp.items():
        assert [(i.addr, i.opcode, i.dsts, i.srcs, i.target) for i in labelled[name].instrs] == [
            (i.addr, i.opcode, i.dsts, i.srcs, i.target) for i in fn.instrs
        ]
    assert [(x.head, x.tail) for x in S.loops(labelled["row_sums"])] == [(0xF0, 0x130), (0x160, 0x300), (0x200, 0x280)]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("LDG.E.128.CONSTANT R4, desc[UR6][R2.64]", ("global_load", 16)),
        ("LDG.E.U16.CONSTANT R0, desc[UR10][R8.64]", ("global_load", 2)),
        ("LDG.E.S8 R0, desc[UR10][R8.64]", ("global_load", 1)),
        ("STG.E.64 desc[UR4][R2.64], R6", ("global_store", 8)),
        ("STG.E desc[UR4][R6.64], R9", ("global_store", 4)),
        ("LDL R2, [R1+0x4]", ("local_load", 4)),
        ("STL.128 [R1], R4", ("local_store", 16)),
        ("LDS.64 R8, [R0+0x108]", ("shared_load", 8)),
        ("LDSM.16.M88.4 R4, [R2]", ("shared_load", 16)),
        ("STS.128 [R5+0x10], R16", ("shared_store", 16)),
        ("RED.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR4][R2.64], R5", ("global_atomic", 4)),
        ("ATOMG.E.ADD.STRONG.GPU PT, R3, desc[UR4][R2.64], R5", ("global_atomic", 4)),
        ("LDGSTS.E.BYPASS.LTC128B.128 [R5], desc[UR4][R2.64]", ("async_copy", 16)),
        ("LDC.64 R6, c[0x0][0x230]", ("const_load", 8)),
        ("FADD R4, R4, R5", None),
        ("ULDC.64 UR4, c[0x0][0x208]", None),
    ],
)
def test_mem_bytes(text, expected):
    assert S.mem_bytes(S.parse_instr(0, text)) == expected


def test_mem_summary(lp):
    (copy,) = S.loops(lp["copy_f4"])
    assert S.mem_summary(copy.own) == {
        "global_load": {"count": 1, "bytes": 16},
        "global_store": {"count": 1, "bytes": 16},
    }
    assert S.mem_summary(lp["axpy_one"].instrs)["global_load"] == {"count": 2, "bytes": 8}


def test_batches_prefetch_vs_immediate(bt, lp):
    (imm,) = S.loops(bt["sum_immediate"])
    (pre,) = S.loops(bt["sum_prefetch"])
    b_imm, b_pre = S.load_batches(imm.own), S.load_batches(pre.own)
    assert (b_imm.waits, b_imm.bytes) == (1, 16)  # LDG R4..R7, then FADD R4, R4, R5
    # two 16-byte loads a pass; the second (issued before the first one's data is used) overlaps the first
    assert (b_pre.waits, b_pre.bytes, b_pre.max_batch_bytes) == (1, 32, 32)
    assert b_pre.waits / b_pre.bytes < b_imm.waits / b_imm.bytes
    (copy,) = S.loops(lp["copy_f4"])
    assert S.load_batches(copy.own) == S.Batches(waits=1, bytes=16, first_batch_bytes=16, max_batch_bytes=16)
    # straight-line code: both loads issued before the FFMA that uses them
    straight = S.load_batches(lp["axpy_one"].instrs, steady_state=False)
    assert straight == S.Batches(waits=1, bytes=8, first_batch_bytes=8, max_batch_bytes=8)


def test_batches_steady_state():
    body = [
        S.parse_instr(16 * k, t)
        for k, t in enumerate(
            [
                "FADD R10, R4, R10",  # uses the load issued at the end of the previous iteration
                "LDG.E.64 R6, desc[UR4][R2.64+0x100]",
                "FADD R11, R6, R11",  # waits for the 8-byte load
                "LDG.E.128 R12, desc[UR4][R8.64]",
                "STG.E.128 desc[UR4][R8.64], R12",  # waits for the 16-byte load
                "LDG.E R4, desc[UR4][R2.64]",  # for the next iteration
            ]
        )
    ]
    # second walk: waits at 0x00 (the 4 bytes issued at the end of the first walk), 0x20 (8) and 0x40 (16)
    assert S.load_batches(body) == S.Batches(waits=3, bytes=28, first_batch_bytes=4, max_batch_bytes=16)
    # one walk: the FADD at 0x00 waits for nothing, the last load is not waited for
    assert S.load_batches(body, steady_state=False) == S.Batches(2, 28, 8, 16)
    # loads whose values are not used in the pass still complete once a pass
    assert S.load_batches([body[1], body[3]]) == S.Batches(1, 24, 24, 24)
    assert S.load_batches(body, kinds=("shared_load",)) == S.Batches(0, 0, 0, 0)
    copies = [
        S.parse_instr(0, "LDGSTS.E.BYPASS.LTC128B.128 [R5], desc[UR4][R2.64]"),
        S.parse_instr(0x10, "LDGSTS.E.BYPASS.LTC128B.128 [R5+0x800], desc[UR4][R2.64+0x10]"),
        S.parse_instr(0x20, "LDGDEPBAR"),
        S.parse_instr(0x30, "DEPBAR.LE SB0, 0x0"),
    ]
    assert S.load_batches(copies) == S.Batches(1, 32, 32, 32)


def test_dynamic_count(lp):
    fn = lp["row_sums"]
    loops = S.loops(fn)
    outside = len(fn.instrs) - sum(len(x.own) for x in loops)
    assert outside == 50 - (5 + 18 + 9)
    trips = {0: 5, 1: 3, 2: 7}
    assert S.dynamic_count(fn, trips) == outside + 5 * 5 + 18 * 3 + 9 * 3 * 7
    assert S.dynamic_count(fn, trips, loops) == S.dynamic_count(fn, trips)
    assert S.dynamic_count(lp["axpy_one"], {}) == 21
    with pytest.raises(KeyError, match=r"loop 2 \[0x200, 0x280\]"):
        S.dynamic_count(fn, {0: 1, 1: 1})


def _sass(name: str, lines: list[str]) -> str:
    body = "\n".join(f"        /*{a:04x}*/  {t} ;   /* 0x000 */" for a, t in enumerate_addrs(lines))
    return f"\t\tFunction : {name}\n{body}\n\t\t..........\n"


def enumerate_addrs(lines: list[str]) -> list[tuple[int, str]]:
    return [(16 * k, t) for k, t in enumerate(lines)]


def test_out_of_line_jump_back_is_not_a_loop():
    """A divergent shuffle's slow path after EXIT jumps back to where it left: no loop; a real loop stays."""
    text = _sass(
        "k",
        [
            "S2R R0, SR_TID.X",  # 0x00
            "BRA.DIV UR4, 0x70",  # 0x10 -> slow path
            "SHFL.BFLY PT, R1, R0, 0x1, 0x1f",  # 0x20
            "IADD3 R2, R2, 0x1, RZ",  # 0x30 join point; loop head
            "ISETP.GE.AND P0, PT, R2, 0x8, PT",  # 0x40
            "@!P0 BRA 0x30",  # 0x50 back edge
            "EXIT",  # 0x60
            "WARPSYNC.COLLECTIVE R3, 0x90",  # 0x70 slow path
            "SHFL.BFLY PT, R1, R0, 0x1, 0x1f",  # 0x80
            "BRA 0x30",  # 0x90 back to the join point
            "BRA 0xa0",  # 0xa0 padding
        ],
    )
    fn = S.parse_sass(text)["k"]
    assert fn.instrs[-1].addr == 0x90  # the self-branch is dropped
    assert S.back_edges(fn) == [(0x30, 0x50)]
    assert [(x.head, x.tail) for x in S.loops(fn)] == [(0x30, 0x50)]


def test_repeated_symbol():
    a = _sass("k", ["MOV R0, R1", "EXIT"])
    b = _sass("k", ["MOV R0, R2", "EXIT"])
    fns = S.parse_sass(a + a + b)
    assert sorted(fns) == ["k", "k#2"] and fns["k#2"].instrs[0].srcs == ("R2",)


def test_describe(lp):
    text = S.describe(lp["row_sums"])
    assert "loop 2 [0x0200, 0x0280] depth 1 parent 1: own 9 / body 9 instrs" in text


def _built_extension() -> Path:
    hits = glob.glob(str(ROOT / "build" / "lib*" / "gpuopt_ops" / "_C*.so"))
    if hits:
        return Path(max(hits, key=lambda p: Path(p).stat().st_mtime))
    return find_installed_extension()


def test_sass_of_built_extension():
    try:
        so = _built_extension()
        S.find_nvdisasm(S.find_cuobjdump())
    except ToolError as e:
        pytest.skip(f"needs cuobjdump, nvdisasm and the built CUDA extension: {e}")
    # bias_act_forward_kernel<__nv_bfloat16, __nv_bfloat16, true, 0> (bias_relu: act 0; the 16-byte vector path)
    name = "_ZN6gpuopt3dev23bias_act_forward_kernelI13__nv_bfloat16S2_Lb1ELi0EEEvNS0_13BiasActParamsIT_T0_EE"
    try:
        fns = S.sass_of(so, [name])
    except ToolError as e:
        if "functions not in" in str(e):
            pytest.skip(f"{so} has no CUDA kernels (a CPU-only build?): {e}")
        raise
    fn = fns[name]
    assert list(fns) == [name] and len(fn.instrs) > 100
    loops = S.loops(fn)
    assert len(loops) == 1 and loops[0].depth == 0  # the row loop: four rows' loads, then their math and stores
    summary = S.mem_summary(loops[0].own)
    assert summary["global_load"]["bytes"] > 0 and summary["global_store"]["bytes"] > 0
    assert any(i.opcode.startswith("LDG.E.128") for i in fn.instrs)
    with pytest.raises(ToolError, match="no_such_kernel"):
        S.sass_of(so, ["no_such_kernel"])


def _gated_name(direction: str, drop: bool) -> str:
    """gated_act_{direction}_kernel<__nv_bfloat16, 3 (silu), true (16-byte vectors), drop> (mangled)."""
    kernel, params = f"gated_act_{direction}_kernel", f"Gated{direction.capitalize()}Params"
    return f"_ZN6gpuopt3dev{len(kernel)}{kernel}I13__nv_bfloat16Li3ELb1ELb{int(drop)}EEEvNS0_{len(params)}{params}IT_EE"


def test_gated_act_sass_of_built_extension():
    """gated_act's 16-byte bf16 kernels (gated_act_kernels.cuh): one grid-stride loop whose two groups a thread
    load all at once (one wait a pass: gate and up, 64 bytes; with grad_out 96) and store as 16-byte vectors; the
    p = 0 instances carry no Philox code (its multiplier 0xD2511F53 nowhere), the dropout ones do."""
    try:
        so = _built_extension()
        S.find_nvdisasm(S.find_cuobjdump())
    except ToolError as e:
        pytest.skip(f"needs cuobjdump, nvdisasm and the built CUDA extension: {e}")
    names = {(d, drop): _gated_name(d, drop) for d in ("forward", "backward") for drop in (False, True)}
    try:
        fns = S.sass_of(so, list(names.values()))
    except ToolError as e:
        if "functions not in" in str(e):
            pytest.skip(f"{so} has no gated_act CUDA kernels (a CPU-only build?): {e}")
        raise
    for (direction, drop), name in names.items():
        fn = fns[name]
        (loop,) = S.loops(fn)
        loads = 64 if direction == "forward" else 96
        assert S.load_batches(loop.own) == S.Batches(1, loads, loads, loads), (direction, drop)
        summary = S.mem_summary(loop.own)
        stores = 2 if direction == "forward" else 4  # out; grad_gate and grad_up: a 16-byte vector a group each
        assert summary["global_load"]["count"] == loads // 16
        assert summary["global_store"] == {"count": stores, "bytes": 16 * stores}
        philox = any("0x2daee0ad" in i.text.lower() or "0xd2511f53" in i.text.lower() for i in fn.instrs)
        assert philox == drop, (direction, drop)


def _built_cubin(kernel: str, workdir: Path) -> Path:
    """The built extension's sm_90 cubin that holds `kernel`, extracted into workdir; skips the test where there is
    no CUDA build or no cuobjdump / nvdisasm."""
    try:
        so = _built_extension()
        S.find_nvdisasm(S.find_cuobjdump())
        cubins = S.extract_cubins(so, "sm_90", kernel, workdir)
    except ToolError as e:
        pytest.skip(f"needs cuobjdump, nvdisasm and the built CUDA extension: {e}")
    if not cubins:
        pytest.skip(f"{so} has no sm_90 CUDA kernels (a CPU-only build?)")
    (cubin,) = cubins
    return cubin


@pytest.mark.slow  # runs cuobjdump over a built cubin (an external tool, ~8 s; the fast lane skips it)
def test_one_pass_disassembly_matches_cuobjdump(tmp_path):
    """sass_of_cubins (one raw-instruction pass of the disassembler for many cubins, the performance model's way
    of reading Triton's cubins) gives every function of the built extension's dropout-add-norm forward cubin, and
    a sample of them (every twelfth, and the first of each kernel template) has the instructions of `cuobjdump
    -sass` on that cubin: the branch, convergence and return targets that raw mode prints as stream addresses
    included. (cuobjdump runs the disassembler once a function, ~0.3 s each: the whole cubin took 27 s.)"""
    cubin = _built_cubin("dan_forward_rows_kernel", tmp_path)
    alone: list[int] = []
    (batched,) = S.sass_of_cubins([cubin.read_bytes()], alone=alone)
    first = {n.split("I")[0]: n for n in reversed(list(batched))}  # a kernel template's first instance
    names = sorted(set(list(batched)[::12]) | set(first.values()))
    ref = S.sass_of(cubin, names)
    assert alone == [] and len(batched) > 20 and len(first) >= 4 and set(names) == set(ref)
    assert all(batched[n].instrs == ref[n].instrs for n in ref)
    targets = {i.text.split()[0].split(".")[0] for n in ref for i in ref[n].instrs if i.target is not None}
    assert "BRA" in targets


@pytest.mark.slow  # runs cuobjdump over the extension (an external tool, ~5 s; the fast lane skips it)
def test_functions_read_by_name_match_cuobjdump():
    """sass_of_functions (the performance model's way of reading the extension's kernels: the named functions'
    code alone through one pass of the disassembler) gives the instructions of `cuobjdump -sass -fun` on the
    extension, for a kernel of each cubin and one that several cubins hold (column_sum_kernel); a name that is
    not there is a ToolError that names it."""
    try:
        so = _built_extension()
        S.find_nvdisasm(S.find_cuobjdump())
    except ToolError as e:
        pytest.skip(f"needs cuobjdump, nvdisasm and the built CUDA extension: {e}")
    names = [
        "_ZN6gpuopt3dev23bias_act_forward_kernelI13__nv_bfloat16S2_Lb1ELi0EEEvNS0_13BiasActParamsIT_T0_EE",
        _gated_name("backward", True),
        "_ZN6gpuopt3dev23nd_backward_rows_kernelI13__nv_bfloat16S2_fLb1ELb0ELi4EEEvNS0_16NdBackwardParamsIT_T0_T1_EE",
        "_ZN6gpuopt3dev24dan_backward_wide_kernelIffffLi4EEEvNS0_17DanBackwardParamsIT_T0_T1_T2_EE",
        "_ZN6gpuopt3dev17column_sum_kernelIffLi4EEEvNS0_15ColumnSumParamsIT_T0_EE",
    ]
    alone: list[str] = []
    try:
        got = S.sass_of_functions(so, names, alone=alone)
    except ToolError as e:
        if "functions not in" in str(e):
            pytest.skip(f"{so} has no CUDA kernels (a CPU-only build?): {e}")
        raise
    ref = S.sass_of(so, names)
    assert list(got) == names and alone == []
    assert all(got[n].instrs == ref[n].instrs and len(got[n].instrs) > 50 for n in names)
    with pytest.raises(ToolError, match="no_such_kernel"):
        S.sass_of_functions(so, [names[0], "no_such_kernel"])


@pytest.mark.slow  # runs the disassembler over a built cubin (an external tool, ~3 s; the fast lane skips it)
def test_one_pass_falls_back_to_a_run_a_cubin(tmp_path, monkeypatch):
    """A listing that is not one line per 16 bytes: sass_of_cubins reads every cubin on its own instead, and
    sass_of_functions every name (both through sass_of, which the tests above check against cuobjdump; here a
    stand-in records what it was asked)."""
    cubin = _built_cubin("bias_act_forward_kernel", tmp_path)
    blob = cubin.read_bytes()
    listed = S._instr_lines
    monkeypatch.setattr(S, "_instr_lines", lambda proc, what: listed(proc, what)[1:])
    asked = []

    def recorded(code, functions=None, arch="sm_90"):
        asked.append((code, functions))
        return {n: S.Function(n, []) for n in functions or ()}

    monkeypatch.setattr(S, "sass_of", recorded)
    alone: list = []
    (again,) = S.sass_of_cubins([blob], alone=alone)
    assert alone == [0] and asked == [(blob, None)] and again == {}
    name = "_ZN6gpuopt3dev23bias_act_forward_kernelIffLb1ELi0EEEvNS0_13BiasActParamsIT_T0_EE"
    alone, asked[:] = [], []
    got = S.sass_of_functions(cubin, [name], alone=alone)
    assert alone == [name] and asked == [(os.fspath(cubin), [name])] and list(got) == [name]

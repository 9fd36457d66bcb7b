"""Static facts about the SASS (machine code) of GPU kernels, read without a GPU:
`python -m tools.sass CODE [--fun SUBSTRING] [--arch sm_90]`.

CODE is an ELF with embedded cubins (a built extension `.so`, a `nvcc -c` object) or a `.cubin` file. Its SASS
comes from `cuobjdump -sass` (cuobjdump calls the CUDA disassembler `nvdisasm`, which is looked up on its own,
see find_nvdisasm). The facts, per function:

  instructions   parse_sass: each instruction line `/*addr*/ [@guard] OPCODE operands ;` becomes an Instr with its
                 opcode, the registers it writes (dsts) and reads (srcs), and its branch target. Branch targets
                 are printed either as addresses (`BRA 0x4b0`) or as labels (`BRA `(.L_x_12)` plus a `.L_x_12:`
                 line before the target); both resolve to a byte offset within the function. NOPs and the
                 self-branch after the final EXIT (padding) are dropped.
  loops          loops: every back edge (a BRA whose target is at or before its own address and dominates it in
                 the control-flow graph of basic blocks) closes a loop whose body is the address range
                 [target, branch]; back edges to the same head are one loop (tail = the last of them). Nesting
                 follows range containment; the `own` instructions of a loop are those whose innermost enclosing
                 loop it is. Compiled loops are laid out contiguously, so the address range is the natural loop
                 up to code moved out of line (slow paths after the final EXIT, which are not counted).
  memory         mem_bytes / mem_summary: memory instructions by kind with their bytes per thread, from the
                 opcode's width modifiers (.128 = 16 B, .64 = 8 B, .U16 = 2 B, .U8 = 1 B, default 4 B).
  load batching  load_batches: how many times per pass of a loop body a thread waits for its loads, and how
                 many bytes each wait covers (the memory-level parallelism that a latency bound needs).
  executed       dynamic_count: instructions executed per thread, given trip counts of the loops.

Everything is a model of the static code: predicated instructions count as executed, both sides of a branch
inside a loop body count, and the waits are found from register dependencies only (see load_batches).
"""

from __future__ import annotations

import argparse
import bisect
import glob
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Union

from tools.cuda_resources import ToolError, find_cuobjdump

EM_CUDA = 190  # e_machine of a cubin (an ELF of device code)
NVDISASM_PIP_PACKAGE = "nvidia-cuda-nvdisasm"


# ----------------------------------------------------------------------------------------------------------------
# Data model
@dataclass(frozen=True)
class Instr:
    """One SASS instruction of a function."""

    addr: int  # byte offset within the function
    text: str  # the instruction, guard included, without the trailing ';' and the /*addr*/ comment
    pred: Optional[str]  # guard like '@P0', '@!P1', '@!PT'; None when unguarded
    opcode: str  # full opcode with modifiers, e.g. 'LDG.E.128.CONSTANT'
    base: str  # the opcode's first component, e.g. 'LDG'
    dsts: tuple[str, ...]  # registers written (R, UR, P, UP), wide operands expanded (R4 of a .128 load: R4..R7)
    srcs: tuple[str, ...]  # registers read: operands, address registers, predicate operands and the guard
    target: Optional[int]  # branch target (BRA, CALL.REL), else None


@dataclass
class Function:
    """The SASS of one function as printed by cuobjdump."""

    name: str  # the symbol (mangled)
    instrs: list[Instr]


@dataclass
class Loop:
    """A loop of a function: the instructions of the address range [head, tail]."""

    index: int  # position in loops() order
    head: int  # address of the first instruction (the target of the back edge)
    tail: int  # address of the (last) backward branch
    depth: int  # 0 = outermost
    parent: Optional[int]  # index of the enclosing loop
    body: list[Instr]  # all instructions in [head, tail]
    own: list[Instr]  # body minus the instructions of the loops nested inside it


@dataclass
class Batches:
    """Load batching of an instruction sequence, see load_batches."""

    waits: int  # load batches per pass (in steady state for a loop body)
    bytes: int  # load bytes per pass (per thread)
    first_batch_bytes: int  # bytes of the first batch: those outstanding at the first wait
    max_batch_bytes: int  # bytes of the largest batch


# ----------------------------------------------------------------------------------------------------------------
# Parsing
_FUNC_RE = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")  # cuobjdump
_SECTION_RE = re.compile(r"^\s*\.text\.(\S+):\s*$")  # the disassembler's own format: a label per section
_LABEL_RE = re.compile(r"^\s*(\.L\w+):\s*$")
_INSTR_RE = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+([^;]*?)\s*;")
_GUARD_RE = re.compile(r"^(@!?U?P(?:T|\d+))\s+")
_HEX_TARGET_RE = re.compile(r"(?:^|[\s,])(0x[0-9a-fA-F]+)\s*$")
_LABEL_TARGET_RE = re.compile(r"`\((\.L\w+)\)")
# a register operand: R7, UR4, P0, UP1 or PR (all predicates), with modifiers (.64, .reuse, .H1_H1 ...)
_REG_RE = re.compile(r"(?<![\w.])(U?R\d+|U?P\d+|PR)((?:\.\w+)*)")
_PRED_OPERAND_RE = re.compile(r"^U?P(?:T|\d+)$")
_NUMBERED_RE = re.compile(r"(U?[RP])(\d+)$")
_MEM_OPERAND_RE = re.compile(r"^-?(desc|gdesc|c)?\[")

# instructions without a register result (stores, branches, barriers): every register operand is read
_NO_DST = frozenset(
    "BRA BRX BRXU JMP JMX CALL RET EXIT NOP BSSY BSYNC BREAK BPT WARPSYNC BAR BARRIER DEPBAR MEMBAR ERRBAR CCTL "
    "CCTLL YIELD ENDCOLLECTIVE KILL RED REDG ST STG STS STL STSM SUST SURED LDGDEPBAR LDGSTS ARRIVES FENCE "
    "UTMALDG UTMASTG UTMAPF UTMACCTL UBLKCP UBLKRED WARPGROUP NANOSLEEP PREEXIT ACQBULK CGAERRBAR".split()
)
# instructions whose first two operands are results (SHFL: predicate and value; VOTE: value and predicate)
_TWO_DST = frozenset("SHFL VOTE VOTEU ATOM ATOMG ELECT".split())
_DOUBLE_OPS = frozenset("DADD DMUL DFMA DMNMX DSETP DSET".split())
_CONVERSIONS = frozenset("F2F I2F F2I I2I F2IP I2FP".split())
_WIDE_TYPES = frozenset("F64 S64 U64".split())
_MMA = frozenset("HMMA IMMA DMMA BMMA".split())
_BRANCHES = frozenset("BRA JMP".split())


def _split_operands(s: str) -> list[str]:
    return [op.strip() for op in s.split(",") if op.strip()] if s else []


def _expand(name: str, width: int) -> list[str]:
    """`R4` of width 4 -> R4..R7 (registers of a wide operand are consecutive)."""
    if name == "PR":
        return [f"P{i}" for i in range(7)]
    m = _NUMBERED_RE.match(name)
    if not m or width <= 1 or m.group(1) in ("P", "UP"):
        return [name]
    return [f"{m.group(1)}{int(m.group(2)) + k}" for k in range(width)]


def _regs(operand: str, width: int = 1) -> list[str]:
    """The registers an operand names. Inside [...] a `.64` register is a 64-bit address (2 registers) and the
    descriptor of `desc[URx]` is a 64-bit pair; outside, `width` registers per named register."""
    out: list[str] = []
    for m in _REG_RE.finditer(operand):
        name, mods = m.group(1), m.group(2).split(".")
        before = operand[: m.start()]
        if before.count("[") > before.count("]"):
            w = 2 if "64" in mods or before.endswith("desc[") else 1
        else:
            w = 2 if "64" in mods else width
        out += _expand(name, w)
    return out


def _mem_width(base: str, mods: Sequence[str]) -> int:
    """Bytes per thread of a memory instruction, from its width modifiers."""
    if base == "LDSM" or base == "STSM":  # .x1/.x2/.x4 matrices of 8x8 16-bit elements: 4 bytes each per thread
        for k in ("4", "2", "1"):
            if k in mods[1:]:
                return 4 * int(k)
        return 4
    for mod in mods:  # vector atomics: ATOMG.E.ADD.F32x4 adds four floats
        v = re.fullmatch(r"[FSUB]F?(\d+)x(\d+)", mod)
        if v:
            return int(v.group(1)) * int(v.group(2)) // 8
    for mod, width in (("256", 32), ("128", 16), ("64", 8), ("F64", 8), ("S64", 8), ("U64", 8)):
        if mod in mods:
            return width
    for mod, width in (("U8", 1), ("S8", 1), ("U16", 2), ("S16", 2)):
        if mod in mods:
            return width
    return 4


def _conversion_widths(base: str, mods: Sequence[str]) -> tuple[int, int]:
    """(dst, src) register widths of a conversion: F2F.F64.F32 writes a pair and reads one register."""
    types = [m for m in mods if re.fullmatch(r"[FSUI](8|16|32|64)", m)]
    w = [2 if t in _WIDE_TYPES else 1 for t in types]
    if len(types) >= 2:
        return w[0], w[1]
    if len(types) == 1:
        t = types[0]
        if base.startswith("I2F"):  # I2F.S64: a 64-bit integer source; I2F.F64: a double result
            return (2, 1) if t == "F64" else (1, w[0])
        if base.startswith("F2I"):  # F2I.S64: a 64-bit result; F2I.F64: a double source
            return (1, 2) if t == "F64" else (w[0], 1)
        return w[0], w[0]
    return 1, 1


def _operand_widths(base: str, mods: Sequence[str], srcs: Sequence[str]) -> tuple[int, list[int]]:
    """Registers per named register of the destination and of each source operand."""
    mem = mem_bytes_of(base, mods)
    if base in ("LDG", "LDS", "LDL", "LD", "LDC", "ULDC", "LDSM", "ATOM", "ATOMG", "ATOMS"):
        dst = max(1, _mem_width(base, mods) // 4)
        return dst, [dst if not s.lstrip().startswith(("[", "desc[", "c[")) else 1 for s in srcs]
    if mem is not None and base not in ("LDGSTS",):  # stores, reductions: the data operands
        data = max(1, _mem_width(base, mods) // 4)
        return 1, [data if "[" not in s else 1 for s in srcs]
    if base in _DOUBLE_OPS:
        return 2, [2] * len(srcs)
    if base in _CONVERSIONS:
        d, s = _conversion_widths(base, mods)
        return d, [s] * len(srcs)
    if base in ("IMAD", "UIMAD") and "WIDE" in mods:  # d(64) = a * b + c(64)
        return 2, [2 if i == 2 else 1 for i in range(len(srcs))]
    if base == "CS2R" and "32" not in mods:
        return 2, [1] * len(srcs)
    if base in _MMA:  # approximate: m16n8k16 (A: 4, B: 2 registers), m16n8k8 (A: 2, B: 1); C/D: 4 (f32) or 2
        acc = 4 if "F32" in mods or base == "IMMA" else 2
        a, b = (4, 2) if any(m in ("16816", "16832", "16864") for m in mods) else (2, 1)
        return acc, [a, b, acc][: len(srcs)] + [1] * max(0, len(srcs) - 3)
    if base in ("HGMMA", "IGMMA", "QGMMA"):  # m64nNk: N/2 f32 (N/4 f16) accumulator registers per thread
        shape = next((m for m in mods if re.fullmatch(r"64x\d+x\d+", m)), "")
        n = int(shape.split("x")[1]) if shape else 8
        acc = max(1, n // 2 if "F32" in mods or "S32" in mods else n // 4)
        return acc, [acc if i == 1 else 1 for i in range(len(srcs))]
    if "64" in mods:  # a 64-bit integer op (IADD.64, MOV.64 ...)
        return 2, [2] * len(srcs)
    return 1, [1] * len(srcs)


def _dst_count(base: str, mods: Sequence[str], ops: Sequence[str]) -> int:
    """How many leading operands are results: the first, plus predicate results right after it (ISETP P0, PT;
    IADD3 R4, P0 (carry); LEA R8, P1), except for the instructions without a result."""
    if not ops or base in _NO_DST or _MEM_OPERAND_RE.match(ops[0]):
        return 0
    if base in _TWO_DST:
        return min(2, len(ops))
    cap = 3 if base in ("IADD3", "UIADD3") and "X" not in mods else 2
    n = 1
    while n < min(cap, len(ops)) and _PRED_OPERAND_RE.match(ops[n]):
        n += 1
    return n


def parse_instr(addr: int, text: str) -> Instr:
    """An Instr from one instruction's text (branch targets by label are left to parse_sass)."""
    text = " ".join(text.split())
    rest = text
    pred = None
    m = _GUARD_RE.match(rest)
    if m:
        pred = m.group(1)
        rest = rest[m.end() :]
    opcode, _, operands = rest.partition(" ")
    mods = opcode.split(".")
    base = mods[0]
    ops = _split_operands(operands)
    n_dst = _dst_count(base, mods, ops)
    dst_w, src_w = _operand_widths(base, mods, ops[n_dst:])
    dsts: list[str] = []
    srcs: list[str] = []
    for op in ops[:n_dst]:
        inner = op.split("[", 1)
        dsts += [r for r in _regs(inner[0], dst_w) if r not in ("PT", "UPT")]
        if len(inner) > 1:  # a register inside brackets of a result operand is an address: read
            srcs += _regs("[" + inner[1])
    for op, w in zip(ops[n_dst:], src_w):
        srcs += _regs(op, w)
    if pred:
        srcs.append(pred.lstrip("@!"))
    srcs = [r for r in srcs if r not in ("PT", "UPT")]
    target = None
    if base in _BRANCHES or (base == "CALL" and "REL" in mods):
        t = _HEX_TARGET_RE.search(operands)
        if t:
            target = int(t.group(1), 16)
    return Instr(
        addr=addr,
        text=text,
        pred=pred,
        opcode=opcode,
        base=base,
        dsts=tuple(dict.fromkeys(dsts)),
        srcs=tuple(dict.fromkeys(srcs)),
        target=target,
    )


def _finish(name: str, raw: list[tuple[int, str]], labels: dict[str, int]) -> Function:
    """Resolve label targets, drop NOPs and the trailing self-branch."""
    instrs: list[Instr] = []
    for addr, text in raw:
        if text == "NOP":
            continue
        ins = parse_instr(addr, text)
        if ins.target is None and (ins.base in _BRANCHES or ins.base == "CALL"):
            m = _LABEL_TARGET_RE.search(text)
            if m and m.group(1) in labels:
                ins = replace(ins, target=labels[m.group(1)])
        instrs.append(ins)
    instrs = [i for i in instrs if i.base != "NOP"]
    if instrs and instrs[-1].base == "BRA" and instrs[-1].pred is None and instrs[-1].target == instrs[-1].addr:
        instrs.pop()
    return Function(name, instrs)


class ParsedSass(Mapping[str, Function]):
    """parse_sass's answer: the functions of a SASS listing by symbol. The listing is split into functions at once
    (a regex per line); a function's instructions are parsed on first access, so a model that reads a few hundred
    kernels of a listing with thousands pays for those alone."""

    def __init__(self) -> None:
        self._raw: dict[str, tuple[list[tuple[int, str]], dict[str, int]]] = {}
        self._done: dict[str, Function] = {}

    def _add(self, name: str, raw: list[tuple[int, str]], labels: dict[str, int]) -> None:
        key, k = name, 1
        while key in self._raw:
            if self._raw[key] == (raw, labels) or self[key].instrs == _finish(name, raw, labels).instrs:
                return  # the same code again (the same symbol in another translation unit)
            k += 1
            key = f"{name}#{k}"
        self._raw[key] = (raw, labels)

    def __getitem__(self, key: str) -> Function:
        fn = self._done.get(key)
        if fn is None:
            raw, labels = self._raw[key]
            fn = _finish(key, raw, labels)
            self._done[key] = fn
        return fn

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, key: object) -> bool:
        return key in self._raw


def parse_sass(text: str) -> ParsedSass:
    """Functions of `cuobjdump -sass` output (one or many ELFs), by symbol. Also reads the disassembler's own
    output, where a function starts at its `.text.<name>:` label. A name that occurs again with different code
    (the same symbol in two translation units) is kept as `<name>#2`, `<name>#3` ... Instructions are parsed when
    a function is first looked up (ParsedSass)."""
    out = ParsedSass()
    name: Optional[str] = None
    raw: list[tuple[int, str]] = []
    labels: dict[str, int] = {}
    pending: list[str] = []

    def close() -> None:
        if name is None:
            return
        for lab in pending:  # a label after the last instruction: the end of the function
            labels[lab] = raw[-1][0] + 16 if raw else 0
        out._add(name, raw, labels)

    for line in text.splitlines():
        m = _FUNC_RE.match(line) or _SECTION_RE.match(line)
        if m:
            close()
            name, raw, labels, pending = m.group(1), [], {}, []
            continue
        if name is None:
            continue
        m = _INSTR_RE.match(line)
        if m:
            addr = int(m.group(1), 16)
            for lab in pending:
                labels[lab] = addr
            pending = []
            raw.append((addr, m.group(2)))
            continue
        m = _LABEL_RE.match(line)
        if m:
            pending.append(m.group(1))
    close()
    return out


# ----------------------------------------------------------------------------------------------------------------
# Loops
def _blocks(fn: Function) -> tuple[list[int], dict[int, int], list[list[int]]]:
    """Basic blocks of fn: (start index of each block, block of each leader address, successors of each block).
    A block ends at a branch, EXIT, RET or CALL; a BRA without a guard or a condition operand and an unguarded
    EXIT / RET / BRX do not fall through; a CALL.REL also leads to its target (so called code is reachable)."""
    ins = fn.instrs
    if not ins:
        return [], {}, []
    index_of = {x.addr: i for i, x in enumerate(ins)}
    enders = ("BRA", "JMP", "EXIT", "RET", "BRX", "JMX", "CALL")
    leaders = {0}
    for i, x in enumerate(ins):
        if x.base in enders:
            leaders.add(i + 1)
        if x.target is not None and x.target in index_of:
            leaders.add(index_of[x.target])
    starts = sorted(k for k in leaders if k < len(ins))
    block_at = {ins[k].addr: b for b, k in enumerate(starts)}
    succs: list[list[int]] = []
    for b in range(len(starts)):
        last = ins[(starts[b + 1] if b + 1 < len(starts) else len(ins)) - 1]
        out = []
        if last.target is not None and last.target in block_at:
            out.append(block_at[last.target])
        if last.base in ("EXIT", "RET", "BRX", "JMX"):
            falls = last.pred not in (None, "@PT")
        elif last.base in _BRANCHES:  # BRA.DIV UR6, BRA.U !UP0: a condition in an operand
            falls = bool(last.srcs)
        else:
            falls = True
        if falls and b + 1 < len(starts):
            out.append(b + 1)
        succs.append(out)
    return starts, block_at, succs


def _dominators(succs: list[list[int]]) -> list[int]:
    """Dominator sets (bit masks) of the blocks, entry block 0; an unreachable block keeps the full set."""
    n = len(succs)
    preds: list[list[int]] = [[] for _ in range(n)]
    for b, out in enumerate(succs):
        for s in out:
            preds[s].append(b)
    full = (1 << n) - 1
    dom = [full] * n
    if n:
        dom[0] = 1
    changed = True
    while changed:
        changed = False
        for b in range(1, n):
            new = full
            for p in preds[b]:
                new &= dom[p]
            new |= 1 << b
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def back_edges(fn: Function) -> list[tuple[int, int]]:
    """(head, branch address) of the back edges of fn: branches to an address at or before their own whose
    target dominates them in the control-flow graph. A backward jump from out-of-line code (the slow path of a
    divergent shuffle, placed after the function's EXIT, jumping back to where it left) is not one."""
    starts, block_at, succs = _blocks(fn)
    dom = _dominators(succs)
    edges = []
    block = -1
    for i, x in enumerate(fn.instrs):
        while block + 1 < len(starts) and starts[block + 1] <= i:
            block += 1
        if x.base == "BRA" and x.target is not None and x.target <= x.addr and x.target in block_at:
            if dom[block] >> block_at[x.target] & 1:
                edges.append((x.target, x.addr))
    return edges


def loops(fn: Function) -> list[Loop]:
    """Loops of a function from its back edges (see back_edges), ordered by head address, outer before inner.

    The loop of a back edge is the address range [target, branch]; back edges with the same target are one
    loop whose tail is the last of them. A loop's parent is the smallest loop whose range contains its range.
    Each instruction belongs to (is in the `own` list of) the deepest loop containing it."""
    tails: dict[int, int] = {}
    for head, tail in back_edges(fn):
        tails[head] = max(tails.get(head, tail), tail)
    ranges = sorted(tails.items(), key=lambda ht: (ht[0], -ht[1]))
    parents: list[Optional[int]] = []
    depths: list[int] = []
    for i, (head, tail) in enumerate(ranges):
        parent = None
        for j in range(i - 1, -1, -1):  # the nearest earlier loop that contains this one is the smallest
            h, t = ranges[j]
            if h <= head and tail <= t:
                parent = j
                break
        parents.append(parent)
        depths.append(0 if parent is None else depths[parent] + 1)
    instrs = fn.instrs
    addrs = [x.addr for x in instrs]
    ordered = all(a <= b for a, b in zip(addrs, addrs[1:]))  # as listed; otherwise each range is a scan

    def span(head: int, tail: int) -> Sequence[int]:  # the indices of the instructions in [head, tail]
        if ordered:
            return range(bisect.bisect_left(addrs, head), bisect.bisect_right(addrs, tail))
        return [k for k, a in enumerate(addrs) if head <= a <= tail]

    spans = [span(head, tail) for head, tail in ranges]
    result = [
        Loop(i, head, tail, depths[i], parents[i], [instrs[k] for k in spans[i]], [])
        for i, (head, tail) in enumerate(ranges)
    ]
    # an instruction's innermost loop: the deepest that contains it, then the smallest, then the first; each loop
    # marks its range, in increasing order of that preference, so the last mark is the owner
    owner: list[Optional[int]] = [None] * len(instrs)
    for lp in sorted(result, key=lambda lp: (lp.depth, lp.head - lp.tail, -lp.index)):
        for k in spans[lp.index]:
            owner[k] = lp.index
    for ins, o in zip(instrs, owner):
        if o is not None:
            result[o].own.append(ins)
    return result


def dynamic_count(fn: Function, trips: Mapping[int, float], loops_: Optional[list[Loop]] = None) -> float:
    """Instructions executed per thread. An instruction outside loops counts once; one in the own body of a loop
    counts trips[loop] * trips[parent] * ... times (trips: executions of the loop body per entry of the loop).
    KeyError names a loop without a trip count."""
    if loops_ is None:
        loops_ = loops(fn)
    by_index = {lp.index: lp for lp in loops_}

    def multiplier(lp: Loop) -> float:
        m = 1.0
        cur: Optional[Loop] = lp
        while cur is not None:
            if cur.index not in trips:
                raise KeyError(f"no trip count for loop {cur.index} [{cur.head:#x}, {cur.tail:#x}] of {fn.name}")
            m *= trips[cur.index]
            cur = by_index.get(cur.parent) if cur.parent is not None else None
        return m

    in_loops = sum(len(lp.own) for lp in loops_)
    return float(len(fn.instrs) - in_loops) + sum(len(lp.own) * multiplier(lp) for lp in loops_)


# ----------------------------------------------------------------------------------------------------------------
# Memory
_KINDS = {
    "LDG": "global_load",
    "LD": "global_load",  # generic address: taken as global
    "STG": "global_store",
    "ST": "global_store",
    "LDL": "local_load",
    "STL": "local_store",
    "LDS": "shared_load",
    "LDSM": "shared_load",
    "STS": "shared_store",
    "STSM": "shared_store",
    "ATOMG": "global_atomic",
    "RED": "global_atomic",
    "REDG": "global_atomic",
    "ATOM": "global_atomic",  # generic address: taken as global (ATOMS is the shared-memory atomic)
    "LDGSTS": "async_copy",
    "LDC": "const_load",
}


def mem_bytes_of(base: str, mods: Sequence[str]) -> Optional[tuple[str, int]]:
    """(kind, bytes per thread) of an opcode given as base and modifiers (see mem_bytes)."""
    kind = _KINDS.get(base)
    return None if kind is None else (kind, _mem_width(base, mods))


def mem_bytes(instr: Instr) -> Optional[tuple[str, int]]:
    """(kind, bytes per thread) of a memory instruction, None for others. Kinds: global_load (LDG, LD),
    global_store (STG, ST), local_load (LDL), local_store (STL), shared_load (LDS, LDSM), shared_store (STS,
    STSM), global_atomic (ATOMG, RED, ATOM), async_copy (LDGSTS: the bytes copied), const_load (LDC). Width from
    the modifiers: .128 = 16, .64 = 8, .U16/.S16 = 2, .U8/.S8 = 1, else 4 bytes (LDSM: 4 bytes per matrix)."""
    key = (instr.base, instr.opcode)
    try:
        return _MEM_BYTES[key]
    except KeyError:
        got = _MEM_BYTES[key] = mem_bytes_of(instr.base, instr.opcode.split("."))
        return got


# mem_bytes by opcode: the model asks again for each instruction of each loop body and walk (millions of times),
# of a few hundred distinct opcodes
_MEM_BYTES: dict = {}


def mem_summary(instrs: Iterable[Instr]) -> dict[str, dict[str, int]]:
    """kind -> {'count': instructions, 'bytes': bytes per thread} over instrs (each instruction once)."""
    out: dict[str, dict[str, int]] = {}
    for ins in instrs:
        mb = mem_bytes(ins)
        if mb:
            d = out.setdefault(mb[0], {"count": 0, "bytes": 0})
            d["count"] += 1
            d["bytes"] += mb[1]
    return out


def load_batches(
    instrs: list[Instr], kinds: Sequence[str] = ("global_load", "async_copy"), steady_state: bool = True
) -> Batches:
    """Waits for loads per pass over instrs, and the bytes per wait.

    Method: walk the instructions in address order, keeping the set of registers written by outstanding loads of
    the given kinds. An instruction that reads or overwrites an outstanding register is a wait: every
    outstanding load counts as complete there (loads issued together return together) and the batch closes
    with the bytes issued since the previous wait. Async copies (LDGSTS) write no register: their wait is the
    next DEPBAR. With steady_state (a loop body), the walk runs twice and only the second walk counts, so loads
    issued at the end of one iteration and first used in the next overlap with the next iteration (their bytes
    belong to the first batch of the second walk). Without it (straight-line code) one walk counts. When the
    counted walk issues loads but never waits, waits = 1: they must complete somewhere.
    """
    outstanding: set[str] = set()
    async_pending = False
    pending = 0  # bytes issued since the last wait
    waits = 0
    total = 0
    batches: list[int] = []
    for walk in (0, 1) if steady_state else (1,):
        counting = walk == 1
        for ins in instrs:
            touches = outstanding and not (outstanding.isdisjoint(ins.srcs) and outstanding.isdisjoint(ins.dsts))
            if touches or (async_pending and ins.base == "DEPBAR"):
                if counting:
                    waits += 1
                    batches.append(pending)
                outstanding.clear()
                async_pending = False
                pending = 0
            mb = mem_bytes(ins)
            if mb and mb[0] in kinds:
                outstanding.update(ins.dsts)
                async_pending |= ins.base == "LDGSTS"
                pending += mb[1]
                if counting:
                    total += mb[1]
    if total and not waits:
        waits, batches = 1, [total]
    return Batches(
        waits=waits,
        bytes=total,
        first_batch_bytes=batches[0] if batches else 0,
        max_batch_bytes=max(batches, default=0),
    )


# ----------------------------------------------------------------------------------------------------------------
# Running cuobjdump
def _nvdisasm_candidates() -> list[str]:
    found: list[Optional[str]] = [shutil.which("nvdisasm"), "/usr/local/cuda/bin/nvdisasm"]
    for pkg, pattern in (("nvidia", "*/bin/nvdisasm"), ("triton", "backends/nvidia/bin/nvdisasm")):
        try:  # find_spec of a top-level package locates it without importing it
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            found += sorted(glob.glob(os.path.join(loc, pattern)))
    return [c for c in found if c]


def find_nvdisasm(cuobjdump: Optional[str] = None) -> str:
    """The directory of an nvdisasm executable, which `cuobjdump -sass` needs: $NVDISASM_PATH, next to
    cuobjdump, PATH, /usr/local/cuda/bin, the pip package nvidia-cuda-nvdisasm, the copy bundled with triton."""
    env = os.environ.get("NVDISASM_PATH")
    candidates = [os.path.join(env, "nvdisasm")] if env else []
    if cuobjdump:
        candidates.append(os.path.join(os.path.dirname(cuobjdump), "nvdisasm"))
    candidates += _nvdisasm_candidates()
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.dirname(os.path.abspath(c))
    raise ToolError(
        "nvdisasm not found (cuobjdump -sass needs it; looked at $NVDISASM_PATH, next to cuobjdump, PATH, "
        f"/usr/local/cuda/bin and Python packages). Install it with: {sys.executable} -m pip install "
        f"{NVDISASM_PIP_PACKAGE}, or set NVDISASM_PATH to its directory"
    )


def _cuobjdump(args: Sequence[str], cwd: Optional[os.PathLike] = None) -> str:
    exe = find_cuobjdump()
    env = dict(os.environ, NVDISASM_PATH=find_nvdisasm(exe))
    proc = subprocess.run([exe, *args], capture_output=True, text=True, errors="replace", env=env, cwd=cwd)
    if proc.returncode != 0:
        raise ToolError(f"cuobjdump {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def _is_cubin(path: os.PathLike) -> bool:
    with open(path, "rb") as f:
        head = f.read(20)
    return head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little" if head[5] == 1 else "big") == EM_CUDA


def sass_of(
    code: Union[str, os.PathLike, bytes], functions: Optional[Sequence[str]] = None, arch: str = "sm_90"
) -> dict[str, Function]:
    """Parsed SASS of `code`: a path to an ELF with embedded cubins (.so, .o; only its `arch` cubins are read), a
    .cubin file or cubin bytes (read whatever their arch). Only the named functions are disassembled when
    `functions` is given (all otherwise); ToolError names the functions that are not there."""
    if isinstance(code, bytes):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "code.cubin")
            with open(path, "wb") as f:
                f.write(code)
            return sass_of(path, functions, arch)
    path = os.fspath(code)
    if not os.path.isfile(path):
        raise ToolError(f"no such file: {path}")
    args = ["-sass"] if _is_cubin(path) else ["-sass", "-arch", arch]
    for name in functions or ():
        args += ["-fun", name]
    found = parse_sass(_cuobjdump([*args, path]))
    if functions is None:
        return found
    missing = [n for n in functions if n not in found]
    if missing:
        raise ToolError(f"functions not in the {arch} SASS of {path}: {', '.join(missing)}")
    return {n: found[n] for n in functions}


# ----------------------------------------------------------------------------------------------------------------
# Many cubins with one disassembler run
# The disassembler costs about 0.3 s of CPU a run whatever the input (its set-up for the architecture), and
# `cuobjdump -sass` runs it once per cubin: for the performance model's ~300 Triton cubins that was over a minute
# and a half of CPU, against ~3 s for the same code as one raw instruction stream. sass_of_cubins lays the
# functions of many cubins end to end, disassembles the stream with `nvdisasm --binary SM<arch>` (raw
# instructions, printed in cuobjdump's format) and splits the listing again. Raw mode prints the targets of
# relative branches (BRA, BSSY, CALL.REL, RET.REL, WARPSYNC.COLLECTIVE ...) as addresses in the stream; rather
# than trust a list of such opcodes, the stream is disassembled twice, at two base addresses: a number that moves
# with the base is an address and is taken back to the function's own offset, any other difference between the
# two listings sends the cubin to sass_of. Each instruction's text is then that of `cuobjdump -sass` on the cubin
# alone (tests/test_sass.py compares them on the built extension's cubins). A cubin this cannot read the same way
# (another architecture, relocations in its code, a listing that is not one line per 16 bytes) goes through sass_of.
_HEX_SPLIT_RE = re.compile(r"(0x[0-9a-fA-F]+)")  # split() keeps the numbers, at the odd positions
_SECOND_BASE = 1 << 32  # the second listing's base address: beyond any stream


def _cubin_texts(blob: bytes) -> Optional[tuple[int, list[tuple[str, bytes]]]]:
    """(SM number, [(function, code)]) of a little-endian 64-bit cubin whose `.text.<function>` sections have no
    relocations (an empty relocation section is none); None for anything else."""
    if len(blob) < 64 or blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        return None
    if struct.unpack_from("<H", blob, 18)[0] != EM_CUDA:
        return None
    (flags,) = struct.unpack_from("<I", blob, 0x30)
    # the SM number's place in e_flags depends on the cubin ABI (EI_OSABI 0x33: bits 0-7; 0x41: bits 8-15)
    sm = {0x33: flags & 0xFF, 0x41: (flags >> 8) & 0xFF}.get(blob[7])
    if sm is None:
        return None
    (shoff,) = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    try:
        heads = [struct.unpack_from("<IIQQQQ", blob, shoff + i * shentsize) for i in range(shnum)]
        names_at = heads[shstrndx][4]
        names = [blob[names_at + h[0] : blob.index(b"\0", names_at + h[0])].decode() for h in heads]
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None
    texts = []
    for name, (_, _, _, _, off, size) in zip(names, heads):
        if name.startswith((".rel.text.", ".rela.text.")) and size:
            return None
        if name.startswith(".text."):
            if size % 16:
                return None
            texts.append((name[len(".text.") :], bytes(blob[off : off + size])))
    return sm, texts


def _raw_listing(exe: str, path: str, arch: int, base: int) -> subprocess.Popen:
    return subprocess.Popen(
        [exe, "--binary", f"SM{arch}", "--base-address", hex(base), path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )


def _instr_lines(proc: subprocess.Popen, what: str) -> list[tuple[int, str]]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise ToolError(f"nvdisasm {what} failed ({proc.returncode}): {err.strip()[-2000:]}")
    return [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR_RE.match, out.splitlines()) if m]


def _rebased(text: str, moved: str, start: int) -> Optional[str]:
    """`text` (listed at base 0) with every number that moved by _SECOND_BASE in `moved` (the same instruction at
    that base) made relative to the function at `start`; None if the two differ in any other way."""
    parts, moved_parts = _HEX_SPLIT_RE.split(text), _HEX_SPLIT_RE.split(moved)
    if len(parts) != len(moved_parts) or parts[0::2] != moved_parts[0::2]:
        return None
    for i in range(1, len(parts), 2):
        a, b = int(parts[i], 16), int(moved_parts[i], 16)
        if b - a == _SECOND_BASE:
            parts[i] = hex(a - start)
        elif a != b:
            return None
    return "".join(parts)


def _one_pass(codes: Sequence[bytes], arch: int) -> Optional[list[Optional[list[tuple[int, str]]]]]:
    """The listings of `codes` (functions' machine code, a multiple of 16 bytes each) from one pass of the
    disassembler over them laid end to end (see above): per code its (offset, text) lines with the branch targets
    made relative to it, or None where the two listings differ in more than addresses; None for all when the
    listing is not one line per 16 bytes."""
    stream = bytearray()
    starts = []
    for code in codes:
        starts.append(len(stream))
        stream += code
    if not stream:
        return [[] for _ in codes]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "code.bin")
        with open(path, "wb") as f:
            f.write(stream)
        exe = os.path.join(find_nvdisasm(find_cuobjdump()), "nvdisasm")
        procs = [_raw_listing(exe, path, arch, base) for base in (0, _SECOND_BASE)]
        listing, moved = (_instr_lines(p, f"--binary SM{arch}") for p in procs)
    if len(listing) != len(moved) or len(listing) != len(stream) // 16:
        return None
    out: list[Optional[list[tuple[int, str]]]] = []
    for start, code in zip(starts, codes):
        raw: Optional[list[tuple[int, str]]] = []
        for k in range(start // 16, (start + len(code)) // 16):
            (addr, text), (addr2, text2) = listing[k], moved[k]
            rebased = _rebased(text, text2, start)
            if addr != start + 16 * (k - start // 16) or addr2 - addr != _SECOND_BASE or rebased is None:
                raw = None
                break
            raw.append((addr - start, rebased))
        out.append(raw)
    return out


def sass_of_cubins(cubins: Sequence[bytes], arch: int = 90, alone: Optional[list[int]] = None) -> list[ParsedSass]:
    """sass_of for each of `cubins` (bytes), disassembled in one pass of the disassembler (see above); the indices
    of the cubins read by sass_of instead are appended to `alone`."""
    read = [r if r is not None and r[0] == arch else None for r in map(_cubin_texts, cubins)]
    segments = [(i, name, code) for i, r in enumerate(read) if r is not None for name, code in r[1]]
    raws = _one_pass([code for _, _, code in segments], arch)
    out: list[Optional[ParsedSass]] = [ParsedSass() if r is not None else None for r in read]
    if raws is None:  # not one line per 16 bytes: read each alone
        segments, raws, out = [], [], [None] * len(cubins)
    for (i, name, _), raw in zip(segments, raws):
        parsed = out[i]
        if parsed is None:
            continue
        if raw is None:
            out[i] = None
        else:
            parsed._add(name, raw, {})
    if alone is not None:
        alone += [i for i, p in enumerate(out) if p is None]
    return [p if p is not None else sass_of(c) for p, c in zip(out, cubins)]


def sass_of_functions(
    code: Union[str, os.PathLike], functions: Sequence[str], arch: str = "sm_90", alone: Optional[list[str]] = None
) -> dict[str, Function]:
    """sass_of(code, functions) with the disassembler run over those functions alone, in one pass: the `arch`
    cubins of an ELF (`cuobjdump -xelf`; a .cubin file is read as it is), the named functions' code taken from
    their sections and laid end to end (see above). `cuobjdump -sass -fun` disassembles every function of the
    file whatever the names (the extension's sm_90 code, ~2.4M instructions, takes half a minute); a model that
    reads a hundred of its kernels needs a few seconds. Functions this cannot read the same way (a cubin with
    relocations, a name with two different codes in the file, a listing the rebasing rejects) go through sass_of
    and are appended to `alone`."""
    path = os.fspath(code)
    if not os.path.isfile(path):
        raise ToolError(f"no such file: {path}")
    names = list(dict.fromkeys(functions))
    cubin = _is_cubin(path)
    with tempfile.TemporaryDirectory() as tmp:
        files = [Path(path)] if cubin else extract_cubins(path, arch, None, tmp)
        blobs = [f.read_bytes() for f in files]
    reads = [_cubin_texts(b) for b in blobs]
    sm = reads[0][0] if cubin and reads[0] is not None else int(arch.removeprefix("sm_"))
    wanted = set(names)
    found: dict[str, set[bytes]] = {}
    for r in reads:
        for name, text in r[1] if r is not None and r[0] == sm else ():
            if name in wanted:
                found.setdefault(name, set()).add(text)
    # a cubin read otherwise could hold any of the names (first, in cuobjdump's order): all go through sass_of
    readable = all(r is not None and r[0] == sm for r in reads)
    one = [n for n in names if readable and len(found.get(n, ())) == 1]
    raws = _one_pass([next(iter(found[n])) for n in one], sm) or [None] * len(one)
    out = {n: _finish(n, raw, {}) for n, raw in zip(one, raws) if raw is not None}
    rest = [n for n in names if n not in out]
    if rest:
        out.update(sass_of(path, rest, arch))
        if alone is not None:
            alone += rest
    return {n: out[n] for n in names}


def extract_cubins(elf: os.PathLike, arch: str, containing: Optional[str], workdir: os.PathLike) -> list[Path]:
    """The cubins of `elf` for `arch` whose bytes contain `containing` (e.g. a kernel's symbol; None: every one):
    runs `cuobjdump -xelf all -arch <arch>` in workdir (for libraries too large to disassemble whole), then looks
    at every .cubin in workdir."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    _cuobjdump(["-xelf", "all", "-arch", arch, os.path.abspath(elf)], cwd=work)
    cubins = sorted(work.glob("*.cubin"))
    if containing is None:
        return cubins
    needle = containing.encode()
    return [p for p in cubins if needle in p.read_bytes()]


# ----------------------------------------------------------------------------------------------------------------
# Command line
def describe(fn: Function) -> str:
    """A short text report of one function: its loops, their own instructions, memory and load batches."""
    lines = [f"{fn.name}: {len(fn.instrs)} instructions"]
    lps = loops(fn)
    if not lps:
        b = load_batches(fn.instrs, steady_state=False)
        lines.append(f"  no loops; mem {mem_summary(fn.instrs)}; batches {b}")
    for lp in lps:
        b = load_batches(lp.own)
        lines.append(
            f"  loop {lp.index} [{lp.head:#06x}, {lp.tail:#06x}] depth {lp.depth}"
            + (f" parent {lp.parent}" if lp.parent is not None else "")
            + f": own {len(lp.own)} / body {len(lp.body)} instrs"
        )
        lines.append(f"    mem {mem_summary(lp.own)}")
        lines.append(
            f"    batches: waits {b.waits}, bytes {b.bytes}, first {b.first_batch_bytes}, max {b.max_batch_bytes}"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.sass", description=__doc__.splitlines()[0])
    ap.add_argument("code", help="ELF (.so/.o) with cubins, or a .cubin")
    ap.add_argument("--fun", help="only functions whose symbol contains this substring")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args(argv)
    try:
        fns = sass_of(args.code, arch=args.arch)
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, fn in fns.items():
        if args.fun is None or args.fun in name:
            print(describe(fn))
    return 0


if __name__ == "__main__":
    sys.exit(main())

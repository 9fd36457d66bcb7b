"""Static resource budget of the CUDA kernels, checked without a GPU:
`python -m tools.cuda_resources [PATH_TO_ELF] [--arch sm_90] [--markdown | --grouped] [--json OUT]`.

Reads the cubins embedded in an ELF (by default the installed `gpuopt_ops/_C*.so`; any host object or shared
library with device code works, e.g. a `nvcc -c` .o) with cuobjdump and reports, for every kernel of one SM
architecture (the newest one present unless --arch is given):

  regs, stack, local, shared, constant banks ...   `cuobjdump --dump-resource-usage`
  max block                                        `__launch_bounds__`: EIATTR_MAX_THREADS (or REQNTID) in the
                                                   cubin's .nv.info (`cuobjdump -elf`), else `.maxntid` /
                                                   `.reqntid` in the embedded PTX (`cuobjdump -ptx`). A kernel
                                                   without one counts as 1024 threads ("no launch bound").
  blocks/SM at that block size                     on an sm_90 (H100/H200) SM, see SM90 below. A kernel whose
                                                   registers x threads of its max block exceed the SM's register
                                                   file cannot launch at that size: "does not fit".

Gate (the "Static resource budget" of the design contract), exit status 1 with a summary when it fails:
every fp16/bf16/fp32 kernel variant, i.e. every kernel whose template arguments do not involve `double`, has
STACK == 0 and LOCAL == 0 and fits its max block. fp64 variants are reported but never fail the gate.
Exit status 2: the tool could not run (no cuobjdump, no such file, no cubins in it, unknown --arch).

cuobjdump is looked up as $CUOBJDUMP, then on PATH, then /usr/local/cuda/bin, then in the pip package
`nvidia-cuda-cuobjdump` of the running Python (`pip install nvidia-cuda-cuobjdump`).

Occupancy model, per SM (the CUDA occupancy calculator's rules):
  registers   65536 per SM, allocated per warp in units of 256 (= regs/thread rounded up to a multiple of 8);
  threads     2048 per SM, 64 warps per SM (a block takes ceil(threads / 32) warps), 1024 per block;
  blocks      32 per SM;
  shared      228 KiB per SM, at most 227 KiB per block, plus 1 KiB reserved by the system per block, allocated
              in 128-byte units. Only static shared memory is known from the ELF: dynamic shared memory (the
              third launch parameter) is taken as 0. On sm_90 cuobjdump's SHARED of a kernel that uses shared
              memory already includes a 1 KiB region at offset 0 (`.nv.shared.reserved.0`; `ptxas -v` prints
              1 KiB less); the model still adds the reserved 1 KiB, so it errs on the safe side by 1 KiB.
"""

from __future__ import annotations

import argparse
import gc
import glob
import hashlib
import importlib.util
import json
import math
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

NO_BOUND_THREADS = 1024  # a kernel without __launch_bounds__ may be launched with up to the hardware maximum
PIP_PACKAGE = "nvidia-cuda-cuobjdump"


class ToolError(RuntimeError):
    """The analysis could not run (exit status 2); the message says what to do."""


# ----------------------------------------------------------------------------------------------------------------
# SM model
@dataclass(frozen=True)
class SMLimits:
    name: str
    regs_per_sm: int = 65536
    reg_alloc_unit_per_warp: int = 256  # = 8 registers per thread
    max_regs_per_thread: int = 255
    threads_per_sm: int = 2048
    warps_per_sm: int = 64
    blocks_per_sm: int = 32
    threads_per_block: int = 1024
    warp_size: int = 32
    shared_per_sm: int = 228 * 1024
    shared_per_block: int = 227 * 1024  # usable by one block (static + dynamic)
    shared_reserved_per_block: int = 1024
    shared_alloc_unit: int = 128


SM90 = SMLimits(name="sm_90 (H100/H200)")


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


@dataclass
class Occupancy:
    threads: int
    regs_per_thread: int
    regs_per_thread_alloc: int  # rounded up to the allocation unit
    regs_per_block: int
    warps_per_block: int
    shared_per_block: int  # static + reserved, rounded to the allocation unit
    fits: bool
    blocks_per_sm: int  # 0 when it does not fit
    limited_by: tuple[str, ...]  # every limit that gives blocks_per_sm (ties listed), or why it does not fit
    limits: dict[str, int] = field(default_factory=dict)  # blocks/SM allowed by each resource


def occupancy(
    regs: int, threads: int, static_shared: int = 0, dynamic_shared: int = 0, sm: SMLimits = SM90
) -> Occupancy:
    """Blocks of `threads` threads that one SM holds at once, for a kernel using `regs` registers per thread."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    warps = -(-threads // sm.warp_size)
    regs_alloc = _round_up(max(regs, 1), sm.reg_alloc_unit_per_warp // sm.warp_size)
    regs_per_warp = regs_alloc * sm.warp_size
    regs_per_block = regs_per_warp * warps
    shared = static_shared + dynamic_shared
    shared_alloc = _round_up(shared + sm.shared_reserved_per_block, sm.shared_alloc_unit)

    why = []
    if threads > sm.threads_per_block:
        why.append(f"threads {threads} > {sm.threads_per_block} per block")
    if regs > sm.max_regs_per_thread:
        why.append(f"regs {regs} > {sm.max_regs_per_thread} per thread")
    if regs_per_block > sm.regs_per_sm:
        why.append(f"regs {regs_alloc} x {warps * sm.warp_size} threads = {regs_per_block} > {sm.regs_per_sm} per SM")
    if shared > sm.shared_per_block:
        why.append(f"shared {shared} B > {sm.shared_per_block} B per block")
    limits = {
        "threads": sm.threads_per_sm // threads,
        "warps": sm.warps_per_sm // warps,
        "blocks": sm.blocks_per_sm,
        "shared": sm.shared_per_sm // shared_alloc,
        "regs": sm.regs_per_sm // regs_per_block,
    }
    if why:
        return Occupancy(threads, regs, regs_alloc, regs_per_block, warps, shared_alloc, False, 0, tuple(why), limits)
    blocks = min(limits.values())
    tied = [k for k, v in limits.items() if v == blocks]
    if "threads" in tied and "warps" in tied:  # the same limit whenever threads is a multiple of 32
        tied.remove("warps")
    return Occupancy(
        threads, regs, regs_alloc, regs_per_block, warps, shared_alloc, blocks > 0, blocks, tuple(tied), limits
    )


# ----------------------------------------------------------------------------------------------------------------
# Finding the tools and the ELF
def _pip_cuobjdump_candidates() -> list[Path]:
    """cuobjdump binaries of the pip package nvidia-cuda-cuobjdump in this Python (nvidia/<x>/bin/cuobjdump)."""
    found: list[Path] = []
    try:  # the package's own file list: exact, whatever its layout (nvidia/cu13/bin, nvidia/cuda_cuobjdump/bin)
        from importlib import metadata

        dist = metadata.distribution(PIP_PACKAGE)
        for f in dist.files or []:
            if f.name in ("cuobjdump", "cuobjdump.exe"):
                found.append(Path(dist.locate_file(f)))
    except Exception:
        pass
    try:  # the nvidia namespace package (also finds it when the metadata is missing)
        spec = importlib.util.find_spec("nvidia")
        for loc in (spec.submodule_search_locations or []) if spec else []:
            found += [Path(p) for p in sorted(glob.glob(os.path.join(loc, "*", "bin", "cuobjdump*")))]
    except Exception:
        pass
    return found


def find_cuobjdump() -> str:
    env = os.environ.get("CUOBJDUMP")
    if env:
        p = shutil.which(env) or (env if os.path.isfile(env) else None)
        if p is None or not os.access(p, os.X_OK):
            raise ToolError(f"$CUOBJDUMP={env} is not an executable file")
        return p
    candidates: list[Optional[str]] = [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    candidates += [str(p) for p in _pip_cuobjdump_candidates()]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise ToolError(
        "cuobjdump not found (looked at $CUOBJDUMP, PATH, /usr/local/cuda/bin and the pip package "
        f"{PIP_PACKAGE} in {sys.executable}). Install it with: {sys.executable} -m pip install {PIP_PACKAGE}"
    )


def find_installed_extension() -> Path:
    """gpuopt_ops/_C*.so of the importable gpuopt_ops, found without importing gpuopt_ops (nor its ops)."""
    spec = importlib.util.find_spec("gpuopt_ops")
    if spec is None or not spec.submodule_search_locations:
        raise ToolError(
            "gpuopt_ops is not installed in this Python: install it (pip install -e .) or pass the "
            "path of an ELF (.so or .o) with CUDA kernels"
        )
    hits: list[str] = []
    for loc in spec.submodule_search_locations:
        hits += glob.glob(os.path.join(loc, "_C*.so")) + glob.glob(os.path.join(loc, "_C*.pyd"))
    if not hits:
        raise ToolError(
            f"no built extension _C*.so in {list(spec.submodule_search_locations)}: build it first "
            "(pip install --no-build-isolation -e .) or pass an ELF path"
        )
    return Path(max(hits, key=os.path.getmtime))  # a stale _C of another Python ABI loses to the fresh build


def elf_section_names(path: os.PathLike) -> list[str]:
    """Section names of an ELF file (pure Python, no tools). [] when it is not an ELF."""
    with open(path, "rb") as f:
        ident = f.read(16)
        if ident[:4] != b"\x7fELF":
            return []
        is64, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
        if is64:
            hdr = f.read(48)
            (shoff,) = struct.unpack(end + "Q", hdr[24:32])
            shentsize, shnum, shstrndx = struct.unpack(end + "HHH", hdr[42:48])
        else:
            hdr = f.read(36)
            (shoff,) = struct.unpack(end + "I", hdr[16:20])
            shentsize, shnum, shstrndx = struct.unpack(end + "HHH", hdr[30:36])
        if shoff == 0 or shnum == 0:
            return []
        f.seek(shoff)
        table = f.read(shentsize * shnum)

        def sh(i):
            e = table[i * shentsize : (i + 1) * shentsize]
            if is64:
                name, _t, _fl, _a, off, size = struct.unpack(end + "IIQQQQ", e[:40])
            else:
                name, _t, _fl, _a, off, size = struct.unpack(end + "IIIIII", e[:24])
            return name, off, size

        _, stroff, strsize = sh(shstrndx)
        f.seek(stroff)
        strtab = f.read(strsize)
        names = []
        for i in range(shnum):
            n = sh(i)[0]
            names.append(strtab[n : strtab.index(b"\0", n)].decode("latin-1") if n < len(strtab) else "")
        return names


def has_device_code(path: os.PathLike) -> bool:
    """True when the ELF embeds a CUDA fat binary (a CUDAExtension build; a CPU-only CppExtension has none)."""
    return any(n in (".nv_fatbin", ".nvFatBinSegment", "__nv_relfatbin") for n in elf_section_names(path))


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, errors="replace")


# ----------------------------------------------------------------------------------------------------------------
# Parsers of cuobjdump's text output
_ARCH_RE = re.compile(r"^arch\s*=\s*(sm_\w+)\s*$")
_FUNC_RE = re.compile(r"^\s*Function\s+(\S+?):\s*$")
_KV_RE = re.compile(r"([A-Z_]+(?:\[\d+\])?):(\d+)")


@dataclass
class ResourceUsage:
    name: str  # mangled
    arch: str
    elf_index: int  # which "Fatbin elf code" block (one per arch per translation unit)
    resources: dict[str, int]


def _split_blocks(text: str, kind: str) -> list[tuple[str, list[str]]]:
    """The (arch, lines) of each "Fatbin <kind> code:" block of cuobjdump's output (kind: "elf" or "ptx")."""
    blocks: list[list] = []
    cur: Optional[list] = None
    for line in text.splitlines():
        if line.startswith("Fatbin ") and line.rstrip() in ("Fatbin elf code:", "Fatbin ptx code:"):
            cur = [line.split()[1], "", []]
            blocks.append(cur)
            continue
        if cur is None:
            continue
        if not cur[1] and line.startswith("arch"):
            m = _ARCH_RE.match(line.strip())
            if m:
                cur[1] = m.group(1)
                continue
        cur[2].append(line)
    return [(arch, lines) for k, arch, lines in blocks if k == kind]


def parse_resource_usage(text: str) -> list[ResourceUsage]:
    """Parse `cuobjdump --dump-resource-usage` output: one entry per function per cubin."""
    out: list[ResourceUsage] = []
    for idx, (arch, lines) in enumerate(_split_blocks(text, "elf")):
        cur: Optional[ResourceUsage] = None
        for line in lines:
            m = _FUNC_RE.match(line)
            if m:
                cur = ResourceUsage(m.group(1), arch, idx, {})
                out.append(cur)
                continue
            if line.strip() in ("Common:", "Resource usage:"):
                cur = None
                continue
            if cur is not None:
                for k, v in _KV_RE.findall(line):
                    cur.resources[k] = int(v)
    return out


@dataclass
class KernelInfo:
    entry: bool = False  # a __global__ kernel (symbol marked ENTRY), not a device function
    max_threads: Optional[tuple[int, int, int]] = None  # __launch_bounds__ (EIATTR_MAX_THREADS / .maxntid)
    req_threads: Optional[tuple[int, int, int]] = None  # EIATTR_REQNTID / .reqntid (exact block shape)
    min_blocks: Optional[int] = None  # __launch_bounds__'s 2nd argument where known (.minnctapersm)
    source: str = ""  # where max_threads / req_threads came from: "elf" or "ptx"


_SYM_RE = re.compile(r"^\s*\S+\s+\S+\s+\S+\s+FUNC\s+\S+\s+\S+\s+(.*?)\s+\S+\s+(\S+)\s*$")
_ATTR_RE = re.compile(r"^\s*Attribute:\s*(\S+)")
_VAL_RE = re.compile(r"^\s*Value:\s*(.*)$")
_FN_IN_VAL_RE = re.compile(r"function:\s*(\S+?)\(0x[0-9a-fA-F]+\)")
_HEX_RE = re.compile(r"0x[0-9a-fA-F]+")


def _xyz(nums: Iterable[int]) -> tuple[int, int, int]:
    n = list(nums)[:3]
    n += [1] * (3 - len(n))
    return (n[0] or 1, n[1] or 1, n[2] or 1)


def parse_elf_info(text: str, arch: Optional[str] = None) -> list[dict[str, KernelInfo]]:
    """Parse `cuobjdump -elf`: per cubin (in order), mangled name -> KernelInfo from .symtab and .nv.info."""
    result: list[dict[str, KernelInfo]] = []
    for blk_arch, lines in _split_blocks(text, "elf"):
        if arch and blk_arch != arch:
            continue
        info: dict[str, KernelInfo] = {}
        section, attr, in_symtab, in_info = "", "", False, False
        for line in lines:
            if line.startswith("."):
                section, attr = line.strip(), ""
                in_symtab = section in (".section .symtab", ".symtab")
                in_info = section.startswith(".nv.info")
                continue
            if not (in_symtab or in_info):
                continue
            if in_symtab:
                m = _SYM_RE.match(line)
                if m:
                    info.setdefault(m.group(2), KernelInfo()).entry = "ENTRY" in m.group(1).split()
                continue
            m = _ATTR_RE.match(line)
            if m:
                attr = m.group(1)
                continue
            m = _VAL_RE.match(line)
            if not m or attr not in (
                "EIATTR_MAX_THREADS",
                "EIATTR_REQNTID",
                "EIATTR_MIN_CTA_PER_SM",
                "EIATTR_MAX_CTA_PER_SM",
            ):
                continue
            val = m.group(1)
            fm = _FN_IN_VAL_RE.search(val)
            if fm:  # attribute of the global .nv.info, naming its function
                name, val = fm.group(1), val[fm.end() :]
            elif section.startswith(".nv.info."):
                name = section[len(".nv.info.") :]
            else:
                continue
            nums = [int(h, 16) for h in _HEX_RE.findall(val)]
            if not nums:
                continue
            k = info.setdefault(name, KernelInfo())
            if attr == "EIATTR_MAX_THREADS":
                k.max_threads, k.source = _xyz(nums), "elf"
            elif attr == "EIATTR_REQNTID":
                k.req_threads, k.source = _xyz(nums), "elf"
            else:
                k.min_blocks = nums[0]
        result.append(info)
    return result


_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$][\w$.]*)\s*\(")
_PTX_DIR_RE = re.compile(r"^\s*\.(maxntid|reqntid|minnctapersm|maxnreg)\s+([\d,\s]+?)\s*;?\s*$")


def parse_ptx_directives(text: str) -> dict[str, dict[str, KernelInfo]]:
    """Parse `cuobjdump -ptx`: virtual arch (the PTX block's 'arch = sm_XX') -> mangled name -> KernelInfo."""
    out: dict[str, dict[str, KernelInfo]] = {}
    for arch, lines in _split_blocks(text, "ptx"):
        info = out.setdefault(arch, {})
        cur: Optional[KernelInfo] = None
        for line in lines:
            m = _ENTRY_RE.search(line)
            if m:
                cur = info.setdefault(m.group(1), KernelInfo(entry=True))
                continue
            if cur is None:
                continue
            if line.strip().startswith("{"):
                cur = None  # directives come between the parameter list and the body
                continue
            m = _PTX_DIR_RE.match(line)
            if m:
                nums = [int(x) for x in re.findall(r"\d+", m.group(2))]
                if m.group(1) == "maxntid":
                    cur.max_threads, cur.source = _xyz(nums), "ptx"
                elif m.group(1) == "reqntid":
                    cur.req_threads, cur.source = _xyz(nums), "ptx"
                elif m.group(1) == "minnctapersm":
                    cur.min_blocks = nums[0]
    return out


# ----------------------------------------------------------------------------------------------------------------
# Names
def demangle(names: Sequence[str]) -> dict[str, str]:
    """mangled -> demangled via c++filt (llvm-cxxfilt); names it cannot demangle map to themselves."""
    names = list(dict.fromkeys(names))
    tool = shutil.which("c++filt") or shutil.which("llvm-cxxfilt")
    if not tool or not names:
        return {n: n for n in names}
    p = subprocess.run([tool], input="\n".join(names) + "\n", stdout=subprocess.PIPE, text=True)
    lines = p.stdout.splitlines()
    if p.returncode != 0 or len(lines) != len(names):
        return {n: n for n in names}
    return dict(zip(names, lines))


_OPEN, _CLOSE = "<([", ">)]"


def _split_top(s: str, sep: str) -> list[str]:
    """Split s at occurrences of sep outside <>, () and []."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(depth - 1, 0)
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def _strip_params(s: str) -> str:
    """'void ns::k<int>(float*, int)' -> 'void ns::k<int>' (drops the trailing top-level parameter list)."""
    s = s.strip()
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] in _CLOSE:
            depth += 1
        elif s[i] in _OPEN:
            depth -= 1
            if depth == 0:
                return s[:i].rstrip() if s[i] == "(" else s
    return s


def short_name(demangled: str) -> str:
    """'void gpuopt::(anonymous namespace)::k<float, c10::Half, 4>(float const*, int)' -> 'k<float, c10::Half, 4>'."""
    last = _split_top(_strip_params(demangled), "::")[-1]
    return _split_top(last.strip(), " ")[-1] if last.strip() else demangled


def template_args(name: str) -> str:
    """The template argument list of a short or demangled name ('' when it has none)."""
    s = short_name(name)
    i = s.find("<")
    return s[i + 1 : s.rfind(">")] if i >= 0 and s.endswith(">") else ""


def is_fp64_variant(demangled: str) -> bool:
    """A kernel variant whose template arguments involve `double` (for a non-template kernel: its parameters)."""
    args = template_args(demangled)
    if not args:
        stripped = _strip_params(demangled)
        args = demangled[len(stripped) :]
    return re.search(r"\bdouble\b", args) is not None


# ----------------------------------------------------------------------------------------------------------------
# Rows
@dataclass
class Row:
    kernel: str  # short name with template arguments
    demangled: str
    mangled: str
    arch: str
    kind: str  # "kernel" | "device function"
    regs: int
    stack: int
    local: int
    shared: int
    constant: dict[str, int]
    resources: dict[str, int]  # everything cuobjdump printed for the function
    max_block: Optional[int]  # threads of the declared bound; NO_BOUND_THREADS when none (see launch_bound)
    launch_bound: Optional[tuple[int, int, int]]  # None: no launch bound
    bound_source: str  # "elf" | "ptx" | ""
    min_blocks: Optional[int]
    fp64: bool
    occupancy: Optional[Occupancy]
    problems: list[str]  # gate violations (for fp64 variants: what would be one)

    @property
    def fits(self) -> Optional[bool]:
        return None if self.occupancy is None else self.occupancy.fits

    @property
    def gated(self) -> bool:
        return not self.fp64

    @property
    def failing(self) -> bool:
        return self.gated and bool(self.problems)

    def max_block_text(self) -> str:
        if self.kind != "kernel":
            return "n/a"
        if self.launch_bound is None:
            return f"{NO_BOUND_THREADS}, no launch bound"
        x, y, z = self.launch_bound
        shape = f" ({x}x{y}x{z})" if (y, z) != (1, 1) else ""
        return f"{self.max_block}{shape}"

    def to_json(self) -> dict:
        d = asdict(self)
        d["fits"] = self.fits
        d["gated"] = self.gated
        d["failing"] = self.failing
        d["max_block_text"] = self.max_block_text()
        return d


def _arch_key(arch: str) -> tuple[int, str]:
    m = re.match(r"sm_(\d+)(\w*)", arch)
    return (int(m.group(1)), m.group(2)) if m else (-1, arch)


def normalize_arch(arch: str) -> str:
    a = arch.strip().lower()
    if re.fullmatch(r"\d+\.\d+\w*", a):
        a = a.replace(".", "")
    if re.fullmatch(r"\d+\w*", a):
        a = "sm_" + a
    return a.replace("compute_", "sm_")


def _function_info(u, block_ids: list, elf_blocks: list, ptx_infos: list) -> tuple:
    """(KernelInfo, launch bound, its source, is a kernel) of one function of the resource usage: its ELF symbol
    block's facts (the block of the same index, else any that has it), the bound and min blocks from PTX where the
    ELF has none."""
    info: Optional[KernelInfo] = None
    pos = block_ids.index(u.elf_index)
    if len(elf_blocks) == len(block_ids) and u.name in elf_blocks[pos]:
        info = elf_blocks[pos][u.name]
    else:
        info = next((b[u.name] for b in elf_blocks if u.name in b), None)
    has_elf = info is not None
    info = info or KernelInfo()
    bound, source = info.req_threads or info.max_threads, info.source
    if bound is None:
        for p in ptx_infos:
            if u.name in p and (p[u.name].req_threads or p[u.name].max_threads):
                bound = p[u.name].req_threads or p[u.name].max_threads
                source = "ptx"
                info.min_blocks = info.min_blocks or p[u.name].min_blocks
                break
    if info.min_blocks is None:
        info.min_blocks = next((p[u.name].min_blocks for p in ptx_infos if u.name in p), None)
    # a function is a kernel when its symbol says ENTRY, or (no symbol table parsed) when PTX has its .entry
    in_ptx = any(u.name in p for p in ptx_infos)
    return info, bound, source, info.entry if has_elf else (in_ptx or not elf_blocks)


def build_rows(
    res_text: str,
    elf_text: str = "",
    ptx_text: str = "",
    arch: Optional[str] = None,
    demangler: Callable[[Sequence[str]], dict[str, str]] = demangle,
    sm: SMLimits = SM90,
) -> tuple[str, list[Row]]:
    """Rows for every function of `arch` (default: the newest arch with cubins). Returns (arch, rows)."""
    usage = parse_resource_usage(res_text)
    archs = sorted({u.arch for u in usage}, key=_arch_key)
    if not archs:
        raise ToolError(
            "the ELF holds no cubins (no 'Fatbin elf code' in cuobjdump's output): a CPU-only build "
            "of the extension, or PTX only?"
        )
    if arch is None:
        arch = archs[-1]
    arch = normalize_arch(arch)
    if arch not in archs:
        raise ToolError(f"no cubin for {arch} in the ELF; it has {', '.join(archs)}")
    usage = [u for u in usage if u.arch == arch]
    elf_blocks = parse_elf_info(elf_text, arch) if elf_text else []
    ptx = parse_ptx_directives(ptx_text) if ptx_text else {}
    # PTX of the same virtual arch first, then any other (the directives come from the same source)
    ptx_infos = [ptx[a] for a in sorted(ptx, key=lambda a: (a != arch, _arch_key(a)))]
    block_ids = sorted({u.elf_index for u in usage})
    names = demangler([u.name for u in usage])

    rows: list[Row] = []
    for u in usage:
        info, bound, source, entry = _function_info(u, block_ids, elf_blocks, ptx_infos)
        dem = names.get(u.name, u.name)
        r = u.resources
        row = Row(
            kernel=short_name(dem),
            demangled=dem,
            mangled=u.name,
            arch=arch,
            kind="kernel" if entry else "device function",
            regs=r.get("REG", 0),
            stack=r.get("STACK", 0),
            local=r.get("LOCAL", 0),
            shared=r.get("SHARED", 0),
            constant={k: v for k, v in r.items() if k.startswith("CONSTANT")},
            resources=dict(r),
            max_block=(math.prod(bound) if bound else NO_BOUND_THREADS) if entry else None,
            launch_bound=bound if entry else None,
            bound_source=source if bound else "",
            min_blocks=info.min_blocks,
            fp64=is_fp64_variant(dem),
            occupancy=None,
            problems=[],
        )
        if entry:
            row.occupancy = occupancy(row.regs, row.max_block, row.shared, sm=sm)
        if row.stack > 0:
            row.problems.append(f"STACK {row.stack} B")
        if row.local > 0:
            row.problems.append(f"LOCAL {row.local} B")
        if row.occupancy is not None and not row.occupancy.fits:
            row.problems.append("does not fit its max block: " + "; ".join(row.occupancy.limited_by))
        rows.append(row)
    rows.sort(key=lambda x: (x.kind != "kernel", x.kernel.split("<")[0], x.fp64, x.kernel, x.mangled))
    return arch, rows


# GPUOPT_TOOL_STORE=<folder>: analyze's results kept between runs (scripts/run_tests.sh: build/tool-store), for the
# callers that read the same build: the static gate, the performance model and this tool's README command. Reading
# a whole extension costs a minute of CPU on 2 cores (`cuobjdump -elf` prints ~450 MB for it); an entry is named by
# everything the result depends on (_analysis_path), so another build, arch, cuobjdump or parser is read afresh.
TOOL_STORE_ENV = "GPUOPT_TOOL_STORE"


def file_digest(path: os.PathLike) -> str:
    """The sha256 of a file's bytes, read a MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def kept_path(kind: str, ident: Sequence[object], tools: Sequence[str], source: os.PathLike) -> Optional[Path]:
    """Where a result is kept under $GPUOPT_TOOL_STORE (None without it): `<kind>-<hash>.pkl`, the hash of `ident`
    (what the result is of: the code's digest, the arguments), each tool by its real path, size and mtime (a venv
    reached through a link names the same tool) and the source of the module that computes the result."""
    folder = os.environ.get(TOOL_STORE_ENV, "").strip()
    if not folder:
        return None
    stats = []
    for tool in tools:
        real = os.path.realpath(tool)
        st = os.stat(real)
        stats.append((real, st.st_size, st.st_mtime_ns))
    key = repr((tuple(ident), stats, Path(source).read_bytes()))
    return Path(folder) / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:40]}.pkl"


def _analysis_path(elf: Path, arch: Optional[str], tool: str, sm: SMLimits) -> Optional[Path]:
    """Where analyze's result for these arguments is kept (kept_path): named by the ELF's bytes, the arch asked
    for, the SM limits, cuobjdump and this module's source (the parsers and the occupancy model)."""
    if not os.environ.get(TOOL_STORE_ENV, "").strip():
        return None
    return kept_path("cuda-resources", (file_digest(elf), arch, repr(sm)), [tool], __file__)


def analyze(
    elf: os.PathLike, arch: Optional[str] = None, cuobjdump: Optional[str] = None, sm: SMLimits = SM90
) -> tuple[str, list[Row]]:
    """Run cuobjdump on `elf` and return (arch, rows); under $GPUOPT_TOOL_STORE a result kept for the same ELF,
    arguments, cuobjdump and parser is read instead."""
    elf = Path(elf)
    if not elf.is_file():
        raise ToolError(f"no such file: {elf}")
    tool = cuobjdump or find_cuobjdump()
    return kept_result(_analysis_path(elf, arch, tool, sm), lambda: _analyze_now(elf, arch, tool, sm))


def kept_result(path: Optional[os.PathLike], compute: Callable[[], object]):
    """compute()'s result, kept as a pickle at `path` (None: not kept) for the processes that name the same path:
    read when it is there (a read refreshes the file's time: a store kept between runs drops what no run has read
    for a while), else computed and written whole or not at all, for a concurrent reader. The cyclic garbage
    collector pauses while a pickle loads: the model's kept SASS is ~0.5M small objects, each collection during the
    load walks those made so far (a load took 3-8x as long), and nothing the load makes is garbage."""
    if path is not None:
        enabled = gc.isenabled()
        try:
            gc.disable()
            with open(path, "rb") as f:
                result = pickle.load(f)
            os.utime(path)
            return result
        except FileNotFoundError:  # not computed yet, or just dropped as unread
            pass
        finally:
            if enabled:
                gc.enable()
    result = compute()
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(result, f)
        os.replace(tmp, path)
    return result


def _analyze_now(elf: Path, arch: Optional[str], tool: str, sm: SMLimits) -> tuple[str, list[Row]]:
    res = _run([tool, "--dump-resource-usage", str(elf)])
    if "Fatbin elf code" not in res.stdout:
        msg = (res.stderr or res.stdout).strip()
        if "does not contain device code" in msg or res.returncode == 0 or "Fatbin ptx code" in res.stdout:
            raise ToolError(
                f"{elf} holds no cubins ({msg or 'no Fatbin elf code'}): it is not a CUDA build (a "
                "CPU-only build of the extension?). Build with nvcc (pip install --no-build-isolation "
                "-e . with a CUDA toolkit) or pass another ELF."
            )
        raise ToolError(f"{tool} --dump-resource-usage {elf} failed (exit {res.returncode}): {msg}")
    archs = sorted({u.arch for u in parse_resource_usage(res.stdout)}, key=_arch_key)
    want = normalize_arch(arch) if arch else (archs[-1] if archs else None)
    elf_text = ptx_text = ""
    if want in archs:
        e = _run([tool, "-elf", "-arch", want, str(elf)])
        elf_text = e.stdout if e.returncode == 0 else ""
        blocks = parse_elf_info(elf_text, want) if elf_text else []
        known = set().union(*blocks) if blocks else set()
        # the embedded PTX (.maxntid / .reqntid) only when the cubins' .nv.info did not cover every function
        if any(u.arch == want and u.name not in known for u in parse_resource_usage(res.stdout)):
            p = _run([tool, "-ptx", str(elf)])
            ptx_text = p.stdout if p.returncode == 0 else ""
    return build_rows(res.stdout, elf_text, ptx_text, arch=want, sm=sm)


# ----------------------------------------------------------------------------------------------------------------
# Output
COLUMNS = ("kernel", "regs", "stack", "local", "shared", "max block", "blocks/SM", "limited by", "fits", "gate")


def _cells(r: Row) -> list[str]:
    occ = r.occupancy
    if occ is None:
        blocks, limit, fits = "n/a", "", "n/a (device fn)"
    elif occ.fits:
        blocks, limit, fits = str(occ.blocks_per_sm), "+".join(occ.limited_by), "yes"
    else:
        blocks, limit, fits = "0", "; ".join(occ.limited_by), "does not fit"
    if r.fp64:
        gate = "fp64, not gated" + (f" ({', '.join(p.split(':')[0] for p in r.problems)})" if r.problems else "")
    else:
        gate = "FAIL: " + ", ".join(p.split(":")[0] for p in r.problems) if r.problems else "ok"
    return [
        r.kernel,
        str(r.regs),
        str(r.stack),
        str(r.local),
        str(r.shared),
        r.max_block_text(),
        blocks,
        limit,
        fits,
        gate,
    ]


def format_table(rows: Sequence[Row]) -> str:
    data = [list(COLUMNS)] + [_cells(r) for r in rows]
    widths = [max(len(row[i]) for row in data) for i in range(len(COLUMNS))]
    numeric = {1, 2, 3, 4, 6}
    out = []
    for j, row in enumerate(data):
        out.append(
            "  ".join(
                c.rjust(widths[i]) if i in numeric and j else c.ljust(widths[i]) for i, c in enumerate(row)
            ).rstrip()
        )
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_markdown(rows: Sequence[Row]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")

    out = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join(":---" if i in (0, 5, 7, 8, 9) else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    for r in rows:
        c = _cells(r)
        c[0] = f"`{c[0]}`"  # backticks keep <...> literal in GitHub markdown
        out.append("| " + " | ".join(c[0:1] + [esc(x) for x in c[1:]]) + " |")
    return "\n".join(out)


def _family(kernel: str) -> str:
    """kernel name plus a trailing integer template argument (e.g. the groups a thread), without the dtypes."""
    m = re.match(r"([\w:]+)<(.*)>$", kernel)
    if not m:
        return kernel
    last = m.group(2).split(",")[-1].strip()
    return f"{m.group(1)}<{last}>" if last.isdigit() else m.group(1)


def format_grouped(rows: Sequence[Row]) -> str:
    """One markdown row per kernel family over its fp16/bf16/fp32 variants (ranges where they differ); the
    README's table. Identical kernels from several translation units count once."""
    fams: dict = {}
    for r in rows:
        if r.kind == "kernel" and not r.fp64:
            fams.setdefault(_family(r.kernel), {})[r.kernel] = r

    def rng(vals) -> str:
        v = sorted(set(vals))
        return str(v[0]) if len(v) == 1 else f"{v[0]}–{v[-1]}"

    out = [
        "| kernel (fp16 / bf16 / fp32 variants) | variants | registers | stack | shared (B) | max block | "
        "blocks / SM at max block |",
        "|:---|---:|---:|---:|---:|---:|---:|",
    ]
    for fam, variants in sorted(fams.items()):
        vs = list(variants.values())
        blocks = [r.occupancy.blocks_per_sm if r.occupancy and r.occupancy.fits else 0 for r in vs]
        out.append(
            f"| `{fam}` | {len(vs)} | {rng(r.regs for r in vs)} | {max(r.stack + r.local for r in vs)} | "
            f"{rng(r.shared for r in vs)} | {rng(r.max_block_text() for r in vs)} | {rng(blocks)} |"
        )
    return "\n".join(out)


def summarize(arch: str, rows: Sequence[Row], sm: SMLimits = SM90) -> tuple[bool, str]:
    """(gate passed, summary text)."""
    kernels = [r for r in rows if r.kind == "kernel"]
    gated = [r for r in kernels if r.gated]
    fails = [r for r in rows if r.failing]
    fp64_bad = [r for r in rows if r.fp64 and r.problems]
    spill = [r for r in gated if r.stack > 0 or r.local > 0]
    nofit = [r for r in gated if r.fits is False]
    lines = [
        f"{arch}: {len(kernels)} kernels ({len(gated)} fp16/bf16/fp32 variants, {len(kernels) - len(gated)} fp64), "
        f"occupancy on an {sm.name} SM; "
        f"{sum(1 for r in kernels if r.launch_bound is None)} kernels have no launch bound (counted at "
        f"{NO_BOUND_THREADS} threads).",
    ]
    if fails:
        lines.append(
            f"GATE FAILED: {len(spill)} of {len(gated)} fp16/bf16/fp32 variants use stack or local memory, "
            f"{len(nofit)} do not fit their max block:"
        )
        lines += [f"  {r.kernel}: {'; '.join(r.problems)}" for r in fails]
    else:
        lines.append("gate passed: no fp16/bf16/fp32 variant uses stack or local memory, each fits its max block.")
    if fp64_bad:
        lines.append(
            f"fp64 variants are reported but do not fail the gate; {len(fp64_bad)} would: "
            + ", ".join(f"{r.kernel} ({'; '.join(r.problems)})" for r in fp64_bad)
        )
    else:
        lines.append("fp64 variants are reported but do not fail the gate (none would).")
    return not fails, "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.cuda_resources", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "elf", nargs="?", help="ELF with CUDA kernels (.so or .o); default: the installed gpuopt_ops/_C*.so"
    )
    ap.add_argument("--arch", help="SM architecture to report (e.g. sm_90); default: the newest one present")
    ap.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    ap.add_argument(
        "--grouped",
        action="store_true",
        help="print one markdown row per kernel family (fp16/bf16/fp32 variants), as in the README",
    )
    ap.add_argument("--json", metavar="OUT", help="write all rows (and the summary) to OUT as JSON")
    args = ap.parse_args(argv)
    try:
        elf = Path(args.elf) if args.elf else find_installed_extension()
        if args.elf is None and elf.is_file() and elf_section_names(elf) and not has_device_code(elf):
            raise ToolError(
                f"{elf} holds no cubins: the installed extension is a CPU-only build. Rebuild it with "
                "a CUDA toolkit, or pass an ELF with CUDA kernels."
            )
        tool = find_cuobjdump()
        arch, rows = analyze(elf, args.arch, tool)
    except ToolError as e:
        print(f"cuda_resources: error: {e}", file=sys.stderr)
        return 2
    ok, summary = summarize(arch, rows)
    print(f"# {elf} ({arch}, cuobjdump: {tool})")
    print(format_grouped(rows) if args.grouped else format_markdown(rows) if args.markdown else format_table(rows))
    print()
    print(summary)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "elf": str(elf),
                    "arch": arch,
                    "cuobjdump": tool,
                    "sm_limits": asdict(SM90),
                    "no_bound_threads": NO_BOUND_THREADS,
                    "passed": ok,
                    "summary": summary,
                    "rows": [r.to_json() for r in rows],
                },
                indent=1,
            )
            + "\n"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    # main of the module under its importable name: the results analyze keeps then name their classes as every
    # reader of the store does (tools.cuda_resources.Row, not __main__.Row)
    try:
        from tools import cuda_resources as _module
    except ImportError:
        _module = sys.modules[__name__]
    sys.exit(_module.main())

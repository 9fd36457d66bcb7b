"""The launches the CUDA backend's own host code plans (csrc/cuda/torch_ops.h, launch.cuh, launch_config.h,
gated_act_launch.cuh), read from the emulated extension (tools/cuda_emu) in its plan-only mode: an op runs its
checks and planning on CPU tensors as the GPU build does, and each launch is recorded (kernel with its template
arguments, grid, block, dynamic shared memory) and not run, so tensors made with torch.empty are never touched and
a 64M-element case costs nothing.

The device's SM count is the caller's; the blocks each kernel keeps resident on an SM come from the emulator's own
rule (occupancy=None: what an emulated run uses) or from `occupancy(kernel, threads, dynamic_shared)` (the
performance model: the sm_90 occupancy of the built extension's kernels). Kernels are named as tools.cuda_resources
names the built extension's (`nd_forward_rows_kernel<__nv_bfloat16, __nv_bfloat16, float, true, true, 1>`).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

SHARED_PER_BLOCK = 227 * 1024  # an H100 / H200 block's shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin)
# the emulator's 16-bit storage types (tools/cuda_emu/cuda_emu_types.h) -> the CUDA types they stand for
EMULATED_TYPES = {"c10::BFloat16": "__nv_bfloat16", "c10::Half": "__half"}

Occupancy = Callable[[str, int, int], int]  # (kernel, threads a block, dynamic shared bytes) -> blocks per SM


@dataclass(frozen=True)
class PlannedLaunch:
    kernel: str  # name<template arguments>
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int = 0

    @property
    def base(self) -> str:
        return self.kernel.split("<")[0]

    @property
    def args(self) -> list[str]:
        """The kernel's template arguments, as written in its name."""
        inner = self.kernel[len(self.base) + 1 : -1]
        return [a.strip() for a in inner.split(",")] if inner else []


def kernel_name(demangled: str) -> Optional[str]:
    """`name<args>` of a demangled kernel symbol (`void gpuopt::dev::name<args>(params)`), the emulator's types
    renamed to CUDA's; None for a symbol that is not a template kernel."""
    m = re.match(r"(?:void )?(?:[\w:]+::)?(\w+_kernel)<", demangled)
    if not m:
        return None
    depth, start = 0, m.end() - 1
    for i in range(start, len(demangled)):
        depth += {"<": 1, ">": -1}.get(demangled[i], 0)
        if depth == 0:
            name = f"{m.group(1)}{demangled[start : i + 1]}"
            for emulated, cuda in EMULATED_TYPES.items():
                name = name.replace(emulated, cuda)
            return name
    return None


def kernel_symbols(library: str) -> dict[int, str]:
    """{offset in the library: kernel name} of every template kernel the library defines (its symbol table:
    the kernels are hidden, so not in the dynamic one)."""
    text = subprocess.run(["nm", "-C", "--defined-only", library], check=True, capture_output=True, text=True).stdout
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW" and (name := kernel_name(parts[2])):
            addr = int(parts[0], 16)
            if out.get(addr, name) != name:
                raise RuntimeError(f"{library}: kernels {out[addr]} and {name} share the address {addr:#x}")
            out[addr] = name
    return out


class Planner:
    """Plans ops through the emulated extension on a device of `sm_count` SMs (blocks per SM: `occupancy`, or
    None for the emulator's rule capped at `max_blocks_per_sm`)."""

    def __init__(
        self,
        sm_count: int,
        occupancy: Optional[Occupancy] = None,
        max_blocks_per_sm: int = 32,
        shared_per_block: int = SHARED_PER_BLOCK,
    ):
        from tools.cuda_emu.build import load_emulated_ops

        self.ops, self.library = load_emulated_ops()
        self.device = (sm_count, max_blocks_per_sm, shared_per_block)
        self.occupancy = occupancy
        self.table: dict[tuple[int, int, int], int] = {}  # (entry, threads, dynamic shared) -> blocks per SM
        self._symbols: Optional[dict[int, str]] = None

    def name(self, entry: int) -> str:
        if self._symbols is None:
            self._symbols = kernel_symbols(self.library)
        if entry not in self._symbols:
            raise RuntimeError(f"no kernel at offset {entry:#x} of {self.library}")
        return self._symbols[entry]

    def records(self) -> list[PlannedLaunch]:
        """The launches the emulated extension logged since the last call (run or planned), and clears the log."""
        flat = self.ops.take_launch_records()
        out = []
        for i in range(0, len(flat), 9):
            entry, gx, gy, gz, bx, by, bz, shared, ok = flat[i : i + 9]
            if not ok:
                raise RuntimeError(
                    f"launch of {self.name(entry)} failed: grid ({gx}, {gy}, {gz}), block ({bx}, {by}, {bz})"
                )
            out.append(PlannedLaunch(self.name(entry), (gx, gy, gz), (bx, by, bz), shared))
        return out

    def plan(self, call: Callable[[object], object]) -> list[PlannedLaunch]:
        """The launches `call(torch.ops.gpuopt_emu)` plans, in order, none of them run. With an occupancy table,
        a plan that meets a kernel the table lacks is answered and planned again."""
        old = self.ops.configure(*self.device)
        try:
            for _ in range(16):
                flat = [v for key, blocks in self.table.items() for v in (*key, blocks)]
                self.ops.configure_plan(True, self.occupancy is not None, flat)
                self.ops.take_launch_records()
                try:
                    call(self.ops)
                finally:
                    queries = self.ops.take_occupancy_queries()
                    self.ops.configure_plan(False)
                launches = self.records()
                if not queries:
                    return launches
                for i in range(0, len(queries), 3):
                    entry, threads, shared = queries[i : i + 3]
                    self.table[(entry, threads, shared)] = self.occupancy(self.name(entry), threads, shared)
            raise RuntimeError("the launch plan kept asking for occupancies it was given")
        finally:
            self.ops.configure(*old)

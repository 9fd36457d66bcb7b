"""Builds torch extensions that run CUDA kernel source on the CPU under the emulator of tools/cuda_emu.

    from tools.cuda_emu.build import load_extension   # the repository root is on sys.path (pytest: pythonpath)
    lib = load_extension("gpuopt_emu_ops", ["tools/cuda_emu/emulated_ops.cpp"])
    torch.ops.<namespace of its TORCH_LIBRARY>.<op>(...)

Every extension gets tools/cuda_emu/cuda_emu.cpp (the emulator runtime) added to its sources, `-I tools/cuda_emu`
(csrc includes the emulator headers by bare name), `-I csrc`, `-DGPUOPT_CUDA_EMULATOR` and `-O2`. Builds are
cached under tools/cuda_emu/.build/<name>-<key>/ (git-ignored) or $GPUOPT_EMU_BUILD_DIR, keyed by a hash of the
sources and of every file they include (transitively) from tools/cuda_emu, csrc or the extra include dirs, the
flags, the compiler, and the torch and Python versions: a repeated run loads the cached library without invoking
the compiler. Paths inside the checkout enter the key relative to its root, so copies of the repository (the test
tree, a newcomer's checkout in the README test) share a build. Concurrent builds of one key (pytest-xdist) are
serialised by a lock; only the 3 newest builds of a name are kept.

Torch's own headers need C++20, so extensions are compiled in torch's default C++ mode; that the kernel headers
and the emulator are valid C++17 is checked separately with check_cxx17().
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

EMU_DIR = Path(__file__).resolve().parent
REPO_ROOT = EMU_DIR.parent.parent
CSRC_DIR = REPO_ROOT / "csrc"
RUNTIME_SOURCE = EMU_DIR / "cuda_emu.cpp"
DEFINES = ["-DGPUOPT_CUDA_EMULATOR"]
OPT_FLAGS = ["-O2"]

_loaded: dict[tuple[str, str], str] = {}


def build_root() -> Path:
    root = Path(os.environ.get("GPUOPT_EMU_BUILD_DIR", EMU_DIR / ".build"))
    root.mkdir(parents=True, exist_ok=True)
    ignore = root / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")  # build products never show up in git status
    return root


def include_dirs(extra_include_dirs: Iterable[str | os.PathLike] = ()) -> list[str]:
    return [str(EMU_DIR), str(CSRC_DIR)] + [str(Path(d).resolve()) for d in extra_include_dirs]


def compiler() -> str:
    return os.environ.get("CXX", "c++")


def have_compiler() -> bool:
    return shutil.which(compiler()) is not None


_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def dependencies(sources: Sequence[Path], incs: Sequence[str]) -> list[Path]:
    """The sources and every file they include, transitively, that resolves inside the include dirs (or, for
    `#include "..."`, next to the includer). System and torch headers are left out (the key has torch's version)."""
    dirs = [Path(d) for d in incs]
    seen: dict[Path, None] = {}
    todo = [Path(s).resolve() for s in sources]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen[f] = None
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for kind, name in _INCLUDE.findall(text):
            candidates = ([f.parent] if kind == '"' else []) + dirs
            for d in candidates:
                c = (d / name).resolve()
                if c.is_file():
                    todo.append(c)
                    break
    return sorted(seen)


def _in_checkout(path: str | os.PathLike) -> str:
    """`path` as the key names it: relative to this checkout's root when inside it, so that two checkouts of the
    same files (a copy of the repository, another clone) share their builds; absolute otherwise."""
    p = Path(path).resolve()
    return f"<checkout>/{p.relative_to(REPO_ROOT).as_posix()}" if p.is_relative_to(REPO_ROOT) else str(p)


def _cache_key(name: str, sources: Sequence[Path], incs: Sequence[str], cflags: Sequence[str]) -> str:
    import torch

    h = hashlib.sha256()
    inc_names = " ".join(_in_checkout(d) for d in incs)
    for part in (name, torch.__version__, sys.version, compiler(), " ".join(cflags), inc_names):
        h.update(part.encode())
        h.update(b"\0")
    for f in dependencies(sources, incs):
        h.update(_in_checkout(f).encode())
        h.update(b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _prune(root: Path, name: str, keep: Path, keep_count: int = 3) -> None:
    """Deletes all but the `keep_count` newest completed builds of `name` (and never `keep`)."""
    done = [d for d in root.glob(f"{name}-*") if d.is_dir() and (d / "BUILD_OK").exists() and d != keep]
    done.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for d in done[keep_count - 1 :]:
        shutil.rmtree(d, ignore_errors=True)
        (root / f"{d.name}.lock").unlink(missing_ok=True)


def load_extension(
    name: str,
    sources: Sequence[str | os.PathLike],
    extra_include_dirs: Iterable[str | os.PathLike] = (),
    extra_cflags: Sequence[str] = (),
    verbose: bool = False,
) -> str:
    """Compiles (or reuses the cached build of) `sources` + the emulator runtime into a shared library named
    `name`, loads it with torch.ops.load_library (TORCH_LIBRARY registrations run), and returns its path."""
    import torch
    from torch.utils import cpp_extension

    srcs = [Path(s).resolve() for s in sources]
    if RUNTIME_SOURCE not in srcs:
        srcs.append(RUNTIME_SOURCE)
    incs = include_dirs(extra_include_dirs)
    cflags = OPT_FLAGS + DEFINES + list(extra_cflags)
    key = _cache_key(name, srcs, incs, cflags)
    if (name, key) in _loaded:
        return _loaded[(name, key)]

    root = build_root()
    build_dir = root / f"{name}-{key}"
    build_dir.mkdir(parents=True, exist_ok=True)
    stamp = build_dir / "BUILD_OK"
    with open(root / f"{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        library = build_dir / f"{name}.so"
        if stamp.exists() and library.exists():
            torch.ops.load_library(str(library))
            print(f"[cuda_emu] {name}: cached build {library}", file=sys.stderr, flush=True)
        else:
            start = time.perf_counter()
            path = cpp_extension.load(
                name=name,
                sources=[str(s) for s in srcs],
                extra_cflags=cflags,
                extra_include_paths=incs,
                build_directory=str(build_dir),
                with_cuda=False,
                is_python_module=False,
                verbose=verbose,
            )
            library = Path(path) if path else library
            stamp.write_text(key + "\n")
            elapsed = time.perf_counter() - start
            print(f"[cuda_emu] {name}: built in {elapsed:.1f} s -> {library}", file=sys.stderr, flush=True)
            _prune(root, name, keep=build_dir)
    _loaded[(name, key)] = str(library)
    return str(library)


def check_cxx17(
    sources: Sequence[str | os.PathLike],
    extra_include_dirs: Iterable[str | os.PathLike] = (),
    extra_flags: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """Syntax-checks the files (kernel headers, torch-free sources) as C++17, all in one translation unit that
    includes them in order, with the emulator's include dirs and defines and warnings as errors. Raises
    AssertionError with the compiler's output on failure."""
    unit = "".join(f'#include "{Path(src).resolve()}"\n' for src in sources)
    cmd = (
        [compiler(), "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror"]
        + DEFINES
        + [f"-I{d}" for d in include_dirs(extra_include_dirs)]
        + list(extra_flags)
        + ["-x", "c++", "-"]
    )
    result = subprocess.run(cmd, input=unit, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"C++17 check failed:\n$ {' '.join(cmd)}\n{unit}{result.stdout}{result.stderr}")
    return result


@functools.cache
def load_emulated_ops():
    """The CUDA backend's ops (csrc/cuda/torch_ops.h, launch.cuh and the kernels) compiled for the emulator, with
    their real schemas as torch.ops.gpuopt_emu, and the path of the library that holds them. Hidden visibility,
    as setup.py builds _C: torch::stable's types are hidden. Once a process: a process holds one library of the
    gpuopt_emu namespace, and the build's key reads every source it includes (~30 ms), which the tests' every call
    of an op had paid."""
    import torch

    path = load_extension(
        "gpuopt_cuda_emulated",
        [EMU_DIR / "emulated_ops.cpp", CSRC_DIR / "checks.cpp"],
        extra_cflags=["-fvisibility=hidden"],
    )
    return torch.ops.gpuopt_emu, path

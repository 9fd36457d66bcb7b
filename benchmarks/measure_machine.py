"""benchmarks/gpu_measure.py's machine: the wheel unpacked first on sys.path, the run's metadata (versions, GPU,
commit), and the compile workers that fill Triton's cache before the measuring starts."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict
from typing import Optional

from benchmarks.measure_calls import make_call, make_inputs, sync
from benchmarks.measure_plan import ASSUMPTIONS, ROOT, Row


# ------------------------------------------------------------------------------------------------ the wheel
def unpack_wheel(wheel: str) -> str:
    """The wheel's files in a new temporary folder (removed when the process ends), put first on sys.path."""
    import atexit
    import shutil

    d = tempfile.mkdtemp(prefix="gpu_measure_wheel_")
    atexit.register(shutil.rmtree, d, True)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(d)
    sys.path.insert(0, d)
    return d


# ------------------------------------------------------------------------------------------------ metadata
def _version(module: str) -> Optional[str]:
    try:
        from importlib import metadata as md

        return md.version(module)
    except Exception:  # noqa: BLE001
        return None


def machine_meta(device: str, commit: Optional[str]) -> dict:
    import torch

    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        import triton

        versions["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        versions["triton"] = None
    versions["driver"] = None
    gpu = "CPU"
    machine = {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        gpu = props.name
        machine.update(sms=props.multi_processor_count, memory_bytes=props.total_memory)
        try:
            q = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            )  # fmt: skip
            versions["driver"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else None
        except Exception:  # noqa: BLE001
            pass
    for name, dist in (("gpuopt", "gpuopt"), ("liger_kernel", "liger-kernel"), ("quack", "quack-kernels")):
        versions[name] = _version(dist)
    try:
        import gpuopt_ops
        import gpuopt_ops.build_info as bi

        versions["gpuopt_built_with_torch"] = bi.TORCH_VERSION
        machine["gpuopt_ops"] = os.path.dirname(gpuopt_ops.__file__)
    except Exception:  # noqa: BLE001
        pass
    return {
        "gpu": gpu,
        "commit": commit or git_commit() or "unknown",
        "date": datetime.date.today().isoformat(),
        "versions": versions,
        "machine": machine,
    }


def git_commit() -> Optional[str]:
    try:
        q = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=10)  # fmt: skip
        return q.stdout.strip() or None if q.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def peers_importable() -> list[str]:
    out = []
    for backend, module in (("liger", "liger_kernel.ops.layer_norm"), ("quack", "quack.rmsnorm")):
        try:
            __import__(module)
            out.append(backend)
        except Exception:  # noqa: BLE001
            pass
    return out


# ------------------------------------------------------------------------------------------------ compile workers
def child_env(wheel_dir: Optional[str], environ: Optional[dict] = None) -> dict:
    """The environment of this script's child processes: the unpacked wheel first on PYTHONPATH, then the
    inherited PYTHONPATH (benchmarks/gpu_check.sh puts its installed wheel there), the checkout last (for the
    `benchmarks` and `tools` packages: its gpuopt_ops, without a build, must not come first)."""
    env = dict(os.environ if environ is None else environ)
    parts = ([wheel_dir] if wheel_dir else []) + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in parts:
        parts.append(str(ROOT))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONSAFEPATH"] = "1"  # no current folder first on sys.path (the checkout's gpuopt_ops)
    return env


def warm_rows(rows: list[Row], device: str) -> int:
    """Runs each row's call twice (compiling its Triton kernels into the on-disk cache); returns the failures."""
    failures = 0
    key, t = None, None
    for row in rows:
        try:
            if key != (row.dtype, row.n):
                t = None
                t = make_inputs(row.dtype, row.n, device, elements=row.elements)
                key = (row.dtype, row.n)
            fn = make_call(row, t, device)
            fn()
            fn()
            sync(device)
            print(f"warm {row.label()}", flush=True)
        except Exception as err:  # noqa: BLE001
            failures += 1
            print(f"warm {row.label()} failed: {type(err).__name__}: {err}", flush=True)
    return failures


def run_compile_workers(
    rows: list[Row], workers: int, deadline: float, log_dir: str, env: dict, device: str = "cuda"
) -> list[str]:
    """The Triton rows spread over `workers` processes (`--warm-rows`), waited for until `deadline`
    (time.monotonic); a worker still running then is stopped. Returns notes."""
    notes: list[str] = []
    rows = [r for r in rows if r.backend in ("triton", "liger")]  # quack's compiles stay in its process
    if not rows or workers <= 0:
        return notes
    rows.sort(key=lambda r: -ASSUMPTIONS.variants(r))
    procs = []
    for w in range(min(workers, len(rows))):
        part = rows[w::workers]
        spec = os.path.join(log_dir, f"warm_{w}.json")
        with open(spec, "w") as fh:
            json.dump([asdict(r) for r in part], fh)
        log = open(os.path.join(log_dir, f"warm_{w}.log"), "w")  # noqa: SIM115 (closed below)
        cmd = [sys.executable, "-m", "benchmarks.gpu_measure", "--warm-rows", spec, "--device", device]
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append((p, log, len(part)))
    for p, log, n_rows in procs:
        try:
            rc = p.wait(timeout=max(0.0, deadline - time.monotonic()))
            if rc != 0:
                notes.append(f"compile worker {p.pid} ({n_rows} rows) exited {rc}: see {log.name}")
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            notes.append(f"compile worker {p.pid} ({n_rows} rows) stopped at the compile deadline: {log.name}")
        log.close()
    return notes

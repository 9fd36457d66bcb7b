import os

# Inductor's CPU code in the tests is scalar C++ (no vector instruction set): torch.compile tests check how the
# ops behave inside compiled graphs, not Inductor's own vectorization, and a process's first vectorized compile
# costs ~25 s more CPU (it builds and runs a probe per instruction set, and the vector headers are heavy): 37 s
# against 15 s for the training loop's --compile run. Set before torch is imported (Inductor reads it then);
# TORCHINDUCTOR_VEC_ISA_OK=1 in the environment keeps the vector code.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

# Triton kernels run on CPU tensors under the interpreter when there is no GPU. The variable is read when
# @triton.jit decorates a kernel, so it must be set before anything imports triton.
try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import interpreter_lists

    interpreter_lists.install()  # the interpreter's builtins listed once a module, its numpy dtypes kept

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """`cuda`- and `triton_gpu`-marked tests skip cleanly without a GPU. By their marks, not their keywords: a
    test's keywords also hold the names of the folders above it, so a checkout in a folder named `cuda` would skip
    every test."""
    if not _HAS_CUDA:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("cuda") or item.get_closest_marker("triton_gpu"):
                item.add_marker(skip)


# Files whose tests share one costly module fixture (a subprocess that compiles or reads every kernel, an extension
# build, a distributed launch), and their group. Under pytest-xdist with `--dist loadgroup` (scripts/run_tests.sh) a
# group's tests run on one worker, so the fixture is built once, not once per worker; every other test is a unit
# of its own. The performance model and the Triton gate share a group: they compile many of the same Triton
# variants, and the second takes them from the first's store (the triton_store fixture).
XDIST_GROUPS = {
    "test_roofline.py": "triton_compile",
    "test_static_gate_triton.py": "triton_compile",
    "test_model_vs_measured.py": "triton_compile",
    "test_emulator_runtime.py": "emulator_runtime",
    "test_train.py": "train",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup with the groups of XDIST_GROUPS (by file). xdist's own reading of `xdist_group` marks (a
    suffix on the node id) has no effect under pytest 9.2, whose node ids are no longer a settable string; the
    groups here do not depend on it. The largest groups are handed out first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return XDIST_GROUPS.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1], nodeid)

    return FileGroupScheduling(config, log)


# Entries of a kept store ($GPUOPT_TRITON_STORE, $GPUOPT_TOOL_STORE) that no run has read for this long are dropped
# (a store read refreshes an entry).
STORE_KEEP_DAYS = 14


def prune_kept_store(folder) -> None:
    """Drops the entries of a kept store that no run has read for STORE_KEEP_DAYS."""
    import time
    from pathlib import Path

    store = Path(folder)
    cutoff = time.time() - STORE_KEEP_DAYS * 86400
    for entry in store.glob("*.pkl") if store.is_dir() else ():
        try:
            if entry.stat().st_mtime < cutoff:
                entry.unlink()
        except FileNotFoundError:  # another worker dropped it first
            pass


@pytest.fixture(scope="session", autouse=True)
def kept_tool_store():
    """$GPUOPT_TOOL_STORE (scripts/run_tests.sh: build/tool-store), which the static CUDA gate and the performance
    model read through tools.cuda_resources.analyze, and where the model keeps the SASS it reads (tools/roofline.py),
    pruned once a test process."""
    kept = os.environ.get("GPUOPT_TOOL_STORE", "").strip()
    if kept:
        prune_kept_store(kept)


@pytest.fixture(scope="session")
def triton_store(tmp_path_factory):
    """$GPUOPT_TRITON_STORE for the subprocesses of the Triton gate and the performance model: the compile results
    of tools.triton_resources. The folder the environment names, kept between runs (scripts/run_tests.sh:
    build/triton-store; entries are named by everything a compile reads, so a changed kernel compiles afresh),
    else one inside this test process's temporary folder (shared by the files of one xdist worker)."""
    from pathlib import Path

    kept = os.environ.get("GPUOPT_TRITON_STORE", "").strip()
    if not kept:
        return tmp_path_factory.getbasetemp() / "triton-store"
    prune_kept_store(kept)
    return Path(kept)


@pytest.fixture(scope="session")
def roofline_run(triton_store):
    """The performance model on the installed extension and the Triton kernels, beside every committed GPU
    measurement: one `python -m tools.roofline --json --measured docs/measurements/*.json` run a test process,
    shared by tests/test_roofline.py and tests/test_model_vs_measured.py (one xdist group). Triton compiles need a
    process without TRITON_INTERPRET, which this file sets here. Under CI=true a build the model cannot read fails."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tools import cuda_resources as CR

    ci = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
    pytest.importorskip("triton.backends.nvidia")
    try:
        ext = CR.find_installed_extension()
        CR.find_cuobjdump()
    except CR.ToolError as e:
        if ci:
            pytest.fail(f"CI=true but the model cannot read the build: {e}")
        pytest.skip(str(e))
    if not CR.has_device_code(ext):
        if ci:
            pytest.fail(f"CI=true but {ext.name} is a CPU-only build: no CUDA kernels to model")
        pytest.skip(f"{ext.name} is a CPU-only build: no CUDA kernels to model")
    root = Path(__file__).resolve().parent.parent
    measurements = sorted((root / "docs" / "measurements").glob("*.json"))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    env["GPUOPT_TRITON_STORE"] = str(triton_store)
    res = subprocess.run(
        [sys.executable, "-m", "tools.roofline", str(ext), "--json", "--measured", *map(str, measurements)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    return json.loads(res.stdout)


# hypothesis profiles (tests/test_fuzz.py): `dev` by default (small, derandomized: the same examples every run),
# `ci` under CI=true (more examples where they are cheap: the C++ and GPU backends; the interpreter keeps its own
# small count), `long` for a deep random search: `pytest tests/test_fuzz.py --hypothesis-profile=long`.
try:
    from hypothesis import settings as _hsettings

    _hsettings.register_profile("dev", max_examples=100, deadline=None, derandomize=True, print_blob=True)
    _hsettings.register_profile("ci", max_examples=500, deadline=None, derandomize=True, print_blob=True)
    _hsettings.register_profile("long", max_examples=5000, deadline=None, print_blob=True)
    _default = "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"
    _hsettings.load_profile(os.environ.get("GPUOPT_HYPOTHESIS_PROFILE", _default))
except ImportError:  # pragma: no cover
    pass


@pytest.fixture
def triton_looped(monkeypatch):
    """Forces the Triton looped (long-row) kernels for N > 16, with 16-column chunks, so that small rows exercise
    them (the row limits of every row-normalization op: plans.ROW_LIMITS); returns the plans module."""
    pytest.importorskip("triton")
    from gpuopt_ops.triton_kernels import plans

    monkeypatch.setattr(plans, "ROW_LIMITS", plans.ROW_LIMITS.capped(16))
    return plans

"""The README's benchmark and tool commands run as written after its two set-up commands, as a newcomer runs them:
`source .venv/bin/activate`, then `python -m ...` from the repository root.

There, Python imports gpuopt_ops from the source folder before the venv's installed copy; without a build of its
own that folder fails to import ("cannot load the compiled extension gpuopt_ops._C"). The set-up (scripts/
setup_env.sh) therefore ends with scripts/place_build.sh, which copies the installed build into it. The suite runs
in a copy of the repository without the package folders (scripts/run_tests.sh), so this test rebuilds the
newcomer's checkout in a temporary folder: gpuopt_ops/ and triton_kernels/ as the sources of the installed wheel
(its Python files, no _C), benchmarks/, tools/, scripts/place_build.sh and `.venv` (this venv). It checks that the
source folder shadows the venv there, runs place_build.sh as setup_env.sh does, then each README command through
bash, with arguments appended (argparse: the last value wins) that make it small: one op, tiny shapes, one N.

The commands are read from the README's bash blocks, so the two cannot drift: every `python -m benchmarks.* /
tools.*` line must be in QUICK (run here) or NOT_HERE (with the reason it cannot run on this machine)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gpuopt_ops

ROOT = Path(__file__).resolve().parents[1]
PKG = Path(gpuopt_ops.__file__).resolve().parent
ACTIVATE = "source .venv/bin/activate"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# README command (its comment cut) -> the arguments appended to make it small
QUICK = {
    "python -m benchmarks.run": f"--quick --ops ldr --modes fwd --ns 256 --mbytes 0.25 --providers {DEVICE},copy",
    "python -m benchmarks.plot bench_out/bench_*.csv": "",  # the CSV that the line before wrote
    "python -m benchmarks.memory": "--m 64 --n 256",
    "python -m benchmarks.model": "--quick",
    "python -m benchmarks.model --models bert,gpt2,llama,vit": "--quick --models bert",
    "python -m tools.cuda_resources --grouped": "",
    "python -m tools.triton_resources --summary": "--quick",
    "python -m tools.roofline": "--op layer_norm_dropout_relu --backend cuda --dtype bf16 --n 1024 --no-calibration",
    "python -m benchmarks.host_cost": "--ns 256 --dtypes fp32 --mbytes 1 --repeat 2",
    "python -m benchmarks.gpu_measure --dry-run": "",
}
# README commands this test does not run, and why
NOT_HERE = {
    "python -m benchmarks.gpu_measure --wheel dist/gpuopt-0.2.0-cp310-abi3-linux_x86_64.whl": "measures on a GPU "
    "(benchmarks/gpu_check.sh runs it there)",
    "python -m benchmarks.gpu_measure --attach-model docs/measurements/<file>.json": "<file> stands for a "
    "measurement file",
}
# they read the CUDA build's machine code: a CPU-only build has none (CI=true refuses such a build:
# tests/test_packaging.py::test_installed_build_meets_the_ci_rule)
NEEDS_CUDA_BUILD = ("tools.cuda_resources", "tools.roofline")


def readme_blocks() -> list[list[str]]:
    """The lines of each ```bash block of the README, comments cut."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return [[re.sub(r"\s+#.*$", "", ln).strip() for ln in b.splitlines() if ln.strip()] for b in blocks]


def readme_commands() -> list[str]:
    return [ln for b in readme_blocks() for ln in b if re.match(r"python -m (benchmarks|tools)\.", ln)]


def test_readme_commands_are_known():
    """Each README command is run below (QUICK) or said why not (NOT_HERE); the block that lists the benchmarks
    starts by activating the set-up's venv, so that `python` is the one with gpuopt."""
    commands = readme_commands()
    assert "python -m benchmarks.run" in commands and "python -m tools.roofline" in commands, commands
    unknown = [c for c in commands if c not in QUICK and c not in NOT_HERE]
    assert not unknown, f"README commands this test neither runs nor excuses (add them to QUICK or NOT_HERE): {unknown}"
    stale = [c for c in [*QUICK, *NOT_HERE] if c not in commands]
    assert not stale, f"QUICK / NOT_HERE name commands the README no longer has: {stale}"
    bench = next(b for b in readme_blocks() if "python -m benchmarks.run" in b)
    assert bench[0] == ACTIVATE, bench
    setup_env = (ROOT / "scripts" / "setup_env.sh").read_text()
    assert 'bash "$ROOT/scripts/place_build.sh" "$VPY"' in setup_env, "setup_env.sh no longer places the build"


def newcomer_checkout(dest: Path) -> Path:
    """A repository root as a newcomer's clone has it, for what the README's commands import."""
    ignore = shutil.ignore_patterns("__pycache__", "_C*.so", ".build", "triton_kernels")
    shutil.copytree(PKG, dest / "gpuopt_ops", ignore=ignore)
    kernels = PKG / "triton_kernels" if (PKG / "triton_kernels").is_dir() else ROOT / "triton_kernels"
    shutil.copytree(kernels, dest / "triton_kernels", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("benchmarks", "tools", "csrc"):  # csrc: the model plans CUDA launches with the real host code
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", ".build"))
    (dest / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "place_build.sh", dest / "scripts" / "place_build.sh")
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


def newcomer_env() -> dict[str, str]:
    """This environment less what a newcomer's shell does not have (the suite's own settings). The caches stay
    (the emulator's builds, the Triton compile store): each entry is named by everything it was built from, so
    what a command prints does not depend on them."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "TRITON_INTERPRET")
    return {k: v for k, v in os.environ.items() if k not in drop}


def bash(line: str, cwd: Path, timeout=600) -> subprocess.CompletedProcess:
    """`line` in bash after the README's activation line, as typed into a shell at cwd."""
    return subprocess.run(
        ["bash", "-c", f"set -e; {ACTIVATE}; {line}"],
        cwd=cwd,
        env=newcomer_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# A README command that reads what the one before it wrote runs in the same test, right after it.
AFTER = {"python -m benchmarks.plot bench_out/bench_*.csv": "python -m benchmarks.run"}


def quick_units() -> list[list[str]]:
    """The QUICK commands in README order, one test each (pytest-xdist spreads them over the workers), a command
    of AFTER in its producer's test."""
    units: list[list[str]] = []
    for command in readme_commands():
        if command not in QUICK:
            continue
        producer = AFTER.get(command)
        if producer is not None and units and units[-1][-1] == producer:
            units[-1].append(command)
        else:
            units.append([command])
    return units


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory):
    """A newcomer's checkout (newcomer_checkout), and what `import gpuopt_ops` said there before the set-up placed
    the build; then the set-up's last step, scripts/place_build.sh, run in it. One a test process."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the README's commands run in the set-up's venv; this Python is not a venv")
    root = newcomer_checkout(tmp_path_factory.mktemp("newcomer") / "repo")
    # the newcomer's problem: the source folder, first on sys.path, shadows the installed wheel
    before = bash('python -c "import gpuopt_ops"', root)
    # what setup_env.sh does after installing the wheel
    placed = subprocess.run(["bash", "scripts/place_build.sh", ".venv/bin/python"], cwd=root, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    return root, before, placed


@pytest.mark.slow  # fresh interpreters
def test_source_folder_shadows_the_venv_until_the_build_is_placed(newcomer):
    root, before, placed = newcomer
    assert before.returncode != 0, before.stdout
    assert "cannot load the compiled extension gpuopt_ops._C" in before.stderr, before.stderr
    assert f"imported from {root / 'gpuopt_ops' / '__init__.py'}" in before.stderr, before.stderr
    assert placed.returncode == 0, placed.stdout + placed.stderr
    for name in [p.name for p in PKG.glob("_C*.so")]:
        dest, installed = root / "gpuopt_ops" / name, PKG / name
        assert dest.is_file() and not dest.is_symlink(), dest
        assert dest.read_bytes() == installed.read_bytes(), f"{dest} is not the installed build"
    res = bash('python -c "import gpuopt_ops"', root)
    assert res.returncode == 0, res.stderr[-3000:]


def test_quick_units_cover_every_quick_command():
    """Every README command of QUICK runs in one of the tests below, once, and a command of AFTER right after the
    command that writes what it reads."""
    units = quick_units()
    flat = [c for u in units for c in u]
    assert sorted(flat) == sorted(c for c in readme_commands() if c in QUICK), flat
    assert len(flat) == len(set(flat)), flat
    for command, producer in AFTER.items():
        unit = next(u for u in units if command in u)
        assert unit.index(command) > 0 and unit[unit.index(command) - 1] == producer, unit


@pytest.mark.slow  # fresh interpreters: about two minutes of CPU in all, spread over the tests
@pytest.mark.parametrize("unit", quick_units(), ids=lambda u: u[0].removeprefix("python -m "))
def test_readme_command_runs_as_written(newcomer, unit):
    root, _, placed = newcomer
    assert placed.returncode == 0, placed.stdout + placed.stderr
    from gpuopt_ops import build_info

    if build_info.CUDA_ARCH_LIST is None and unit[0].split()[2] in NEEDS_CUDA_BUILD:
        pytest.skip("a CPU-only build: what this command reads is not there (never under CI=true)")
    for command in unit:
        line = f"{command} {QUICK[command]}".strip()
        res = bash(line, root)
        assert res.returncode == 0, f"$ {line}\n(rc {res.returncode})\n{(res.stdout + res.stderr)[-3000:]}"
        if command.startswith("python -m benchmarks.run"):
            assert (root / "bench_out" / f"bench_{DEVICE}.csv").is_file(), res.stdout[-2000:]


def test_place_build_copies_over_links_and_stale_builds(tmp_path):
    """scripts/place_build.sh: a link left in gpuopt_ops/ (a dev loop's) is replaced by a copy, never written
    through; a per-Python _C of an old in-place build, which Python would import before the abi3 one, goes; a
    second run copies nothing."""
    if not list(PKG.glob("_C*.so")) or PKG == ROOT / "gpuopt_ops":
        pytest.skip("needs gpuopt installed from the wheel (scripts/run_tests.sh)")
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "place_build.sh", root / "scripts" / "place_build.sh")
    src = root / "gpuopt_ops"
    src.mkdir()
    elsewhere = tmp_path / "elsewhere.so"
    elsewhere.write_bytes(b"not a build")
    (src / "_C.abi3.so").symlink_to(elsewhere)
    (src / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"stale")

    def place():
        res = subprocess.run(["bash", "scripts/place_build.sh", sys.executable], cwd=root, env=newcomer_env(),
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr

    place()
    assert elsewhere.read_bytes() == b"not a build"
    installed = sorted(p.name for p in PKG.glob("_C*.so"))
    assert sorted(p.name for p in src.glob("_C*.so")) == installed
    for name in installed:
        assert not (src / name).is_symlink() and (src / name).read_bytes() == (PKG / name).read_bytes(), name
    assert sorted(p.name for p in src.iterdir()) == installed  # no temporary left
    stamps = {p.name: p.stat().st_mtime_ns for p in src.iterdir()}
    place()
    assert {p.name: p.stat().st_mtime_ns for p in src.iterdir()} == stamps

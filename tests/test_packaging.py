"""The installed package: one abi3 wheel on the LibTorch stable ABI, its layout and metadata, setup.py's choice of
GPU architectures, the import error of a tree without a build, and CI's rule that it tests the CUDA build (a
CPU-only build fails under CI=true; `.ci/run --preflight` refuses a machine without the toolkit). Runs on the
installed gpuopt (the wheel, under scripts/run_tests.sh) or an editable build."""

import importlib.metadata as md
import importlib.util
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


def c_library() -> Path:
    spec = importlib.util.find_spec("gpuopt_ops._C")
    assert spec is not None and spec.origin, "gpuopt_ops._C is not installed"
    return Path(spec.origin)


def test_c_is_one_abi3_library():
    lib = c_library()
    assert lib.name == "_C.abi3.so", f"{lib}: expected Python's limited-API (abi3) build"
    assert sorted(p.name for p in lib.parent.glob("_C*.so")) == ["_C.abi3.so"], "stale per-Python builds next to it"


def test_c_needs_no_libtorch_cpp_symbols():
    """The stable ABI's promise: _C calls libtorch only through its C shim, so any torch >= 2.11 loads it."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.fail("`nm` (binutils) is needed to read _C's undefined symbols; install binutils")
    res = subprocess.run(
        [nm, "-D", "--undefined-only", "-C", str(c_library())], capture_output=True, text=True, check=True
    )
    undefined = [ln.split(None, 1)[-1] for ln in res.stdout.splitlines() if ln.strip()]
    assert len(undefined) > 10, res.stdout  # nm read the library (libc, libstdc++, the shim)
    cpp = [s for s in undefined if re.search(r"\b(at|c10|torch)::", s)]
    assert cpp == [], f"_C needs {len(cpp)} libtorch C++ symbols: {cpp[:10]}"
    shim = [s for s in undefined if s.startswith(("aoti_torch_", "torch_"))]
    assert shim, "expected _C to call libtorch through the stable C shim (aoti_torch_* / torch_*)"


def installed_distribution():
    """The gpuopt distribution that installed the gpuopt_ops being tested (not a stray egg-info on sys.path)."""
    for dist in md.distributions(name="gpuopt"):
        files = [str(f) for f in (dist.files or [])]
        if any(Path(dist.locate_file(f)).resolve() == PKG / "__init__.py" for f in files if f.endswith("__init__.py")):
            return dist
        if any("__editable__" in f for f in files):
            return dist
    pytest.fail(f"no installed gpuopt distribution owns {PKG}")


def distribution_files():
    dist = installed_distribution()
    return dist, [str(f) for f in (dist.files or [])]


def test_metadata_version_and_license():
    dist, files = distribution_files()
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    assert dist.version == version == "0.2.0"
    assert gpuopt_ops.__version__ == version
    assert dist.metadata.get("License-Expression") == "BSD-3-Clause"
    if not any("__editable__" in f for f in files):
        assert any(f.endswith("licenses/LICENSE") for f in files), files
    assert (ROOT / "LICENSE").read_text().startswith("BSD 3-Clause License")
    assert "## 0.2.0" in (ROOT / "CHANGELOG.md").read_text()


def test_triton_kernels_install_inside_gpuopt_ops():
    """Top-level `triton_kernels` is Triton's own package name (and PyPI's triton-kernels): ours is
    gpuopt_ops.triton_kernels."""
    _, files = distribution_files()
    finders = [f for f in files if f.startswith("__editable__") and f.endswith("_finder.py")]
    if finders:  # editable install: the finder's mapping says what is importable
        text = Path(installed_distribution().locate_file(finders[0])).read_text()
        mapping = re.search(r"MAPPING[^=]*=\s*(\{.*?\})", text, re.DOTALL).group(1)
        assert "'gpuopt_ops.triton_kernels'" in mapping or "'gpuopt_ops'" in mapping, mapping
        assert not re.search(r"['\"]triton_kernels['\"]\s*:", mapping), mapping
    else:
        assert "gpuopt_ops/triton_kernels/norm_dropout.py" in files
        assert not [f for f in files if f.startswith("triton_kernels/")]
    top = installed_distribution().read_text("top_level.txt") or ""
    assert "triton_kernels" not in top.split(), top


def load_setup_module():
    spec = importlib.util.spec_from_file_location("gpuopt_setup_under_test", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # __name__ is not "__main__": defines the helpers, builds nothing
    return mod


def test_setup_arch_list(monkeypatch):
    setup = load_setup_module()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5")
    assert setup._arch_list()[0] == "7.5"
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    # a machine with GPUs: the build targets them (PTX of the newest for what comes after)
    caps = {0: (9, 0), 1: (8, 6), 2: (9, 0)}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: caps[i])
    arch, why = setup._arch_list()
    assert arch == "8.6;9.0+PTX" and "GPUs of this machine" in why
    # none: the documented default
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert setup._arch_list()[0] == setup.DEFAULT_ARCH_LIST == "8.0;9.0+PTX"

    def no_driver():
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(torch.cuda, "device_count", no_driver)
    arch, why = setup._arch_list()
    assert arch == setup.DEFAULT_ARCH_LIST and "no GPU visible" in why


def test_build_info_records_the_build():
    from gpuopt_ops import build_info

    assert re.match(r"\d+\.\d+", build_info.TORCH_VERSION)
    arch = build_info.CUDA_ARCH_LIST
    assert arch is None or re.fullmatch(r"[0-9.;+ PTXa]+", arch), arch


@pytest.mark.slow  # fresh interpreters or external tools: CI runs it, the fast lane between edits does not
def test_import_error_of_a_tree_without_a_build(tmp_path):
    """A source tree on sys.path without _C gets an error that says what to do, not a bare ModuleNotFoundError."""
    shutil.copytree(PKG, tmp_path / "gpuopt_ops", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    res = subprocess.run(
        [sys.executable, "-c", "import gpuopt_ops"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert res.returncode != 0
    assert "cannot load the compiled extension gpuopt_ops._C" in res.stderr, res.stderr[-2000:]
    assert "torch >= 2.11" in res.stderr and "pip install" in res.stderr


# ---------------------------------------------------------------------------------------------- what import registers
def _fresh_python(code):
    """stdout of `code` in a new interpreter (a fresh import of gpuopt_ops); fails with its stderr."""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stdout


@pytest.mark.slow  # fresh interpreters or external tools: CI runs it, the fast lane between edits does not
def test_import_registers_the_triton_twins_and_works_without_triton():
    """`import gpuopt_ops` registers torch.ops.gpuopt.triton_* when triton imports, and without triton the other
    ops still load (one interpreter each way)."""
    pytest.importorskip("triton")
    out = _fresh_python(
        "import torch, gpuopt_ops, sys; op = torch.ops.gpuopt.triton_layer_norm_dropout_relu; "
        "print('OK', op.default._schema.name, 'gpuopt_ops.triton_ops' in sys.modules)"
    )
    assert "OK gpuopt::triton_layer_norm_dropout_relu True" in out
    out = _fresh_python(
        "import sys; sys.modules['triton'] = None; import torch, gpuopt_ops; "
        "x = torch.randn(2, 8); gpuopt_ops.layer_norm_dropout_relu(x, 8); "
        "print('OK', hasattr(torch.ops.gpuopt, 'triton_bias_relu'), 'gpuopt_ops.triton_ops' in sys.modules)"
    )
    assert "OK False False" in out


def test_triton_schemas_match_the_cpp_ops():
    """torch.library.triton_op ignores `schema=` on some torch versions: check what was registered."""
    pytest.importorskip("triton")
    from gpuopt_ops import triton_ops  # noqa: F401

    ops = torch.ops.gpuopt
    names = ("layer_norm_dropout_relu", "layer_norm_dropout_relu_backward", "bias_relu", "bias_relu_backward")
    more = ("bias_act", "dropout_add_norm", "norm_dropout")
    for name in (*names, *more, *(f"{n}_backward" for n in more)):
        cpp = getattr(ops, name).default._schema
        tri = getattr(ops, "triton_" + name).default._schema
        assert [(a.name, str(a.type)) for a in cpp.arguments] == [(a.name, str(a.type)) for a in tri.arguments]
        assert [str(r.type) for r in cpp.returns] == [str(r.type) for r in tri.returns]
        if all(r.name for r in tri.returns):  # named returns where triton_op honours `schema=`
            assert str(tri).replace("triton_", "", 1) == str(cpp)


def test_no_module_imports_another_modules_private_names():
    """The package's modules use each other's public names only (the compiled _C aside)."""
    import ast

    roots = [PKG, PKG / "triton_kernels"] if (PKG / "triton_kernels").is_dir() else [PKG]
    offenders = []
    for root in roots:
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    mod = node.module or ""
                    internal = node.level > 0 or mod.startswith("gpuopt_ops")
                    if not internal:
                        continue
                    if any(part.startswith("_") for part in mod.split(".")):
                        offenders.append(f"{path.name}: from {'.' * node.level}{mod}")
                    offenders += [
                        f"{path.name}: {a.name} from {mod}"
                        for a in node.names
                        if a.name.startswith("_") and a.name != "_C"
                    ]
    assert offenders == []


@pytest.mark.slow  # two pytest-xdist workers start
def test_xdist_groups_keep_a_file_on_one_worker():
    """scripts/run_tests.sh runs `-n N --dist loadgroup`: the files of conftest.XDIST_GROUPS run on one worker (the
    scheduler in tests/conftest.py), the other tests spread over the workers."""
    pytest.importorskip("xdist")
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v",
         "tests/test_roofline.py", "tests/test_sass.py", "-k", "wave_efficiency or trips_are_required or mem_bytes"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ran = re.findall(r"\[(gw\d+)\].*PASSED (tests/\S+)", res.stdout)
    grouped = {gw for gw, test in ran if test.startswith("tests/test_roofline.py")}
    others = {gw for gw, test in ran if test.startswith("tests/test_sass.py")}
    assert len(grouped) == 1 and len([t for _, t in ran if "test_roofline" in t]) == 2, res.stdout
    assert others == {"gw0", "gw1"}, res.stdout  # the ungrouped tests did spread


def test_gpu_skips_follow_marks_not_folder_names(tmp_path):
    """Without a GPU, tests/conftest.py skips the `cuda`- and `triton_gpu`-marked tests only, also in a checkout
    whose folder is named `cuda` (a test's keywords hold the folder names above it)."""
    root = tmp_path / "cuda"
    (root / "tests").mkdir(parents=True)
    for name in ("conftest.py", "interpreter_lists.py"):  # conftest.py and the module it imports
        shutil.copy2(ROOT / "tests" / name, root / "tests" / name)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n  cuda: needs a GPU\n  triton_gpu: needs a GPU\n")
    (root / "tests" / "test_probe.py").write_text(
        "import pytest\n\n\ndef test_plain():\n    pass\n\n\n@pytest.mark.cuda\ndef test_marked():\n    pass\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "tests"],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "tests/test_probe.py::test_plain PASSED" in res.stdout, res.stdout[-3000:]
    marked = "PASSED" if torch.cuda.is_available() else "SKIPPED"
    assert f"tests/test_probe.py::test_marked {marked}" in res.stdout, res.stdout[-3000:]


# ---------------------------------------------------------------------------------------------- CI needs the CUDA build
# Without nvcc, setup.py builds a CPU-only extension and the CUDA gates (tests/test_static_gate_cuda.py,
# tests/test_roofline.py) skip: a CI run would pass having checked no CUDA kernel. Under CI=true the suite therefore
# fails on a CPU-only build, and .ci/run stops before the build on a machine whose toolkit setup.py would not find.
# Users keep GPUOPT_CPU_ONLY=1 and CPU-only builds; only CI insists.
def _ci_is_set(env) -> bool:
    return env.get("CI", "").strip().lower() in ("1", "true", "yes")


def ci_build_problem(env, cuda_arch_list, has_device_code) -> str | None:
    """What is wrong with a build under CI=true (None: nothing, or not CI). `cuda_arch_list` is build_info's,
    `has_device_code` whether _C embeds CUDA code (tools.cuda_resources.has_device_code)."""
    if not _ci_is_set(env):
        return None
    if cuda_arch_list is None:
        return (
            "CI=true, but the installed gpuopt_ops is a CPU-only build (build_info.CUDA_ARCH_LIST is None): the "
            "CUDA static gates and the performance model would skip. Build with a CUDA toolkit (nvcc in "
            "$CUDA_HOME, /usr/local/cuda or on PATH) and without GPUOPT_CPU_ONLY; `.ci/run --preflight` checks it."
        )
    if not has_device_code:
        return (
            f"CI=true: build_info says a CUDA build ({cuda_arch_list}), but the installed _C embeds no CUDA code: "
            "a stale build_info.py next to a CPU-only _C? Rebuild and reinstall the wheel."
        )
    return None


def test_ci_rule_on_fake_builds():
    ci = {"CI": "true"}
    problem = ci_build_problem(ci, None, False)
    assert problem and "CPU-only build" in problem and "CUDA static gates" in problem
    assert "embeds no CUDA code" in ci_build_problem({"CI": "1"}, "9.0+PTX", False)
    assert ci_build_problem(ci, "9.0+PTX", True) is None
    assert ci_build_problem({"CI": " TRUE "}, None, False) is not None
    # outside CI a CPU-only build is a user's choice (GPUOPT_CPU_ONLY=1, or no toolkit)
    for env in ({}, {"CI": ""}, {"CI": "false"}, {"CI": "0"}):
        assert ci_build_problem(env, None, False) is None


def test_installed_build_meets_the_ci_rule():
    """Under CI=true the installed build is a CUDA build (else fails, with what to do); elsewhere it passes."""
    from gpuopt_ops import build_info
    from tools import cuda_resources as CR

    if not _ci_is_set(os.environ):
        assert ci_build_problem(os.environ, build_info.CUDA_ARCH_LIST, False) is None
        return
    has_code = build_info.CUDA_ARCH_LIST is not None and CR.has_device_code(CR.find_installed_extension())
    problem = ci_build_problem(os.environ, build_info.CUDA_ARCH_LIST, has_code)
    if problem:
        pytest.fail(problem)


def _fake_toolkit(root: Path, include=True) -> Path:
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(0o755)
    if include:
        (root / "include").mkdir()
        (root / "include" / "cuda_runtime.h").write_text("")
    return root


# (name, environment, PATH holds a link to this toolkit's nvcc, the default location is a toolkit, CI accepts it)
PREFLIGHT_CASES = [
    ("no toolkit anywhere", {}, None, False, False),
    ("GPUOPT_CPU_ONLY=1 beside a toolkit", {"GPUOPT_CPU_ONLY": "1"}, "full", True, False),
    ("GPUOPT_CPU_ONLY=0", {"GPUOPT_CPU_ONLY": "0"}, None, True, True),
    ("the default location", {}, None, True, True),
    ("nvcc on PATH with include/", {}, "full", False, True),
    ("nvcc on PATH without include/", {}, "bare", False, False),
    ("CUDA_HOME a toolkit", {"CUDA_HOME": "full"}, None, False, True),
    ("CUDA_PATH a toolkit", {"CUDA_PATH": "full"}, None, False, True),
    ("CUDA_HOME without nvcc", {"CUDA_HOME": "empty"}, "full", True, False),
]


@pytest.mark.parametrize("name,env,on_path,default_ok,accepted", PREFLIGHT_CASES, ids=[c[0] for c in PREFLIGHT_CASES])
def test_ci_preflight_refuses_what_setup_would_build_cpu_only(tmp_path, monkeypatch, name, env, on_path, default_ok,
                                                              accepted):  # fmt: skip
    """`.ci/run --preflight` (only its toolkit check runs) passes exactly where setup.py's _find_cuda_home finds a
    toolkit, and fails with the reason where setup.py would build CPU-only (or stop), so a CI machine without nvcc
    fails CI instead of skipping the CUDA gates."""
    kits = {"full": _fake_toolkit(tmp_path / "full"), "bare": _fake_toolkit(tmp_path / "bare", include=False)}
    kits["empty"] = tmp_path / "empty"
    kits["empty"].mkdir()
    default = _fake_toolkit(tmp_path / "default") if default_ok else tmp_path / "no-default"
    # PATH: the few tools the check calls, and nvcc only where the case puts one (a link, as /usr/local/bin/nvcc)
    path_dir = tmp_path / "path"
    path_dir.mkdir()
    for tool in ("dirname", "readlink"):
        (path_dir / tool).symlink_to(shutil.which(tool))
    if on_path:
        (path_dir / "nvcc").symlink_to(kits[on_path] / "bin" / "nvcc")
    case_env = {k: str(kits[v]) if v in kits else v for k, v in env.items()}
    run_env = {"PATH": str(path_dir), "HOME": str(tmp_path), "CI_CUDA_DEFAULT_HOME": str(default), **case_env}
    bash = shutil.which("bash")
    res = subprocess.run([bash, str(ROOT / ".ci" / "run"), "--preflight"], env=run_env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    out = res.stdout + res.stderr
    if accepted:
        assert res.returncode == 0 and "== CI: CUDA toolkit" in out, out
    else:
        assert res.returncode == 1 and "CI needs the CUDA build" in out, out
        assert "lint" not in out  # it stopped before any other step
    # the same environment, as setup.py sees it (its default location stands where CI_CUDA_DEFAULT_HOME points)
    setup = load_setup_module()
    for var in ("GPUOPT_CPU_ONLY", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    for var, value in {"PATH": str(path_dir), **case_env}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(setup, "Path", lambda p: default if str(p) == "/usr/local/cuda" else Path(p))
    try:
        home, _ = setup._find_cuda_home()
    except SystemExit:
        home = None
    assert (home is not None) == accepted, (name, home)

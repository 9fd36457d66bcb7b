"""The reference training loop (the README's main job): accuracy, resume, backends, errors, outputs."""

import gzip
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpuopt_ops import train

SMALL = ["--no-progress", "--hidden", "64", "--batch-size", "128"]


def run(*argv):
    return train.run(train.build_parser().parse_args([*map(str, argv)]))


def history(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def state(out):
    return torch.load(Path(out) / "checkpoint.pt", weights_only=True)


def test_digits_reaches_95_percent_and_leaves_its_outputs(tmp_path):
    summary = run("--out", tmp_path, "--epochs", 4, "--no-progress")
    assert summary["test_acc"] >= 0.95, summary
    for name in ("checkpoint.pt", "metrics.jsonl", "metrics.csv", "curves.png"):
        assert (tmp_path / name).is_file(), name
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    h = history(tmp_path)
    assert [r["epoch"] for r in h] == [1, 2, 3, 4]
    assert h[-1]["train_loss"] < h[0]["train_loss"]
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0].startswith("epoch,step,train_loss")
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name], "no temporary files left behind"


@pytest.mark.parametrize("extra", [[], ["--amp", "fp16"], ["--amp", "bf16", "--checkpoint-activations"]])
def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, extra):
    args = [*SMALL, "--epochs", 3, "--dropout", 0.2, *extra]
    run(*args, "--out", tmp_path / "full")
    run(*args, "--out", tmp_path / "cut", "--stop-after", 1)
    assert [r["epoch"] for r in history(tmp_path / "cut")] == [1]
    run(*args, "--out", tmp_path / "cut", "--resume")
    full, cut = state(tmp_path / "full"), state(tmp_path / "cut")
    for k, v in full["model"].items():
        assert torch.equal(v, cut["model"][k]), f"{k} differs after resume"
    assert full["step"] == cut["step"]
    keys = ("epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "lr")
    assert [[r[k] for k in keys] for r in full["history"]] == [[r[k] for k in keys] for r in cut["history"]]
    assert [r["epoch"] for r in history(tmp_path / "cut")] == [1, 2, 3]


def test_cpu_and_eager_backends_give_the_same_loss_curve(tmp_path):
    curves = {}
    for backend in ("cpu", "eager"):
        run(*SMALL, "--epochs", 3, "--dropout", 0, "--backend", backend, "--out", tmp_path / backend, "--no-plot")
        curves[backend] = [(r["train_loss"], r["test_loss"]) for r in history(tmp_path / backend)]
    torch.testing.assert_close(torch.tensor(curves["cpu"]), torch.tensor(curves["eager"]), rtol=1e-4, atol=1e-5)
    # the checkpoints are interchangeable: same parameter names and shapes
    assert state(tmp_path / "cpu")["model"].keys() == state(tmp_path / "eager")["model"].keys()


def test_activation_checkpointing_gives_the_same_weights(tmp_path):
    args = [*SMALL, "--epochs", 1, "--dropout", 0.3, "--no-plot"]
    run(*args, "--out", tmp_path / "a")
    run(*args, "--out", tmp_path / "b", "--checkpoint-activations")
    a, b = state(tmp_path / "a")["model"], state(tmp_path / "b")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a), "recompute must draw the same dropout masks"


def test_profile_and_memory_report(tmp_path, capsys):
    run(*SMALL, "--epochs", 1, "--profile", "--memory-report", "--out", tmp_path, "--no-plot")
    printed = capsys.readouterr().out
    assert "gpuopt::layer_norm_dropout_relu" in printed and "Self CPU" in printed
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any("gpuopt" in e.get("name", "") for e in trace["traceEvents"])
    mem = json.loads((tmp_path / "memory.json").read_text())
    assert 0 < mem["this_model_saved_bytes"] < mem["eager_saved_bytes"]


def test_compiled_model_trains_like_the_eager_one(tmp_path):
    args = [*SMALL, "--epochs", 1, "--dropout", 0.1, "--hidden", 32, "--no-plot"]
    run(*args, "--out", tmp_path / "plain")
    run(*args, "--out", tmp_path / "compiled", "--compile")
    a, b = history(tmp_path / "plain")[0], history(tmp_path / "compiled")[0]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-3)


def _write_idx(path, array, compress):
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    with (gzip.open if compress else open)(path, "wb") as f:  # closed, so a .gz gets its end-of-stream marker
        f.write(data)


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files(tmp_path, compress):
    rng = np.random.default_rng(0)
    d = tmp_path / "mnist"
    d.mkdir()
    sfx = ".gz" if compress else ""
    for split, n in (("train", 96), ("t10k", 40)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 40, (n, 28, 28)) + (labels[:, None, None] * 20)  # learnable: brightness = label
        _write_idx(d / f"{split}-images-idx3-ubyte{sfx}", images, compress)
        _write_idx(d / f"{split}-labels-idx1-ubyte{sfx}", labels, compress)
    x_train, y_train, x_test, y_test = train.load_data("mnist", d)
    assert x_train.shape == (96, 784) and x_test.shape == (40, 784) and y_train.dtype == torch.int64
    summary = run("--data", "mnist", "--data-dir", d, "--out", tmp_path / "out", "--epochs", 1, *SMALL)
    assert summary["epochs_done"] == 1


def _cli(*argv, env=None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "gpuopt_ops.train", *map(str, argv)], capture_output=True,
                          text=True, env=full_env, timeout=300)


def _tree(path):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(path).rglob("*") if p.is_file()}


def test_bad_input_gives_one_line_and_exit_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    run(*SMALL, "--epochs", 1, "--out", out, "--no-plot")
    before = _tree(out)
    bad_idx = tmp_path / "bad"
    bad_idx.mkdir()
    for name in train.MNIST_FILES.values():
        (bad_idx / name).write_bytes(b"not an idx file")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((out / "checkpoint.pt").read_bytes()[:200])
    cases = [
        (["--bogus"], "unrecognized arguments"),
        (["--epochs", "x"], "invalid int value"),
        (["--backend", "gpu"], "invalid choice"),
        (["--epochs", "0"], "--epochs"),
        (["--dropout", "1.5"], "--dropout"),
        (["--lr", "-1"], "--lr"),
        (["--data", "mnist"], "needs --data-dir"),
        (["--data", "mnist", "--data-dir", tmp_path / "nope"], "is not a folder"),
        (["--data", "mnist", "--data-dir", tmp_path], "not found in"),
        (["--data", "mnist", "--data-dir", bad_idx], "bad magic number"),
        (["--resume", "--hidden", "32"], "another model"),
        (["--resume", "--epochs", "5"], "another model"),
        (["--resume", truncated], "cannot read checkpoint"),
        (["--resume", tmp_path / "missing.pt"], "no checkpoint at"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "no CUDA GPU"))
        cases.append((["--backend", "cuda", "--device", "cpu"], "needs a GPU"))
    for argv, message in cases:
        capsys.readouterr()
        rc = train.main([*SMALL, "--epochs", "1", "--out", str(out), *map(str, argv)])
        stderr = capsys.readouterr().err
        assert rc == 2, (argv, rc, stderr[-2000:])
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuopt-train: error: ") and message in lines[0], \
            (argv, stderr)
        assert _tree(out) == before, f"{argv} changed the run folder"
    res = _cli("--bogus")  # the real command line: exit code and one line
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "gpuopt-train: error: unrecognized arguments: --bogus (see gpuopt-train --help)"]
    res = _cli("--backend", "triton", "--device", "cpu", "--out", tmp_path / "t", env={"TRITON_INTERPRET": "0"})
    assert res.returncode == 2 and "TRITON_INTERPRET=1" in res.stderr
    assert not (tmp_path / "t").exists()
    assert _cli("--help").returncode == 0


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint.pt"
    train.atomic_write_bytes(target, lambda f: f.write(b"old, complete"))

    def crash(f):
        f.write(b"half of a new checkpoint")
        raise KeyboardInterrupt("killed mid-save")

    with pytest.raises(KeyboardInterrupt):
        train.atomic_write_bytes(target, crash)
    assert target.read_bytes() == b"old, complete"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the triton backend is covered by the GPU tests")
def test_triton_backend_under_the_interpreter_trains_like_cpu(tmp_path):
    """Same masks bit for bit on every backend, so even with dropout the two runs give the same losses."""
    pytest.importorskip("triton")
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest without a GPU
    args = ["--no-progress", "--no-plot", "--epochs", 1, "--hidden", 32, "--batch-size", 256, "--dropout", 0.1]
    run(*args, "--backend", "cpu", "--out", tmp_path / "cpu")
    run(*args, "--backend", "triton", "--out", tmp_path / "triton")
    a, b = history(tmp_path / "cpu")[0], history(tmp_path / "triton")[0]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert a["test_acc"] == b["test_acc"]


def test_fuse_flag_trains_a_stock_model_as_well_as_the_default(tmp_path):
    """--fuse builds the MLP from nn.Linear/nn.ReLU/nn.LayerNorm/nn.Dropout and runs gpuopt_ops.fuse on it."""
    from gpuopt_ops.modules import FusedLayerNormDropoutReLU, LinearBiasReLU

    model = train.MLP(64, 10, 32, 2, 0.1, "bias_relu", "stock")
    assert {type(m) for m in model.modules()} >= {torch.nn.Linear, torch.nn.ReLU, torch.nn.LayerNorm,
                                                   torch.nn.Dropout}
    fused = __import__("gpuopt_ops").fuse(model)
    kinds = [type(m) for m in fused.modules()]
    assert kinds.count(FusedLayerNormDropoutReLU) == 2 and kinds.count(LinearBiasReLU) == 2
    assert list(fused.state_dict()) == list(train.MLP(64, 10, 32, 2).state_dict()), "the default's keys"

    args = [*SMALL, "--epochs", 3, "--dropout", 0.2]
    default = run(*args, "--out", tmp_path / "default")
    fuse = run(*args, "--out", tmp_path / "fuse", "--fuse")
    assert fuse["test_acc"] >= 0.85, fuse  # 3 short epochs; the full run reaches the default's ~98 %
    assert abs(fuse["test_acc"] - default["test_acc"]) <= 0.02, (fuse, default)
    # same initialisation order, the same ops and the same dropout seeds: bit-identical weights at the end
    a, b = state(tmp_path / "default")["model"], state(tmp_path / "fuse")["model"]
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [r["test_acc"] for r in history(tmp_path / "fuse")] == [r["test_acc"] for r in history(tmp_path / "default")]

"""The reference training loop (gpuopt_ops.train, the README's main job): accuracy, outputs, resume, backends,
the command line's errors, no host sync per step, and, under torchrun on gloo (CPU), DDP and FSDP2 against one
process, checkpoints moving between world sizes, and a crashing rank.

Runs of one process happen in this process (train.run / train.main); the torchrun tests (marked slow) launch
tests/train_distributed_runs.py and tests/train_with_failure.py.
"""

import gzip
import hashlib
import importlib.metadata
import inspect
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpuopt_ops import train
from gpuopt_ops.train import loop

from helpers import TESTS, torchrun

SMALL = ["--no-progress", "--hidden", "64", "--batch-size", "128"]
# the torchrun runs: both processes and the one-process runs they are compared with take the same flags
DIST_COMMON = ["--no-progress", "--no-plot", "--hidden", "32", "--batch-size", "64", "--epochs", "2"]
TIMEOUT = 300


@pytest.fixture(autouse=True, scope="module")
def one_intra_op_thread():
    """The C++ kernels split rows over torch's intra-op threads; on a small shared machine two threads contending
    for the cores make these tiny batches several times slower than one. Restored after this file."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(*argv):
    return train.run(train.build_parser().parse_args([*map(str, argv)]))


def history(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def state(out):
    return torch.load(Path(out) / "checkpoint.pt", weights_only=True)


def assert_same_weights(a, b, what):
    assert list(a["model"]) == list(b["model"])
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), f"{what}: {k} differs"


def max_diff(a, b):
    return max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])


# ---------------------------------------------------------------------------------------------- one process
def test_digits_reaches_95_percent_and_leaves_its_outputs(tmp_path):
    """The default model reaches 95 % on digits in 4 epochs and leaves checkpoint, metrics, csv and a PNG plot,
    with no temporary files."""
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
    """--stop-after 1 then --resume ends with the weights, steps and metrics of an uninterrupted run (fp32, fp16
    with its GradScaler state, bf16 with activation checkpointing)."""
    args = [*SMALL, "--epochs", 3, "--dropout", 0.2, "--no-plot", *extra]
    run(*args, "--out", tmp_path / "full")
    run(*args, "--out", tmp_path / "cut", "--stop-after", 1)
    assert [r["epoch"] for r in history(tmp_path / "cut")] == [1]
    run(*args, "--out", tmp_path / "cut", "--resume")
    full, cut = state(tmp_path / "full"), state(tmp_path / "cut")
    assert_same_weights(full, cut, "after resume")
    assert full["step"] == cut["step"]
    keys = ("epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "lr")
    assert [[r[k] for k in keys] for r in full["history"]] == [[r[k] for k in keys] for r in cut["history"]]
    assert [r["epoch"] for r in history(tmp_path / "cut")] == [1, 2, 3]


def test_cpu_and_eager_backends_give_the_same_loss_curve(tmp_path):
    """The C++ kernels and the unfused eager modules train alike (no dropout), with interchangeable checkpoints."""
    curves = {}
    for backend in ("cpu", "eager"):
        run(*SMALL, "--epochs", 3, "--dropout", 0, "--backend", backend, "--out", tmp_path / backend, "--no-plot")
        curves[backend] = [(r["train_loss"], r["test_loss"]) for r in history(tmp_path / backend)]
    torch.testing.assert_close(torch.tensor(curves["cpu"]), torch.tensor(curves["eager"]), rtol=1e-4, atol=1e-5)
    assert state(tmp_path / "cpu")["model"].keys() == state(tmp_path / "eager")["model"].keys()


def test_activation_checkpointing_gives_the_same_weights(tmp_path):
    """Recomputing the blocks in backward draws the same dropout masks: bit-identical weights."""
    args = [*SMALL, "--epochs", 1, "--dropout", 0.3, "--no-plot"]
    run(*args, "--out", tmp_path / "a")
    run(*args, "--out", tmp_path / "b", "--checkpoint-activations")
    assert_same_weights(state(tmp_path / "a"), state(tmp_path / "b"), "recompute must draw the same masks")


def test_profile_and_memory_report(tmp_path, capsys):
    """--profile prints a key_averages table with our ops and writes a Chrome trace; --memory-report finds that
    the fused model saves fewer bytes for backward than the eager one."""
    run(*SMALL, "--epochs", 1, "--profile", "--memory-report", "--out", tmp_path, "--no-plot")
    printed = capsys.readouterr().out
    assert "Self CPU" in printed  # the table
    ours = [ln for ln in printed.splitlines() if ln.startswith("gpuopt ops: ")]
    assert len(ours) == 1 and "gpuopt::layer_norm_dropout_relu (" in ours[0], printed  # whatever its rank
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any("gpuopt" in e.get("name", "") for e in trace["traceEvents"])
    mem = json.loads((tmp_path / "memory.json").read_text())
    assert 0 < mem["this_model_saved_bytes"] < mem["eager_saved_bytes"]


def test_compiled_model_trains_like_the_eager_one(tmp_path):
    """--compile (torch.compile, fullgraph) gives the losses of the uncompiled model."""
    args = [*SMALL, "--epochs", 1, "--dropout", 0.1, "--hidden", 32, "--no-plot"]
    run(*args, "--out", tmp_path / "plain")
    run(*args, "--out", tmp_path / "compiled", "--compile")
    a, b = history(tmp_path / "plain")[0], history(tmp_path / "compiled")[0]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-3)


def write_idx(path, array, compress):
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    with (gzip.open if compress else open)(path, "wb") as f:  # closed, so a .gz gets its end-of-stream marker
        f.write(data)


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files(tmp_path, compress):
    """--data mnist reads the four IDX files, raw or gzipped, and trains on them."""
    rng = np.random.default_rng(0)
    d = tmp_path / "mnist"
    d.mkdir()
    sfx = ".gz" if compress else ""
    for split, n in (("train", 96), ("t10k", 40)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 40, (n, 28, 28)) + (labels[:, None, None] * 20)  # learnable: brightness = label
        write_idx(d / f"{split}-images-idx3-ubyte{sfx}", images, compress)
        write_idx(d / f"{split}-labels-idx1-ubyte{sfx}", labels, compress)
    x_train, y_train, x_test, y_test = train.load_data("mnist", d)
    assert x_train.shape == (96, 784) and x_test.shape == (40, 784) and y_train.dtype == torch.int64
    summary = run("--data", "mnist", "--data-dir", d, "--out", tmp_path / "out", "--epochs", 1, "--no-plot", *SMALL)
    assert summary["epochs_done"] == 1


def tree(path):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(path).rglob("*") if p.is_file()}


def test_bad_input_gives_one_line_and_exit_2_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """Bad flags, data or checkpoints: main() returns 2 after one `gpuopt-train: error: ...` line and leaves the
    run folder as it was; the real command (one subprocess) exits with code 2 and prints that one line."""
    # the real command, started first: its start-up (importing torch) overlaps the in-process cases
    cli = subprocess.Popen(
        [sys.executable, "-m", "gpuopt_ops.train", "--bogus"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out = tmp_path / "run"
    run(*SMALL, "--epochs", 1, "--out", out, "--no-plot")
    before = tree(out)
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
        (["--log-every", "0"], "--log-every must be >= 1"),
        (["--fsdp"], "--fsdp shards over several processes"),
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
        assert len(lines) == 1 and lines[0].startswith("gpuopt-train: error: ") and message in lines[0], (argv, stderr)
        assert tree(out) == before, f"{argv} changed the run folder"
    # the backend check is the ops' own (gpuopt_ops.backends), reworded as a flag error
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert train.main(["--backend", "triton", "--device", "cpu", "--out", str(tmp_path / "t")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("gpuopt-train: error: --backend triton: ")
        and "TRITON_INTERPRET=1" in lines[0]
    ), lines
    assert not (tmp_path / "t").exists()
    monkeypatch.undo()
    with pytest.raises(SystemExit) as exit_help:
        train.main(["--help"])
    assert exit_help.value.code == 0 and "--log-every" in capsys.readouterr().out
    _, stderr = cli.communicate(timeout=TIMEOUT)
    assert cli.returncode == 2 and stderr.strip().splitlines() == [
        "gpuopt-train: error: unrecognized arguments: --bogus (see gpuopt-train --help)"
    ]


def test_console_script_is_the_cli_main():
    """The installed `gpuopt-train` command runs gpuopt_ops.train's main()."""
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="gpuopt-train")
    assert script.load() is train.main


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path):
    """atomic_write_bytes: an interrupted write leaves the old file whole and no temporary file."""
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
    args = ["--no-progress", "--no-plot", "--epochs", 1, "--hidden", 32, "--batch-size", 719, "--dropout", 0.1]
    run(*args, "--backend", "cpu", "--out", tmp_path / "cpu")
    run(*args, "--backend", "triton", "--out", tmp_path / "triton")
    a, b = history(tmp_path / "cpu")[0], history(tmp_path / "triton")[0]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert a["test_acc"] == b["test_acc"]


def test_fuse_flag_trains_a_stock_model_as_well_as_the_default(tmp_path):
    """--fuse builds the MLP from nn.Linear/nn.ReLU/nn.LayerNorm/nn.Dropout and runs gpuopt_ops.fuse on it: the
    default model's parameter names, and with the same seed the same weights, bit for bit."""
    from gpuopt_ops.modules import FusedLayerNormDropoutReLU, LinearBiasReLU

    model = train.MLP(64, 10, 32, 2, 0.1, "bias_relu", "stock")
    assert {type(m) for m in model.modules()} >= {torch.nn.Linear, torch.nn.ReLU, torch.nn.LayerNorm, torch.nn.Dropout}
    fused = __import__("gpuopt_ops").fuse(model)
    kinds = [type(m) for m in fused.modules()]
    assert kinds.count(FusedLayerNormDropoutReLU) == 2 and kinds.count(LinearBiasReLU) == 2
    assert list(fused.state_dict()) == list(train.MLP(64, 10, 32, 2).state_dict()), "the default's keys"

    args = [*SMALL, "--epochs", 3, "--dropout", 0.2, "--no-plot"]
    default = run(*args, "--out", tmp_path / "default")
    fuse = run(*args, "--out", tmp_path / "fuse", "--fuse")
    assert fuse["test_acc"] >= 0.85, fuse  # 3 short epochs; the full run reaches the default's ~98 %
    assert abs(fuse["test_acc"] - default["test_acc"]) <= 0.02, (fuse, default)
    # same initialisation order, the same ops and the same dropout seeds: bit-identical weights at the end
    assert_same_weights(state(tmp_path / "default"), state(tmp_path / "fuse"), "--fuse")
    assert [r["test_acc"] for r in history(tmp_path / "fuse")] == [r["test_acc"] for r in history(tmp_path / "default")]


def test_dropout_streams_differ_across_ranks_but_repeat():
    """rank_seed: a different dropout seed per rank, the same for the same --seed, another for another --seed."""
    seeds = [train.rank_seed(7, r) for r in range(4)]
    assert len(set(seeds)) == 4 and seeds == [train.rank_seed(7, r) for r in range(4)]
    assert train.rank_seed(8, 0) != seeds[0]


# ---------------------------------------------------------------------------------------------- host syncs
HOST_READS = ("item", "__int__", "__float__", "__bool__", "tolist")


def count_host_reads(monkeypatch):
    """Wraps the Tensor methods that copy a value to the host (a GPU→CPU sync on a GPU); returns the counter.

    Not counted, being reads of tensors that stay on the CPU even for a CUDA model, so no device sync: AdamW's
    `step` counter (optimizer._get_value; on the CPU unless capturable/fused), and the DataLoader's draws from the
    CPU generator (the sampler's permutation, the workers' base seed) when an epoch's iterator starts."""
    counter = {"n": 0}
    for name in HOST_READS:
        method = getattr(torch.Tensor, name)

        def counting(self, *a, _method=method, **k):
            caller = inspect.currentframe().f_back.f_code
            if caller.co_name != "_get_value" and "torch/utils/data/" not in caller.co_filename.replace("\\", "/"):
                counter["n"] += 1
            return _method(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return counter


def test_a_training_step_makes_no_host_sync(tmp_path, monkeypatch):
    """Between two reads of the running loss (every --log-every steps) the loop calls no Tensor.item / int /
    float / bool / tolist; the reads happen at the log points and at the end of the epoch, and do read (so the
    count is not vacuous); evaluation reads once."""
    reads, evals = [], []
    counter = count_host_reads(monkeypatch)
    read_sums, evaluate = loop.read_sums, loop.evaluate

    def recording_read(sums, first_step, last_step, *a):
        before = counter["n"]
        out = read_sums(sums, first_step, last_step, *a)
        reads.append((last_step, before, counter["n"]))
        return out

    def recording_evaluate(*a):
        before = counter["n"]
        out = evaluate(*a)
        evals.append(counter["n"] - before)
        return out

    monkeypatch.setattr(loop, "read_sums", recording_read)
    monkeypatch.setattr(loop, "evaluate", recording_evaluate)
    # digits: 1438 training samples, 23 steps of 64 per epoch
    run(
        "--no-progress",
        "--no-plot",
        "--epochs",
        2,
        "--hidden",
        32,
        "--batch-size",
        64,
        "--log-every",
        5,
        "--out",
        tmp_path,
    )
    assert [r[0] for r in reads] == [5, 10, 15, 20, 23, 25, 30, 35, 40, 45, 46]
    assert all(after > before for _, before, after in reads), "the reads copy the sums to the host"
    for (step, _, after), (next_step, before, _) in zip(reads, reads[1:]):
        if step not in (23, 46):  # not across an epoch's end: only training steps in between
            assert before == after, f"{before - after} host reads in steps {step + 1}-{next_step}"
    assert evals == [1, 1], "evaluate reads its sums once"


@pytest.mark.cuda
def test_a_training_step_makes_no_host_sync_on_cuda(tmp_path, monkeypatch):
    """On a GPU, a training step and the on-device sums run under torch.cuda.set_sync_debug_mode("error"): any
    synchronizing call raises. The reads at the log points still happen."""
    reads = []
    train_step, add, read_sums = loop.train_step, loop.EpochSums.add, loop.read_sums

    def no_sync(fn):
        def wrapped(*a, **k):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return fn(*a, **k)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        return wrapped

    def recording_read(sums, first_step, last_step, *a):
        reads.append(last_step)
        return read_sums(sums, first_step, last_step, *a)

    monkeypatch.setattr(loop, "train_step", no_sync(train_step))
    monkeypatch.setattr(loop.EpochSums, "add", no_sync(add))
    monkeypatch.setattr(loop, "read_sums", recording_read)
    run(
        "--no-progress",
        "--no-plot",
        "--epochs",
        1,
        "--hidden",
        32,
        "--batch-size",
        64,
        "--log-every",
        5,
        "--device",
        "cuda",
        "--out",
        tmp_path,
    )
    assert reads == [5, 10, 15, 20, 23]


def poison_step(monkeypatch, at_step):
    """Makes the step taken after `at_step` steps see NaN inputs, so its loss and gradients are NaN."""
    train_step = loop.train_step

    def poisoned(t, xb, yb):
        return train_step(t, xb * float("nan") if t.step == at_step else xb, yb)

    monkeypatch.setattr(loop, "train_step", poisoned)


def test_a_non_finite_loss_stops_the_run_naming_the_steps(tmp_path, monkeypatch):
    """A NaN loss at step 7 is found at the next read (step 10 with --log-every 5): RuntimeError naming steps
    6-10, before any checkpoint of that epoch is written. With fp16 the GradScaler skips that step instead and the
    run finishes with finite weights."""
    poison_step(monkeypatch, 6)
    args = ["--no-progress", "--no-plot", "--epochs", 1, "--hidden", 32, "--batch-size", 64, "--log-every", 5]
    with pytest.raises(RuntimeError, match=r"gpuopt-train: the loss became nan in steps 6-10 .*lower --lr"):
        run(*args, "--out", tmp_path / "fp32")
    assert not (tmp_path / "fp32" / "checkpoint.pt").exists()
    summary = run(*args, "--amp", "fp16", "--out", tmp_path / "fp16")
    assert summary["epochs_done"] == 1
    assert all(torch.isfinite(v).all() for v in state(tmp_path / "fp16")["model"].values())
    assert math.isnan(history(tmp_path / "fp16")[0]["train_loss"]), "the skipped step's loss is counted, as before"


def test_run_keeps_a_process_group_it_did_not_create(tmp_path):
    """A process group initialised before run() is used and still initialised afterwards (here a one-process
    gloo group: no DDP, but the same ownership rule as under torchrun)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        run(*SMALL, "--epochs", 1, "--hidden", 16, "--no-plot", "--out", tmp_path)
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- torchrun
@pytest.fixture(scope="module")
def crash_launch(tmp_path_factory):
    """The crash test's torchrun launch: rank 1 raises at its 4th step (tests/train_with_failure.py injects the
    failure). Started when first requested: the DDP test requests it too, so that the two launches' start-ups
    (mostly imports, ~7 s) overlap. Yields (process, path of its stderr)."""
    out = tmp_path_factory.mktemp("crash")
    with open(out / "stderr.txt", "w") as err:
        proc = torchrun(
            TESTS / "train_with_failure.py",
            1,
            3,
            *DIST_COMMON,
            "--epochs",
            3,
            "--out",
            out / "run",
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    yield proc, out / "stderr.txt"
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_ddp_and_fsdp2_under_torchrun(tmp_path, capsys, crash_launch):
    """One torchrun launch (2 processes, gloo) runs several trainings in one process group, which each run
    leaves in place:
    - DDP on the global batches of one process matches one process; FSDP2 matches DDP; same optimizer state keys;
    - resume at the same world size (--stop-after 1, --resume) is bit-identical to an uninterrupted run;
    - the same seed gives the same DDP run, bit for bit, and the ranks' dropout generators differ;
    - checkpoints move: DDP's epoch 1 is finished by one process, one process's by FSDP2;
    - a global batch that does not divide by the world size is a one-line error that writes nothing."""
    run(*DIST_COMMON, "--dropout", 0, "--out", tmp_path / "single")
    run(*DIST_COMMON, "--dropout", 0.1, "--stop-after", 1, "--out", tmp_path / "b")  # FSDP2 finishes it
    launch = torchrun(TESTS / "train_distributed_runs.py", tmp_path, *DIST_COMMON)
    _, stderr = launch.communicate(timeout=TIMEOUT)
    assert launch.returncode == 0, stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["group_kept"] == [True] * 8

    single, ddp, fsdp = (state(tmp_path / k) for k in ("single", "ddp", "fsdp"))
    assert ddp["world_size"] == 2 and len(ddp["rng_per_rank"]) == 2
    assert max_diff(ddp, single) < 1e-5, "DDP on the same global batches must match one process"
    assert max_diff(fsdp, ddp) < 1e-5, "FSDP2 must match DDP"
    assert ddp["optimizer"]["state"].keys() == single["optimizer"]["state"].keys() == fsdp["optimizer"]["state"].keys()
    losses = lambda s: [v for r in s["history"] for v in (r["train_loss"], r["test_loss"])]  # noqa: E731
    assert losses(single) == pytest.approx(losses(ddp), rel=1e-4)

    full, cut, again = (state(tmp_path / k) for k in ("full", "cut", "again"))
    assert_same_weights(full, cut, "DDP resume")
    assert_same_weights(full, again, "same seed")
    assert not torch.equal(full["rng_per_rank"][0]["torch"], full["rng_per_rank"][1]["torch"]), (
        "the ranks' dropout generators must differ"
    )

    capsys.readouterr()
    run(*DIST_COMMON, "--dropout", 0.1, "--resume", "--out", tmp_path / "a")  # one process finishes DDP's run
    assert "written by 2 process(es)" in capsys.readouterr().out
    a, b = state(tmp_path / "a"), state(tmp_path / "b")
    assert a["epoch"] == 2 and a["world_size"] == 1
    assert b["epoch"] == 2 and b["world_size"] == 2

    bad = results["bad_batch"]
    assert bad["rc"] == 2 and bad["stderr"].strip().splitlines() == [
        "gpuopt-train: error: rank 0: --batch-size 63 is the global batch: it must be divisible by the world size 2"
    ]
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_a_crashing_rank_fails_the_run_without_hanging(crash_launch):
    """Rank 1 raises at its 4th step (a failure injected by tests/train_with_failure.py): it says so in one line
    and torchrun stops the job with a non-zero exit code instead of hanging."""
    proc, stderr = crash_launch
    assert proc.wait(timeout=TIMEOUT) != 0
    assert "gpuopt-train: rank 1: failed: RuntimeError: injected failure on rank 1 at step 3" in stderr.read_text()

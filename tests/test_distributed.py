"""The training loop under torchrun on gloo (CPU): DDP and FSDP2 match one process, checkpoints move between
world sizes, resume is exact at the same world size, and a crashing rank fails the run instead of hanging."""

import os
import subprocess
import sys

import pytest
import torch

from gpuopt_ops import train

COMMON = ["--no-progress", "--no-plot", "--hidden", "32", "--batch-size", "64", "--epochs", "2"]
TIMEOUT = 240


def launch(out, *argv, nproc=2, env=None, check=True):
    if nproc == 1:
        cmd = [sys.executable, "-m", "gpuopt_ops.train"]
    else:  # --standalone: a local rendezvous on a free port
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "gpuopt_ops.train"]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    res = subprocess.run([*cmd, *COMMON, "--out", str(out), *map(str, argv)], capture_output=True, text=True,
                         env=full_env, timeout=TIMEOUT)
    if check:
        assert res.returncode == 0, res.stderr[-3000:]
    return res


def weights(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)


def max_diff(a, b):
    return max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])


def test_ddp_and_fsdp2_match_one_process(tmp_path):
    launch(tmp_path / "single", "--dropout", 0, nproc=1)
    launch(tmp_path / "ddp", "--dropout", 0)
    launch(tmp_path / "fsdp", "--dropout", 0, "--fsdp")
    single, ddp, fsdp = (weights(tmp_path / k) for k in ("single", "ddp", "fsdp"))
    assert ddp["world_size"] == 2 and len(ddp["rng_per_rank"]) == 2
    assert max_diff(ddp, single) < 1e-5, "DDP on the same global batches must match one process"
    assert max_diff(fsdp, ddp) < 1e-5, "FSDP2 must match DDP"
    assert ddp["optimizer"]["state"].keys() == single["optimizer"]["state"].keys() == fsdp["optimizer"]["state"].keys()
    h1, h2 = (train_history(tmp_path / k) for k in ("single", "ddp"))
    assert h1 == pytest.approx(h2, rel=1e-4)


def train_history(out):
    return [v for r in weights(out)["history"] for v in (r["train_loss"], r["test_loss"])]


def test_resume_at_the_same_world_size_is_bit_identical(tmp_path):
    launch(tmp_path / "full", "--dropout", 0.2)
    launch(tmp_path / "cut", "--dropout", 0.2, "--stop-after", 1)
    launch(tmp_path / "cut", "--dropout", 0.2, "--resume")
    full, cut = weights(tmp_path / "full"), weights(tmp_path / "cut")
    for k in full["model"]:
        assert torch.equal(full["model"][k], cut["model"][k]), k


def test_checkpoints_move_between_ddp_and_one_process(tmp_path):
    launch(tmp_path / "a", "--dropout", 0.1, "--stop-after", 1)           # DDP writes epoch 1
    res = launch(tmp_path / "a", "--dropout", 0.1, "--resume", nproc=1)   # one process finishes
    assert "written by 2 process(es)" in res.stdout and weights(tmp_path / "a")["epoch"] == 2
    launch(tmp_path / "b", "--dropout", 0.1, "--stop-after", 1, nproc=1)  # one process writes epoch 1
    launch(tmp_path / "b", "--dropout", 0.1, "--resume", "--fsdp")        # FSDP2 finishes
    assert weights(tmp_path / "b")["epoch"] == 2 and weights(tmp_path / "b")["world_size"] == 2


def test_dropout_streams_differ_across_ranks_but_repeat():
    seeds = [train.rank_seed(7, r) for r in range(4)]
    assert len(set(seeds)) == 4 and seeds == [train.rank_seed(7, r) for r in range(4)]
    assert train.rank_seed(8, 0) != seeds[0]


def test_same_seed_same_ddp_run(tmp_path):
    launch(tmp_path / "a", "--dropout", 0.3, "--epochs", 1)
    launch(tmp_path / "b", "--dropout", 0.3, "--epochs", 1)
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    rng = a["rng_per_rank"]
    assert not torch.equal(rng[0]["torch"], rng[1]["torch"]), "the ranks' dropout generators must differ"


def test_a_crashing_rank_fails_the_run_without_hanging(tmp_path):
    res = launch(tmp_path / "crash", "--epochs", 3, env={"GPUOPT_TRAIN_FAIL_AT": "1:3"}, check=False)
    assert res.returncode != 0
    assert "rank 1: failed: RuntimeError: injected failure on rank 1 at step 3" in res.stderr


def test_global_batch_must_divide_by_the_world_size(tmp_path):
    res = launch(tmp_path / "bad", "--batch-size", 63, check=False)
    assert res.returncode != 0
    assert "must be divisible by the world size 2" in res.stderr
    assert not (tmp_path / "bad").exists()

"""Checkpoints: the atomic file write, the RNG states, reading and checking a checkpoint, and the full (unsharded)
state dicts, in one format for a single process, DDP and FSDP2 so that checkpoints move between them."""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .errors import PROG, UsageError

CHECKPOINT_FORMAT = "gpuopt-train/1"
# what must match for a checkpoint to be resumed (the backend, amp, compile, ... may change between runs)
ARCH_KEYS = ("data", "in_features", "num_classes", "hidden", "depth", "linear", "epochs", "batch_size")


def atomic_write_bytes(path: Path, write) -> None:
    """Writes via a temporary file in the same folder, fsync, then rename: a crash leaves the old file intact."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    with contextlib.suppress(OSError):  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save of `state` to `path`, atomically (atomic_write_bytes)."""
    atomic_write_bytes(path, lambda f: torch.save(state, f))


def rng_state(device: torch.device) -> dict:
    """This process's torch (CPU and CUDA), numpy and Python generator states, as weights_only-loadable values."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": random.getstate(),
    }


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restores what rng_state saved."""
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))


def load_checkpoint(path: Path, cfg: dict) -> dict:
    """The checkpoint at `path`, checked to be ours and to fit the model and schedule `cfg` (UsageError if not)."""
    if not path.is_file():
        raise UsageError(f"--resume: no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file
        raise UsageError(f"--resume: cannot read checkpoint {path}: {str(err).splitlines()[0]}") from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise UsageError(f"--resume: {path} is not a {PROG} checkpoint (format {CHECKPOINT_FORMAT})")
    diffs = [
        f"{k}: checkpoint {ckpt['config'].get(k)!r}, this run {cfg[k]!r}"
        for k in ARCH_KEYS
        if ckpt["config"].get(k) != cfg[k]
    ]
    if diffs:
        raise UsageError(
            f"--resume: {path} was written by another model or schedule ({'; '.join(diffs)}); "
            "pass the same flags or another --out"
        )
    return ckpt


def state_dict_options(**kw):
    """torch.distributed.checkpoint's options for full (unsharded) state dicts; `kw` adds to them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_state(model: nn.Module, optimizer, cpu_offload: bool) -> tuple[dict, dict]:
    """Full (unsharded) model and optimizer state dicts keyed by parameter names (on CPU and on rank 0 only
    with `cpu_offload`, which a process group needs).

    The same format for a single process, DDP and FSDP2, so checkpoints move between them. A collective under
    FSDP2: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    opts = state_dict_options(cpu_offload=cpu_offload)
    return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, optimizer, options=opts)


def load_model_state(model: nn.Module, ckpt: dict) -> None:
    """The checkpoint's weights into the (not yet sharded) model; UsageError if they do not fit."""
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, ValueError, KeyError) as err:
        raise UsageError(f"--resume: checkpoint does not fit this model: {str(err).splitlines()[0]}") from err


def load_optimizer_state(model: nn.Module, optimizer, ckpt: dict) -> None:
    """The checkpoint's full optimizer state into `optimizer` (sharded like the model under FSDP2); UsageError if
    it does not fit."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    try:
        set_optimizer_state_dict(model, optimizer, optim_state_dict=ckpt["optimizer"], options=state_dict_options())
    except (RuntimeError, ValueError, KeyError) as err:
        raise UsageError(f"--resume: optimizer state does not fit this model: {str(err).splitlines()[0]}") from err

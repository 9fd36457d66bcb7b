"""The command line: the parser, run() (every check of the flags, the data and a checkpoint, before anything is
written) and main(), which turns a UsageError into one `gpuopt-train: error: ...` line and exit code 2."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from ..backends import resolve_backend
from .checkpoint import load_checkpoint
from .data import load_data
from .distributed import Dist
from .errors import PROG, UsageError
from .loop import RunContext, train
from .model import model_config

DESCRIPTION = "The reference training loop: an MLP built from the fused ops, trained on a bundled dataset."
EPILOG = """\
examples:
  gpuopt-train                                  # digits (bundled with scikit-learn), CPU or GPU
  gpuopt-train --data mnist --data-dir DIR --backend triton --amp bf16 --compile
  gpuopt-train --resume                         # continue runs/digits/checkpoint.pt
  torchrun --standalone --nproc_per_node=K -m gpuopt_ops.train [--fsdp]

Writes into --out: checkpoint.pt (every epoch, atomically), metrics.jsonl / metrics.csv, curves.png, and with
--profile trace.json, with --memory-report memory.json. Errors in the flags, the data or a checkpoint print one
line and exit with code 2 before anything is written."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of argparse's usage + error
        raise UsageError(f"{message} (see {PROG} --help)")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass  # the defaults in the flags' help, and the epilog's examples as written


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=_HelpFormatter)
    for add_flags in (_add_data_flags, _add_schedule_flags, _add_model_flags, _add_run_flags, _add_report_flags):
        add_flags(ap)  # in this order: the order of --help
    return ap


def _add_data_flags(ap: argparse.ArgumentParser) -> None:
    """--data, --data-dir, --out: what to train on and where the run writes."""
    ap.add_argument(
        "--data",
        choices=("digits", "mnist"),
        default="digits",
        help="digits: scikit-learn's bundled 8x8 digits (no download); mnist: IDX files in --data-dir",
    )
    ap.add_argument("--data-dir", type=Path, default=None, help="folder with the MNIST IDX files (raw or .gz)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default runs/<data>)")


def _add_schedule_flags(ap: argparse.ArgumentParser) -> None:
    """--epochs, --batch-size, --lr, --weight-decay: the optimisation schedule."""
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)


def _add_model_flags(ap: argparse.ArgumentParser) -> None:
    """The model and how it runs: size, dropout, linear kind, backend, device, amp, fuse, compile, activation
    checkpointing."""
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--depth", type=int, default=2, help="number of [linear → LN-dropout-ReLU] blocks")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument(
        "--linear",
        choices=("bias_relu", "plain"),
        default="bias_relu",
        help="bias_relu: matmul + fused bias-ReLU; plain: nn.Linear",
    )
    ap.add_argument(
        "--backend",
        choices=("auto", "cuda", "triton", "cpu", "eager"),
        default="auto",
        help="auto: CUDA kernels on a GPU, C++ on CPU; eager: the unfused PyTorch modules",
    )
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument(
        "--amp", choices=("none", "bf16", "fp16"), default="none", help="autocast dtype; fp16 uses a GradScaler"
    )
    ap.add_argument(
        "--fuse",
        action="store_true",
        help="build the model from stock nn.Linear/LayerNorm/ReLU/Dropout, then gpuopt_ops.fuse it",
    )
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (fullgraph)")
    ap.add_argument(
        "--checkpoint-activations",
        action="store_true",
        help="recompute each block in backward (torch.utils.checkpoint, non-reentrant)",
    )


def _add_run_flags(ap: argparse.ArgumentParser) -> None:
    """How the run goes: clipping, seed, resume / stop, FSDP, data workers, how often the loss is read."""
    ap.add_argument("--clip", type=float, default=1.0, help="max gradient norm (0: no clipping)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        default=None,
        metavar="CHECKPOINT",
        help="continue from CHECKPOINT (default <out>/checkpoint.pt)",
    )
    ap.add_argument(
        "--stop-after",
        type=int,
        default=None,
        metavar="K",
        help="stop after K epochs of this run (time-sliced jobs; resume later with --resume)",
    )
    ap.add_argument("--fsdp", action="store_true", help="under torchrun: FSDP2 (fully_shard per block) instead of DDP")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    ap.add_argument(
        "--log-every",
        type=int,
        default=50,
        metavar="N",
        help="read the running loss and accuracy from the device every N steps (and at the end of "
        "each epoch) for the progress bar and the check that the loss is finite; the steps in "
        "between make no host sync",
    )


def _add_report_flags(ap: argparse.ArgumentParser) -> None:
    """What the run reports: profile, memory report, progress bar, curves."""
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile 3 training steps: Chrome trace <out>/trace.json and a key_averages table",
    )
    ap.add_argument(
        "--memory-report",
        action="store_true",
        help="bytes saved for backward (and peak CUDA memory) of one step, fused vs eager model",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--no-plot", action="store_true", help="do not draw curves.png")


def resolve_device(args) -> torch.device:
    if args.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is available (torch.cuda.is_available() is False)")
    return torch.device(args.device)


def backend_for(args, device: torch.device) -> str:
    """The backend --backend names on this device ("eager": the unfused modules); the capability checks are the
    ops' own (gpuopt_ops.backends.resolve_backend), with the advice reworded in terms of the flags."""
    if args.backend == "eager":
        return "eager"
    if args.backend == "cpu" and device.type != "cpu":
        raise UsageError("--backend cpu runs on CPU tensors: use --device cpu, or --backend cuda/triton")
    if args.backend == "cuda" and device.type != "cuda":
        raise UsageError("--backend cuda needs a GPU (--device cuda); on CPU use --backend cpu")
    try:
        return resolve_backend(args.backend, device, "layer_norm_dropout_relu")
    except (ValueError, RuntimeError, ImportError) as err:
        raise UsageError(f"--backend {args.backend}: {err}") from err


def check_flags(args, dist: Dist) -> None:
    """The checks of the flags alone (UsageError)."""
    if args.epochs < 1 or args.batch_size < 1 or args.hidden < 1 or args.depth < 1 or args.workers < 0:
        raise UsageError("--epochs, --batch-size, --hidden and --depth must be >= 1 and --workers >= 0")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise UsageError(f"--lr must be a finite number > 0, got {args.lr}")
    if not 0.0 <= args.dropout <= 1.0:
        raise UsageError(f"--dropout must be in [0, 1], got {args.dropout}")
    if args.stop_after is not None and args.stop_after < 1:
        raise UsageError(f"--stop-after must be >= 1, got {args.stop_after}")
    if args.log_every < 1:
        raise UsageError(f"--log-every must be >= 1, got {args.log_every}")
    if args.batch_size % dist.world:
        raise UsageError(
            f"--batch-size {args.batch_size} is the global batch: it must be divisible by the world size {dist.world}"
        )
    if args.fsdp and dist.world < 2:
        raise UsageError("--fsdp shards over several processes: launch with torchrun --nproc_per_node=K (K >= 2)")
    if args.fsdp and args.amp == "fp16":
        raise UsageError("--fsdp with --amp fp16 is not supported (no sharded GradScaler here): use --amp bf16")
    if args.fuse and args.backend == "eager":
        raise UsageError("--fuse swaps in our kernels: use it with --backend auto/cuda/triton/cpu, not eager")
    if args.memory_report and dist.world > 1:
        raise UsageError("--memory-report measures one process: run it without torchrun")


def run(args) -> dict:
    """One training run of the parsed flags `args` (build_parser().parse_args(...)); returns its summary.

    Under torchrun every rank calls it. A process group already initialised by the caller is used and left
    initialised; otherwise the run creates one and destroys it at the end."""
    dist = Dist()
    # everything that can fail on the user's input is checked before anything is written
    check_flags(args, dist)
    device = resolve_device(args)
    if device.type == "cuda" and dist.world > 1:
        if dist.local_rank >= torch.cuda.device_count():
            raise UsageError(f"LOCAL_RANK {dist.local_rank} but only {torch.cuda.device_count()} GPUs")
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    backend = backend_for(args, device)
    out_dir = args.out if args.out is not None else Path("runs") / args.data
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} exists and is not a folder")
    data = load_data(args.data, args.data_dir)
    x_train, y_train, x_test, y_test = data
    cfg = model_config(args, x_train.shape[1], int(max(y_train.max(), y_test.max())) + 1)
    ckpt_path = out_dir / "checkpoint.pt"
    resume_path = None if args.resume is None else (ckpt_path if args.resume == "auto" else Path(args.resume))
    ckpt = load_checkpoint(resume_path, cfg) if resume_path is not None else None

    dist.init(device)
    try:
        return train(RunContext(args, dist, device, backend, out_dir, cfg, data, ckpt, resume_path))
    finally:
        dist.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The `gpuopt-train` command: returns the exit code (0, or 2 after a one-line error)."""
    try:
        args = build_parser().parse_args(argv)
        run(args)
    except UsageError as err:
        print(f"{PROG}: error: {_rank_prefix()}{err}", file=sys.stderr)
        return 2
    except Exception as err:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # say which rank failed before torchrun tears down the rest
            print(f"{PROG}: {_rank_prefix()}failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        raise
    return 0


def _rank_prefix() -> str:
    return f"rank {os.environ.get('RANK', '0')}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""

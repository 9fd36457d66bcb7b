"""The reference training loop: an MLP built from the fused ops, trained on a bundled dataset.

    python -m gpuopt_ops.train                       # digits (bundled with scikit-learn), CPU or GPU
    python -m gpuopt_ops.train --data mnist --data-dir DIR --backend triton --amp bf16 --compile
    python -m gpuopt_ops.train --resume              # continue runs/digits/checkpoint.pt

Model: blocks [LinearBiasReLU (or nn.Linear) → FusedLayerNormDropoutReLU] and a linear head. `--backend eager`
builds the same model from unfused PyTorch modules with the same parameter names, so checkpoints move between
backends. `--fuse` builds it from stock nn.Linear / nn.ReLU / nn.LayerNorm / nn.Dropout instead (same parameter
names, same initialisation order) and swaps our modules in with gpuopt_ops.fuse, as a user would on their own
model: with the same --seed it ends with the weights of the default model, bit for bit. Writes into --out: checkpoint.pt (every epoch, atomically), metrics.jsonl / metrics.csv, curves.png,
and with --profile trace.json, with --memory-report memory.json.

Errors in the flags, the data or a checkpoint print one line and exit with code 2 before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import json
import math
import os
import random
import struct
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

from .memory import saved_tensor_bytes
from .modules import EagerLayerNormDropoutReLU, EagerLinearReLU, FusedLayerNormDropoutReLU, LinearBiasReLU

PROG = "gpuopt-train"
CHECKPOINT_FORMAT = "gpuopt-train/1"
# what must match for a checkpoint to be resumed (the backend, amp, compile, ... may change between runs)
ARCH_KEYS = ("data", "in_features", "num_classes", "hidden", "depth", "linear", "epochs", "batch_size")


class UsageError(Exception):
    """A problem with the flags, the data or a checkpoint: reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of argparse's usage + error
        raise UsageError(f"{message} (see {PROG} --help)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", choices=("digits", "mnist"), default="digits",
                    help="digits: scikit-learn's bundled 8x8 digits (no download); mnist: IDX files in --data-dir")
    ap.add_argument("--data-dir", type=Path, default=None, help="folder with the MNIST IDX files (raw or .gz)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default runs/<data>)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--depth", type=int, default=2, help="number of [linear → LN-dropout-ReLU] blocks")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--linear", choices=("bias_relu", "plain"), default="bias_relu",
                    help="bias_relu: matmul + fused bias-ReLU; plain: nn.Linear")
    ap.add_argument("--backend", choices=("auto", "cuda", "triton", "cpu", "eager"), default="auto",
                    help="auto: CUDA kernels on a GPU, C++ on CPU; eager: the unfused PyTorch modules")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none",
                    help="autocast dtype; fp16 uses a GradScaler")
    ap.add_argument("--fuse", action="store_true",
                    help="build the model from stock nn.Linear/LayerNorm/ReLU/Dropout, then gpuopt_ops.fuse it")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (fullgraph)")
    ap.add_argument("--checkpoint-activations", action="store_true",
                    help="recompute each block in backward (torch.utils.checkpoint, non-reentrant)")
    ap.add_argument("--clip", type=float, default=1.0, help="max gradient norm (0: no clipping)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", nargs="?", const="auto", default=None, metavar="CHECKPOINT",
                    help="continue from CHECKPOINT (default <out>/checkpoint.pt)")
    ap.add_argument("--stop-after", type=int, default=None, metavar="K",
                    help="stop after K epochs of this run (time-sliced jobs; resume later with --resume)")
    ap.add_argument("--fsdp", action="store_true",
                    help="under torchrun: FSDP2 (fully_shard per block) instead of DDP")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    ap.add_argument("--profile", action="store_true",
                    help="profile 3 training steps: Chrome trace <out>/trace.json and a key_averages table")
    ap.add_argument("--memory-report", action="store_true",
                    help="bytes saved for backward (and peak CUDA memory) of one step, fused vs eager model")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--no-plot", action="store_true", help="do not draw curves.png")
    return ap


# ---------------------------------------------------------------------------------------------- data
MNIST_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
               "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}


def read_idx(path: Path) -> np.ndarray:
    """Reads an IDX file (the MNIST format: big-endian magic 0x0000 0x08 ndim, then the dims), raw or gzip."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as err:
        raise UsageError(f"cannot read {path}: {err}") from err
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise UsageError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    dims = struct.unpack(f">{ndim}I", data[4:header])
    expected = int(np.prod(dims)) if dims else 1
    if len(data) - header != expected:
        raise UsageError(f"{path}: header says {dims} ({expected} bytes) but the file holds "
                         f"{len(data) - header} bytes of data")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims).copy()


def _find_mnist_file(data_dir: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (data_dir / name).is_file():
            return data_dir / name
    raise UsageError(f"MNIST file {stem}[.gz] not found in {data_dir} (need {', '.join(MNIST_FILES.values())})")


def load_data(name: str, data_dir: Optional[Path]) -> Tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test): float32 features (standardised with train statistics), int64 labels."""
    if name == "digits":
        try:
            from sklearn.datasets import load_digits
        except ImportError as err:
            raise UsageError("--data digits needs scikit-learn (pip install scikit-learn), "
                             "or use --data mnist --data-dir DIR") from err
        x, y = load_digits(return_X_y=True)
        order = np.random.default_rng(0).permutation(len(x))  # the fixed split: same for every --seed
        n_test = len(x) // 5
        test, train = order[:n_test], order[n_test:]
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    else:
        if data_dir is None:
            raise UsageError("--data mnist needs --data-dir DIR with the four MNIST IDX files")
        if not data_dir.is_dir():
            raise UsageError(f"--data-dir {data_dir} is not a folder")
        arrays = {k: read_idx(_find_mnist_file(data_dir, v)) for k, v in MNIST_FILES.items()}
        for split in ("train", "test"):
            if len(arrays[f"{split}_x"]) != len(arrays[f"{split}_y"]):
                raise UsageError(f"MNIST {split} images and labels differ in count "
                                 f"({len(arrays[f'{split}_x'])} vs {len(arrays[f'{split}_y'])})")
        x_train = arrays["train_x"].reshape(len(arrays["train_x"]), -1)
        x_test = arrays["test_x"].reshape(len(arrays["test_x"]), -1)
        y_train, y_test = arrays["train_y"], arrays["test_y"]
    x_train = x_train.astype(np.float32)
    x_test = x_test.astype(np.float32)
    mean = x_train.mean(axis=0)
    std = np.maximum(x_train.std(axis=0), 1e-3 * max(float(x_train.std()), 1e-6))
    to_t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(dt)  # noqa: E731
    return (to_t((x_train - mean) / std, torch.float32), to_t(y_train, torch.int64),
            to_t((x_test - mean) / std, torch.float32), to_t(y_test, torch.int64))


# ---------------------------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, in_features: int, out_features: int, p: float, linear: str, backend: str) -> None:
        super().__init__()
        if backend == "eager":
            self.linear = EagerLinearReLU(in_features, out_features) if linear == "bias_relu" \
                else nn.Linear(in_features, out_features)
            self.norm = EagerLayerNormDropoutReLU(out_features, p)
        else:
            self.linear = LinearBiasReLU(in_features, out_features, backend=backend) if linear == "bias_relu" \
                else nn.Linear(in_features, out_features)
            self.norm = FusedLayerNormDropoutReLU(out_features, p, backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


def stock_block(in_features: int, out_features: int, p: float, linear: str) -> nn.Sequential:
    """Block's computation from stock PyTorch modules only, with Block's parameter names (linear.*, norm.*):
    what `--fuse` hands to gpuopt_ops.fuse, as a user's own model would be."""
    layers = [("linear", nn.Linear(in_features, out_features))]
    if linear == "bias_relu":
        layers.append(("act", nn.ReLU()))
    layers += [("norm", nn.LayerNorm(out_features)), ("dropout", nn.Dropout(p)), ("relu", nn.ReLU())]
    return nn.Sequential(OrderedDict(layers))


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden: int = 256, depth: int = 2, p: float = 0.1,
                 linear: str = "bias_relu", backend: str = "auto", checkpoint_activations: bool = False) -> None:
        """backend "stock" builds the blocks from nn.Linear / nn.ReLU / nn.LayerNorm / nn.Dropout (stock_block)."""
        super().__init__()
        widths = [in_features] + [hidden] * depth
        make = (lambda i, o: stock_block(i, o, p, linear)) if backend == "stock" else \
            (lambda i, o: Block(i, o, p, linear, backend))
        self.blocks = nn.Sequential(*[make(widths[i], widths[i + 1]) for i in range(depth)])
        self.head = nn.Linear(hidden, num_classes)
        self.checkpoint_activations = checkpoint_activations

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpoint_activations and self.training and torch.is_grad_enabled():
                # non-reentrant; the RNG state is restored on recompute, so the same dropout seed is drawn
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x)


def model_config(args, in_features: int, num_classes: int) -> Dict:
    return {"data": args.data, "in_features": in_features, "num_classes": num_classes, "hidden": args.hidden,
            "depth": args.depth, "linear": args.linear, "epochs": args.epochs, "batch_size": args.batch_size}


# ---------------------------------------------------------------------------------------------- helpers
def resolve_device(args) -> torch.device:
    if args.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is available (torch.cuda.is_available() is False)")
    return torch.device(args.device)


def resolve_backend(args, device: torch.device) -> str:
    """The backend of --backend on this device; the capability checks are the ops' own (ops._check_backend)."""
    from .ops import _check_backend

    backend = args.backend
    if backend == "auto":
        return "cuda" if device.type == "cuda" else "cpu"
    if backend == "eager":
        return backend
    if backend == "cpu" and device.type != "cpu":
        raise UsageError("--backend cpu runs on CPU tensors: use --device cpu, or --backend cuda/triton")
    if backend == "cuda" and device.type != "cuda":
        raise UsageError("--backend cuda needs a GPU (--device cuda); on CPU use --backend cpu")
    try:
        return _check_backend(backend, torch.empty(0, device=device), "layer_norm_dropout_relu")
    except (ValueError, RuntimeError, ImportError) as err:
        raise UsageError(f"--backend {backend}: {err}") from err


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


def rng_state(device: torch.device) -> Dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
            "python": random.getstate()}


def set_rng_state(state: Dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))


def load_checkpoint(path: Path, cfg: Dict) -> Dict:
    if not path.is_file():
        raise UsageError(f"--resume: no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file
        raise UsageError(f"--resume: cannot read checkpoint {path}: {str(err).splitlines()[0]}") from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise UsageError(f"--resume: {path} is not a {PROG} checkpoint (format {CHECKPOINT_FORMAT})")
    diffs = [f"{k}: checkpoint {ckpt['config'].get(k)!r}, this run {cfg[k]!r}" for k in ARCH_KEYS
             if ckpt["config"].get(k) != cfg[k]]
    if diffs:
        raise UsageError(f"--resume: {path} was written by another model or schedule ({'; '.join(diffs)}); "
                         "pass the same flags or another --out")
    return ckpt


def saved_activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast) -> int:
    """Bytes of the tensors autograd saves for backward in one training step (unique storages, not params)."""

    def loss_fn():
        with autocast():
            return F.cross_entropy(model(x).float(), y)

    saved, loss = saved_tensor_bytes(loss_fn, exclude=model.parameters())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return saved


def memory_report(model: nn.Module, cfg: Dict, args, x: torch.Tensor, y: torch.Tensor, device, autocast,
                  out_dir: Path) -> Dict:
    """Saved-for-backward bytes (and peak CUDA memory) of one step of this model and of its eager twin."""
    eager = MLP(cfg["in_features"], cfg["num_classes"], cfg["hidden"], cfg["depth"], args.dropout,
                cfg["linear"], "eager").to(device)
    eager.load_state_dict(model.state_dict())
    report = {"batch_size": int(x.shape[0]), "device": str(device), "amp": args.amp}
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    for name, m in (("this_model", model), ("eager", eager)):
        m.train()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        report[f"{name}_saved_bytes"] = saved_activation_bytes(m, x, y, autocast)
        if device.type == "cuda":
            torch.cuda.synchronize()
            report[f"{name}_peak_cuda_bytes_over_base"] = torch.cuda.max_memory_allocated() - base
    torch.set_rng_state(cpu_rng)  # the report must not change the training run
    if cuda_rng is not None:
        torch.cuda.set_rng_state_all(cuda_rng)
    report["ratio_saved"] = report["this_model_saved_bytes"] / max(1, report["eager_saved_bytes"])
    print(f"memory: bytes saved for backward per step (batch {x.shape[0]}): this model "
          f"{report['this_model_saved_bytes']:,} B, eager {report['eager_saved_bytes']:,} B "
          f"(ratio {report['ratio_saved']:.2f})")
    if device.type == "cuda":
        print(f"memory: peak CUDA memory of one step over the baseline: this model "
              f"{report['this_model_peak_cuda_bytes_over_base']:,} B, eager "
              f"{report['eager_peak_cuda_bytes_over_base']:,} B")
    atomic_write_bytes(out_dir / "memory.json", lambda f: f.write(json.dumps(report, indent=2).encode()))
    return report


def write_metrics(out_dir: Path, history: List[Dict]) -> None:
    lines = "".join(json.dumps(h) + "\n" for h in history).encode()
    atomic_write_bytes(out_dir / "metrics.jsonl", lambda f: f.write(lines))
    if history:
        import io

        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(history[0].keys()))
        w.writeheader()
        w.writerows(history)
        atomic_write_bytes(out_dir / "metrics.csv", lambda f: f.write(buf.getvalue().encode()))


def plot_curves(out_dir: Path, history: List[Dict]) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{PROG}: matplotlib is not installed; no plot (pip install matplotlib)", file=sys.stderr)
        return None
    ep = [h["epoch"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(ep, [h["train_loss"] for h in history], "o-", label="train")
    ax1.plot(ep, [h["test_loss"] for h in history], "s-", label="test")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("cross-entropy loss")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(ep, [100 * h["train_acc"] for h in history], "o-", label="train")
    ax2.plot(ep, [100 * h["test_acc"] for h in history], "s-", label="test")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("accuracy (%)")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.suptitle(f"gpuopt MLP — {history[-1]['data']}, backend {history[-1]['backend']}")
    fig.tight_layout()
    path = out_dir / "curves.png"
    atomic_write_bytes(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return path


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device, autocast) -> Tuple[float, float]:
    model.eval()
    total, loss_sum, correct = 0, 0.0, 0
    for xb, yb in loader:
        xb = xb.to(device, non_blocking=True)
        yb = yb.to(device, non_blocking=True)
        with autocast():
            logits = model(xb).float()
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
        correct += int((logits.argmax(1) == yb).sum())
        total += len(yb)
    model.train()
    return loss_sum / max(total, 1), correct / max(total, 1)


# ---------------------------------------------------------------------------------------------- main
class Dist:
    """This process's place in a torchrun job (world 1 without torchrun)."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.active = False

    @property
    def main(self) -> bool:
        return self.rank == 0

    def init(self, device: torch.device) -> None:
        if self.world > 1 and not torch.distributed.is_initialized():
            import datetime

            torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                                 timeout=datetime.timedelta(minutes=10))
            self.active = True

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def sum(self, values: Sequence[float], device) -> List[float]:
        t = torch.tensor(list(values), dtype=torch.float64, device=device)
        if self.active:
            torch.distributed.all_reduce(t)
        return t.tolist()

    def gather_object(self, obj):
        if not self.active:
            return [obj]
        out = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.active and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
            self.active = False


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank `rank`'s dropout generator: different on every rank, fixed by --seed."""
    return int(np.random.SeedSequence([seed % 2**63, rank]).generate_state(1, np.uint64)[0] >> 1)


def _state_dict_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_state(model: nn.Module, optimizer, dist: Dist) -> Tuple[Dict, Dict]:
    """Full (unsharded) model and optimizer state dicts keyed by parameter names, on CPU, on rank 0.

    The same format for a single process, DDP and FSDP2, so checkpoints move between them."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    opts = _state_dict_options(cpu_offload=dist.active)
    return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, optimizer, options=opts)


def run(args) -> Dict:
    dist = Dist()
    log = print if dist.main else (lambda *a, **k: None)
    # everything that can fail on the user's input is checked before anything is written
    if args.epochs < 1 or args.batch_size < 1 or args.hidden < 1 or args.depth < 1 or args.workers < 0:
        raise UsageError("--epochs, --batch-size, --hidden and --depth must be >= 1 and --workers >= 0")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise UsageError(f"--lr must be a finite number > 0, got {args.lr}")
    if not 0.0 <= args.dropout <= 1.0:
        raise UsageError(f"--dropout must be in [0, 1], got {args.dropout}")
    if args.stop_after is not None and args.stop_after < 1:
        raise UsageError(f"--stop-after must be >= 1, got {args.stop_after}")
    if args.batch_size % dist.world:
        raise UsageError(f"--batch-size {args.batch_size} is the global batch: it must be divisible by the "
                         f"world size {dist.world}")
    if args.fsdp and dist.world < 2:
        raise UsageError("--fsdp shards over several processes: launch with torchrun --nproc_per_node=K (K >= 2)")
    if args.fsdp and args.amp == "fp16":
        raise UsageError("--fsdp with --amp fp16 is not supported (no sharded GradScaler here): use --amp bf16")
    if args.fuse and args.backend == "eager":
        raise UsageError("--fuse swaps in our kernels: use it with --backend auto/cuda/triton/cpu, not eager")
    if args.memory_report and dist.world > 1:
        raise UsageError("--memory-report measures one process: run it without torchrun")
    device = resolve_device(args)
    if device.type == "cuda" and dist.world > 1:
        if dist.local_rank >= torch.cuda.device_count():
            raise UsageError(f"LOCAL_RANK {dist.local_rank} but only {torch.cuda.device_count()} GPUs")
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    backend = resolve_backend(args, device)
    out_dir = args.out if args.out is not None else Path("runs") / args.data
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} exists and is not a folder")
    x_train, y_train, x_test, y_test = load_data(args.data, args.data_dir)
    cfg = model_config(args, x_train.shape[1], int(max(y_train.max(), y_test.max())) + 1)
    ckpt_path = out_dir / "checkpoint.pt"
    resume_path = None if args.resume is None else (ckpt_path if args.resume == "auto" else Path(args.resume))
    ckpt = load_checkpoint(resume_path, cfg) if resume_path is not None else None

    dist.init(device)
    try:
        return _train(args, dist, log, device, backend, out_dir, ckpt_path, resume_path, ckpt, cfg,
                      (x_train, y_train, x_test, y_test))
    finally:
        dist.close()


def _train(args, dist, log, device, backend, out_dir, ckpt_path, resume_path, ckpt, cfg, data) -> Dict:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    from torch.utils.data.distributed import DistributedSampler

    x_train, y_train, x_test, y_test = data
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    random.seed(args.seed)
    np.random.seed(args.seed % 2**32)
    model = MLP(cfg["in_features"], cfg["num_classes"], args.hidden, args.depth, args.dropout, args.linear,
                "stock" if args.fuse else backend, args.checkpoint_activations).to(device)
    if args.fuse:  # the one-line way in for an unmodified model; same parameter names, so checkpoints match
        from .fuse import fuse

        model = fuse(model, inplace=True, backend=backend)
    if ckpt is not None:
        try:
            model.load_state_dict(ckpt["model"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise UsageError(f"--resume: checkpoint does not fit this model: {str(err).splitlines()[0]}") from err
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    wrapped = model
    if args.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32) if amp_dtype else \
            MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        amp_dtype = None  # FSDP2 casts the parameters itself; no autocast on top
    elif dist.active:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)
    pin = device.type == "cuda"
    train_set, test_set = TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)
    local_batch = args.batch_size // dist.world
    # the shuffle depends on (seed, epoch, world size) only; rank r takes every world-th sample of it, so a
    # global batch of K ranks is the batch a single process takes (when len(data) divides by K: else it pads)
    sampler = DistributedSampler(train_set, num_replicas=dist.world, rank=dist.rank, shuffle=True, seed=args.seed)
    steps_per_epoch = math.ceil(len(sampler) / local_batch)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * steps_per_epoch)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()

    torch.manual_seed(rank_seed(args.seed, dist.rank))  # dropout: a different, reproducible stream per rank
    if device.type == "cuda":
        torch.cuda.manual_seed(rank_seed(args.seed, dist.rank))
    start_epoch, step, history = 0, 0, []
    if ckpt is not None:
        try:
            set_optimizer_state_dict(model, optimizer, optim_state_dict=ckpt["optimizer"],
                                     options=_state_dict_options())
        except (RuntimeError, ValueError, KeyError) as err:
            raise UsageError(f"--resume: optimizer state does not fit this model: {str(err).splitlines()[0]}") \
                from err
        scheduler.load_state_dict(ckpt["scheduler"])
        if ckpt.get("scaler") and scaler.is_enabled():
            scaler.load_state_dict(ckpt["scaler"])
        start_epoch, step, history = ckpt["epoch"], ckpt["step"], list(ckpt["history"])
        states = ckpt.get("rng_per_rank") or [ckpt["rng"]]
        if len(states) == dist.world:
            set_rng_state(states[dist.rank], device)
        else:
            log(f"{PROG}: the checkpoint was written by {len(states)} process(es), this run has {dist.world}: "
                "weights, optimizer and schedule resume exactly; the data split and dropout streams start anew")
            torch.manual_seed(rank_seed(args.seed + start_epoch, dist.rank))
        log(f"{PROG}: resumed {resume_path} at epoch {start_epoch}, step {step}")
    if dist.main:
        out_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()

    train_loader = DataLoader(train_set, batch_size=local_batch, num_workers=args.workers, pin_memory=pin,
                              sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=512, num_workers=args.workers, pin_memory=pin)
    step_model = torch.compile(wrapped, fullgraph=not dist.active) if args.compile else wrapped
    params = [p for p in model.parameters()]

    if args.memory_report:
        xb, yb = next(iter(DataLoader(train_set, batch_size=args.batch_size)))
        memory_report(model, cfg, args, xb.to(device), yb.to(device), device, autocast, out_dir)

    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    mode = f", {'FSDP2' if args.fsdp else 'DDP'} over {dist.world} processes" if dist.active else ""
    log(f"{PROG}: {args.data} ({len(train_set)} train / {len(test_set)} test), MLP {cfg['in_features']}→"
        f"{args.hidden}×{args.depth}→{cfg['num_classes']}, backend {backend}, device {device}, amp {args.amp}"
        f"{', compiled' if args.compile else ''}{', activation checkpointing' if args.checkpoint_activations else ''}"
        f"{mode}")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    fail_at = _injected_failure(dist.rank)
    t_run = time.perf_counter()
    end_epoch = args.epochs if args.stop_after is None else min(args.epochs, start_epoch + args.stop_after)
    model.train()
    for epoch in range(start_epoch, end_epoch):
        sampler.set_epoch(epoch)
        prof_ctx = contextlib.nullcontext()
        if args.profile and epoch == start_epoch and dist.main:
            prof_ctx = _profiler(out_dir, device)
        bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch + 1}/{args.epochs}", leave=False,
                   disable=args.no_progress or not dist.main, file=sys.stderr) if tqdm else None
        t0 = time.perf_counter()
        seen, loss_sum, correct = 0, 0.0, 0
        with prof_ctx as prof:
            for xb, yb in train_loader:
                if fail_at is not None and step == fail_at:
                    raise RuntimeError(f"injected failure on rank {dist.rank} at step {step} (GPUOPT_TRAIN_FAIL_AT)")
                xb = xb.to(device, non_blocking=True)
                yb = yb.to(device, non_blocking=True)
                with torch.profiler.record_function("gpuopt.train_step"):
                    with autocast():
                        logits = step_model(xb).float()
                    loss = F.cross_entropy(logits, yb)
                    optimizer.zero_grad(set_to_none=True)
                    scaler.scale(loss).backward()
                    if args.clip > 0:
                        scaler.unscale_(optimizer)
                        torch.nn.utils.clip_grad_norm_(params, args.clip)
                    scaler.step(optimizer)
                    scaler.update()
                    scheduler.step()
                step += 1
                n = len(yb)
                loss_val = loss.item()
                if not math.isfinite(loss_val) and not scaler.is_enabled():
                    raise RuntimeError(f"{PROG}: the loss is {loss_val} at step {step}; lower --lr or use --amp bf16")
                seen += n
                loss_sum += loss_val * n
                correct += int((logits.detach().argmax(1) == yb).sum())
                if prof is not None:
                    prof.step()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss_val:.4f}",
                                    samples_s=f"{dist.world * seen / (time.perf_counter() - t0):.0f}")
        if bar is not None:
            bar.close()
        train_time = time.perf_counter() - t0
        loss_sum, correct, seen = dist.sum([loss_sum, correct, seen], device)
        test_loss, test_acc = evaluate(step_model, test_loader, device, autocast)  # every rank: FSDP gathers
        rec = {"epoch": epoch + 1, "step": step, "train_loss": loss_sum / seen, "train_acc": correct / seen,
               "test_loss": test_loss, "test_acc": test_acc, "lr": scheduler.get_last_lr()[0],
               "epoch_seconds": round(train_time, 4), "samples_per_s": round(seen / train_time, 1),
               "data": args.data, "backend": backend, "amp": args.amp}
        history.append(rec)
        log(f"epoch {epoch + 1:3d}/{args.epochs}  train loss {rec['train_loss']:.4f} acc {100 * rec['train_acc']:.2f}%"
            f"  test loss {test_loss:.4f} acc {100 * test_acc:.2f}%  {rec['samples_per_s']:.0f} samples/s")
        model_sd, optim_sd = full_state(model, optimizer, dist)  # collective under FSDP: every rank calls it
        rngs = dist.gather_object(rng_state(device))
        if dist.main:
            state = {"format": CHECKPOINT_FORMAT, "config": cfg, "model": model_sd, "optimizer": optim_sd,
                     "scheduler": scheduler.state_dict(),
                     "scaler": scaler.state_dict() if scaler.is_enabled() else None, "epoch": epoch + 1,
                     "step": step, "rng": rngs[0], "rng_per_rank": rngs, "world_size": dist.world,
                     "history": history, "torch": str(torch.__version__)}
            atomic_write_bytes(ckpt_path, lambda f: torch.save(state, f))
            write_metrics(out_dir, history)
        dist.barrier()
    wall = time.perf_counter() - t_run
    summary = {"epochs_done": history[-1]["epoch"] if history else 0, "test_acc": history[-1]["test_acc"]
               if history else None, "seconds": round(wall, 2), "out": str(out_dir)}
    if history and not args.no_plot and dist.main:
        plot = plot_curves(out_dir, history)
        summary["plot"] = str(plot) if plot else None
    if device.type == "cuda":
        summary["peak_cuda_bytes"] = torch.cuda.max_memory_allocated()
        log(f"memory: peak CUDA memory allocated during training {summary['peak_cuda_bytes'] / 2**20:.1f} MiB")
    if history:
        log(f"{PROG}: done {summary['epochs_done']}/{args.epochs} epochs in {wall:.1f} s; test accuracy "
            f"{100 * history[-1]['test_acc']:.2f}%; wrote {ckpt_path}, {out_dir / 'metrics.jsonl'}"
            f"{', ' + summary['plot'] if summary.get('plot') else ''}")
    else:
        log(f"{PROG}: nothing to do: the checkpoint has already finished {start_epoch}/{args.epochs} epochs")
    return summary


def _injected_failure(rank: int) -> Optional[int]:
    """GPUOPT_TRAIN_FAIL_AT=RANK:STEP makes that rank raise at that step (to test failure handling)."""
    spec = os.environ.get("GPUOPT_TRAIN_FAIL_AT")
    if not spec:
        return None
    r, s = spec.split(":")
    return int(s) if int(r) == rank else None


@contextlib.contextmanager
def _profiler(out_dir: Path, device):
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"

    def ready(prof):
        trace = out_dir / "trace.json"
        prof.export_chrome_trace(str(trace))
        print(prof.key_averages().table(sort_by=sort, row_limit=15))
        print(f"profile: Chrome trace of 3 training steps written to {trace} (open in chrome://tracing or Perfetto)")

    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3, repeat=1), on_trace_ready=ready,
                 record_shapes=True) as prof:
        yield prof


def main(argv: Optional[Sequence[str]] = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())

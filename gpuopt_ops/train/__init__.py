"""The reference training loop: an MLP built from the fused ops, trained on a bundled dataset.

    gpuopt-train                                     # or python -m gpuopt_ops.train: digits, CPU or GPU
    gpuopt-train --data mnist --data-dir DIR --backend triton --amp bf16 --compile
    gpuopt-train --resume                            # continue runs/digits/checkpoint.pt
    torchrun --standalone --nproc_per_node=K -m gpuopt_ops.train [--fsdp]

Model: blocks [LinearBiasReLU (or nn.Linear) → FusedLayerNormDropoutReLU] and a linear head. `--backend eager`
builds the same model from unfused PyTorch modules with the same parameter names, so checkpoints move between
backends. `--fuse` builds it from stock nn.Linear / nn.ReLU / nn.LayerNorm / nn.Dropout instead (same parameter
names, same initialisation order) and swaps our modules in with gpuopt_ops.fuse, as a user would on their own
model: with the same --seed it ends with the weights of the default model, bit for bit. Writes into --out:
checkpoint.pt (every epoch, atomically), metrics.jsonl / metrics.csv, curves.png, and with --profile trace.json,
with --memory-report memory.json. Errors in the flags, the data or a checkpoint print one line and exit with
code 2 before anything is written.

Modules: cli (parser, run, main), loop (the training loop, evaluation, memory report, profiler), data, model,
checkpoint, distributed (torchrun's process group, per-rank seeds), plots (metrics files, curves), errors.
"""

from .checkpoint import CHECKPOINT_FORMAT, atomic_write_bytes, load_checkpoint
from .cli import build_parser, main, run
from .data import MNIST_FILES, load_data, read_idx
from .distributed import Dist, rank_seed
from .errors import PROG, UsageError
from .loop import RunContext, evaluate, train, train_step
from .model import MLP, Block, model_config, stock_block

__all__ = [
    "main",
    "run",
    "build_parser",
    "UsageError",
    "PROG",
    "MLP",
    "Block",
    "stock_block",
    "model_config",
    "load_data",
    "read_idx",
    "MNIST_FILES",
    "atomic_write_bytes",
    "load_checkpoint",
    "CHECKPOINT_FORMAT",
    "Dist",
    "rank_seed",
    "RunContext",
    "train",
    "train_step",
    "evaluate",
]

"""The training loop: one run from a checked RunContext to its checkpoints and metrics, plus evaluation, the
--memory-report measurement and the --profile profiler.

A training step makes no host sync: the loss and the correct count are summed on the device (EpochSums) and read
every --log-every steps and at the end of each epoch; those reads also check that the loss stayed finite.
`train_step` is the one function a step calls, looked up in this module at every step, so a test (or a user) can
wrap it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ..memory import saved_tensor_bytes
from .checkpoint import (
    CHECKPOINT_FORMAT,
    atomic_write_bytes,
    full_state,
    load_model_state,
    load_optimizer_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from .distributed import Dist, rank_seed
from .errors import PROG
from .model import MLP, build_model
from .plots import plot_curves, write_metrics


@dataclass
class RunContext:
    """What run() checked and resolved from the flags before anything was written: the context of one run."""

    args: argparse.Namespace
    dist: Dist
    device: torch.device
    backend: str  # resolved for `device`: "cuda", "triton", "cpu" or "eager"
    out_dir: Path
    cfg: dict  # model_config(): what a resumed checkpoint must match
    data: tuple[torch.Tensor, ...]  # x_train, y_train, x_test, y_test (load_data)
    ckpt: Optional[dict] = None  # the checkpoint to resume from
    resume_path: Optional[Path] = None

    @property
    def ckpt_path(self) -> Path:
        return self.out_dir / "checkpoint.pt"

    def log(self, message: str) -> None:
        if self.dist.main:  # one copy of each line under torchrun
            print(message)


@dataclass
class Trainer:
    """What a training step works with, and `step`: the number of steps taken so far in the run (resumes
    included), which the loop advances after each train_step."""

    model: nn.Module  # the unwrapped (possibly FSDP-sharded) model: parameters and state dicts
    step_model: nn.Module  # what the step calls: the model, its DDP wrapper, or torch.compile of either
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Callable[[], contextlib.AbstractContextManager]
    clip: float
    step: int = 0

    def __post_init__(self) -> None:
        self.params = list(self.model.parameters())


def train_step(t: Trainer, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step on the batch (xb, yb), on the device: returns (loss, logits) without reading them."""
    with torch.profiler.record_function("gpuopt.train_step"):
        with t.autocast():
            logits = t.step_model(xb).float()
        loss = F.cross_entropy(logits, yb)
        t.optimizer.zero_grad(set_to_none=True)
        t.scaler.scale(loss).backward()
        if t.clip > 0:
            t.scaler.unscale_(t.optimizer)
            torch.nn.utils.clip_grad_norm_(t.params, t.clip)
        t.scaler.step(t.optimizer)
        t.scaler.update()
        t.scheduler.step()
    return loss, logits


class EpochSums:
    """An epoch's sum of loss·batch and count of correct predictions, kept on the device; read() copies both to
    the host in one sync."""

    def __init__(self, device: torch.device) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.seen = 0

    def add(self, loss: torch.Tensor, logits: torch.Tensor, yb: torch.Tensor) -> None:
        n = len(yb)
        # float64 products summed in step order: bit for bit the Python-float sum of loss.item() * n
        self.loss_sum += loss.detach().double() * n
        self.correct += (logits.detach().argmax(1) == yb).sum()
        self.seen += n

    def read(self) -> tuple[float, int]:
        loss_sum, correct = torch.stack([self.loss_sum, self.correct.double()]).tolist()
        return loss_sum, int(correct)


def read_sums(
    sums: EpochSums, first_step: int, last_step: int, check_finite: bool, log_every: int
) -> tuple[float, int]:
    """(loss sum, correct count) of the epoch so far; with `check_finite`, a RuntimeError when the loss became
    non-finite in steps first_step..last_step (1-based), the steps since the previous read."""
    loss_sum, correct = sums.read()
    if check_finite and not math.isfinite(loss_sum):
        raise RuntimeError(
            f"{PROG}: the loss became {loss_sum} in steps {first_step}-{last_step} (it is read "
            f"every --log-every {log_every} steps); lower --lr or use --amp bf16"
        )
    return loss_sum, correct


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device, autocast) -> tuple[float, float]:
    """(mean loss, accuracy) over `loader`, in eval mode (the model is left in train mode)."""
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    total = 0
    for xb, yb in loader:
        xb = xb.to(device, non_blocking=True)
        yb = yb.to(device, non_blocking=True)
        with autocast():
            logits = model(xb).float()
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
        correct += (logits.argmax(1) == yb).sum()
        total += len(yb)
    model.train()
    loss_sum, correct = torch.stack([loss_sum, correct.double()]).tolist()
    return loss_sum / max(total, 1), correct / max(total, 1)


def saved_activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast) -> int:
    """Bytes of the tensors autograd saves for backward in one training step (unique storages, not params)."""

    def loss_fn():
        with autocast():
            return F.cross_entropy(model(x).float(), y)

    saved, loss = saved_tensor_bytes(loss_fn, exclude=model.parameters())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return saved


def memory_report(
    model: nn.Module, cfg: dict, args, x: torch.Tensor, y: torch.Tensor, device, autocast, out_dir: Path
) -> dict:
    """Saved-for-backward bytes (and peak CUDA memory) of one step of this model and of its eager twin."""
    eager = MLP(
        cfg["in_features"], cfg["num_classes"], cfg["hidden"], cfg["depth"], args.dropout, cfg["linear"], "eager"
    ).to(device)
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
    print(
        f"memory: bytes saved for backward per step (batch {x.shape[0]}): this model "
        f"{report['this_model_saved_bytes']:,} B, eager {report['eager_saved_bytes']:,} B "
        f"(ratio {report['ratio_saved']:.2f})"
    )
    if device.type == "cuda":
        print(
            f"memory: peak CUDA memory of one step over the baseline: this model "
            f"{report['this_model_peak_cuda_bytes_over_base']:,} B, eager "
            f"{report['eager_peak_cuda_bytes_over_base']:,} B"
        )
    atomic_write_bytes(out_dir / "memory.json", lambda f: f.write(json.dumps(report, indent=2).encode()))
    return report


@contextlib.contextmanager
def profiler(out_dir: Path, device):
    """torch.profiler over steps 3-5 of the epoch (after one skipped and one warm-up step): a Chrome trace into
    <out_dir>/trace.json, a key_averages table (the top 15 by self time) and a line of the gpuopt ops on stdout. The
    loop calls prof.step() after each step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"

    def ready(prof):
        trace = out_dir / "trace.json"
        prof.export_chrome_trace(str(trace))
        averages = prof.key_averages()
        print(averages.table(sort_by=sort, row_limit=15))
        # our ops whatever their rank (the table's top 15 by time can leave them out on a busy machine)
        ours = [e for e in averages if e.key.startswith("gpuopt::")]
        if ours:
            print(
                "gpuopt ops: "
                + ", ".join(f"{e.key} ({e.count} calls, {e.self_cpu_time_total / 1e3:.2f} ms self CPU)" for e in ours)
            )
        print(f"profile: Chrome trace of 3 training steps written to {trace} (open in chrome://tracing or Perfetto)")

    with profile(
        activities=activities,
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=ready,
        record_shapes=True,
    ) as prof:
        yield prof


def train(ctx: RunContext) -> dict:
    """Trains (or resumes) the run of `ctx`, writing its checkpoint and metrics after every epoch; returns the
    summary. Under torchrun every rank calls it (the process group is initialised)."""
    from torch.utils.data.distributed import DistributedSampler

    args, dist, device, cfg = ctx.args, ctx.dist, ctx.device, ctx.cfg
    x_train, y_train, x_test, y_test = ctx.data
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    random.seed(args.seed)
    np.random.seed(args.seed % 2**32)
    model = build_model(cfg, args, ctx.backend, device)
    if ctx.ckpt is not None:
        load_model_state(model, ctx.ckpt)
    wrapped, amp_dtype = _distribute(model, args, dist, device)
    optimizer = _optimizer(model, args)
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
    start_epoch, step, history = _resume(ctx, model, optimizer, scheduler, scaler)
    if dist.main:
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()

    train_loader = DataLoader(
        train_set, batch_size=local_batch, num_workers=args.workers, pin_memory=pin, sampler=sampler
    )
    test_loader = DataLoader(test_set, batch_size=512, num_workers=args.workers, pin_memory=pin)
    step_model = torch.compile(wrapped, fullgraph=not dist.active) if args.compile else wrapped
    t = Trainer(model, step_model, optimizer, scheduler, scaler, autocast, args.clip, step)

    if args.memory_report:
        xb, yb = next(iter(DataLoader(train_set, batch_size=args.batch_size)))
        memory_report(model, cfg, args, xb.to(device), yb.to(device), device, autocast, ctx.out_dir)

    _log_start(ctx, len(train_set), len(test_set))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # with fp16 the GradScaler skips the steps whose loss or gradients are not finite: nothing to report then
    check_finite = not scaler.is_enabled()
    t_run = time.perf_counter()
    end_epoch = args.epochs if args.stop_after is None else min(args.epochs, start_epoch + args.stop_after)
    model.train()
    for epoch in range(start_epoch, end_epoch):
        sampler.set_epoch(epoch)
        profile = args.profile and epoch == start_epoch and dist.main
        sums, read_at, train_time = _train_epoch(ctx, t, train_loader, epoch, steps_per_epoch, profile)
        loss_sum, correct = read_sums(sums, read_at + 1, t.step, check_finite, args.log_every)
        loss_sum, correct, seen = dist.sum([loss_sum, correct, sums.seen], device)
        test = evaluate(step_model, test_loader, device, autocast)  # every rank: FSDP gathers
        lr = scheduler.get_last_lr()[0]
        history.append(_epoch_record(ctx, epoch, t.step, (loss_sum, correct, seen), test, lr, train_time))
        _save_epoch(ctx, t, history)
        dist.barrier()
    return _summary(ctx, history, start_epoch, time.perf_counter() - t_run)


def _distribute(model: nn.Module, args, dist: Dist, device) -> tuple[nn.Module, Optional[torch.dtype]]:
    """(what the step calls, the autocast dtype): the model sharded by FSDP2 (which casts the parameters itself, so
    no autocast on top) with --fsdp, wrapped in DDP under torchrun, else the model itself."""
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    if args.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = (
            MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)
            if amp_dtype
            else MixedPrecisionPolicy()
        )
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model, None
    if dist.active:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None), amp_dtype
    return model, amp_dtype


def _optimizer(model: nn.Module, args) -> torch.optim.Optimizer:
    """AdamW with weight decay on the matrices only (not on biases and norm parameters)."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=args.lr
    )


def _resume(ctx: RunContext, model, optimizer, scheduler, scaler) -> tuple[int, int, list]:
    """(start epoch, step, history) of the run: the checkpoint's, with the optimizer, schedule, scaler and RNG
    states it holds restored, or a fresh start."""
    if ctx.ckpt is None:
        return 0, 0, []
    args, dist, ckpt = ctx.args, ctx.dist, ctx.ckpt
    load_optimizer_state(model, optimizer, ckpt)
    scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt.get("scaler") and scaler.is_enabled():
        scaler.load_state_dict(ckpt["scaler"])
    start_epoch, step, history = ckpt["epoch"], ckpt["step"], list(ckpt["history"])
    states = ckpt.get("rng_per_rank") or [ckpt["rng"]]
    if len(states) == dist.world:
        set_rng_state(states[dist.rank], ctx.device)
    else:
        ctx.log(
            f"{PROG}: the checkpoint was written by {len(states)} process(es), this run has {dist.world}: "
            "weights, optimizer and schedule resume exactly; the data split and dropout streams start anew"
        )
        torch.manual_seed(rank_seed(args.seed + start_epoch, dist.rank))
    ctx.log(f"{PROG}: resumed {ctx.resume_path} at epoch {start_epoch}, step {step}")
    return start_epoch, step, history


def _log_start(ctx: RunContext, n_train: int, n_test: int) -> None:
    args, dist, cfg = ctx.args, ctx.dist, ctx.cfg
    mode = f", {'FSDP2' if args.fsdp else 'DDP'} over {dist.world} processes" if dist.active else ""
    ctx.log(
        f"{PROG}: {args.data} ({n_train} train / {n_test} test), MLP {cfg['in_features']}→"
        f"{args.hidden}×{args.depth}→{cfg['num_classes']}, backend {ctx.backend}, device {ctx.device}, amp {args.amp}"
        f"{', compiled' if args.compile else ''}"
        f"{', activation checkpointing' if args.checkpoint_activations else ''}{mode}"
    )


def _progress_bar(ctx: RunContext, epoch: int, steps_per_epoch: int):
    """The epoch's tqdm bar on stderr (disabled by --no-progress and on every rank but the first), None without
    tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(
        total=steps_per_epoch,
        desc=f"epoch {epoch + 1}/{ctx.args.epochs}",
        leave=False,
        disable=ctx.args.no_progress or not ctx.dist.main,
        file=sys.stderr,
    )


def _train_epoch(ctx: RunContext, t: Trainer, loader: DataLoader, epoch: int, steps_per_epoch: int, profile: bool):
    """One epoch of train_step over `loader`: (its EpochSums, the step up to which the loss was read finite, the
    seconds it took). Reads the sums every --log-every steps (the finite check, the bar's loss); with `profile`,
    runs under the profiler."""
    args, device = ctx.args, ctx.device
    check_finite = not t.scaler.is_enabled()
    prof_ctx = profiler(ctx.out_dir, device) if profile else contextlib.nullcontext()
    bar = _progress_bar(ctx, epoch, steps_per_epoch)
    t0 = time.perf_counter()
    sums = EpochSums(device)
    read_at = t.step  # the loss was finite up to this step
    with prof_ctx as prof:
        for xb, yb in loader:
            xb = xb.to(device, non_blocking=True)
            yb = yb.to(device, non_blocking=True)
            loss, logits = train_step(t, xb, yb)
            t.step += 1
            sums.add(loss, logits, yb)
            if prof is not None:
                prof.step()
            if t.step % args.log_every == 0:
                loss_sum, _ = read_sums(sums, read_at + 1, t.step, check_finite, args.log_every)
                read_at = t.step
                if bar is not None:
                    bar.set_postfix(
                        loss=f"{loss_sum / sums.seen:.4f}",
                        samples_s=f"{ctx.dist.world * sums.seen / (time.perf_counter() - t0):.0f}",
                        refresh=False,
                    )
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return sums, read_at, time.perf_counter() - t0


def _epoch_record(ctx: RunContext, epoch: int, step: int, train_totals, test, lr: float, train_time: float) -> dict:
    """An epoch's metrics (train_totals: the loss sum, correct count and samples over all ranks; test: (loss,
    accuracy)), logged in one line."""
    args = ctx.args
    loss_sum, correct, seen = train_totals
    test_loss, test_acc = test
    rec = {
        "epoch": epoch + 1,
        "step": step,
        "train_loss": loss_sum / seen,
        "train_acc": correct / seen,
        "test_loss": test_loss,
        "test_acc": test_acc,
        "lr": lr,
        "epoch_seconds": round(train_time, 4),
        "samples_per_s": round(seen / train_time, 1),
        "data": args.data,
        "backend": ctx.backend,
        "amp": args.amp,
    }
    ctx.log(
        f"epoch {epoch + 1:3d}/{args.epochs}  train loss {rec['train_loss']:.4f} acc "
        f"{100 * rec['train_acc']:.2f}%  test loss {test_loss:.4f} acc {100 * test_acc:.2f}%  "
        f"{rec['samples_per_s']:.0f} samples/s"
    )
    return rec


def _save_epoch(ctx: RunContext, t: Trainer, history: list[dict]) -> None:
    """The checkpoint (model, optimizer, schedule, scaler, every rank's RNG state) and the metrics after an epoch,
    written by the first rank; every rank takes part in gathering the state."""
    dist = ctx.dist
    model_sd, optim_sd = full_state(t.model, t.optimizer, cpu_offload=dist.active)  # every rank: FSDP gathers
    rngs = dist.gather_object(rng_state(ctx.device))
    if dist.main:
        state = {
            "format": CHECKPOINT_FORMAT,
            "config": ctx.cfg,
            "model": model_sd,
            "optimizer": optim_sd,
            "scheduler": t.scheduler.state_dict(),
            "scaler": t.scaler.state_dict() if t.scaler.is_enabled() else None,
            "epoch": history[-1]["epoch"],
            "step": t.step,
            "rng": rngs[0],
            "rng_per_rank": rngs,
            "world_size": dist.world,
            "history": history,
            "torch": str(torch.__version__),
        }
        save_checkpoint(ctx.ckpt_path, state)
        write_metrics(ctx.out_dir, history)


def _summary(ctx: RunContext, history: list[dict], start_epoch: int, wall: float) -> dict:
    args, out_dir = ctx.args, ctx.out_dir
    summary = {
        "epochs_done": history[-1]["epoch"] if history else 0,
        "test_acc": history[-1]["test_acc"] if history else None,
        "seconds": round(wall, 2),
        "out": str(out_dir),
    }
    if history and not args.no_plot and ctx.dist.main:
        plot = plot_curves(out_dir, history)
        summary["plot"] = str(plot) if plot else None
    if ctx.device.type == "cuda":
        summary["peak_cuda_bytes"] = torch.cuda.max_memory_allocated()
        ctx.log(f"memory: peak CUDA memory allocated during training {summary['peak_cuda_bytes'] / 2**20:.1f} MiB")
    if history:
        ctx.log(
            f"{PROG}: done {summary['epochs_done']}/{args.epochs} epochs in {wall:.1f} s; test accuracy "
            f"{100 * history[-1]['test_acc']:.2f}%; wrote {ctx.ckpt_path}, {out_dir / 'metrics.jsonl'}"
            f"{', ' + summary['plot'] if summary.get('plot') else ''}"
        )
    else:
        ctx.log(f"{PROG}: nothing to do: the checkpoint has already finished {start_epoch}/{args.epochs} epochs")
    return summary

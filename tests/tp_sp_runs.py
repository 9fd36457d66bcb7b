"""Run by tests/test_dtensor.py in 2 processes (helpers.TwoRanks, as torchrun starts them; gloo, CPU): a LLaMA-style
stack of gpuopt modules trained the way large models are (tensor + sequence parallelism on DTensors, FSDP2, each
block compiled with fullgraph=True under selective activation checkpointing), against the same stack in one process.

Mesh (dp = 1, tp = 2). Per block: the residual norms (FusedDropoutAddRMSNorm, prenorm) run sequence parallel
(gpuopt_ops.dtensor.SequenceParallel: x and the residual Shard(1), the weight replicated); an attention stand-in
(a column-parallel LinearBiasAct through gpuopt_ops.dtensor.ColwiseParallel, whose bias_act runs on the Shard(2)
matmul output with a Shard(0) bias, then a row-parallel linear back to Shard(1)); GatedMLP with column-parallel
gate / up projections (gated_act on two Shard(2) tensors) and a row-parallel down projection. The SAC policy saves
matmuls only, so every gpuopt op is recomputed in the backward: the profiler must see each forward op as many times
in the backward as in the forward. With dropout (argv[2], p: 0.1 by default, in the norms and the gated MLP) each
shard draws the whole tensor's masks (the public functions' shard seeds, gpuopt_ops.dtensor.shard_seed), so the step
equals one process's with the same seeds, and a recomputation that drew another mask would show in the gradients.
argv[3] "none" leaves out the checkpointing. Rank 0 writes a JSON summary to argv[1].
"""

from __future__ import annotations

import functools
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from gpuopt_ops.dtensor import ColwiseParallel as GpuoptColwiseParallel
from gpuopt_ops.dtensor import SequenceParallel
from gpuopt_ops.modules import FusedDropoutAddRMSNorm, GatedMLP, LinearBiasAct

from helpers import exit_without_teardown

D, F, B, S, LAYERS = 32, 64, 2, 8, 2
P = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1  # dropout in the norms and the gated MLP
SAC = (sys.argv[3] if len(sys.argv) > 3 else "sac") == "sac"  # "sac": selective checkpointing; "none": without
STEP_SEED = 7  # every rank, and the one-process reference, draw their dropout seeds from this state
FORWARD_OPS = ("gpuopt::dropout_add_norm", "gpuopt::bias_act", "gpuopt::gated_act")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = FusedDropoutAddRMSNorm(D, p=P, prenorm=True)
        self.wq = LinearBiasAct(D, F, act="gelu")
        self.wo = nn.Linear(F, D, bias=False)
        self.ffn_norm = FusedDropoutAddRMSNorm(D, p=P, prenorm=True)
        self.mlp = GatedMLP(D, F, p=P)

    def forward(self, h, residual):
        x, residual = self.attention_norm(h, residual)  # positional: the style prepares both
        h = self.wo(self.wq(x))
        x, residual = self.ffn_norm(h, residual)
        return self.mlp(x), residual


def _matmuls_only(ctx, op, *args, **kwargs):
    saved = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
    return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(nn.Module):
    """A block whose forward runs under selective activation checkpointing (matmuls saved, the rest recomputed)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, h, residual):
        context = functools.partial(create_selective_checkpoint_contexts, _matmuls_only)
        return checkpoint(self.block, h, residual, use_reentrant=False, context_fn=context)


def build() -> nn.ModuleList:
    torch.manual_seed(0)
    blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
    with torch.no_grad():
        for p in blocks.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # norm weights other than ones
    return blocks


def run(blocks, h, residual):
    for block in blocks:
        h, residual = block(h, residual)
    return h + residual


def _count(prof) -> dict[str, int]:
    counts = dict.fromkeys(FORWARD_OPS, 0)
    for e in prof.events():
        if e.name in counts:
            counts[e.name] += 1
    return counts


def main() -> int:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(1)
    h0, r0 = torch.randn(B, S, D), torch.randn(B, S, D)

    ref_blocks = build()
    torch.manual_seed(STEP_SEED)
    ref_loss = run(ref_blocks, h0, r0).square().mean()
    ref_loss.backward()

    blocks = build()
    plan = {
        "attention_norm": SequenceParallel(use_local_output=False),
        "ffn_norm": SequenceParallel(use_local_output=False),
        "wq": GpuoptColwiseParallel(input_layouts=Shard(1), use_local_output=False),
        "wo": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "mlp.gate_proj": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
        "mlp.up_proj": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }
    model = nn.ModuleList()
    tp, dp = mesh["tp"], mesh["dp"]  # sliced once: each slicing makes another mesh, which a compiled block guards on
    for block in blocks:
        parallelize_module(block, tp, plan)
        compiled = torch.compile(Checkpointed(block) if SAC else block, fullgraph=True)  # a graph break is an error
        fully_shard(compiled, mesh=dp)
        model.append(compiled)

    # h and the residual require grad, as an embedding's output does: every block then takes the one graph its first
    # compile made (with inputs that need no grad the second block compiled again)
    h, r = (distribute_tensor(t, tp, [Shard(1)]) for t in (h0.requires_grad_(), r0.requires_grad_()))
    torch.manual_seed(STEP_SEED)
    run(model, h, r).full_tensor().square().mean().backward()  # compiles; the profiled step below is the second
    model.zero_grad(set_to_none=True)
    torch.manual_seed(STEP_SEED)  # the same seeds as the reference's step
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as fwd_prof:
        out = run(model, h, r)
        loss = out.full_tensor().square().mean()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as bwd_prof:
        loss.backward()

    grads = {}
    for (name, p), (_, q) in zip(blocks.named_parameters(), ref_blocks.named_parameters()):
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        grads[name] = {
            "diff": (g - q.grad).abs().max().item(),
            "placements": [str(pl) for pl in p.grad.placements] if isinstance(p.grad, DTensor) else None,
        }
    summary = {
        "loss": loss.item(),
        "ref_loss": ref_loss.item(),
        "forward_ops": _count(fwd_prof),
        "backward_ops": _count(bwd_prof),
        "grads": grads,
        "out_placements": [str(pl) for pl in out.placements],
    }
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(summary, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())

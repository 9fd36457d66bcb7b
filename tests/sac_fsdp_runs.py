"""Launched by tests/test_sac_fsdp.py in 2 processes (helpers.TwoRanks, as torchrun starts them; gloo on CPU): the
recipe of today's distributed LLaMA trainers with gpuopt's modules inside. Each block of a small LLaMA-style model is
checkpointed selectively (torch.utils.checkpoint with create_selective_checkpoint_contexts: matmuls saved, everything
else recomputed in the backward, our ops included), then compiled with torch.compile(fullgraph=True), then sharded
with FSDP2's fully_shard, in that order (torchtitan's; the compile is nn.Module.compile, torch.compile of the block's
call in place, so that fully_shard gets the block itself rather than a wrapper). One training step per model; no
sequence parallelism, no DTensor activations (FSDP2 makes the parameters DTensors and gathers them around each
block).

    torchrun --standalone --nproc_per_node=2 tests/sac_fsdp_runs.py OUT

Two models, one launch: "gpuopt" (FusedDropoutAddRMSNorm, LinearBiasAct, GatedMLP, dropout p > 0 in each) and
"inner_seed", the same model with one more dropout done by a test-only op, gpuopt_test::dropout_inner_seed, that
draws its seed inside the op instead of taking it as an input (a negative control for the mask check).

While a step runs, every call of the recorded ops (the gpuopt forward ops and the test op) is recorded with its
phase (forward or backward, the backward's calls being the checkpoint's recomputations), its seed, and digests of
its other inputs and of its outputs, by a kernel registered at the ADInplaceOrView dispatch key: it runs on every
call, eager or from compiled code, below autograd (a TorchDispatchMode would do, but torch.compile refuses to
compile under one). Rank 0 writes OUT/<model>.pt: each rank's loss and their mean, every parameter's gradient
(the full tensor), both ranks' records, the code of the graphs the compiler received and dynamo's graph breaks.

The model, the data, the seeds and the mask check live here; the test (tests/test_sac_fsdp.py) imports them to run
the one-process reference and to judge the records.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from gpuopt_ops.modules import FusedDropoutAddRMSNorm, GatedMLP, LinearBiasAct
from gpuopt_ops.ops import draw_seed

from helpers import exit_without_teardown

WIDTH, HEADS, BLOCKS, SEQ, VOCAB = 64, 4, 2, 16, 32
BATCH_PER_RANK, WORLD = 4, 2
P = 0.1  # every dropout of the model
INIT_SEED, DATA_SEED, STEP_SEED = 0, 1, 100  # rank r's step runs with torch.manual_seed(STEP_SEED + r)

# The ops recorded by the mask check, with the position of their seed argument (None: no seed input)
RECORDED = {
    "gpuopt::dropout_add_norm": 4,
    "gpuopt::gated_act": 2,
    "gpuopt::bias_act": None,
    "gpuopt_test::dropout_inner_seed": None,
}


# ---------------------------------------------------------------------------------------------- the test op
@torch.library.custom_op("gpuopt_test::dropout_inner_seed", mutates_args=())
def dropout_inner_seed(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout whose seed is drawn inside the op, from torch's default generator, at each call: what a custom op
    must not do. Its recomputation under activation checkpointing draws again, so it may drop other elements."""
    seed = int(torch.randint(0, 2**62, (1,)).item())
    keep = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed)) >= p
    return x * keep / (1 - p)


@dropout_inner_seed.register_fake
def _(x, p):
    return torch.empty_like(x)


def _inner_seed_setup_context(ctx, inputs, output):
    ctx.p = inputs[1]
    ctx.save_for_backward(output)


def _inner_seed_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    return grad * (out != 0) / (1 - ctx.p), None


dropout_inner_seed.register_autograd(_inner_seed_backward, setup_context=_inner_seed_setup_context)


# ---------------------------------------------------------------------------------------------- the model
MATMULS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
}


def save_only_matmuls(ctx, func, *args, **kwargs):
    """The selective checkpointing policy: keep the matmuls' outputs, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if func in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


class Attention(nn.Module):
    """Causal multi-head self-attention written with matmuls (softmax(q kᵀ / √d) v), its output projection a
    LinearBiasAct (bias and GELU fused)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.out = LinearBiasAct(WIDTH, WIDTH, act="gelu")
        self.register_buffer("causal", torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        scores = (q @ k.transpose(-2, -1)) / (d // HEADS) ** 0.5
        weights = scores.masked_fill(self.causal[:s, :s], float("-inf")).softmax(-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    """A pre-norm block: dropout(h) + residual → RMSNorm → attention; dropout(attention) + residual → RMSNorm →
    SwiGLU MLP (dropout inside). Returns (branch output, residual stream). inner_seed: one more dropout, by the
    test op, on the attention output. sac: the forward runs under selective activation checkpointing."""

    def __init__(self, inner_seed: bool = False, sac: bool = True) -> None:
        super().__init__()
        self.attn_norm = FusedDropoutAddRMSNorm(WIDTH, p=P, prenorm=True)
        self.attn = Attention()
        self.mlp_norm = FusedDropoutAddRMSNorm(WIDTH, p=P, prenorm=True)
        self.mlp = GatedMLP(WIDTH, 2 * WIDTH, act="silu", p=P)
        self.inner_seed = inner_seed
        self.sac = sac

    def _forward(self, h: torch.Tensor, residual: torch.Tensor):
        x, residual = self.attn_norm(h, residual)
        a = self.attn(x)
        if self.inner_seed:
            a = dropout_inner_seed(a, P)
        x, residual = self.mlp_norm(a, residual)
        return self.mlp(x), residual

    def forward(self, h: torch.Tensor, residual: torch.Tensor):
        if not self.sac:
            return self._forward(h, residual)
        context_fn = functools.partial(create_selective_checkpoint_contexts, save_only_matmuls)
        return checkpoint(self._forward, h, residual, use_reentrant=False, context_fn=context_fn)


class Model(nn.Module):
    """Token and position embeddings (dropout(positions) + tokens opens the residual stream), BLOCKS blocks, a
    final dropout-add-RMSNorm and an untied head."""

    def __init__(self, inner_seed: bool = False, sac: bool = True) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block(inner_seed, sac) for _ in range(BLOCKS))
        self.norm = FusedDropoutAddRMSNorm(WIDTH, p=P)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.pos(torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens))
        residual = self.tok(tokens)
        for block in self.blocks:
            h, residual = block(h, residual)
        return self.head(self.norm(h, residual))


def build_model(inner_seed: bool = False, sac: bool = True) -> Model:
    """The same weights on every process: the model is built under INIT_SEED (and nn.Linear's initialisation
    draws from the default generator only)."""
    torch.manual_seed(INIT_SEED)
    return Model(inner_seed, sac)


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s rows of the global batch (WORLD * BATCH_PER_RANK sequences): tokens and next-token targets."""
    g = torch.Generator().manual_seed(DATA_SEED)
    data = torch.randint(0, VOCAB, (WORLD * BATCH_PER_RANK, SEQ + 1), generator=g)
    rows = data[rank * BATCH_PER_RANK : (rank + 1) * BATCH_PER_RANK]
    return rows[:, :-1], rows[:, 1:]


def loss_fn(model: nn.Module, rank: int, seed: int | None = None) -> torch.Tensor:
    """Rank `rank`'s step: the generator seeded with STEP_SEED + rank (each rank draws its own dropout seeds, and
    a one-process run seeded the same way draws the same ones) or `seed`, the mean cross-entropy on its rows."""
    tokens, targets = batch(rank)
    torch.manual_seed(STEP_SEED + rank if seed is None else seed)
    return F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))


def expected_seeds(rank: int, n: int) -> list[int]:
    """The first n dropout seeds that rank `rank`'s step draws, those of a one-process run seeded as the rank:
    gpuopt_ops draws each one with draw_seed from the default generator, and nothing else in the forward draws."""
    g = torch.Generator().manual_seed(STEP_SEED + rank)
    return [int(draw_seed(torch.device("cpu"), g)) for _ in range(n)]


# ---------------------------------------------------------------------------------------------- the mask check
def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        # a copy: numpy() on the tensor itself would pin its storage, which FSDP2 frees after each block
        t = t.detach().clone().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def check_recomputed_masks(records: list[dict]) -> tuple[list[str], int]:
    """Each call made in the backward (a checkpoint's recomputation) against the forward call it recomputes: the
    forward call of the same op whose non-seed inputs are bit-identical. The recomputation must take the forward
    call's seed and give its outputs bit for bit (the same inputs and seed give the same mask, so equal outputs
    with dropout on mean equal masks; a mask drawn anew gives other outputs). Returns (problems, number of
    recomputations checked); a recomputation with no forward call to match is a problem too."""
    problems, checked = [], 0
    forward = [r for r in records if r["phase"] == "forward"]
    for r in (r for r in records if r["phase"] == "backward"):
        matches = [f for f in forward if f["op"] == r["op"] and f["inputs"] == r["inputs"]]
        where = f"{r['op']} (recomputed in the backward, inputs {r['inputs']})"
        if len(matches) != 1:
            problems.append(f"{where}: {len(matches)} forward calls with the same inputs, expected 1")
            continue
        f = matches[0]
        checked += 1
        if f["seed"] != r["seed"]:
            problems.append(f"{where}: seed {r['seed']} != the forward's {f['seed']}")
        if f["outputs"] != r["outputs"]:
            problems.append(f"{where}: outputs {r['outputs']} != the forward's {f['outputs']} (another mask)")
    return problems, checked


class Recorder:
    """Records the calls of the RECORDED ops (see the module's docstring) while `phase` is set."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.records: list[dict] = []
        self.libs = {}
        for qualname, seed_at in RECORDED.items():
            namespace, name = qualname.split("::")
            op = getattr(getattr(torch.ops, namespace), name).default
            if namespace not in self.libs:
                self.libs[namespace] = torch.library.Library(namespace, "IMPL")
            self.libs[namespace].impl(name, self._kernel(qualname, op, seed_at), "ADInplaceOrView")

    def _kernel(self, qualname, op, seed_at):
        def kernel(*args):
            with torch._C._AutoDispatchBelowADInplaceOrView():
                out = op(*args)
            # plain tensors and parameters, not the fake or functional tensors of the compiler's tracing
            real = all(type(a) in (torch.Tensor, nn.Parameter) for a in args if isinstance(a, torch.Tensor))
            if self.phase is not None and real:
                tensors = [a for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i != seed_at]
                self.records.append(
                    {
                        "phase": self.phase,
                        "op": qualname,
                        "seed": None if seed_at is None else args[seed_at].tolist(),
                        "inputs": digest(tensors),
                        "outputs": digest(out if isinstance(out, tuple) else (out,)),
                    }
                )
            return out

        return kernel


# ---------------------------------------------------------------------------------------------- the runs
def recording_inductor(graphs: list, compile_fx):
    """Inductor (the default backend) that first keeps the code of each graph it is given in `graphs`."""

    def backend(gm, example_inputs):
        graphs.append(gm.print_readable(print_output=False))
        return compile_fx(gm, example_inputs)

    return backend


def main() -> None:
    import torch.distributed as dist
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx
    from torch.distributed.fsdp import fully_shard

    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    assert dist.get_world_size() == WORLD
    recorder = Recorder()

    for name, inner_seed in (("gpuopt", False), ("inner_seed", True)):
        graphs = []
        backend = recording_inductor(graphs, compile_fx)
        counters.clear()
        model = build_model(inner_seed)
        for block in model.blocks:
            block.compile(backend=backend, fullgraph=True)
            fully_shard(block)
        fully_shard(model)

        recorder.records, recorder.phase = [], "forward"
        loss = loss_fn(model, rank)
        recorder.phase = "backward"
        loss.backward()
        recorder.phase = None

        losses = [torch.zeros(()) for _ in range(WORLD)]
        dist.all_gather(losses, loss.detach())
        grads = {k: p.grad.full_tensor() for k, p in model.named_parameters()}  # FSDP2 averaged them over ranks
        records = [None] * WORLD
        dist.all_gather_object(records, recorder.records)
        if rank == 0:
            breaks = dict(counters["graph_break"])
            result = {"losses": torch.stack(losses), "grads": grads, "records": records, "graphs": graphs}
            result["graph_breaks"] = breaks
            torch.save(result, out / f"{name}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown(0)  # every file is written and the group destroyed (the test reads what the runs wrote)

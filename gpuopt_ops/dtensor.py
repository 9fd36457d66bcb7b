"""DTensor sharding rules of the gpuopt ops (tensor and sequence parallelism).

Registered on `import gpuopt_ops` for the C++ / CUDA ops and on `import gpuopt_ops.triton_ops` for the Triton
twins, through `torch.distributed.tensor.experimental.register_sharding`. For each op, on each mesh dimension:

- every input Replicate: every output Replicate;
- rows sharded, `Shard(d)` of x on any dimension d but the last, parameters Replicate: the op runs on the local
  rows with no communication. The outputs shaped like x keep `Shard(d)`; the per-row statistics (mean, rstd, flat
  (M,) tensors) are `Shard(0)` when the dimensions before d have one element in all, else `_StridedShard(0,
  split_factor=prod(x.shape[:d]))`, the placement of exactly the local rows in the flat order (sequence
  parallelism: x (B, S, D) as `Shard(1)` leaves each rank B runs of S / world rows). The backward returns
  grad_weight and grad_bias as `Partial()` (each rank's sum over its rows), for the caller's reduction;
- element-wise ops (bias_relu, bias_act, gated_act of two tensors) also take `Shard` on the last dimension, with
  the bias sharded as `Shard(0)` the same way (column-parallel linear outputs); grad_bias is then `Shard(0)`.

Refused with an error that names the placement: a norm's input sharded on its last (normalized) dimension and the
one-tensor `[gate | up]` layout of gated_act sharded on its last dimension (the halves would split). Other
placements (Partial, a sharded weight) are redistributed by DTensor to one of the strategies above.

Dropout (p > 0). The masks of a shard must be those of the same elements of the whole tensor, whatever the world
size. The public functions (and the modules) pass a shard seed (`shard_seed`): [seed, base, period, jump], which
numbers each rank's local elements by their linear index in the whole tensor (DESIGN 2.4, `shard_map`).
The rules take a (4,) seed at p > 0 only with the rows left where they are (the seed numbers that box), and refuse
p > 0 with a (1,) seed: it cannot know the placement. Every rank must draw the same seed (seed them alike, as any
SPMD program does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Optional

import torch

from .checks import shard_map_follows_the_rule

try:  # torch.distributed is optional (some builds leave it out)
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor.experimental import register_sharding
    from torch.distributed.tensor.parallel import ColwiseParallel as _TorchColwiseParallel
    from torch.distributed.tensor.parallel import SequenceParallel as _TorchSequenceParallel
    from torch.distributed.tensor.placement_types import _StridedShard
except ImportError:  # pragma: no cover - exercised only on builds without torch.distributed
    DTensor = None
    _TorchSequenceParallel = _TorchColwiseParallel = object

AVAILABLE = DTensor is not None

_DROPOUT_MESSAGE = (
    "dropout (p > 0) on DTensor inputs takes a (4,) shard seed (gpuopt_ops.dtensor.shard_seed), which the public "
    "functions (gpuopt_ops.layer_norm_dropout_relu, norm_dropout, dropout_add_norm, gated_act) and the modules "
    "make: it numbers each shard's elements as in the whole tensor, so the masks do not depend on the world size. "
    "A replicated seed cannot know the placement: each mask would be keyed by the element's index in the shard"
)


class ShardingError(ValueError):
    """A DTensor placement the op cannot compute on without changing its result."""


def _ndim(spec) -> int:
    return len(spec.tensor_meta.shape)


def _last_dim_shards(spec) -> list:
    """The placements of spec that split its last dimension."""
    last = _ndim(spec) - 1
    return [pl for pl in spec.placements if isinstance(pl, Shard) and (pl.dim % max(_ndim(spec), 1)) == last]


def _check_rows(op: str, name: str, spec, what: str = "the norm needs whole rows") -> None:
    if spec is not None and _last_dim_shards(spec):
        raise ShardingError(
            f"gpuopt.{op}: {name} is sharded on its last dimension ({list(spec.placements)}): {what}. Redistribute "
            f"{name} to Shard(d) on another dimension, or to Replicate(), first"
        )


def _rows_placement(shape, d: int):
    """The placement of the flat (M,) per-row statistics of x (shape) sharded as Shard(d)."""
    lead = math.prod(shape[:d])
    return Shard(0) if lead == 1 else _StridedShard(0, split_factor=lead)


def _opt(spec, placement):
    """placement for an optional tensor argument, None where it is absent."""
    return None if spec is None else placement


def _norm_forward_strategies(x, params, n_stats, stats_empty, extra_rows=(), n_row_outputs=1):
    """x, *extra_rows (row-shaped or None), params, seed -> row outputs, statistics: one strategy with every input
    replicated and one for each dimension of x but the last that its rows may be sharded on."""
    rep = Replicate()
    shape = tuple(x.tensor_meta.shape)
    strategies = []
    for row in [rep, *[Shard(d) for d in range(len(shape) - 1)]]:
        stat = rep if row is rep else _rows_placement(shape, row.dim)
        outs = [row] * n_row_outputs + [rep if stats_empty(i) else stat for i in range(n_stats)]
        ins = [row, *[_opt(s, row) for s in extra_rows], *[_opt(s, rep) for s in params], rep]
        strategies.append((outs, ins))
    return strategies


def _norm_backward_strategies(x, params, stats, stats_empty, grad_params, front=(), row_grads=1, row_grad_empty=()):
    """grad_out, *front (row-shaped or None), x-like, params, stats, seed -> row grads, param grads."""
    rep = Replicate()
    shape = tuple(x.tensor_meta.shape)
    strategies = []
    for row in [rep, *[Shard(d) for d in range(len(shape) - 1)]]:
        stat = rep if row is rep else _rows_placement(shape, row.dim)
        outs = [rep if (row_grad_empty and row_grad_empty[i]) else row for i in range(row_grads)]
        outs += [rep if (row is rep or not present) else Partial() for present in grad_params]
        ins = [row, *[_opt(s, row) for s in front], row, *[_opt(s, rep) for s in params]]
        ins += [rep if stats_empty[i] else stat for i in range(len(stats))]
        ins += [rep]
        strategies.append((outs, ins))
    return strategies


def _ldr_rule(x, weight, bias, seed, p, eps):
    _check_rows("layer_norm_dropout_relu", "x", x)
    return [(o, i + [None, None]) for o, i in _norm_forward_strategies(x, [weight, bias], 2, lambda i: False)]


def _ldr_backward_rule(grad_out, x, weight, bias, mean, rstd, seed, p):
    _check_rows("layer_norm_dropout_relu_backward", "x", x)
    grads = [weight is not None, bias is not None]
    return [
        (o, i + [None]) for o, i in _norm_backward_strategies(x, [weight, bias], [mean, rstd], [False, False], grads)
    ]


def _nd_rule(x, weight, bias, seed, p, eps, rms, relu):
    _check_rows("norm_dropout", "x", x)
    return [(o, i + [None] * 4) for o, i in _norm_forward_strategies(x, [weight, bias], 2, lambda i: rms and i == 0)]


def _nd_backward_rule(grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu):
    _check_rows("norm_dropout_backward", "x", x)
    grads = [weight is not None, bias is not None]
    strategies = _norm_backward_strategies(x, [weight, bias], [mean, rstd], [bool(rms), False], grads)
    return [(o, i + [None] * 3) for o, i in strategies]


def _dan_rule(x, residual, weight, bias, seed, p, eps, rms, residual_in_fp32):
    _check_rows("dropout_add_norm", "x", x)
    _check_rows("dropout_add_norm", "residual", residual)
    strategies = _norm_forward_strategies(x, [weight, bias], 2, lambda i: rms and i == 0, [residual], n_row_outputs=2)
    return [(o, i + [None] * 4) for o, i in strategies]


def _dan_backward_rule(grad_out, grad_sum, sum, weight, bias, mean, rstd, seed, p, rms, has_residual):
    _check_rows("dropout_add_norm_backward", "sum", sum)
    _check_rows("dropout_add_norm_backward", "grad_out", grad_out)
    grads = [weight is not None, bias is not None]
    strategies = _norm_backward_strategies(
        sum,
        [weight, bias],
        [mean, rstd],
        [bool(rms), False],
        grads,
        front=[grad_sum],
        row_grads=2,
        row_grad_empty=(False, not has_residual),
    )
    return [(o, i + [None] * 3) for o, i in strategies]


def _elementwise_strategies(x, n_out: int, grad_bias: bool, last_ok: bool):
    """(outputs, the bias's placement, x's placement) for an element-wise op on x: x-shaped outputs, and
    with grad_bias a last output that is the bias's gradient (Partial for row shards, Shard(0) for last-dim
    shards, where the bias is Shard(0) too)."""
    rep = Replicate()
    nd = _ndim(x)
    strategies = []
    for row in [rep, *[Shard(d) for d in range(nd if last_ok else nd - 1)]]:
        last = row is not rep and row.dim == nd - 1
        outs = [row] * (n_out - 1 if grad_bias else n_out)
        if grad_bias:
            outs.append(rep if row is rep else (Shard(0) if last else Partial()))
        strategies.append((outs, Shard(0) if last else rep, row))
    return strategies


def _bias_relu_rule(x, bias):
    return [(o, [r, b]) for o, b, r in _elementwise_strategies(x, 1, False, True)]


def _bias_relu_backward_rule(grad_out, out):
    return [(o, [r, r]) for o, _, r in _elementwise_strategies(out, 2, True, True)]


def _bias_act_rule(x, bias, act):
    return [(o, [r, b, None]) for o, b, r in _elementwise_strategies(x, 1, False, True)]


def _bias_act_backward_rule(grad_out, saved, bias, act):
    return [(o, [r, r, b, None]) for o, b, r in _elementwise_strategies(saved, 2, True, True)]


def _gated_rule(gate, up, seed, p, act):
    rep = Replicate()
    if up is None:
        _check_rows("gated_act", "gate", gate, "its last dimension holds [gate | up], whose halves a shard splits")
    return [
        (o, [r, _opt(up, r), rep, None, None]) for o, _, r in _elementwise_strategies(gate, 1, False, up is not None)
    ]


def _gated_backward_rule(grad_out, gate, up, seed, p, act):
    rep = Replicate()
    if up is None:
        _check_rows("gated_act_backward", "gate", gate, "its last dimension holds [gate | up]")
    return [
        ([r, rep if up is None else r], [r, r, _opt(up, r), rep, None, None])
        for _, _, r in _elementwise_strategies(gate, 1, False, up is not None)
    ]


def _rules() -> dict[str, tuple[Callable, int, Optional[int]]]:
    """op name -> (sharding function, index of its first non-tensor argument, and for the dropout ops the index of
    the argument whose rows the seed numbers: x, or in a backward the forward's x / sum / gate). A dropout op's
    seed is the argument before its first non-tensor one (p)."""
    return {
        "layer_norm_dropout_relu": (_ldr_rule, 4, 0),
        "layer_norm_dropout_relu_backward": (_ldr_backward_rule, 7, 1),
        "norm_dropout": (_nd_rule, 4, 0),
        "norm_dropout_backward": (_nd_backward_rule, 7, 1),
        "dropout_add_norm": (_dan_rule, 5, 0),
        "dropout_add_norm_backward": (_dan_backward_rule, 8, 2),
        "bias_relu": (_bias_relu_rule, 100, None),
        "bias_relu_backward": (_bias_relu_backward_rule, 100, None),
        "bias_act": (_bias_act_rule, 2, None),
        "bias_act_backward": (_bias_act_backward_rule, 3, None),
        "gated_act": (_gated_rule, 3, 0),
        "gated_act_backward": (_gated_backward_rule, 4, 1),
    }


def register(prefix: str = "") -> list[str]:
    """Registers the rules for torch.ops.gpuopt.<prefix><op> (prefix "" or "triton_"); returns the op names."""
    if not AVAILABLE:
        return []
    propagator = DTensor._op_dispatcher.sharding_propagator
    done = []
    for name, (fn, static_argnum, rows) in _rules().items():
        overload = getattr(torch.ops.gpuopt, prefix + name).default
        register_sharding(overload)(fn if rows is None else _with_dropout(name, fn, static_argnum - 1, rows))
        # p (and eps, act, the flags) decide the strategy or its error: they belong to the cache key, which
        # register_sharding would start at the first int argument only
        propagator.op_to_schema_info[overload] = RuntimeSchemaInfo(static_argnum, needs_pytree=True)
        done.append(prefix + name)
    return done


def replicated_like(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """t (a plain tensor, the same on every rank) as a replicated DTensor on x's mesh when x is a DTensor."""
    if AVAILABLE and isinstance(x, DTensor) and not isinstance(t, DTensor):
        return DTensor.from_local(t, x.device_mesh, [Replicate()] * x.device_mesh.ndim, run_check=False)
    return t


def is_dtensor(x: Optional[torch.Tensor]) -> bool:
    return AVAILABLE and isinstance(x, DTensor)


def dropout_error(op: str) -> ShardingError:
    return ShardingError(f"gpuopt.{op}: {_DROPOUT_MESSAGE}")


def shard_map(global_shape, local_shape, offset) -> Optional[tuple[int, int, int]]:
    """(base, period, jump) of a local box of a row-major tensor: local element i is element
    i + base + (i // period) * jump of the whole tensor (DESIGN 2.4). None when the box's elements are not
    numbered so: two sharded dimensions with a dimension of more than one local element before the outer one."""
    g, loc, off = list(global_shape), list(local_shape), list(offset)
    strides = [math.prod(g[j + 1 :]) for j in range(len(g))]
    base = sum(o * st for o, st in zip(off, strides))
    cut = [j for j in range(len(g)) if loc[j] < g[j]]
    if not cut or math.prod(loc) == 0:
        return base, 1, 0
    k = cut[-1]
    if math.prod(loc[:k]) == 1:  # one run of consecutive elements
        return base, 1, 0
    if len(cut) > 1 and any(loc[m] != 1 for m in range(cut[-2])):
        return None
    return base, loc[k] * strides[k], (g[k] - loc[k]) * strides[k]


def _check_placements(op: str, x, last_ok: bool) -> None:
    nd = x.dim()
    for pl in x.placements:
        if isinstance(pl, Replicate) or (
            isinstance(pl, Shard)
            and not isinstance(pl, _StridedShard)
            and (pl.dim % nd < nd - 1 or (last_ok and pl.dim % nd == nd - 1))
        ):
            continue
        where = "its last dimension" if isinstance(pl, Shard) and pl.dim % nd == nd - 1 else f"{pl}"
        raise ShardingError(
            f"gpuopt.{op}: dropout (p > 0) on a DTensor takes Replicate() or Shard(d) placements of whole rows, got "
            f"{list(x.placements)} ({where}). Redistribute it first (x.redistribute(mesh, [Shard(0)]) or Replicate())"
        )


def _with_dropout(op: str, fn: Callable, seed_at: int, rows_at: int) -> Callable:
    """The rule of a dropout op: fn's strategies at p = 0; at p > 0 the seed must be a shard seed (`shard_seed`),
    made for the rows argument's placement, which the op must then keep: only the strategy that leaves it in place
    is offered (no redistribution, so each rank runs on the very box its seed numbers)."""

    def rule(*args):
        strategies = fn(*args)
        if not args[seed_at + 1] > 0.0:
            return strategies
        seed, rows = args[seed_at], args[rows_at]
        shard = isinstance(seed, DTensorSpec) and tuple(seed.tensor_meta.shape) == (4,)
        if not (shard and all(isinstance(pl, Replicate) for pl in seed.placements)):
            raise dropout_error(op)
        # mesh dimensions of one rank hold the whole tensor whatever their placement: they do not count
        sizes = rows.mesh.shape
        here = {pl for pl, size in zip(rows.placements, sizes) if size > 1} or {rows.placements[0]}
        if len(here) != 1:
            raise ShardingError(
                f"gpuopt.{op}: dropout (p > 0) on a DTensor placed differently on each mesh dimension "
                f"({list(rows.placements)}) is not supported: redistribute it to one placement on every mesh dimension"
            )
        (pl,) = here
        keep = [(o, i) for o, i in strategies if i[rows_at] == pl]
        if not keep:
            raise ShardingError(f"gpuopt.{op}: dropout (p > 0) cannot run on {pl}")
        return keep

    return rule


def shard_seed(op: str, x, drawn, unit: int, out_shape=None, last_ok: bool = False):
    """The seed of a dropout op on the DTensor x: [seed, base, period, jump], this rank's numbering of its box of
    the output (`shard_map`; out_shape: x's shape by default) after the drawn seed (a replicated (1,) DTensor, the
    same on every rank). A (4,) DTensor placed Replicate(), though each rank holds its own numbering: the rules
    take a (4,) seed at p > 0 as a shard seed and keep the rows where they are, so no operation ever moves it.
    unit: what the map's terms must be multiples of (N for the row ops, 8 for gated_act)."""
    _check_placements(op, x, last_ok)
    mesh, placements = x.device_mesh, tuple(x.placements)
    out_shape = tuple(x.shape) if out_shape is None else tuple(out_shape)
    local_shape, offset = _local_box(out_shape, mesh, placements)
    numbering = shard_map(out_shape, local_shape, offset)
    if numbering is None or not shard_map_follows_the_rule(*numbering, unit):
        raise ShardingError(
            f"gpuopt.{op}: dropout (p > 0) on a DTensor of shape {tuple(x.shape)} placed {list(placements)}: this "
            f"rank's elements are not one numbering of the whole tensor's (box {local_shape} at {offset}; the map's "
            f"base, period and jump must be multiples of {unit}). Redistribute it to Shard(0) or Replicate() first"
        )
    return torch.cat([drawn, replicated_like(x, torch.tensor(numbering, dtype=torch.int64, device=x.device))])


def _local_box(shape, mesh, placements) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(local shape, offset) of this rank's box of a tensor of `shape` placed as `placements` (Replicate / Shard):
    DTensor's chunking (ceil-sized chunks, the last ones short or empty; mesh dimensions sharding the same
    dimension nest in mesh order). Plain ints from the rank's mesh coordinate, so a compiled graph specialises on
    its rank instead of guarding on a symbolic one."""
    local, offset = list(shape), [0] * len(shape)
    coordinate = mesh.get_coordinate()
    for i, pl in enumerate(placements):
        if isinstance(pl, Shard):
            d = pl.dim % len(shape)
            chunk = -(-local[d] // mesh.size(i))
            start = min(coordinate[i] * chunk, local[d])
            size = min(local[d], start + chunk) - start
            offset[d] += start
            local[d] = size
    return tuple(local), tuple(offset)


class SequenceParallel(_TorchSequenceParallel):
    """torch's `SequenceParallel` style for modules with several tensor inputs and outputs: the residual norms
    (`FusedDropoutAddLayerNorm` / `FusedDropoutAddRMSNorm`, `forward(x, residual)`, prenorm returning `(out, sum)`).

    torch's style prepares the first positional input only and passes that one on, so a residual given positionally
    would be dropped and the norm would run without it. This one prepares every positional tensor input the same
    way (a DTensor redistributed to Shard(sequence_dim), a local tensor taken as that shard) and, with
    use_local_output=True, converts every output. Parameters are replicated, as in torch's.
    """

    @staticmethod
    def _prepare_input_fn(sequence_sharding, mod, inputs, device_mesh):
        prepare = _TorchSequenceParallel._prepare_input_fn
        return tuple(
            prepare(sequence_sharding, mod, (t,), device_mesh) if isinstance(t, torch.Tensor) else t for t in inputs
        )

    @staticmethod
    def _prepare_output_fn(use_local_output, mod, outputs, device_mesh):
        if not use_local_output:
            return outputs
        if isinstance(outputs, tuple):
            return tuple(o.to_local() if isinstance(o, DTensor) else o for o in outputs)
        return outputs.to_local()


class ShardsAsLinear:
    """Marks a module that `ColwiseParallel` shards as nn.Linear: `weight` (out, in) and `bias` (out,), then only
    element-wise work on the matmul's output (gpuopt_ops.modules' LinearBiasReLU and LinearBiasAct)."""


class ColwiseParallel(_TorchColwiseParallel):
    """torch's `ColwiseParallel` style, which takes nn.Linear and nn.Embedding only, also for `LinearBiasReLU` and
    `LinearBiasAct` (a `ShardsAsLinear`): weight and bias `Shard(0)` as nn.Linear's, the output `Shard(-1)`. The
    activation is element-wise, so it runs on each rank's columns (bias_act's last-dimension strategy) with no
    communication."""

    def _apply(self, module, device_mesh):
        if not isinstance(module, ShardsAsLinear):
            return super()._apply(module, device_mesh)
        return distribute_module(
            module,
            device_mesh,
            self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )

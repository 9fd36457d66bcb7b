"""Run by tests/test_dtensor.py in 2 processes (helpers.TwoRanks, as torchrun starts them; gloo, CPU): every gpuopt
op on DTensors.

For each op, backend (C++; Triton too where it imports) and placement of its rows (Replicate, Shard(0), Shard(1),
and Shard on the last dimension for the element-wise ops), the op is called on DTensors and on the whole tensors:
the output placements must be the documented ones, x-shaped outputs and statistics must equal the whole-tensor
call bit for bit, and parameter gradients come back Partial with a sum within 1e-6 of the whole-tensor one. Then
the refusals (a norm sharded on its last dimension, dropout through the raw ops, the [gate | up] layout split), the
public functions' autograd, and dropout (p > 0) through the public functions: the whole tensor's bits. Rank 0
writes a JSON summary to argv[1].
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (gpuopt_ops imports it)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor  # noqa: E402
from torch.distributed.tensor.placement_types import _StridedShard  # noqa: E402

import gpuopt_ops  # noqa: E402

import interpreter_lists  # noqa: E402
from helpers import exit_without_teardown  # noqa: E402

interpreter_lists.install()  # as tests/conftest.py does: the interpreter made cheaper to call into

B, S, N = 2, 4, 16  # x (B, S, N); Shard(1) leaves each rank B runs of S / 2 rows (strided statistics)
CHECKS: list[str] = []


def _backends():
    yield "cpu", torch.ops.gpuopt, ""
    try:
        import gpuopt_ops.triton_ops  # noqa: F401
    except Exception:  # triton missing: the C++ ops alone
        return
    yield "triton", torch.ops.gpuopt, "triton_"


def _dist(t, placement, mesh):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return t
    return distribute_tensor(t, mesh, [placement])


_GATHERS_STRIDED = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 14)


def _stats_placement(d: int):
    return Shard(0) if d == 0 else _StridedShard(0, split_factor=B)


def _compare(name, got, want, placement, exact=True):
    assert isinstance(got, DTensor), f"{name}: not a DTensor ({type(got).__name__})"
    assert tuple(got.placements) == (placement,), f"{name}: placements {got.placements}, expected {placement}"
    if isinstance(placement, _StridedShard):
        # the statistics of x sharded on dimension 1: B runs of S / world rows each. Compared on the local rows
        # (torch 2.11's redistribute cannot gather a _StridedShard; newer versions can, see the check below)
        world, rank = dist.get_world_size(), dist.get_rank()
        mine = want.view(B, S)[:, rank * S // world : (rank + 1) * S // world].reshape(-1)
        assert torch.equal(got.to_local(), mine), f"{name}: local statistics differ from the whole tensor's rows"
        if _GATHERS_STRIDED:
            assert torch.equal(got.full_tensor(), want), f"{name}: gathered statistics differ"
        CHECKS.append(name)
        return
    full = got.full_tensor()
    if exact:
        assert full.shape == want.shape and torch.equal(full, want), (
            f"{name}: differs from the whole-tensor call by {(full.double() - want.double()).abs().max().item()}"
        )
    else:
        torch.testing.assert_close(full, want, rtol=1e-6, atol=1e-6, msg=name)
    CHECKS.append(name)


def _call(mesh, op, args, placements, outs, label):
    """op on the whole tensors and on DTensors placed as `placements` (one per arg, None: not a tensor / absent);
    outs: per output, (placement, exact)."""
    want = op(*args)
    got = op(*[_dist(a, pl, mesh) if pl is not None else a for a, pl in zip(args, placements)])
    if not isinstance(want, (tuple, list)):
        want, got = (want,), (got,)
    for i, ((pl, exact), g, w) in enumerate(zip(outs, got, want)):
        if pl is None:  # an empty placeholder output
            continue
        _compare(f"{label} output {i}", g, w, pl, exact)
    return got


def check_norms(mesh, ops, prefix, label):
    torch.manual_seed(0)
    x, res = torch.randn(B, S, N), torch.randn(B, S, N)
    w, b = torch.randn(N) + 1, torch.randn(N)
    seed = torch.zeros(1, dtype=torch.int64)
    g = torch.randn(B, S, N)
    rep = Replicate()
    for d in (None, 0, 1):
        row = rep if d is None else Shard(d)
        stat = rep if d is None else _stats_placement(d)
        grad_pl = rep if d is None else Partial()
        tag = f"{label} {row}"
        # layer_norm_dropout_relu
        op, bop = (
            getattr(ops, prefix + "layer_norm_dropout_relu"),
            getattr(ops, prefix + "layer_norm_dropout_relu_backward"),
        )
        out, mean, rstd = op(x, w, b, seed, 0.0, 1e-5)
        _call(
            mesh,
            op,
            [x, w, b, seed, 0.0, 1e-5],
            [row, rep, rep, rep, None, None],
            [(row, True), (stat, True), (stat, True)],
            f"{tag} layer_norm_dropout_relu",
        )
        _call(
            mesh,
            bop,
            [g, x, w, b, mean, rstd, seed, 0.0],
            [row, row, rep, rep, stat, stat, rep, None],
            [(row, True), (grad_pl, False), (grad_pl, False)],
            f"{tag} layer_norm_dropout_relu_backward",
        )
        # norm_dropout, layer and rms
        for rms in (False, True):
            op, bop = getattr(ops, prefix + "norm_dropout"), getattr(ops, prefix + "norm_dropout_backward")
            out, mean, rstd = op(x, w, None if rms else b, seed, 0.0, 1e-5, rms, True)
            bias = None if rms else b
            _call(
                mesh,
                op,
                [x, w, bias, seed, 0.0, 1e-5, rms, True],
                [row, rep, rep, rep, None, None, None, None],
                [(row, True), (None if rms else stat, True), (stat, True)],
                f"{tag} norm_dropout rms={rms}",
            )
            _call(
                mesh,
                bop,
                [g, x, w, bias, mean, rstd, seed, 0.0, rms, True],
                [row, row, rep, rep, rep if rms else stat, stat, rep, None, None, None],
                [(row, True), (grad_pl, False), (None if rms else grad_pl, False)],
                f"{tag} norm_dropout_backward rms={rms}",
            )
        # dropout_add_norm, with and without a residual
        for rms, r in ((False, res), (True, res), (True, None)):
            op, bop = getattr(ops, prefix + "dropout_add_norm"), getattr(ops, prefix + "dropout_add_norm_backward")
            bias = None if rms else b
            out, s, mean, rstd = op(x, r, w, bias, seed, 0.0, 1e-5, rms, False)
            _call(
                mesh,
                op,
                [x, r, w, bias, seed, 0.0, 1e-5, rms, False],
                [row, row, rep, rep, rep, None, None, None, None],
                [(row, True), (row, True), (None if rms else stat, True), (stat, True)],
                f"{tag} dropout_add_norm rms={rms} residual={r is not None}",
            )
            _call(
                mesh,
                bop,
                [g, g * 0.5, s, w, bias, mean, rstd, seed, 0.0, rms, r is not None],
                [row, row, row, rep, rep, rep if rms else stat, stat, rep, None, None, None],
                [
                    (row, True),
                    (row if r is not None else None, True),
                    (grad_pl, False),
                    (None if rms else grad_pl, False),
                ],
                f"{tag} dropout_add_norm_backward rms={rms} residual={r is not None}",
            )


def check_elementwise(mesh, ops, prefix, label):
    torch.manual_seed(1)
    x, bias = torch.randn(B, S, N), torch.randn(N)
    g = torch.randn(B, S, N)
    gate, up, packed = torch.randn(B, S, N), torch.randn(B, S, N), torch.randn(B, S, 2 * N)
    seed = torch.zeros(1, dtype=torch.int64)
    rep = Replicate()
    for d in (None, 0, 1, 2):
        row = rep if d is None else Shard(d)
        bias_pl = Shard(0) if d == 2 else rep
        grad_b = rep if d is None else (Shard(0) if d == 2 else Partial())
        tag = f"{label} {row}"
        op, bop = getattr(ops, prefix + "bias_relu"), getattr(ops, prefix + "bias_relu_backward")
        out = _call(mesh, op, [x, bias], [row, bias_pl], [(row, True)], f"{tag} bias_relu")[0]
        _call(mesh, bop, [g, out.full_tensor()], [row, row], [(row, True), (grad_b, False)], f"{tag} bias_relu_bwd")
        for act in (1, 3):
            op, bop = getattr(ops, prefix + "bias_act"), getattr(ops, prefix + "bias_act_backward")
            _call(mesh, op, [x, bias, act], [row, bias_pl, None], [(row, True)], f"{tag} bias_act {act}")
            _call(
                mesh,
                bop,
                [g, x, bias, act],
                [row, row, bias_pl, None],
                [(row, True), (grad_b, False)],
                f"{tag} bias_act_backward {act}",
            )
        op, bop = getattr(ops, prefix + "gated_act"), getattr(ops, prefix + "gated_act_backward")
        _call(mesh, op, [gate, up, seed, 0.0, 3], [row, row, rep, None, None], [(row, True)], f"{tag} gated_act")
        _call(
            mesh,
            bop,
            [g, gate, up, seed, 0.0, 3],
            [row, row, row, rep, None, None],
            [(row, True), (row, True)],
            f"{tag} gated_act_backward",
        )
        if d != 2:  # [gate | up] along the last dimension: rows only
            _call(
                mesh,
                op,
                [packed, None, seed, 0.0, 3],
                [row, None, rep, None, None],
                [(row, True)],
                f"{tag} gated_act packed",
            )
            _call(
                mesh,
                bop,
                [g, packed, None, seed, 0.0, 3],
                [row, row, None, rep, None, None],
                [(row, True), (None, True)],
                f"{tag} gated_act_backward packed",
            )


def _raises(name, fn, *needles):
    try:
        fn()
    except Exception as e:  # DTensor may wrap the rule's error; its message must carry ours
        text = f"{type(e).__name__}: {e}"
        assert all(n in text for n in needles), f"{name}: message lacks {needles}: {text[:600]}"
        CHECKS.append(name)
        return
    raise AssertionError(f"{name}: no error")


def check_refusals(mesh, ops, prefix, label):
    x, w, b = torch.randn(B, S, N), torch.randn(N), torch.randn(N)
    seed = torch.zeros(1, dtype=torch.int64)
    rep = Replicate()
    xd_last = distribute_tensor(x, mesh, [Shard(2)])
    wd, bd, sd = (distribute_tensor(t, mesh, [rep]) for t in (w, b, seed))
    op = getattr(ops, prefix + "layer_norm_dropout_relu")
    _raises(
        f"{label} norm on Shard(2)",
        lambda: op(xd_last, wd, bd, sd, 0.0, 1e-5),
        "sharded on its last dimension",
        "Shard(dim=2)",
        "layer_norm_dropout_relu",
    )
    dan = getattr(ops, prefix + "dropout_add_norm")
    _raises(
        f"{label} dropout_add_norm on Shard(2)",
        lambda: dan(xd_last, xd_last, wd, None, sd, 0.0, 1e-5, True, False),
        "sharded on its last dimension",
    )
    xd = distribute_tensor(x, mesh, [Shard(1)])
    op(xd, wd, bd, sd, 0.0, 1e-5)  # p = 0 runs and is cached; p > 0 must not reuse that decision
    _raises(
        f"{label} dropout on DTensors (raw op)",
        lambda: op(xd, wd, bd, sd, 0.25, 1e-5),
        "shard seed",
        "cannot know the placement",
    )
    ga = getattr(ops, prefix + "gated_act")
    packed = distribute_tensor(torch.randn(B, S, 2 * N), mesh, [Shard(2)])
    _raises(f"{label} [gate | up] on Shard(2)", lambda: ga(packed, None, sd, 0.0, 3), "[gate | up]")


def check_redistributed(mesh, ops, prefix, label):
    """Placements no strategy takes are redistributed by DTensor to one that does, with the same values: a Partial
    x (each rank holding half of it) is reduced, a Shard(0) norm weight is gathered."""
    torch.manual_seed(3)
    x, w, b = torch.randn(B, S, N), torch.randn(N) + 1, torch.randn(N)
    seed = torch.zeros(1, dtype=torch.int64)
    rep = Replicate()
    op = getattr(ops, prefix + "layer_norm_dropout_relu")
    want = op(x, w, b, seed, 0.0, 1e-5)
    half = DTensor.from_local(x / 2, mesh, [Partial()], run_check=False)  # x / 2 is exact: the sum is x
    wd, bd, sd = (distribute_tensor(t, mesh, [rep]) for t in (w, b, seed))
    got = op(half, wd, bd, sd, 0.0, 1e-5)
    # DTensor picks the cheapest strategy: a reduce-scatter to Shard(0) (or an all-reduce to Replicate)
    _compare(f"{label} Partial x", got[0], want[0], got[0].placements[0])
    assert got[0].placements[0] in (rep, Shard(0), Shard(1)), got[0].placements
    xs, ws = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(w, mesh, [Shard(0)])
    got = op(xs, ws, bd, sd, 0.0, 1e-5)
    _compare(f"{label} Shard(0) weight", got[0], want[0], Shard(0))


def check_public_autograd(mesh, backend):
    """The public functions on DTensors: x's gradient Shard, the parameters' sums equal to the whole tensors'."""
    torch.manual_seed(2)
    rep = Replicate()
    x, res = torch.randn(B, S, N), torch.randn(B, S, N)
    w, b = torch.randn(N) + 1, torch.randn(N)

    def run(xs, rs, ws, bs):
        out, s = gpuopt_ops.dropout_add_norm(
            xs, rs, ws, bs, norm="layer", p=0.1, training=False, prenorm=True, backend=backend
        )
        y = gpuopt_ops.layer_norm_dropout_relu(out + s, (N,), ws, bs, p=0.0, backend=backend)
        return gpuopt_ops.gated_act(y, out, act="silu", p=0.0, backend=backend)

    leaves = [t.clone().requires_grad_(True) for t in (x, res, w, b)]
    want = run(*leaves)
    want.backward(torch.ones_like(want))
    for d in (0, 1):
        dleaves = [
            distribute_tensor(t.detach().clone(), mesh, [Shard(d) if i < 2 else rep]).requires_grad_(True)
            for i, t in enumerate((x, res, w, b))
        ]
        got = run(*dleaves)
        _compare(f"{backend} public Shard({d}) output", got, want.detach(), Shard(d))
        got.backward(torch.ones_like(got))
        for name, dl, leaf in zip(("x", "residual", "weight", "bias"), dleaves, leaves):
            grad = dl.grad
            assert isinstance(grad, DTensor), f"{name}: grad is {type(grad).__name__}"
            full = grad.full_tensor()
            if name in ("x", "residual"):
                assert torch.equal(full, leaf.grad), f"Shard({d}) grad of {name} differs"
            else:
                torch.testing.assert_close(full, leaf.grad, rtol=1e-5, atol=1e-6, msg=f"Shard({d}) grad of {name}")
            CHECKS.append(f"{backend} public Shard({d}) grad {name} {grad.placements}")


def check_public_dropout(mesh, backend):
    """Dropout (p > 0) through the public functions on DTensors: each shard draws the masks of the same elements of
    the whole tensor, so out (and sum) equal one process's call with the same seed bit for bit, and so do the
    gradients of x, residual and up (the parameters' within 1e-6: each rank sums its own rows). Every rank seeds
    its generator alike. Then what is refused: a Partial x, and the raw op (its seed cannot know the placement)."""
    torch.manual_seed(5)
    rep = Replicate()
    x, res, up = torch.randn(B, S, N), torch.randn(B, S, N), torch.randn(B, S, N)
    w, b = torch.randn(N) + 1, torch.randn(N)
    cases = {
        "layer_norm_dropout_relu": lambda t: [
            gpuopt_ops.layer_norm_dropout_relu(t[0], (N,), t[2], t[3], p=0.3, backend=backend)
        ],
        "norm_dropout rms": lambda t: [
            gpuopt_ops.norm_dropout(t[0], t[2], None, norm="rms", activation="relu", p=0.3, backend=backend)
        ],
        "dropout_add_norm": lambda t: list(
            gpuopt_ops.dropout_add_norm(t[0], t[1], t[2], t[3], p=0.3, prenorm=True, backend=backend)
        ),
        "gated_act": lambda t: [gpuopt_ops.gated_act(t[0], t[1], p=0.3, backend=backend)],
        "gated_act packed": lambda t: [gpuopt_ops.gated_act(torch.cat([t[0], t[1]], -1), p=0.3, backend=backend)],
    }
    for name, run in cases.items():
        dims = (None, 0, 1, 2) if name == "gated_act" else (None, 0, 1)
        second = up if name.startswith("gated") else res
        leaves = [t.clone().requires_grad_(True) for t in (x, second, w, b)]
        torch.manual_seed(11)
        want = run(leaves)
        sum(o.double().sum() * (i + 1) for i, o in enumerate(want)).backward()
        for d in dims:
            row = rep if d is None else Shard(d)
            dleaves = [
                distribute_tensor(t.detach().clone(), mesh, [row if i < 2 else rep]).requires_grad_(True)
                for i, t in enumerate((x, second, w, b))
            ]
            torch.manual_seed(11)
            got = run(dleaves)
            for i, (g, wt) in enumerate(zip(got, want)):
                _compare(f"{backend} public {name} p=0.3 {row} output {i}", g, wt.detach(), row)
            sum(o.double().sum() * (i + 1) for i, o in enumerate(got)).backward()
            for lname, dl, leaf in zip(("x", "second", "weight", "bias"), dleaves, leaves):
                if leaf.grad is None:
                    assert dl.grad is None, f"{name} {row}: {lname} has a gradient the whole call does not"
                    continue
                full = dl.grad.full_tensor()
                if lname in ("x", "second"):
                    assert torch.equal(full, leaf.grad), f"{name} {row}: grad of {lname} differs"
                else:
                    torch.testing.assert_close(full, leaf.grad, rtol=1e-5, atol=1e-6, msg=f"{name} {row} {lname}")
                CHECKS.append(f"{backend} public {name} p=0.3 {row} grad {lname} {dl.grad.placements}")
    # a (1, 2) mesh with x Replicate on the one-rank dimension: that dimension holds the whole tensor either way
    mesh2 = init_device_mesh("cpu", (1, dist.get_world_size()))
    torch.manual_seed(11)
    want = gpuopt_ops.dropout_add_norm(x, res, w, b, p=0.3, backend=backend)
    xd, rd = (distribute_tensor(t, mesh2, [rep, Shard(1)]) for t in (x, res))
    wd, bd = (distribute_tensor(t, mesh2, [rep, rep]) for t in (w, b))
    torch.manual_seed(11)
    got = gpuopt_ops.dropout_add_norm(xd, rd, wd, bd, p=0.3, backend=backend)
    assert torch.equal(got.full_tensor(), want), f"{backend} (1, 2) mesh: differs from the whole tensor's"
    CHECKS.append(f"{backend} public dropout_add_norm p=0.3 (1, 2) mesh {list(got.placements)}")
    half = DTensor.from_local(x / 2, mesh, [Partial()], run_check=False)
    _raises(
        f"{backend} public dropout on a Partial x",
        lambda: gpuopt_ops.layer_norm_dropout_relu(half, (N,), p=0.1, backend=backend),
        "Replicate() or Shard(d) placements of whole rows",
        "Partial",
    )


def main() -> int:
    out_path = sys.argv[1]
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank = dist.get_rank()
    errors = []
    for label, ops, prefix in _backends():
        for fn in (check_norms, check_elementwise, check_refusals, check_redistributed):
            try:
                fn(mesh, ops, prefix, label)
            except Exception:
                errors.append(f"rank {rank} {label} {fn.__name__}:\n{traceback.format_exc()}")
        for fn in (check_public_autograd, check_public_dropout):
            try:
                fn(mesh, "triton" if prefix else "cpu")
            except Exception:
                errors.append(f"rank {rank} {label} {fn.__name__}:\n{traceback.format_exc()}")
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"checks": CHECKS, "errors": errors, "world": dist.get_world_size()}, f)
    for e in errors:
        print(e, file=sys.stderr)
    dist.destroy_process_group()
    return 1 if errors else 0


if __name__ == "__main__":
    exit_without_teardown(main())

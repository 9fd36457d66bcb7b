"""Dropout on a shard draws the masks of the same elements of the whole tensor (DESIGN 2.4, sharded
tensors): a 4-element seed [seed, base, period, jump] numbers element i of the op's output
i + base + (i // period) * jump.

- `shard_map` (gpuopt_ops.dtensor) gives the numbering of a box of a row-major tensor: checked against the
  whole tensor's linear indices, and the reference mask under a map against the whole tensor's mask.
- Every dropout op on every backend (C++ CPU, Triton under the interpreter, the CUDA source under the emulator;
  the GPU backends where there is one), forward and backward, on boxes cut from a whole tensor: row shards
  (Shard(0)), sequence shards of a (B, S, N) tensor with B > 1 (the rows jump), both, and column shards of
  gated_act's two-tensor layout. The box's results are the same bits as the whole tensor's at the same elements:
  out, the statistics, grad_x (and sum, grad_residual, grad_up). The launch plans are varied too: the looped Triton
  kernels, and emulated devices whose persistent grids loop over rows or whose shared memory sends long rows to
  the looped CUDA kernels.
- The checks refuse a map whose terms break the rule (multiples of N for the row ops, of 8 for gated_act).
"""

from __future__ import annotations

import pytest
import torch
from test_batch_invariance import DEVICES, triton_plan  # noqa: F401  (a fixture)

from gpuopt_ops import reference as R
from gpuopt_ops.dtensor import shard_map
from gpuopt_ops.ops import ACTIVATIONS

from backends import DEFAULT, backend_params, marks_for, require_op
from helpers import load_emulated_ops

SEED = 2**41 + 12345
P = 0.3
EPS = 1e-5
ALL = backend_params(*DEFAULT, "cuda-emulated")


def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])


def box_seed(seed, global_shape, box, device="cpu"):
    """The 4-element seed of the box (a tuple of slices) of a tensor of global_shape."""
    local = [len(range(*s.indices(g))) for s, g in zip(box, global_shape)]
    offset = [s.indices(g)[0] for s, g in zip(box, global_shape)]
    numbering = shard_map(global_shape, local, offset)
    assert numbering is not None
    return torch.tensor([seed, *numbering], dtype=torch.int64, device=device)


def full(box, ndim):
    return tuple(box) + (slice(None),) * (ndim - len(box))


# --------------------------------------------------------------------------------------------- the numbering
NUMBERING_CASES = [
    ((6, 10), (slice(2, 5),)),
    ((3, 5, 8), (slice(None), slice(1, 4))),
    ((3, 5, 8), (slice(1, 3), slice(2, 5))),
    ((1, 5, 8), (slice(None), slice(1, 4))),
    ((2, 4, 6, 8), (slice(1, 2), slice(None), slice(2, 5))),
    ((3, 5, 16), (slice(None), slice(None), slice(8, 16))),
    ((3, 5, 16), (slice(1, 3), slice(None), slice(0, 8))),
    ((4, 6), (slice(0, 0),)),
]


@pytest.mark.parametrize("shape,box", NUMBERING_CASES)
def test_shard_map_numbers_each_element_by_its_index_in_the_whole_tensor(shape, box):
    index = torch.arange(torch.Size(shape).numel()).reshape(shape)
    want = index[full(box, len(shape))].reshape(-1)
    seed = box_seed(0, shape, full(box, len(shape)))
    got = torch.from_numpy(R.shard_index(seed, want.numel()))
    assert torch.equal(got, want)


def test_shard_map_refuses_boxes_that_are_not_one_numbering():
    # dims 0 and 2 cut with dim 0 holding more than one local element before them: rows of several runs each
    assert shard_map((2, 4, 6, 8), (2, 2, 3, 8), (0, 1, 2, 0)) is None
    assert shard_map((2, 4, 6, 8), (1, 2, 3, 8), (1, 1, 2, 0)) is not None


def test_reference_mask_of_a_box_is_the_whole_tensors_mask_there():
    shape, box = (3, 5, 40), (slice(None), slice(1, 4), slice(None))
    whole = R.dropout_keep_mask(SEED, 15, 40, P).reshape(shape)
    local = R.dropout_keep_mask(box_seed(SEED, shape, box), 9, 40, P).reshape(3, 3, 40)
    assert torch.equal(local, whole[box])
    assert not torch.equal(local, R.dropout_keep_mask(SEED, 9, 40, P).reshape(3, 3, 40))  # the map matters


# ----------------------------------------------------------------------------------------------- the ops
ROW_OPS = ["ldr", "nd-rms-relu", "dan-layer-res", "dan-rms"]
BOXES = {
    "rows": (slice(1, 3),),
    "seq": (slice(None), slice(1, 4)),
    "both": (slice(1, 3), slice(2, 5)),
}
B, S = 3, 5


def row_inputs(n, dtype):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(B, S, n, generator=g) * 2 + 1).to(dtype)
    return dict(
        x=x,
        residual=torch.randn(B, S, n, generator=g).to(dtype),
        grad_out=torch.randn(B, S, n, generator=g).to(dtype),
        grad_sum=torch.randn(B, S, n, generator=g).to(dtype),
        weight=(1 + 0.3 * torch.randn(n, generator=g)).to(dtype),
        bias=(0.2 * torch.randn(n, generator=g)).to(dtype),
    )


def run_row_op(backend, op, t, seed):
    """{name: result} of op's forward and backward on the (b, s, n) tensors t (x-shaped results and (b, s)
    statistics), on the backend's device."""
    dev = backend.device
    x, g, w, b = (t[k].to(dev) for k in ("x", "grad_out", "weight", "bias"))
    seed = seed.to(dev)
    fwd, bwd = backend.op(op_name(op)), backend.op(op_name(op) + "_backward")
    rows = x.shape[:2]
    if op == "ldr":
        out, mean, rstd = fwd(x, w, b, seed, P, EPS)
        gx, _, _ = bwd(g, x, w, b, mean, rstd, seed, P)
        res = dict(out=out, mean=mean.reshape(rows), rstd=rstd.reshape(rows), grad_x=gx)
    elif op == "nd-rms-relu":
        out, mean, rstd = fwd(x, w, b, seed, P, EPS, True, True)
        gx, _, _ = bwd(g, x, w, b, mean, rstd, seed, P, True, True)
        res = dict(out=out, rstd=rstd.reshape(rows), grad_x=gx)
    else:
        rms, has_res = op == "dan-rms", op == "dan-layer-res"
        r = t["residual"].to(dev) if has_res else None
        gs = t["grad_sum"].to(dev) if has_res else None
        out, s, mean, rstd = fwd(x, r, w, b, seed, P, EPS, rms, False)
        gx, gr, _, _ = bwd(g, gs, s, w, b, mean, rstd, seed, P, rms, has_res)
        res = dict(out=out, sum=s, rstd=rstd.reshape(rows), grad_x=gx)
        if not rms:
            res["mean"] = mean.reshape(rows)
        if has_res:
            res["grad_residual"] = gr
    return {k: v.cpu() for k, v in res.items()}


def op_name(op):
    return {"ldr": "layer_norm_dropout_relu", "nd-rms-relu": "norm_dropout"}.get(op, "dropout_add_norm")


def assert_box_bits(whole, local, box, where):
    for name, got in local.items():
        want = whole[name][full(box, whole[name].dim())]
        if not torch.equal(bits(got), bits(want)):
            bad = (bits(got) != bits(want)).nonzero()
            raise AssertionError(
                f"{where}: {name} differs from the whole tensor's at {bad.shape[0]} places, e.g. {bad[0].tolist()}"
            )


def check_row_op(backend, op, n, dtype, box_name):
    require_op(backend, op_name(op))
    t = row_inputs(n, dtype)
    whole = run_row_op(backend, op, t, torch.tensor([SEED]))
    box = BOXES[box_name]
    local_t = {k: (v[full(box, 3)].contiguous() if v.dim() == 3 else v) for k, v in t.items()}
    local = run_row_op(backend, op, local_t, box_seed(SEED, (B, S, n), full(box, 3)))
    assert_box_bits(whole, local, box, f"{backend.name} {op} n={n} {dtype} box {box_name}")
    # the masks are the whole tensor's, not the box's own: without the map they differ
    plain = run_row_op(backend, op, local_t, torch.tensor([SEED]))
    assert not torch.equal(bits(plain["out"]), bits(local["out"]))


DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


def row_matrix():
    """(backend, op, n, dtype, box) over every op, N and box; the backends that run here slowly (Triton's
    interpreter, the emulated CUDA source) take fp32 and bf16 in turn, so each dtype meets every op, N and box
    somewhere at half the cost. Of theirs, the fast lane keeps one diagonal of each op's N x box square (each N
    meets one box, each box one N); the full suite runs the whole square."""
    out = []
    for bp in ALL:
        backend = bp.values[0]
        slow = backend.runs_slowly
        i = 0
        for op in ROW_OPS:
            for j, n in enumerate((37, 64, 1000)):
                for k, box in enumerate(BOXES):
                    i += 1
                    marks = marks_for(bp, full_suite_only=slow and (j + k) % 3 != 0)
                    for dtype in DTYPES:
                        dt = dtype.values[0]
                        if slow and dt != (torch.float32, torch.bfloat16)[i % 2]:
                            continue
                        name = f"{bp.id}-{op}-{n}-{dtype.id}-{box}"
                        out.append(pytest.param(backend, op, n, dt, box, id=name, marks=marks))
    return out


@pytest.mark.parametrize("backend,op,n,dtype,box_name", row_matrix())
def test_row_ops_on_a_box_give_the_whole_tensors_bits(backend, op, n, dtype, box_name):
    check_row_op(backend, op, n, dtype, box_name)


@pytest.mark.slow  # the looped kernels under Triton's interpreter; the fast lane's box cases run the one-block ones
@pytest.mark.parametrize("op", ["ldr", "dan-layer-res"])
@pytest.mark.parametrize("n", [37, 64])
@pytest.mark.parametrize("backend", backend_params("triton-interpret"))
def test_triton_looped_kernels_on_a_box(backend, triton_plan, op, n):  # noqa: F811  (the fixture)
    """The looped kernels (16-column chunks) and 3 persistent programs, each looping over row tiles."""
    triton_plan(programs=3, looped=True)
    check_row_op(backend, op, n, torch.float32, "seq")


@pytest.mark.slow  # the interpreter's slowest box cases (rows of up to 12288 columns); the full suite runs them
@pytest.mark.parametrize("op,n", [("ldr", 768), ("ldr", 12288), ("dan-rms", 12288)])
@pytest.mark.parametrize("backend", backend_params("triton-interpret"))
def test_triton_chunked_and_wide_kernels_on_a_box(backend, op, n):
    """Rows of three chunks (N = 768) and the wide backward (N = 12288), which the N above do not reach."""
    check_row_op(backend, op, n, torch.float32, "seq")


@pytest.mark.parametrize("device", ["1x2", "99KiB"])
@pytest.mark.parametrize("op,n", [("ldr", 1000), ("dan-layer-res", 1000), ("ldr", 12288), ("dan-rms", 12288)])
@pytest.mark.parametrize("backend", backend_params("cuda-emulated"))
def test_emulated_cuda_plans_on_a_box(backend, op, n, device):
    """Persistent grids of 2 blocks looping over the rows (1x2), and a device whose 99 KiB of shared memory sends
    long rows to the looped kernels (N = 12288 also takes the wide or the looped backward)."""
    emu = load_emulated_ops()
    old = emu.configure(*DEVICES[device])
    try:
        check_row_op(backend, op, n, torch.float32, "seq")
    finally:
        emu.configure(*old)


# ----------------------------------------------------------------------------------------------- gated_act
GATED_BOXES = {
    "rows": ((slice(1, 3),), False),
    "seq-packed": ((slice(None), slice(1, 4)), True),
    "cols": ((slice(None), slice(None), slice(8, 32)), False),
    "rows-cols": ((slice(1, 2), slice(None), slice(16, 40)), False),
}


def run_gated(backend, gate, up, grad_out, seed):
    dev = backend.device
    gate, grad_out = gate.to(dev), grad_out.to(dev)
    up = None if up is None else up.to(dev)
    seed = seed.to(dev)
    out = backend.op("gated_act")(gate, up, seed, P, ACTIVATIONS["silu"])
    gg, gu = backend.op("gated_act_backward")(grad_out, gate, up, seed, P, ACTIVATIONS["silu"])
    res = dict(out=out.cpu(), grad_gate=gg.cpu())
    if up is not None:
        res["grad_up"] = gu.cpu()
    return res


@pytest.mark.parametrize("box_name", list(GATED_BOXES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("f", [40, 48])
@pytest.mark.parametrize("backend", ALL)
def test_gated_act_on_a_box_gives_the_whole_tensors_bits(backend, f, dtype, box_name):
    require_op(backend, "gated_act")
    box, packed = GATED_BOXES[box_name]
    box = full(box, 3)
    g = torch.Generator().manual_seed(f)
    gate = (2 * torch.randn(B, S, f, generator=g)).to(dtype)
    up = torch.randn(B, S, f, generator=g).to(dtype)
    grad_out = torch.randn(B, S, f, generator=g).to(dtype)
    if packed:  # the [gate | up] layout: the box cuts rows only, so it keeps whole [gate | up] rows
        both = torch.cat([gate, up], -1)
        whole = run_gated(backend, both, None, grad_out, torch.tensor([SEED]))
        local = run_gated(
            backend, both[box].contiguous(), None, grad_out[box].contiguous(), box_seed(SEED, (B, S, f), box)
        )
        assert_box_bits(whole, local, box, f"{backend.name} gated_act packed f={f} {dtype} box {box_name}")
        return
    whole = run_gated(backend, gate, up, grad_out, torch.tensor([SEED]))
    local = run_gated(
        backend,
        gate[box].contiguous(),
        up[box].contiguous(),
        grad_out[box].contiguous(),
        box_seed(SEED, (B, S, f), box),
    )
    assert_box_bits(whole, local, box, f"{backend.name} gated_act f={f} {dtype} box {box_name}")


# ----------------------------------------------------------------------------------------------- refusals
BAD_MAPS = [
    ([SEED, 3, 40, 0], "base 3, period 40, jump 0"),  # base not a multiple of N
    ([SEED, 0, 0, 40], "base 0, period 0, jump 40"),
    ([SEED, 0, 40, -40], "base 0, period 40, jump -40"),
]


@pytest.mark.parametrize("seed,match", BAD_MAPS)
@pytest.mark.parametrize("backend", backend_params("cpu", "triton-interpret"))
def test_a_map_that_breaks_the_rule_is_refused(backend, seed, match):
    require_op(backend, "layer_norm_dropout_relu")
    x = torch.randn(4, 40)
    with pytest.raises((RuntimeError, ValueError), match=match):
        backend.op("layer_norm_dropout_relu")(x, None, None, torch.tensor(seed), P, EPS)


@pytest.mark.parametrize("backend", backend_params("cpu", "triton-interpret"))
def test_gated_act_map_terms_are_multiples_of_8(backend):
    require_op(backend, "gated_act")
    gate = torch.randn(2, 12)
    with pytest.raises((RuntimeError, ValueError), match="multiple of 8"):
        backend.op("gated_act")(gate, gate, torch.tensor([SEED, 4, 12, 0]), P, ACTIVATIONS["silu"])


@pytest.mark.parametrize("backend", backend_params("cpu", "triton-interpret"))
def test_a_seed_of_other_sizes_or_strided_is_refused(backend):
    require_op(backend, "layer_norm_dropout_relu")
    x = torch.randn(4, 40)
    strided = torch.tensor([SEED, 0, SEED, 40, SEED, 0, SEED, 0])[::2]
    for seed in (torch.tensor([SEED, 0]), strided):
        with pytest.raises((RuntimeError, ValueError), match="seed must have 1 element"):
            backend.op("layer_norm_dropout_relu")(x, None, None, seed, P, EPS)

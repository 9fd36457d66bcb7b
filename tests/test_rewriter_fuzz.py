"""Differential fuzzing of the `torch.compile(backend="gpuopt")` rewriter and of `gpuopt_ops.fuse()`: small programs
from the grammar of their patterns plus perturbations that must not change what a program computes
(tests/rewriter_programs.py), each run compiled (or fused) and in eager mode, in eval and in training, and compared
within the rounding of the dtypes it computes in. A compile crash is a failure; a graph the rewriter leaves alone
is not, except where the pattern is intact (then the rewrite must happen, and the fused ops must run).

Two kinds of fuzzers: a sweep over every (family, perturbation) of the grammar and every fuse() container, with the
other fields drawn by a generator seeded by the case (reproducible, parametrized: a failure names its case), and
hypothesis drawing every field freely (derandomized, no example database; profiles in tests/conftest.py).
`dev` (the default) runs 80 sweep and 10 hypothesis rewriter programs, 15 + 10 fuse() models and 3 compiled
nn.Sequentials; `ci` (CI=true or GPUOPT_HYPOTHESIS_PROFILE=ci) 203 + 100 rewriter programs, 60 + 75 fuse() models
and 25 compiled nn.Sequentials. The Inductor programs (4 in dev, 12 in ci) are marked slow. Below the fuzzers, one
example per known fault of the rewriter and of fuse(), so that a failure names the fault.
"""

import dataclasses
import random

import pytest
import torch
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from rewriter_programs import (
    ACTS,
    CHAINS,
    DTYPES,
    GATED_ACTS,
    GATED_FORMS,
    KEEPS_FUSION,
    NORMS,
    PERTURBATIONS,
    RESIDUALS,
    Rejected,
    ResidualSequential,
    ReversedSequential,
    SeqSpec,
    Spec,
    build,
    check_compiled,
    check_dropout_masks,
    check_fused,
    count_fused_ops,
    make_program,
)
from torch import nn

# F.rms_norm of a 16-bit x with an fp32 weight (a drawn case) warns that it cannot take ATen's fused kernel
# (Inductor's C++ code generator, on a drawn program that mixes the two 16-bit types, warns likewise)
pytestmark = [
    pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight"),
    pytest.mark.filterwarnings("ignore:bf16 and fp16 are mixed in the scheduler node"),
]

# examples per fuzzer: the profile's max_examples (dev 100, ci 500) scaled to what a program costs
_PROFILE_EXAMPLES = settings.default.max_examples
_FUZZ = dict(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


def _examples(fraction: float, least: int) -> int:
    return max(least, int(_PROFILE_EXAMPLES * fraction))


# ---------------------------------------------------------------------------------------------- strategies
@st.composite
def specs(draw, families=("norm_chain", "residual", "bias_act", "gated")):
    family = draw(st.sampled_from(families))
    perturb = draw(st.sampled_from(PERTURBATIONS[family]))
    # a bf16 autocast region changes nothing for bf16 inputs: fp32 and fp16 there
    dtype = draw(st.sampled_from(DTYPES if not perturb.startswith("autocast") else [torch.float32, torch.float16]))
    norm = draw(st.sampled_from(NORMS))
    if norm in ("ln", "ln_module"):
        eps = draw(st.sampled_from([None, 1e-6, 1e-5, 0.0]))
    elif norm == "rms_written":
        eps = draw(st.sampled_from([1e-6, 1e-5]))
    else:
        eps = draw(st.sampled_from([None, None, 1e-6]))
    return Spec(
        family=family,
        dtype=dtype,
        n=draw(st.sampled_from([16, 24, 32, 64])),
        lead=draw(st.sampled_from([(4,), (8,), (2, 3)])),
        scale=draw(st.sampled_from([1.0, 0.05])),
        norm=norm,
        eps=eps,
        weight=draw(st.booleans()),
        bias=draw(st.integers(0, 3)) > 0,  # linear without bias is no pattern: rarely drawn
        param_fp32=dtype != torch.float32 and draw(st.integers(0, 3)) == 0,
        chain=draw(st.sampled_from(CHAINS)),
        residual=draw(st.sampled_from(RESIDUALS)),
        prenorm=draw(st.booleans()),
        linear=draw(st.sampled_from(["linear", "addmm"])),
        act=draw(st.sampled_from(GATED_ACTS if family == "gated" else ACTS)),
        gated=draw(st.sampled_from(GATED_FORMS)) if family == "gated" else "two",
        p=draw(st.sampled_from([0.0, 0.0, 0.1, 0.5])),
        perturb=perturb,
        choice=draw(st.integers(0, 7)),
        seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def seq_specs(draw):
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["ln", "rms", "linear"]))
        tail = draw(st.sampled_from([*CHAINS, ()]))
        if kind == "ln":
            eps = draw(st.sampled_from([1e-5, 1e-6, 0.0]))
            blocks.append(("ln", eps, draw(st.booleans()), draw(st.booleans()), tail))
        elif kind == "rms":
            blocks.append(("rms", draw(st.sampled_from([None, 1e-6])), draw(st.booleans()), tail))
        else:
            act = draw(st.sampled_from(["relu", "gelu", "gelu_tanh", "silu", None]))
            blocks.append(("linear", draw(st.booleans()), act))
    return SeqSpec(
        blocks=tuple(blocks),
        container=draw(st.sampled_from(["plain", "nested", "subclass", "residual", "reversed"])),
        dtype=draw(st.sampled_from(DTYPES)),
        n=draw(st.sampled_from([16, 32, 64])),
        lead=draw(st.sampled_from([(4,), (2, 3)])),
        p=draw(st.sampled_from([0.0, 0.0, 0.3])),
        scale=draw(st.sampled_from([1.0, 0.05])),
        seed=draw(st.integers(0, 2**16)),
    )


# ---------------------------------------------------------------------------------------------- the fuzzers
def run_program(spec: Spec, inductor: bool = False, count_ops: bool = False) -> None:
    """Eval, then training: p = 0 against eager's outputs and gradients, p > 0 against eager's formula with the
    recovered mask where the program has one (else: it must compile and backpropagate)."""
    program = build(spec)
    rec = check_compiled(program, training=False, inductor=inductor)  # Rejected: eager cannot run it
    if program.fuses and count_ops:
        ran = count_fused_ops(program)
        assert ran >= len(rec.rewrites) >= 1, f"{len(rec.rewrites)} rewrites, {ran} gpuopt ops ran\n{program.source}"
    try:
        if spec.p == 0.0:
            check_compiled(program, training=True, inductor=inductor)
        elif program.mask_check is not None:
            check_dropout_masks(program, inductor=inductor)
        else:
            check_compiled(program, training=True, inductor=inductor, values=False)
    except Rejected:  # eager cannot train it (in-place on a leaf, or on a value autograd saved): eval only
        pass


def sweep_spec(family: str, perturb: str, i: int) -> Spec:
    """The i-th program of the sweep over (family, perturbation): the other fields drawn by a generator seeded by
    the three (reproducible without hypothesis), 16-bit dtypes and small inputs (where a wrong eps or a skipped
    rounding shows most) two times in three."""
    rng = random.Random(f"{family}/{perturb}/{i}")
    half = rng.random() < 2 / 3 and not perturb.startswith("autocast")
    dtype = rng.choice([torch.bfloat16, torch.float16]) if half else torch.float32
    if family == "bias_act" and perturb in KEEPS_FUSION and i % 2 == 0:
        dtype = torch.float32  # 16-bit linears keep their bias (no site): every other intact program is fp32
    if perturb == "none" and family not in ("bias_act", "gated") and i < len(NORMS):
        # each norm form intact, with its default eps, on small inputs (where eps shows), dtypes in turn
        dtype = (torch.bfloat16, torch.float16, torch.float32)[i % 3]
        norm = NORMS[i]
        spec = sweep_spec(family, "norm_default", i)
        return dataclasses.replace(
            spec,
            dtype=dtype,
            norm=norm,
            eps=1e-6 if norm == "rms_written" else None,
            scale=0.05,
            param_fp32=False,
            perturb="none",
        )
    # inner values other than the result exist in the written-out forms; views are matched after addmm only (into
    # the bias_act activations)
    written = perturb == "other_user"
    norm = "rms_written" if written else rng.choice(NORMS)
    gated, act = "two", None
    if family == "gated":  # its own generator: the other families' draws stay as they were
        grng = random.Random(f"gated-form/{perturb}/{i}")
        gated = grng.choice(GATED_FORMS[2:] if perturb == "halves_swapped" else GATED_FORMS)
        # another user of each inner value of both written-out activations, in turn
        act = ("gelu_written", "silu_written")[i % 2] if written else grng.choice(GATED_ACTS)
        if perturb == "none" and i < len(GATED_FORMS):  # each form intact, the three GELU-like ones in fp32
            gated, act = GATED_FORMS[i], GATED_ACTS[i]
            dtype = (torch.float32, torch.float32, torch.float32, torch.bfloat16, torch.float16)[i]
    eps = {"ln": [None, 1e-6, 0.0], "ln_module": [None, 1e-6], "rms_written": [1e-6]}.get(norm, [None, None, 1e-6])
    return Spec(
        family=family,
        dtype=dtype,
        n=rng.choice([16, 24, 32, 64]),
        lead=rng.choice([(4,), (8,), (2, 3)]),
        scale=0.05 if rng.random() < 0.5 else 1.0,
        norm=norm,
        eps=rng.choice(eps),
        weight=rng.random() < 0.75,
        bias=family == "bias_act" or rng.random() < 0.8,  # a linear without bias is no pattern (hypothesis draws it)
        param_fp32=half and rng.random() < 0.25,
        chain=rng.choice(CHAINS),
        residual=rng.choice(RESIDUALS),
        prenorm=rng.random() < 0.5,
        linear="addmm" if perturb.startswith("view") else rng.choice(["linear", "addmm"]),
        act=act or ("gelu_written" if written else rng.choice(ACTS[3:] if perturb.startswith("view") else ACTS)),
        gated=gated,
        p=rng.choice([0.0, 0.0, 0.1]),
        perturb=perturb,
        # other_user: the i-th inner value (3: all of them); gated in-place / halves: the i-th target / way
        choice=i if written or (family, perturb) in _SWEEP_LEAST else rng.randrange(8),
        seed=rng.randrange(2**16),
    )


# every (family, perturbation) of the grammar: one program each in dev, four in ci; five for another user of each
# inner value of the written-out forms, and for each norm form (gated: each form) intact with its default eps; for
# the gated family each in-place target (activation, gate, up) and both ways of taking the halves apart otherwise
_SWEEP_PER_CASE = 1 if _PROFILE_EXAMPLES <= 100 else 4
_SWEEP_LEAST = {("gated", "inplace_inside"): 3, ("gated", "halves_swapped"): 2}
_SWEEP = [
    (f, p, i)
    for f, ps in PERTURBATIONS.items()
    for p in ps
    for i in range(
        max(_SWEEP_PER_CASE, 5)
        if p == "other_user" or (p == "none" and f != "bias_act")
        else max(_SWEEP_PER_CASE, _SWEEP_LEAST.get((f, p), 1))
    )
]


# the fast lane runs the first program of each (family, perturbation), the full suite every one
@pytest.mark.parametrize(
    "family,perturb,i",
    [pytest.param(f, p, i, id=f"{f}-{p}-{i}", marks=pytest.mark.slow if i else ()) for f, p, i in _SWEEP],
)
def test_rewriter_sweep_matches_eager(family, perturb, i):
    for attempt in range(5):  # where eager cannot run a draw (Rejected), the next one
        try:
            return run_program(sweep_spec(family, perturb, i + 1000 * attempt), count_ops=perturb == "none")
        except Rejected:
            continue
    pytest.fail(f"eager ran none of five programs of {family} / {perturb}")


@settings(max_examples=_examples(0.2, 10) if _PROFILE_EXAMPLES > 100 else 10, **_FUZZ)
@given(spec=specs())
def test_rewriter_matches_eager(spec):
    try:
        run_program(spec, count_ops=spec.seed % 4 == 0)
    except Rejected as e:
        note(f"rejected: {e}")
        assume(False)


@settings(max_examples=_examples(0.15, 10) if _PROFILE_EXAMPLES > 100 else 10, **_FUZZ)
@given(spec=seq_specs())
def test_fuse_matches_eager(spec):
    try:
        check_fused(spec, training=False)
        if spec.p == 0.0:
            check_fused(spec, training=True)
    except Rejected as e:
        note(f"rejected: {e}")
        assume(False)


def fuse_sweep_spec(container: str, i: int) -> SeqSpec:
    """The i-th model of the fuse() sweep over containers: blocks drawn by a generator seeded by both, small
    inputs, 16-bit dtypes two times in three, p = 0 (training is compared too)."""
    rng = random.Random(f"fuse/{container}/{i}")
    blocks = []
    for _ in range(rng.randint(1, 3)):
        kind, tail = rng.choice(["ln", "rms", "linear"]), rng.choice([*CHAINS, ()])
        if kind == "ln":
            blocks.append(("ln", rng.choice([1e-5, 1e-6, 0.0]), rng.random() < 0.75, rng.random() < 0.75, tail))
        elif kind == "rms":
            blocks.append(("rms", rng.choice([None, None, 1e-6]), rng.random() < 0.75, tail))
        else:
            blocks.append(("linear", rng.random() < 0.8, rng.choice(["relu", "gelu", "gelu_tanh", "silu", None])))
    dtype = (torch.bfloat16, torch.float16, torch.float32)[i % 3]
    if i == 0:  # an RMSNorm with its default eps alone, on small inputs (a later norm would undo a wrong scale)
        blocks = [("rms", None, rng.random() < 0.75, rng.choice(CHAINS))]
    return SeqSpec(
        blocks=tuple(blocks),
        container=container,
        dtype=dtype,
        n=rng.choice([16, 32, 64]),
        lead=rng.choice([(4,), (2, 3)]),
        p=0.0,
        scale=0.05,
        seed=rng.randrange(2**16),
    )


_FUSE_SWEEP = [
    (c, i) for c in ("plain", "nested", "subclass", "residual", "reversed") for i in range(3 * _SWEEP_PER_CASE)
]


@pytest.mark.parametrize("container,i", _FUSE_SWEEP, ids=[f"{c}-{i}" for c, i in _FUSE_SWEEP])
def test_fuse_sweep_matches_eager(container, i):
    spec = fuse_sweep_spec(container, i)
    check_fused(spec, training=False)
    check_fused(spec, training=True)


@settings(max_examples=_examples(0.05, 3) if _PROFILE_EXAMPLES > 100 else 3, **_FUZZ)
@given(spec=seq_specs())
def test_compiled_sequential_matches_eager(spec):
    """The nn.Sequential programs, compiled with the gpuopt backend instead of fused."""
    from rewriter_programs import build_sequential

    model, x = build_sequential(spec)
    program = make_program(
        "return self.model(x)",
        {"model": model},
        {"x": x, "r": None, "t": None},
        tol_dtype=spec.dtype,
        grad_inputs=("x",),
    )
    note(f"{spec}\n{model}")
    try:
        check_compiled(program, training=False)
        if spec.p == 0.0:
            check_compiled(program, training=True)
    except Rejected as e:
        note(f"rejected: {e}")
        assume(False)


@pytest.mark.slow
@settings(max_examples=_examples(0.024, 4), **_FUZZ)
@given(spec=specs())
def test_rewriter_with_inductor_matches_eager(spec):
    try:
        run_program(dataclasses.replace(spec, p=0.0), inductor=True)
    except Rejected as e:
        note(f"rejected: {e}")
        assume(False)


# ---------------------------------------------------------------------------------------------- known faults
def _program(source, dtype=torch.float32, n=32, lead=(4,), scale=1.0, modules=None, grad_inputs=("x", "r")):
    """A program over x, r, t of shape lead + (n,) with parameters w, b (norm), W, lb (linear) in dtype."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, s=1.0, offset=0.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s + offset).to(dtype)

    inputs = {"x": rnd(*lead, n, s=scale), "r": rnd(*lead, n, s=scale), "t": rnd(*lead, n, s=scale)}
    params = {"w": rnd(n, s=0.5, offset=1.0), "b": rnd(n, s=0.5), "W": rnd(n, n, s=n**-0.5), "lb": rnd(n, s=0.5)}
    for name, module in (modules or {}).items():
        params[name] = module.to(dtype)
    return make_program(source, params, inputs, tol_dtype=dtype, grad_inputs=grad_inputs)


def _eval_and_train(program, train=True):
    check_compiled(program, training=False)
    if train:
        check_compiled(program, training=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_default_eps_in_half_types_rewriter(dtype):
    """nn.RMSNorm(N) / F.rms_norm without eps use the fp32 epsilon for fp16 / bf16 inputs, not the 16-bit type's."""
    residual = _program(
        "s = F.dropout(x, 0.0, self.training) + r\nreturn self.norm(s)",
        dtype=dtype,
        scale=0.05,
        modules={"norm": nn.RMSNorm(32)},
    )
    _eval_and_train(residual)
    chain = _program("return F.relu(F.rms_norm(x, (32,), self.w))", dtype=dtype, scale=0.05)
    _eval_and_train(chain)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_default_eps_in_half_types_fuse(dtype):
    spec = SeqSpec(blocks=(("rms", None, True, ("dropout", "relu")),), dtype=dtype, scale=0.05)
    check_fused(spec, training=False)
    check_fused(spec, training=True)


def test_inplace_add_on_the_sum_before_the_norm():
    """s = dropout(h) + r; s.add_(t); layer_norm(s): the norm must see the updated sum (and training compile)."""
    _eval_and_train(
        _program("s = F.dropout(x, 0.0, self.training) + r\ns.add_(t)\nreturn F.layer_norm(s, (32,), self.w, self.b)")
    )


@pytest.mark.parametrize(
    "source",
    [
        # norm → dropout: the input of the norm is changed before the dropout
        "y = F.layer_norm(x, (32,), self.w, self.b)\nx.mul_(-1)\nreturn F.dropout(y, 0.0, self.training) + x",
        # linear → gelu: the linear's input is changed before the activation
        "y = F.linear(x, self.W, self.lb)\nx.mul_(2)\nreturn F.gelu(y) + x",
        # the older rules: layer_norm → relu and linear → relu
        "y = F.layer_norm(x, (32,), self.w, self.b)\nx.mul_(-1)\nreturn F.relu(y) + x",
        "y = F.linear(x, self.W, self.lb)\nx.mul_(2)\nreturn F.relu(y) + x",
    ],
    ids=["norm-dropout", "linear-gelu", "layer_norm-relu", "linear-relu"],
)
def test_inplace_mutation_of_an_input_inside_the_pattern(source):
    check_compiled(_program(source), training=False)  # eager cannot train it either (in-place on a leaf)


@pytest.mark.parametrize(
    "source",
    [
        'with torch.autocast("cpu", dtype=torch.bfloat16):\n    y = F.linear(x, self.W, self.lb)\nreturn F.gelu(y)',
        'y = F.linear(x, self.W, self.lb)\nwith torch.autocast("cpu", dtype=torch.bfloat16):\n    z = F.gelu(y)\n'
        "return z",
        'with torch.autocast("cpu", dtype=torch.bfloat16):\n    y = F.linear(x, self.W, self.lb)\nreturn F.relu(y)',
        'y = F.linear(x, self.W, self.lb)\nwith torch.autocast("cpu", dtype=torch.bfloat16):\n    z = F.relu(y)\n'
        "return z",
    ],
    ids=["linear-in-gelu-out", "linear-out-gelu-in", "linear-in-relu-out", "linear-out-relu-in"],
)
def test_autocast_boundary_inside_the_pattern(source):
    program = _program(source)
    program.tol_dtype = torch.bfloat16
    _eval_and_train(program)


def test_self_add_of_the_dropout_output():
    """layer_norm(d + d): matched as dropout(h) + residual with residual = d, then d erased while still used."""
    _eval_and_train(_program("d = F.dropout(x, 0.0, self.training)\nreturn F.layer_norm(d + d, (32,), self.w, self.b)"))


def test_written_tanh_gelu_with_another_user_of_an_inner_value():
    source = """
y = F.linear(x, self.W, self.lb)
c = 0.044715 * y ** 3
z = 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + c)))
return z, c
"""
    _eval_and_train(_program(source))


@pytest.mark.parametrize("view", ["view(-1)", "view(-1, 16, 2)"])
def test_addmm_view_that_changes_the_last_dim(view):
    _eval_and_train(_program(f"return F.gelu(torch.addmm(self.lb, x, self.W.t()).{view})"))


def test_written_rms_norm_cast_to_another_dtype_before_the_weight():
    """fp32 x, the normalized value rounded to bf16 before an fp32 weight: the rounding is part of the function."""
    source = """
nrm = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
return F.dropout(self.w * nrm, 0.0, self.training)
"""
    _eval_and_train(_program(source))


def test_fuse_layer_norm_eps_zero():
    spec = SeqSpec(blocks=(("ln", 0.0, True, True, ("dropout", "relu")),))
    check_fused(spec, training=False)
    check_fused(spec, training=True)


@pytest.mark.parametrize("container", ["residual", "reversed"])
def test_fuse_sequential_subclass_with_its_own_forward(container):
    spec = SeqSpec(blocks=(("linear", True, "gelu"), ("ln", 1e-5, True, True, ("relu",))), container=container)
    check_fused(spec, training=False)
    check_fused(spec, training=True)


def test_sequential_subclasses_are_not_fused_and_the_plain_one_is():
    import gpuopt_ops

    modules = [nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16), nn.ReLU()]
    for cls in (ResidualSequential, ReversedSequential):
        fused = gpuopt_ops.fuse(cls(*modules))
        assert [type(m) for m in fused] == [type(m) for m in modules], cls.__name__
    fused = gpuopt_ops.fuse(nn.Sequential(*modules))
    assert not any(isinstance(m, (nn.GELU, nn.ReLU)) for m in fused)

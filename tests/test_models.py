"""The compile backend on unmodified library models: HF transformers' BERT, GPT-2, LLaMA, Gemma, the T5 encoder,
OPT, Mistral, Qwen2 and Phi-3, and timm's ViT.

Small random-weight configurations (2 layers, no download). For each model the test counts the gpuopt ops that
actually run (torch.profiler) against the fusable sites the architecture has, per layer, and checks the outputs
(eval) and the gradients (training with dropout off) against eager PyTorch. The graphs run with
options={"inductor": False}: the rewritten graph as it is, so the test measures our rewrite, not Inductor's compile
time; one test also goes through Inductor.

Fusable sites, L = number of layers:
- BERT (post-norm): LayerNorm(dropout(dense(h)) + residual) twice per layer; dense → GELU (erf) once per layer;
  the embeddings' LayerNorm → dropout once (norm_dropout). The embeddings' add of the position embeddings
  broadcasts over the batch (not the same function as a residual add: left to the norm-dropout rule).
- GPT-2 (pre-norm): dropout(embeddings) → ln_1 (the dropout output is the first residual), then per layer
  residual + dropout(attn) → ln_2 and residual + dropout(mlp) → next ln_1 / ln_f, the sums reused as residuals;
  addmm → view → gelu_new (the tanh GELU written out) once per layer.
- LLaMA: residual + h → RMSNorm (written out in Python) twice per layer, the sums reused; the first layer's
  input norm has no add before it, so it is no site. The MLP, `down_proj(act_fn(gate_proj(x)) * up_proj(x))` with
  act_fn SiLU, is one gated_act per layer (its projections have no bias: no bias_act site).
- Mistral, Qwen2: LLaMA's layout (Qwen2's attention projections have biases but no activation): the same sites.
- ViT (timm): dropout(x + pos_embed) → norm1, then per block x + dropout(proj(attn)) → norm2 and
  x + dropout(fc2(mlp)) → next norm1 / final norm; fc1 → GELU once per block.
- Gemma: as LLaMA, with Gemma's RMSNorm: the weight enters as `1 + weight` in fp32 and multiplies before the cast
  back to x's dtype, and it is computed between the sum and the norm (the op goes after it).
- T5 encoder: dropout(embeddings) → RMSNorm once, then hidden + dropout(sublayer) → the next RMSNorm twice per
  layer (the last one the final norm); T5's RMSNorm multiplies the un-cast x by the fp32 rsqrt. Its MLP's linears
  have no bias.
- OPT: embeddings + positions → LayerNorm once, then residual + dropout(h) → a reshape or view that keeps the last
  dimension → LayerNorm twice per layer; fc1 → ReLU once per layer (bias_relu).

Under `torch.autocast(bf16)` the matmuls give bf16 branches that are added to the fp32 residual stream: LLaMA,
Phi-3 and BERT fuse the same sites as in fp32 but the linear → activation ones (a bf16 linear keeps its bias, which
it adds before its one rounding). The norm op takes the branch converted to fp32, as the unfused add does; the gated
MLP's gate and up are both bf16 matmul outputs, and the op computes in fp32 and rounds once.
"""

from __future__ import annotations

import pytest
import torch

import gpuopt_ops  # noqa: F401  (registers the "gpuopt" backend)

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

LAYERS = 2
EXPECTED = {  # forward gpuopt ops per model (each runs its _backward once in a training step)
    "bert": {"dropout_add_norm": 2 * LAYERS, "bias_act": LAYERS, "norm_dropout": 1, "bias_relu": 0, "gated_act": 0},
    "gpt2": {"dropout_add_norm": 2 * LAYERS + 1, "bias_act": LAYERS, "norm_dropout": 0, "bias_relu": 0, "gated_act": 0},
    "llama": {"dropout_add_norm": 2 * LAYERS, "bias_act": 0, "norm_dropout": 0, "bias_relu": 0, "gated_act": LAYERS},
    "vit": {"dropout_add_norm": 2 * LAYERS + 1, "bias_act": LAYERS, "norm_dropout": 0, "bias_relu": 0, "gated_act": 0},
    "gemma": {"dropout_add_norm": 2 * LAYERS, "bias_act": 0, "norm_dropout": 0, "bias_relu": 0, "gated_act": LAYERS},
    "t5": {"dropout_add_norm": 2 * LAYERS + 1, "bias_act": 0, "norm_dropout": 0, "bias_relu": 0, "gated_act": 0},
    "opt": {"dropout_add_norm": 2 * LAYERS + 1, "bias_act": 0, "norm_dropout": 0, "bias_relu": LAYERS, "gated_act": 0},
    "mistral": {"dropout_add_norm": 2 * LAYERS, "bias_act": 0, "norm_dropout": 0, "bias_relu": 0, "gated_act": LAYERS},
    "qwen2": {"dropout_add_norm": 2 * LAYERS, "bias_act": 0, "norm_dropout": 0, "bias_relu": 0, "gated_act": LAYERS},
    "phi3": {"dropout_add_norm": 2 * LAYERS, "bias_act": 0, "norm_dropout": 0, "bias_relu": 0, "gated_act": LAYERS},
}
# the fast lane runs four architectures that between them meet every fused op and both gated layouts; the full
# suite runs each
FAST_LANE_MODELS = ("bert", "llama", "opt", "phi3")
MODELS = [pytest.param(m, marks=() if m in FAST_LANE_MODELS else pytest.mark.slow) for m in EXPECTED]


def _model(name: str, dropout: float):
    """(model, inputs): a small random-weight configuration (benchmarks.model.transformer_model)."""
    from benchmarks.model import transformer_model

    return transformer_model(name, width=64, depth=LAYERS, dropout=dropout, batch=3, seq=12)


def _output(result) -> torch.Tensor:
    return result if isinstance(result, torch.Tensor) else result[0]


def _count(events, names) -> dict:
    counts = dict.fromkeys(names, 0)
    for e in events:
        for n in names:
            if e.name == f"gpuopt::{n}":
                counts[n] += 1
    return counts


def _compiled(model, **options):
    torch._dynamo.reset()
    return torch.compile(model, backend="gpuopt", options={"inductor": False, **options})


@pytest.mark.parametrize("name", MODELS)
def test_every_site_runs_fused_and_eval_outputs_match(name, capsys):
    model, inputs = _model(name, dropout=0.1)
    model.eval()
    with torch.no_grad():
        expected = _output(model(**inputs))
        compiled = _compiled(model, verbose=True)
        compiled(**inputs)  # compile outside the profiled run
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = _output(compiled(**inputs))
    counts = _count(prof.events(), EXPECTED[name])
    assert counts == EXPECTED[name], f"{name}: ran {counts}, the architecture has {EXPECTED[name]}"
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gpuopt backend:")]
    assert len(lines) == sum(EXPECTED[name].values()), lines
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_training_gradients_match_eager_with_dropout_off(name):
    model, inputs = _model(name, dropout=0.0)
    model.train()
    eager = _output(model(**inputs))
    eager.square().mean().backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    compiled = _compiled(model)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = _output(compiled(**inputs))
        got.square().mean().backward()
    torch.testing.assert_close(got, eager, atol=2e-5, rtol=1e-4)
    names = [*EXPECTED[name], *(f"{n}_backward" for n in EXPECTED[name])]
    counts = _count(prof.events(), names)
    want = {**EXPECTED[name], **{f"{n}_backward": c for n, c in EXPECTED[name].items()}}
    assert counts == want, f"{name}: ran {counts}, expected {want}"
    grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(grads[k], expected[k], atol=1e-5, rtol=1e-3, msg=k)


def test_training_with_dropout_fuses_and_draws_masks():
    """GPT-2 in training with dropout on: every site still runs fused (dropout inside the op), the masks come from
    torch's generator (same seed, same result; another seed, another result) and the loss backpropagates."""
    model, inputs = _model("gpt2", dropout=0.25)
    model.train()
    compiled = _compiled(model)
    torch.manual_seed(1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        first = _output(compiled(**inputs))
    torch.manual_seed(1)
    again = _output(compiled(**inputs))
    torch.manual_seed(2)
    other = _output(compiled(**inputs))
    assert _count(prof.events(), EXPECTED["gpt2"]) == EXPECTED["gpt2"]
    torch.testing.assert_close(again, first, atol=0, rtol=0)
    assert not torch.equal(other, first)
    first.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
def test_inductor_compiles_the_rewritten_gpt2():
    """The default path: the rewritten graph compiled by Inductor (forward and backward) matches eager (one layer:
    Inductor's compile time is the cost of this test)."""
    from benchmarks.model import transformer_model

    model, inputs = transformer_model("gpt2", width=32, depth=1, dropout=0.0, batch=2, seq=8)
    model.train()
    eager = _output(model(**inputs))
    eager.square().mean().backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    got = _output(torch.compile(model, backend="gpuopt")(**inputs))
    got.square().mean().backward()
    torch.testing.assert_close(got, eager, atol=2e-5, rtol=1e-4)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[k], atol=1e-5, rtol=1e-3, msg=k)


@pytest.mark.parametrize(
    "name", ["llama", pytest.param("phi3", marks=pytest.mark.slow), pytest.param("bert", marks=pytest.mark.slow)]
)
def test_autocast_fuses_the_sites_of_fp32_with_eager_numerics(name, capsys):
    """Under torch.autocast(bf16), the way most people train: the sites of fp32 run fused, except the linear →
    activation ones (a bf16 linear adds its bias before its one rounding, so it keeps it), and the output (eval) and
    the gradients (training, dropout off) are as close to eager autocast as bf16's rounding allows."""
    want = {**EXPECTED[name], "bias_act": 0, "bias_relu": 0}
    model, inputs = _model(name, dropout=0.1)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = _output(model(**inputs))
        compiled = _compiled(model, verbose=True)
        compiled(**inputs)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = _output(compiled(**inputs))
    assert _count(prof.events(), want) == want
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gpuopt backend:")]
    assert len(lines) == sum(want.values()), lines
    assert got.dtype == expected.dtype
    scale = expected.float().abs().max()
    # the gated MLP computes act(gate) * up in fp32 and rounds once, as Inductor's code does, where eager rounds
    # the activation and the product to bf16: half a bf16 ulp of the output's max there (Inductor's own difference
    # from eager is the same: test_autocast_gated_numerics_are_inductors)
    tol = 2**-8 if EXPECTED[name]["gated_act"] else 2e-3
    assert (got.float() - expected.float()).abs().max() <= tol * scale

    model, inputs = _model(name, dropout=0.0)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _output(model(**inputs)).float().square().mean().backward()
    eager_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    compiled = _compiled(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _output(compiled(**inputs)).float().square().mean().backward()
    for k, g in eager_grads.items():
        p = dict(model.named_parameters())[k]
        assert p.grad is not None, k
        assert (p.grad - g).abs().max() <= 2e-2 * g.abs().max() + 1e-6, k


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "phi3"])
def test_autocast_gated_numerics_are_inductors(name):
    """Under torch.autocast(bf16), eval: the rewritten graph (gated_act and the norm sites) differs from eager by no
    more than Inductor's own compile of the model does, and is that compile's result to fp32 rounding (both compute
    the gated product in fp32 and round it once)."""
    model, inputs = _model(name, dropout=0.0)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        eager = _output(model(**inputs)).float()
        ours = _output(_compiled(model)(**inputs)).float()
        torch._dynamo.reset()
        inductor = _output(torch.compile(model, backend="inductor")(**inputs)).float()
    torch._dynamo.reset()
    d_ours, d_inductor = (ours - eager).abs().max().item(), (inductor - eager).abs().max().item()
    assert d_ours <= 1.1 * d_inductor + 1e-6, (d_ours, d_inductor)
    assert (ours - inductor).abs().max().item() <= 1e-4 * eager.abs().max().item()


def test_bloom_gelu_form_fuses_in_inference():
    """BLOOM writes its tanh GELU as 0.5 * x * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))) inside a custom
    autograd.Function. Without grad Dynamo inlines it, and dense_h_to_4h → GELU fuses (2 per 2 layers, beside the
    4 residual norms); with grad the Function's own backward is the user's, so the site is left as it is."""
    config = transformers.BloomConfig(
        vocab_size=101, hidden_size=64, n_layer=LAYERS, n_head=4, hidden_dropout=0.0, attention_dropout=0.0
    )
    torch.manual_seed(0)
    model = transformers.BloomModel(config).eval()
    inputs = {"input_ids": torch.randint(0, 101, (3, 12))}
    want = {"dropout_add_norm": 2 * LAYERS, "bias_act": LAYERS}
    with torch.no_grad():
        expected = _output(model(**inputs))
        compiled = _compiled(model)
        compiled(**inputs)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = _output(compiled(**inputs))
    assert _count(prof.events(), want) == want
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    compiled = _compiled(model)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = _output(compiled(**inputs))
    assert _count(prof.events(), want) == {"dropout_add_norm": 2 * LAYERS, "bias_act": 0}
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)

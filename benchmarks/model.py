"""Training steps side by side in one run: a stock MLP against the same MLP after `gpuopt_ops.fuse`, and
transformer models (BERT, GPT-2, LLaMA, ViT, Gemma, T5, OPT, Mistral, Qwen2, Phi-3) in eager mode, under
torch.compile's Inductor and under the "gpuopt" backend.

    python -m benchmarks.model                          # the MLP; GPU if there is one, else CPU
    python -m benchmarks.model --device cpu --batch 4096 --width 1024 --depth 4 --p 0.1
    python -m benchmarks.model --quick                  # tiny shapes, seconds (the CI smoke test)
    python -m benchmarks.model --models bert,gpt2,llama,vit [--width 256 --depth 2 --batch 8 --seq 128]
    python -m benchmarks.model --models llama --autocast   # LLaMA's training step under torch.autocast(bf16)

Transformer models (`--models`): small random-weight configurations of HF transformers' BertModel, GPT2Model,
LlamaModel, GemmaModel, the T5 encoder, OPTModel, MistralModel, Qwen2Model, Phi3Model and timm's
vit_tiny_patch16_224 layout (`transformer_model`, shared with tests/test_models.py): width --width, --depth layers,
dropout --p, --batch sequences of --seq tokens (ViT: --batch images whose patch count is about --seq). Each step is
a forward in train mode (under torch.autocast(bf16) with --autocast), a mean-square loss and backward, for eager,
Inductor (`backend="inductor"`) and `backend="gpuopt"` (our rewrites, then Inductor). Printed per model: the three
step times, the ratios, and the share of the gpuopt step spent inside gpuopt ops, in all and per op with its calls
(torch.profiler over one step, `gpuopt_share`: on the CPU each gpuopt::* op's CPU time over the step's, on a GPU
its kernels' device time over the step's) - at small widths on the CPU the step is matmul-bound and that share
bounds what fusion can gain. In LLaMA, Mistral, Qwen2, Gemma and Phi-3 the MLP's gated activation is one
gated_act (and its backward) per layer.

The model is torchvision.ops.MLP's layout written with stock modules: depth × [Linear → LayerNorm → ReLU →
Dropout(p)] and a Linear head. The fused copy is `gpuopt_ops.fuse(stock)`: the same weights (the state dicts are
checked equal), LayerNorm → ReLU → Dropout running as one layer_norm_dropout_relu op. A step is
zero_grad(set_to_none=True), forward in train mode, a mean-square loss and backward (no optimizer update, which
costs the same for both). Both models step on the same input; on the CPU they run in `--rounds` interleaved rounds
whose samples are pooled (timing helpers of benchmarks.run), so the ratio is meaningful on a shared machine and
absolute times are not. Printed: median / p20 / p80 ms per step of each, and the fused / stock time ratio.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from benchmarks.run import _percentile, _sync, metadata, time_cpu, time_gpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def stock_mlp(width: int, depth: int, p: float, classes: int = 10) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU(), nn.Dropout(p)]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def make_step(model: nn.Module, x: torch.Tensor):
    def step():
        model.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()

    return step


TRANSFORMER_MODELS = ("bert", "gpt2", "llama", "vit", "gemma", "t5", "opt", "mistral", "qwen2", "phi3")


# The LLaMA-style decoders: the transformers class prefix, and the configuration arguments beyond the shared ones.
_DECODERS = {
    "llama": ("Llama", lambda **k: {}),
    "gemma": ("Gemma", lambda width, heads, **k: {"head_dim": width // heads}),
    "mistral": ("Mistral", lambda **k: {}),
    "qwen2": ("Qwen2", lambda **k: {}),
    "phi3": (
        "Phi3",
        lambda seq, dropout, **k: {
            "original_max_position_embeddings": max(32, seq),
            "resid_pdrop": dropout,
            "embd_pdrop": dropout,
            "attention_dropout": 0.0,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
}


def transformer_model(name: str, width: int = 64, depth: int = 2, dropout: float = 0.1, batch: int = 3, seq: int = 12):
    """(model, inputs) of a small random-weight configuration: one of TRANSFORMER_MODELS, HF transformers' (the T5
    encoder only) or timm's ViT. Width must be a multiple of 4 (4 heads); no download."""
    import timm
    import transformers

    torch.manual_seed(0)
    if name == "vit":
        return _vit(timm, width, depth, dropout, batch, seq)
    if name in _DECODERS:
        model = _decoder(transformers, name, width, depth, dropout, seq)
    else:
        model = _hf_model(transformers, name, width, depth, dropout, seq)
    model.config._attn_implementation = "sdpa"
    return model, {"input_ids": torch.randint(0, _VOCAB, (batch, seq))}


_VOCAB, _HEADS = 101, 4  # the HF models' vocabulary and attention heads


def _vit(timm, width: int, depth: int, dropout: float, batch: int, seq: int):
    """timm's ViT-Tiny layout with an image of about `seq` 16-pixel patches, and its input batch."""
    side = max(1, round(seq**0.5)) * 16
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        depth=depth,
        img_size=side,
        embed_dim=width,
        num_heads=4,
        drop_rate=dropout,
        proj_drop_rate=dropout,
        attn_drop_rate=0.0,
        drop_path_rate=0.0,
    )
    return model, {"x": torch.randn(batch, 3, side, side)}


def _hf_sizes(width: int, depth: int, seq: int) -> dict:
    """The sizes every HF configuration here names the same way (BERT, OPT and the LLaMA-style decoders)."""
    return dict(
        vocab_size=_VOCAB,
        hidden_size=width,
        num_hidden_layers=depth,
        num_attention_heads=_HEADS,
        max_position_embeddings=max(32, seq),
    )


def _decoder(transformers, name: str, width: int, depth: int, dropout: float, seq: int):
    prefix, extra = _DECODERS[name]
    config = getattr(transformers, f"{prefix}Config")(
        **_hf_sizes(width, depth, seq),
        num_key_value_heads=2,
        intermediate_size=2 * width,
        **extra(width=width, heads=_HEADS, seq=seq, dropout=dropout),
    )
    return getattr(transformers, f"{prefix}Model")(config)


def _hf_model(transformers, name: str, width: int, depth: int, dropout: float, seq: int):
    """BERT, GPT-2, the T5 encoder or OPT in a small random-weight configuration."""
    if name == "bert":
        config = transformers.BertConfig(
            **_hf_sizes(width, depth, seq),
            intermediate_size=4 * width,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=0.0,
        )
        return transformers.BertModel(config, add_pooling_layer=False)
    elif name == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=_VOCAB,
            n_embd=width,
            n_layer=depth,
            n_head=_HEADS,
            n_positions=max(32, seq),
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        return transformers.GPT2Model(config)
    elif name == "t5":
        config = transformers.T5Config(
            vocab_size=_VOCAB,
            d_model=width,
            d_kv=width // _HEADS,
            d_ff=2 * width,
            num_layers=depth,
            num_heads=_HEADS,
            dropout_rate=dropout,
        )
        return transformers.T5EncoderModel(config)
    elif name == "opt":
        config = transformers.OPTConfig(
            **_hf_sizes(width, depth, seq),
            ffn_dim=2 * width,
            word_embed_proj_dim=width,
            dropout=dropout,
            attention_dropout=0.0,
            pad_token_id=1,
        )
        return transformers.OPTModel(config)
    raise ValueError(f"unknown model {name!r}: choose from {', '.join(TRANSFORMER_MODELS)}")


def _time_steps(steps: dict, args) -> dict[str, list[float]]:
    """name -> time samples (ms) of each step function: on a GPU do_bench's [p20, median, p80] of each; on the CPU
    every per-run time of --rounds interleaved rounds of --min-run-time seconds a step."""
    samples: dict[str, list[float]] = {name: [] for name in steps}
    if args.device == "cuda":
        for name, fn in steps.items():
            med, p20, p80 = time_gpu(fn, warmup_ms=25, rep_ms=200)
            samples[name] = [p20[0], med[0], p80[0]]
    else:
        for _ in range(args.rounds):
            for name, fn in steps.items():
                samples[name] += time_cpu(fn, args.min_run_time)
    return samples


def _first(result) -> torch.Tensor:
    return result if isinstance(result, torch.Tensor) else result[0]


def _train_step(model, fn, inputs, autocast_device=None):
    """zero_grad, forward, a mean-square loss, backward; the forward under torch.autocast(bf16) on autocast_device
    when given (how LLaMA-style models train)."""
    import contextlib

    def step():
        model.zero_grad(set_to_none=True)
        ctx = torch.autocast(autocast_device, dtype=torch.bfloat16) if autocast_device else contextlib.nullcontext()
        with ctx:
            out = _first(fn(**inputs))
        out.float().square().mean().backward()

    return step


def gpuopt_share(prof, device: str) -> tuple[float, dict[str, float]]:
    """(share of the step inside gpuopt ops, {op: its share}) from a torch.profiler run of one step. CPU: each gpuopt
    op's CPU time (its own work and what it calls) over the step's self CPU time; CUDA: each gpuopt op's device
    time (its kernels) over the step's device time."""
    events = prof.key_averages()
    if device == "cuda":
        total = sum(e.self_device_time_total for e in events)
        per_op = {e.key[len("gpuopt::") :]: e.device_time_total for e in events if e.key.startswith("gpuopt::")}
    else:
        total = sum(e.self_cpu_time_total for e in events)
        per_op = {e.key[len("gpuopt::") :]: e.cpu_time_total for e in events if e.key.startswith("gpuopt::")}
    if not total:
        return 0.0, {}
    shares = {op: t / total for op, t in sorted(per_op.items())}
    return sum(shares.values()), shares


def run_transformers(args) -> dict[str, dict[str, float]]:
    import gpuopt_ops  # noqa: F401  (registers the "gpuopt" backend)

    meta = metadata(args.device)
    print(
        f"benchmarks.model: training steps, width {args.width}, {args.depth} layers, batch {args.batch} x "
        f"{args.seq}, dropout {args.p}, {'bf16 autocast' if args.autocast else 'fp32'}, {meta['device']}, "
        f"torch {meta['torch']}"
    )
    results: dict[str, dict[str, float]] = {}
    for name in args.models:
        model, inputs = transformer_model(name, args.width, args.depth, args.p, args.batch, args.seq)
        model = model.to(args.device).train()
        inputs = {k: v.to(args.device) for k, v in inputs.items()}
        torch._dynamo.reset()
        runs = {
            "eager": model,
            "inductor": torch.compile(model, backend="inductor"),
            "gpuopt": torch.compile(model, backend="gpuopt"),
        }

        amp = args.device if args.autocast else None
        steps = {k: _train_step(model, fn, inputs, amp) for k, fn in runs.items()}
        for fn in steps.values():  # compile and warm up
            fn()
            fn()
        _sync(args.device)
        samples = _time_steps(steps, args)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if args.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            steps["gpuopt"]()
            _sync(args.device)
        share, per_op = gpuopt_share(prof, args.device)
        counts = {k: 0 for k in per_op}
        for e in prof.events():
            if e.name.startswith("gpuopt::"):
                counts[e.name[len("gpuopt::") :]] = counts.get(e.name[len("gpuopt::") :], 0) + 1
        med = {k: _percentile(v, 0.5) for k, v in samples.items()}
        res = {**med, "gpuopt_share": share, "gpuopt_ops": per_op, "gpuopt_calls": counts}
        results[name] = res
        ops = ", ".join(f"{op} {100 * v:.1f} % ({counts.get(op, 0)} calls)" for op, v in per_op.items())
        print(
            f"  {name:7s}  eager {med['eager']:8.2f} ms  inductor {med['inductor']:8.2f} ms  gpuopt "
            f"{med['gpuopt']:8.2f} ms   eager/gpuopt {med['eager'] / med['gpuopt']:.2f}x   inductor/gpuopt "
            f"{med['inductor'] / med['gpuopt']:.2f}x   gpuopt ops {100 * res['gpuopt_share']:.1f} % of the step"
            + (f": {ops}" if ops else "")
        )
    return results


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--p", type=float, default=0.1, help="dropout probability")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per model (CPU)")
    ap.add_argument("--min-run-time", type=float, default=1.0, help="seconds per model and round (CPU)")
    ap.add_argument("--quick", action="store_true", help="batch 256, width 128, depth 2, one short round")
    ap.add_argument(
        "--models", default=None, help=f"comma list of {','.join(TRANSFORMER_MODELS)}: the transformer steps"
    )
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence (--models)")
    ap.add_argument("--autocast", action="store_true", help="forward under torch.autocast(bf16) (--models)")
    args = ap.parse_args(argv)
    if args.models is not None:
        args.models = [m for m in args.models.split(",") if m]
        for flag, default in (("batch", 4096), ("width", 1024)):  # the MLP's defaults: transformer defaults
            if getattr(args, flag) == default:
                setattr(args, flag, {"batch": 8, "width": 256}[flag])
    if args.quick:
        args.batch, args.width, args.depth, args.rounds, args.min_run_time = 256, 128, 2, 1, 0.2
        if args.models is not None:
            args.batch, args.width, args.seq = 2, 64, 16
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def run(args) -> dict[str, object]:
    import gpuopt_ops

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    torch.manual_seed(0)
    stock = stock_mlp(args.width, args.depth, args.p).to(device=device, dtype=dtype).train()
    fused = gpuopt_ops.fuse(stock)
    kinds = [type(m).__name__ for m in fused]
    assert kinds.count("FusedLayerNormDropoutReLU") == args.depth, kinds
    ss, sf = stock.state_dict(), fused.state_dict()
    assert list(ss) == list(sf) and all(torch.equal(ss[k], sf[k]) for k in ss), "fuse changed the weights"
    x = torch.randn(args.batch, args.width, device=device, dtype=dtype)
    steps = {"stock": make_step(stock, x), "fused": make_step(fused, x)}
    for fn in steps.values():  # warm-up (allocator, thread pools)
        fn()
    _sync(args.device)
    samples = _time_steps(steps, args)
    meta = metadata(args.device)
    result: dict[str, object] = {"device": meta["device"], "torch": meta["torch"], "date": meta["date"]}
    print(
        f"benchmarks.model: MLP {args.depth} × [Linear → LayerNorm → ReLU → Dropout({args.p})] + head, "
        f"batch {args.batch}, width {args.width}, {args.dtype}, {meta['device']}, torch {meta['torch']}"
    )
    for name, vals in samples.items():
        med, p20, p80 = (_percentile(vals, q) for q in (0.5, 0.2, 0.8))
        result[name] = med
        print(
            f"  {name:6s} fwd+bwd step  median {med:9.3f} ms   p20 {p20:9.3f}   p80 {p80:9.3f}   ({len(vals)} samples)"
        )
    result["ratio"] = result["fused"] / result["stock"]
    print(f"  fused / stock step time: {result['ratio']:.3f}  (speed-up {1 / result['ratio']:.2f}×)")
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    run_transformers(args) if args.models is not None else run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A training step of a stock MLP against the same MLP after `gpuopt_ops.fuse`, side by side in one run.

    python -m benchmarks.model                          # GPU if there is one, else CPU
    python -m benchmarks.model --device cpu --batch 4096 --width 1024 --depth 4 --p 0.1
    python -m benchmarks.model --quick                  # tiny shapes, seconds (the CI smoke test)

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
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.width, args.depth, args.rounds, args.min_run_time = 256, 128, 2, 1, 0.2
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
    samples: dict[str, list[float]] = {name: [] for name in steps}
    if args.device == "cuda":
        for name, fn in steps.items():
            med, p20, p80 = time_gpu(fn, warmup_ms=25, rep_ms=200)
            samples[name] = [p20[0], med[0], p80[0]]
    else:
        for _ in range(args.rounds):
            for name, fn in steps.items():
                samples[name] += time_cpu(fn, args.min_run_time)
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
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The model: an MLP of blocks [LinearBiasReLU (or nn.Linear) → FusedLayerNormDropoutReLU] and a linear head.

`backend="eager"` builds the same blocks from the unfused PyTorch modules and `backend="stock"` from nn.Linear /
nn.ReLU / nn.LayerNorm / nn.Dropout (what `--fuse` hands to gpuopt_ops.fuse); all three have the same parameter
names and initialisation order, so checkpoints move between them.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..modules import EagerLayerNormDropoutReLU, EagerLinearReLU, FusedLayerNormDropoutReLU, LinearBiasReLU


class Block(nn.Module):
    def __init__(self, in_features: int, out_features: int, p: float, linear: str, backend: str) -> None:
        super().__init__()
        if backend == "eager":
            self.linear = (
                EagerLinearReLU(in_features, out_features)
                if linear == "bias_relu"
                else nn.Linear(in_features, out_features)
            )
            self.norm = EagerLayerNormDropoutReLU(out_features, p)
        else:
            self.linear = (
                LinearBiasReLU(in_features, out_features, backend=backend)
                if linear == "bias_relu"
                else nn.Linear(in_features, out_features)
            )
            self.norm = FusedLayerNormDropoutReLU(out_features, p, backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


def stock_block(in_features: int, out_features: int, p: float, linear: str) -> nn.Sequential:
    """Block's computation from stock PyTorch modules only, with Block's parameter names (linear.*, norm.*):
    what `--fuse` hands to gpuopt_ops.fuse, as a user's own model would be."""
    layers = [("linear", nn.Linear(in_features, out_features))]
    if linear == "bias_relu":
        layers.append(("act", nn.ReLU()))
    layers += [("norm", nn.LayerNorm(out_features)), ("dropout", nn.Dropout(p)), ("relu", nn.ReLU())]
    return nn.Sequential(OrderedDict(layers))


class MLP(nn.Module):
    def __init__(
        self,
        in_features: int,
        num_classes: int,
        hidden: int = 256,
        depth: int = 2,
        p: float = 0.1,
        linear: str = "bias_relu",
        backend: str = "auto",
        checkpoint_activations: bool = False,
    ) -> None:
        """backend "stock" builds the blocks from nn.Linear / nn.ReLU / nn.LayerNorm / nn.Dropout (stock_block)."""
        super().__init__()
        widths = [in_features] + [hidden] * depth
        make = (
            (lambda i, o: stock_block(i, o, p, linear))
            if backend == "stock"
            else (lambda i, o: Block(i, o, p, linear, backend))
        )
        self.blocks = nn.Sequential(*[make(widths[i], widths[i + 1]) for i in range(depth)])
        self.head = nn.Linear(hidden, num_classes)
        self.checkpoint_activations = checkpoint_activations

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpoint_activations and self.training and torch.is_grad_enabled():
                # non-reentrant; the RNG state is restored on recompute, so the same dropout seed is drawn
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x)


def model_config(args, in_features: int, num_classes: int) -> dict:
    """The run's architecture and schedule as stored in a checkpoint (checkpoint.ARCH_KEYS must match on resume)."""
    return {
        "data": args.data,
        "in_features": in_features,
        "num_classes": num_classes,
        "hidden": args.hidden,
        "depth": args.depth,
        "linear": args.linear,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
    }


def build_model(cfg: dict, args, backend: str, device: torch.device) -> nn.Module:
    """The MLP of `cfg` on `device`; with --fuse built from stock modules, then gpuopt_ops.fuse'd in place."""
    model = MLP(
        cfg["in_features"],
        cfg["num_classes"],
        args.hidden,
        args.depth,
        args.dropout,
        args.linear,
        "stock" if args.fuse else backend,
        args.checkpoint_activations,
    ).to(device)
    if args.fuse:  # the one-line way in for an unmodified model; same parameter names, so checkpoints match
        from ..fuse import fuse

        model = fuse(model, inplace=True, backend=backend)
    return model

"""`fuse(model)` / `unfuse(model)`: our fused modules swapped into an unmodified model, and back.

Inside every nn.Sequential that runs its children as a plain chain (nested too; subclasses such as
torchvision.ops.MLP included when they keep nn.Sequential's own forward and have no forward hooks):

- LayerNorm → Dropout → ReLU, LayerNorm → ReLU → Dropout, LayerNorm → ReLU  ⇒  FusedLayerNormDropoutReLU
  (ReLU then dropout equals dropout then ReLU with the same mask, because the dropout scale is positive);
- LayerNorm → Dropout (no ReLU after it)  ⇒  FusedLayerNormDropout;
- RMSNorm → Dropout → ReLU, RMSNorm → ReLU → Dropout, RMSNorm → ReLU, RMSNorm → Dropout  ⇒  FusedRMSNormDropout
  (with activation "relu" or None); the norm modules of these two rows normalize one dimension;
- Linear (with bias) → ReLU  ⇒  LinearBiasReLU;
- Linear (with bias) → GELU (either approximation) / SiLU  ⇒  LinearBiasAct.

The LayerNorm / Linear slot gets the fused module, which takes over the *same* Parameter objects (so an optimizer
built on the model still holds them), and each consumed Dropout / activation slot gets an nn.Identity: state_dict
keys and values are unchanged. Only exact nn.LayerNorm / nn.RMSNorm / nn.Linear / nn.Dropout / nn.ReLU / nn.GELU /
nn.SiLU instances match (a subclass may override forward), and a module object that occurs more than once in the
model (a ReLU reused elsewhere) is never consumed. A norm whose eps our ops refuse (eps <= 0) is left as it is;
verbose=True says why a candidate was left. Forward hooks registered on the replaced modules are not carried
over.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Optional

from torch import nn

from .backends import resolve_backend
from .modules import (
    FusedLayerNormDropout,
    FusedLayerNormDropoutReLU,
    FusedRMSNormDropout,
    LinearBiasAct,
    LinearBiasReLU,
)

# the attribute on a fused module that records what fuse() replaced, for unfuse()
_RECORD = "_gpuopt_fused_from"


def _occurrences(model: nn.Module) -> Counter:
    return Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))


def _why_not_sequential(seq: nn.Module) -> Optional[str]:
    """None when seq runs its children as a plain chain (nn.Sequential's own forward), else why it is left alone:
    a subclass with its own forward (a residual per module, another order) computes something else."""
    if type(seq).forward is not nn.Sequential.forward:
        return f"{type(seq).__name__} overrides nn.Sequential.forward: its children are not a plain chain"
    if seq._forward_pre_hooks or seq._forward_hooks:
        return "it has forward hooks"
    return None


def _why_not_head(head: nn.Module) -> Optional[str]:
    """None when our ops accept head's arguments, else why not (the stock module is then left in place)."""
    eps = getattr(head, "eps", None)
    if isinstance(head, (nn.LayerNorm, nn.RMSNorm)) and eps is not None and not eps > 0:
        return f"eps={eps}: the fused norms need eps > 0"
    return None


def _match(children: list[tuple[str, nn.Module]], i: int, uses: Counter):
    """The pattern starting at children[i]: (pattern name, consumed (key, module) pairs), or None."""

    def single(j: int, cls) -> Optional[nn.Module]:
        if j < len(children) and type(children[j][1]) is cls and uses[id(children[j][1])] == 1:
            return children[j][1]
        return None

    head = children[i][1]
    if uses[id(head)] != 1:
        return None
    if type(head) in (nn.LayerNorm, nn.RMSNorm):
        norm = type(head).__name__
        one_dim = len(head.normalized_shape) == 1
        if type(head) is nn.RMSNorm and not one_dim:
            return None
        if single(i + 1, nn.Dropout) is not None and single(i + 2, nn.ReLU) is not None:
            return f"{norm} → Dropout → ReLU", children[i + 1 : i + 3]
        if single(i + 1, nn.ReLU) is not None:
            if single(i + 2, nn.Dropout) is not None:
                return f"{norm} → ReLU → Dropout", children[i + 1 : i + 3]
            return f"{norm} → ReLU", children[i + 1 : i + 2]
        if single(i + 1, nn.Dropout) is not None and one_dim:
            return f"{norm} → Dropout", children[i + 1 : i + 2]
    if type(head) is nn.Linear and head.bias is not None:
        if single(i + 1, nn.ReLU) is not None:
            return "Linear → ReLU", children[i + 1 : i + 2]
        if single(i + 1, nn.GELU) is not None and children[i + 1][1].approximate in ("none", "tanh"):
            return "Linear → GELU", children[i + 1 : i + 2]
        if single(i + 1, nn.SiLU) is not None:
            return "Linear → SiLU", children[i + 1 : i + 2]
    return None


def _activation_name(module: nn.Module) -> str:
    if isinstance(module, nn.GELU):
        return "gelu" if module.approximate == "none" else "gelu_tanh"
    return "silu"


def _fused_module(head: nn.Module, consumed, backend: str) -> nn.Module:
    # built on the meta device (no allocation, no draw from torch's generator), then given head's Parameters
    if isinstance(head, (nn.LayerNorm, nn.RMSNorm)):
        dropouts = [m for _, m in consumed if isinstance(m, nn.Dropout)]
        p = dropouts[0].p if dropouts else 0.0
        relu = any(isinstance(m, nn.ReLU) for _, m in consumed)
        affine, factory = head.elementwise_affine, {"backend": backend, "device": "meta"}
        if isinstance(head, nn.RMSNorm):
            act = "relu" if relu else None
            fused = FusedRMSNormDropout(head.normalized_shape, p, head.eps, affine, activation=act, **factory)
        else:
            cls = FusedLayerNormDropoutReLU if relu else FusedLayerNormDropout
            fused = cls(head.normalized_shape, p, head.eps, affine, head.bias is not None, **factory)
        training = dropouts[0].training if dropouts else head.training
    elif isinstance(consumed[0][1], nn.ReLU):
        fused = LinearBiasReLU(head.in_features, head.out_features, backend=backend, device="meta")
        training = head.training
    else:
        act = _activation_name(consumed[0][1])
        fused = LinearBiasAct(head.in_features, head.out_features, act=act, backend=backend, device="meta")
        training = head.training
    fused.weight = head.weight
    if "bias" in fused._parameters:
        fused.bias = head.bias
    fused.train(training)
    return fused


def fuse(model: nn.Module, *, inplace: bool = False, backend: str = "auto", verbose: bool = False) -> nn.Module:
    """The model with LayerNorm / RMSNorm → Dropout/ReLU and Linear → activation runs inside nn.Sequentials swapped
    for our fused modules (see the module docstring). Returns a deep copy, or `model` itself with inplace=True.

    `backend` ("auto" | "cuda" | "cpu" | "triton") goes to every fused module. verbose=True prints one line per
    replacement: qualified name of the replaced slot, the pattern and the fused module.
    """
    resolve_backend(backend)
    if not inplace:
        model = copy.deepcopy(model)
    uses = _occurrences(model)
    for seq_name, seq in list(model.named_modules()):
        if not isinstance(seq, nn.Sequential):
            continue
        children = list(seq._modules.items())
        why = _why_not_sequential(seq)
        if why is not None:
            if verbose and any(_match(children, i, uses) for i in range(len(children))):
                print(f"gpuopt_ops.fuse: {seq_name or '(model)'} left as it is: {why}")
            continue
        i = 0
        while i < len(children):
            found = _match(children, i, uses)
            if found is None:
                i += 1
                continue
            pattern, consumed = found
            key, head = children[i]
            why = _why_not_head(head)
            if why is not None:
                if verbose:
                    qual = f"{seq_name}.{key}" if seq_name else key
                    print(f"gpuopt_ops.fuse: {qual} ({pattern}) left as it is: {why}")
                i += 1
                continue
            fused = _fused_module(head, consumed, backend)
            setattr(
                fused,
                _RECORD,
                {"head": type(head).__name__, "pattern": pattern, "consumed": [(k, m) for k, m in consumed]},
            )
            seq._modules[key] = fused
            for k, _ in consumed:
                seq._modules[k] = nn.Identity()
            if verbose:
                qual = f"{seq_name}.{key}" if seq_name else key
                print(f"gpuopt_ops.fuse: {qual} (+{len(consumed)}): {pattern} -> {fused}")
            i += 1 + len(consumed)
    return model


def _stock_module(fused: nn.Module, record) -> nn.Module:
    affine = fused.weight is not None
    if record["head"] == "LayerNorm":
        stock = nn.LayerNorm(fused.normalized_shape, fused.eps, affine, bias=fused.bias is not None, device="meta")
    elif record["head"] == "RMSNorm":
        stock = nn.RMSNorm(fused.normalized_shape, fused.eps, affine, device="meta")
    else:
        stock = nn.Linear(fused.in_features, fused.out_features, device="meta")
    stock.weight = fused.weight
    if "bias" in stock._parameters:
        stock.bias = fused.bias
    return stock.train(fused.training)


def unfuse(model: nn.Module, *, inplace: bool = False) -> nn.Module:
    """Reverses fuse(): every fused module that fuse() put into an nn.Sequential becomes the stock nn.LayerNorm /
    nn.Linear again (same Parameters), and the Identity slots get their Dropout / ReLU back. Fused modules that
    fuse() did not create (a model written with our modules) are left as they are. Deep copy unless inplace=True.
    (nn.LayerNorm / nn.RMSNorm / nn.Linear by what fuse() replaced.)
    """
    if not inplace:
        model = copy.deepcopy(model)
    for _, seq in list(model.named_modules()):
        if not isinstance(seq, nn.Sequential):
            continue
        for key, child in list(seq._modules.items()):
            record = getattr(child, _RECORD, None)
            if record is None:
                continue
            if not all(isinstance(seq._modules.get(k), nn.Identity) for k, _ in record["consumed"]):
                continue  # the slots were changed after fuse(): leave this one fused rather than guess
            seq._modules[key] = _stock_module(child, record)
            for k, m in record["consumed"]:
                seq._modules[k] = m.train(child.training)
    return model

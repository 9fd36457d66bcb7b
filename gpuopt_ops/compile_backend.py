"""The Dynamo backend "gpuopt": `torch.compile(model_or_fn, backend="gpuopt")`.

Registered on `import gpuopt_ops`. In the FX graph Dynamo captures it rewrites

- layer_norm → dropout → relu, layer_norm → relu → dropout and layer_norm → relu into one call of
  `gpuopt_ops.layer_norm_dropout_relu` (dropout's p and `training` flag kept: training=False fuses with p = 0);
- linear (with bias) → relu into a bias-free linear and `gpuopt_ops.bias_relu`,

then compiles the graph with Inductor (forward and backward; AOTAutograd traces through the public functions, so
each training call draws a fresh dropout seed from torch's generator on x's device, as in eager mode).

relu is any of F.relu / torch.relu / Tensor.relu (and their in-place forms). A match requires every intermediate
value to have no other user, constant p / training / eps / normalized_shape, and dtypes and devices our ops take;
anything else is left to Inductor as it is. Print the rewrites with
`torch.compile(m, backend="gpuopt", options={"verbose": True})`; any other option goes to Inductor as a config
patch.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx
import torch.nn.functional as F

from .ops import bias_relu, layer_norm_dropout_relu

_LAYER_NORM = {F.layer_norm, torch.layer_norm}
_DROPOUT = {F.dropout, torch.dropout}
_RELU_FUNCTIONS = {F.relu, torch.relu, torch.relu_, F.relu_}
_RELU_METHODS = {"relu", "relu_"}
_LINEAR = {F.linear, torch._C._nn.linear}
_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64}


def _ldr(x, normalized_shape, weight, bias, p, training, eps):
    return layer_norm_dropout_relu(x, normalized_shape, weight, bias, p=p, training=training, eps=eps)


def _linear_bias_relu(x, weight, bias):
    return bias_relu(F.linear(x, weight), bias)


# ---------------------------------------------------------------------------------------------- matching
def _is_relu(node: torch.fx.Node) -> bool:
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS:
        return (
            len(node.args) == 1
            and set(node.kwargs) <= {"inplace"}
            and isinstance(node.kwargs.get("inplace", False), bool)
        )
    return node.op == "call_method" and node.target in _RELU_METHODS and len(node.args) == 1 and not node.kwargs


def _arg(node: torch.fx.Node, i: int, name: str, default: Any) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _dropout_params(node: torch.fx.Node):
    """(p, training) of a dropout node with constant arguments, else None."""
    if node.op != "call_function" or node.target not in _DROPOUT:
        return None
    if node.target is torch.dropout:  # torch.dropout(input, p, train)
        p, training = _arg(node, 1, "p", None), _arg(node, 2, "train", None)
    else:
        p, training = _arg(node, 1, "p", 0.5), _arg(node, 2, "training", True)
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not isinstance(training, bool):
        return None
    if not 0.0 <= float(p) <= 1.0:
        return None
    return float(p), training


def _value(node: Any) -> Optional[torch.Tensor]:
    if not isinstance(node, torch.fx.Node):
        return None
    v = node.meta.get("example_value", node.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def _tensor_ok(x: torch.fx.Node, params) -> bool:
    """x and the parameters are tensors our ops take: dtype, device, params of x's dtype or fp32."""
    xv = _value(x)
    if xv is None or xv.dtype not in _DTYPES or xv.device.type not in ("cpu", "cuda"):
        return False
    for prm in params:
        if prm is None:
            continue
        pv = _value(prm)
        if pv is None or pv.device != xv.device or pv.dtype not in (xv.dtype, torch.float32):
            return False
    return True


def _only_user(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].args and users[0].args[0] is node else None


def _layer_norm_args(node: torch.fx.Node):
    if node.op != "call_function" or node.target not in _LAYER_NORM:
        return None
    x = node.args[0]
    shape = _arg(node, 1, "normalized_shape", None)
    weight, bias = _arg(node, 2, "weight", None), _arg(node, 3, "bias", None)
    eps = _arg(node, 4, "eps", 1e-5)
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not shape or not all(type(s) is int for s in shape):
        return None
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
        return None
    if not _tensor_ok(x, [weight, bias]):
        return None
    xv = _value(x)
    if xv.dim() < len(shape) or tuple(xv.shape[xv.dim() - len(shape) :]) != tuple(shape):
        return None  # normalized_shape must be x's trailing dims (it is for any valid call; keeps SymInts out)
    return x, tuple(shape), weight, bias, float(eps)


def _rewrite(gm: torch.fx.GraphModule, log: list[str]) -> int:
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.graph is not graph or node.op not in ("call_function", "call_method"):
            continue
        ln = _layer_norm_args(node)
        if ln is not None:
            first = _only_user(node)
            if first is None:
                continue
            chain, p, training = None, 0.0, False
            if _dropout_params(first) is not None:
                second = _only_user(first)
                if second is not None and _is_relu(second):
                    (p, training), chain = _dropout_params(first), [first, second]
                    pattern = "layer_norm → dropout → relu"
            elif _is_relu(first):
                second = _only_user(first)
                if second is not None and _dropout_params(second) is not None:
                    (p, training), chain = _dropout_params(second), [first, second]
                    pattern = "layer_norm → relu → dropout"
                else:
                    chain, pattern = [first], "layer_norm → relu"
            if chain is None:
                continue
            x, shape, weight, bias, eps = ln
            last = chain[-1]
            with graph.inserting_before(last):
                new = graph.call_function(_ldr, (x, shape, weight, bias, p, training, eps))
            new.meta.update(last.meta)
            last.replace_all_uses_with(new)
            for dead in reversed([node, *chain]):
                graph.erase_node(dead)
            log.append(f"{pattern} ({node.name}, p={p}, training={training}) -> gpuopt::layer_norm_dropout_relu")
            count += 1
        elif node.op == "call_function" and node.target in _LINEAR:
            x = node.args[0]
            weight, bias = _arg(node, 1, "weight", None), _arg(node, 2, "bias", None)
            if bias is None or not isinstance(weight, torch.fx.Node) or not _tensor_ok(x, [weight, bias]):
                continue
            bv = _value(bias)
            if bv.dim() != 1:
                continue
            relu = _only_user(node)
            if relu is None or not _is_relu(relu):
                continue
            with graph.inserting_before(relu):
                new = graph.call_function(_linear_bias_relu, (x, weight, bias))
            new.meta.update(relu.meta)
            relu.replace_all_uses_with(new)
            graph.erase_node(relu)
            graph.erase_node(node)
            log.append(f"linear → relu ({node.name}) -> linear + gpuopt::bias_relu")
            count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count


def rewrite_graph(gm: torch.fx.GraphModule, verbose: bool = False) -> list[str]:
    """Rewrites the patterns in gm in place; returns one line per rewrite (printed when verbose)."""
    log: list[str] = []
    _rewrite(gm, log)
    if verbose:
        for line in log:
            print(f"gpuopt backend: {line}")
    return log


def gpuopt_backend(
    gm: torch.fx.GraphModule, example_inputs, options: Optional[dict[str, Any]] = None, mode: Optional[str] = None
):
    """Dynamo backend: rewrite the fusable patterns (see the module docstring), then compile with Inductor."""
    from torch._inductor.compile_fx import compile_fx

    options = dict(options or {})
    verbose = bool(options.pop("verbose", False))
    rewrite_graph(gm, verbose)
    if mode not in (None, "default"):
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode), **options}
    return compile_fx(gm, example_inputs, config_patches=options or None)


def register() -> None:
    from torch._dynamo import register_backend

    try:
        register_backend(gpuopt_backend, name="gpuopt")
    except AssertionError:  # already registered (a reload of this module): "duplicate name: gpuopt"
        pass

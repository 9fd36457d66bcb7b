"""The norm rules of the "gpuopt" Dynamo backend (compile_backend.py): layer_norm → dropout / relu chains into
layer_norm_dropout_relu, a norm (LayerNorm, RMSNorm, RMSNorm written out) after a residual add or a dropout into
dropout_add_norm, and a norm followed by dropout / relu into norm_dropout."""

from __future__ import annotations

import operator
from typing import Any, Optional

import torch
import torch.fx

from .compile_graph import (
    ADD,
    DROPOUT,
    DTYPES,
    LAYER_NORM,
    MUL,
    POW,
    RMS_NORM,
    RSQRT,
    arg_at,
    calls,
    const_value,
    dropout_params,
    is_relu,
    only_user,
    operands_of,
    param_ok,
    provably_same,
    replace,
    same_like,
    tensor_ok,
    users_of,
    value_of,
)
from .modules import default_rms_eps
from .ops import dropout_add_norm, layer_norm_dropout_relu, norm_dropout


def _ldr(x, normalized_shape, weight, bias, p, training, eps):
    return layer_norm_dropout_relu(x, normalized_shape, weight, bias, p=p, training=training, eps=eps)


def _dropout_add_norm(x, residual, weight, bias, rms, p, training, eps, prenorm):
    norm = "rms" if rms else "layer"
    return dropout_add_norm(x, residual, weight, bias, norm=norm, p=p, training=training, eps=eps, prenorm=prenorm)


def _norm_dropout(x, weight, bias, rms, activation, p, training, eps):
    norm = "rms" if rms else "layer"
    return norm_dropout(x, weight, bias, norm=norm, activation=activation, p=p, training=training, eps=eps)


# ---------------------------------------------------------------------------------------------- LN chains
def _layer_norm_args(node: torch.fx.Node):
    if node.op != "call_function" or node.target not in LAYER_NORM:
        return None
    x = node.args[0]
    shape = arg_at(node, 1, "normalized_shape", None)
    weight, bias = arg_at(node, 2, "weight", None), arg_at(node, 3, "bias", None)
    eps = arg_at(node, 4, "eps", 1e-5)
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not shape or not all(type(s) is int for s in shape):
        return None
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
        return None
    if not tensor_ok(x, [weight, bias]):
        return None
    xv = value_of(x)
    if xv.dim() < len(shape) or tuple(xv.shape[xv.dim() - len(shape) :]) != tuple(shape):
        return None  # normalized_shape must be x's trailing dims (it is for any valid call; keeps SymInts out)
    return x, tuple(shape), weight, bias, float(eps)


def rewrite_ldr_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    """layer_norm → dropout → relu, layer_norm → relu → dropout and layer_norm → relu: one layer_norm_dropout_relu
    call."""
    ln = _layer_norm_args(node)
    if ln is None:
        return False
    first = only_user(node)
    if first is None:
        return False
    chain, p, training = None, 0.0, False
    if dropout_params(first) is not None:
        second = only_user(first)
        if second is not None and is_relu(second):
            (p, training), chain = dropout_params(first), [first, second]
            pattern = "layer_norm → dropout → relu"
    elif is_relu(first):
        second = only_user(first)
        if second is not None and dropout_params(second) is not None:
            (p, training), chain = dropout_params(second), [first, second]
            pattern = "layer_norm → relu → dropout"
        else:
            chain, pattern = [first], "layer_norm → relu"
    if chain is None:
        return False
    x, shape, weight, bias, eps = ln
    last = chain[-1]
    if not provably_same(graph, [node, *chain], (x, weight, bias), last, [last]):
        return False
    replace(graph, last, [node, *chain], _ldr, (x, shape, weight, bias, p, training, eps))
    log.append(f"{pattern} ({node.name}, p={p}, training={training}) -> gpuopt::layer_norm_dropout_relu")
    return True


# ---------------------------------------------------------------------------------------------- norm sites
class _Norm:
    """A matched norm: its input node, parameters, the nodes it consists of and the node giving its result."""

    def __init__(self, source, weight, bias, eps, rms, nodes, result, kind):
        self.source, self.weight, self.bias, self.eps, self.rms = source, weight, bias, eps, rms
        self.nodes, self.result, self.kind = nodes, result, kind


def _match_layer_norm(node: torch.fx.Node) -> Optional[_Norm]:
    if not calls(node, LAYER_NORM):
        return None
    shape = arg_at(node, 1, "normalized_shape", None)
    shape = (shape,) if isinstance(shape, int) else shape
    weight, bias, eps = arg_at(node, 2, "weight", None), arg_at(node, 3, "bias", None), arg_at(node, 4, "eps", 1e-5)
    xv = value_of(node.args[0])
    if xv is None or not isinstance(shape, (tuple, list)) or len(shape) != 1 or type(shape[0]) is not int:
        return None
    if const_value(eps) is None or eps <= 0 or xv.dim() < 1 or xv.shape[-1] != shape[0]:
        return None
    return _Norm(node.args[0], weight, bias, float(eps), False, [node], node, "layer_norm")


def _match_rms_norm(node: torch.fx.Node) -> Optional[_Norm]:
    if not calls(node, RMS_NORM):
        return None
    shape = arg_at(node, 1, "normalized_shape", None)
    shape = (shape,) if isinstance(shape, int) else shape
    weight, eps = arg_at(node, 2, "weight", None), arg_at(node, 3, "eps", None)
    xv = value_of(node.args[0])
    if xv is None or not isinstance(shape, (tuple, list)) or len(shape) != 1 or type(shape[0]) is not int:
        return None
    if xv.dim() < 1 or xv.shape[-1] != shape[0] or xv.dtype not in DTYPES:
        return None
    eps = default_rms_eps(xv.dtype) if eps is None else eps  # F.rms_norm's default, as ATen resolves it
    if const_value(eps) is None or eps <= 0:
        return None
    return _Norm(node.args[0], weight, None, float(eps), True, [node], node, "rms_norm")


def _is_to_float32(node: Any) -> bool:
    """x.to(torch.float32) / x.float() / x.to(dtype=torch.float32) with nothing else."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_method":
        return False
    if node.target == "float":
        return len(node.args) == 1 and not node.kwargs
    if node.target != "to":
        return False
    dtypes = [a for a in node.args[1:]] + ([node.kwargs["dtype"]] if "dtype" in node.kwargs else [])
    return dtypes == [torch.float32] and set(node.kwargs) <= {"dtype"}


def _match_written_rms_norm(rsqrt: torch.fx.Node) -> Optional[_Norm]:
    """RMSNorm written out, rooted at its rsqrt: n = m * rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) with h = x or
    x.to(float32) and m = h or x (T5 multiplies x itself: the product promotes it to fp32 exactly), then either
    w * n.to(dtype) (LLaMA, T5) or (n * w).to(dtype) (Gemma, whose w is `1 + weight.float()`, any 1-D node of
    x's dtype or fp32), each step optional. Casts only to x's dtype: the op's output dtype."""
    if not calls(rsqrt, RSQRT, ("rsqrt",)) or len(rsqrt.args) != 1 or rsqrt.kwargs:
        return None
    add_eps = rsqrt.args[0]
    ops = operands_of(add_eps, ADD, "add")
    if ops is None:
        return None
    var, eps = (ops[0], const_value(ops[1])) if const_value(ops[1]) is not None else (ops[1], const_value(ops[0]))
    if eps is None or eps <= 0 or not calls(var, {torch.mean}, ("mean",)):
        return None
    dim = arg_at(var, 1, "dim", None)
    if arg_at(var, 2, "keepdim", False) is not True or dim not in (-1, (-1,), [-1]) or len(var.args) > 3:
        return None
    sq = var.args[0]
    if calls(sq, POW, ("pow",)) and len(sq.args) == 2 and const_value(sq.args[1]) == 2.0:
        h = sq.args[0]
    elif operands_of(sq, MUL, "mul") is not None and sq.args[0] is sq.args[1]:
        h = sq.args[0]
    else:
        return None
    if not isinstance(h, torch.fx.Node):
        return None
    x = h.args[0] if _is_to_float32(h) else h
    normed = next(iter(rsqrt.users)) if len(rsqrt.users) == 1 else None
    ops = operands_of(normed, MUL, "mul") if normed is not None else None
    if ops is None or rsqrt not in ops:
        return None
    m = ops[1] if ops[0] is rsqrt else ops[0]
    if m is not h and m is not x:
        return None
    xv = value_of(x)
    if xv is None or xv.dtype not in DTYPES or (x is not h and xv.dtype == torch.float64):
        return None
    nodes = ([h] if x is not h else []) + [sq, var, add_eps, rsqrt, normed]
    result = normed

    def sole_user(n):
        return next(iter(n.users)) if len(n.users) == 1 else None

    def cast(n):  # n's only user when it is a cast to x's dtype (the rounding step the op does once, at its end)
        c = sole_user(n)
        if c is None or c.op != "call_method" or c.target not in ("to", "type_as") or len(c.args) != 2 or c.kwargs:
            return None
        cv = value_of(c)
        return c if cv is not None and cv.dtype == xv.dtype else None

    def weighted(n):  # (mul, weight) when n's only user multiplies it by a 1-D parameter of x's last dimension
        mul = sole_user(n)
        ops = operands_of(mul, MUL, "mul") if mul is not None else None
        if ops is None:
            return None
        other = ops[1] if ops[0] is n else ops[0]
        if isinstance(other, torch.fx.Node) and other is not n and param_ok(other, xv):
            return mul, other
        return None

    weight = None
    first_cast = cast(result)
    if first_cast is not None:
        nodes.append(first_cast)
        result = first_cast
    found = weighted(result)
    if found is not None:
        result, weight = found
        nodes.append(result)
        if first_cast is None and cast(result) is not None:
            result = cast(result)
            nodes.append(result)
    return _Norm(x, weight, None, float(eps), True, nodes, result, "written-out RMSNorm")


def _match_norm(node: torch.fx.Node) -> Optional[_Norm]:
    return _match_layer_norm(node) or _match_rms_norm(node) or _match_written_rms_norm(node)


def _dropout_only_into(node: Any, user: torch.fx.Node):
    """(input, p, training) when node is a constant-parameter dropout whose only user is `user`."""
    if not isinstance(node, torch.fx.Node) or users_of(node) != {user}:
        return None
    params = dropout_params(node)
    if params is None or node.args[0] is None or node.kwargs.get("inplace", False) or arg_at(node, 3, "inplace", False):
        return None
    return (node.args[0], *params)


def _row_views(node: Any) -> tuple[Any, list]:
    """(base, views): node = views[0](views[1](...(base))), each a view / reshape with constant sizes that keeps the
    last dimension, so it maps rows to rows and a norm over the last dimension commutes with it (OPT's and Swin's
    reshape between the residual add and the norm). views is [] when node is no such view."""
    views = []
    while (
        isinstance(node, torch.fx.Node)
        and node.op == "call_method"
        and node.target in ("view", "reshape")
        and not node.kwargs
        and len(node.args) >= 2
        and isinstance(node.args[0], torch.fx.Node)
    ):
        v, src = value_of(node), value_of(node.args[0])
        if v is None or src is None or v.dim() < 1 or src.dim() < 1 or v.shape[-1] != src.shape[-1]:
            break
        if not all(type(d) is int for d in v.shape):
            break  # the op's output is reshaped to these sizes: constants only
        views.append(node)
        node = node.args[0]
    return node, views


def _same_rows(node: Any, ref: torch.Tensor) -> bool:
    """node's value has ref's dtype, device, element count and last dimension (the same rows, maybe reshaped)."""
    v = value_of(node)
    return (
        v is not None
        and v.dtype == ref.dtype
        and v.device == ref.device
        and v.numel() == ref.numel()
        and v.dim() >= 1
        and v.shape[-1] == ref.shape[-1]
    )


def _sum_site(s: torch.fx.Node):
    """What a norm's input is made of: (branch, residual, p, training, the nodes it consumes, the pattern's name) for
    dropout(h) + residual (either operand order), h + residual and dropout(h) (residual None); else None."""
    ops = operands_of(s, ADD, "add")
    if ops is not None and all(isinstance(o, torch.fx.Node) for o in ops):
        for a, b in (ops, ops[::-1]):
            d = _dropout_only_into(a, s)
            if d is not None:
                head, p, training = d
                return head, b, p, training, [a, s], "dropout → add → "
        head, residual = ops
        hv, rv = value_of(head), value_of(residual)
        if hv is not None and rv is not None and hv.dtype == torch.float32 and rv.dtype != torch.float32:
            head, residual = residual, head  # the 16-bit operand is the branch (IEEE addition commutes)
        return head, residual, 0.0, False, [s], "add → "
    if calls(s, DROPOUT):
        params = dropout_params(s)
        if params is None or s.kwargs.get("inplace", False) or arg_at(s, 3, "inplace", False):
            return None
        return s.args[0], None, *params, [s], "dropout → "
    return None


def _rows_ok(xv: Optional[torch.Tensor]) -> bool:
    """A norm input our ops take: a dtype and a device they have kernels for, at least one dimension."""
    return xv is not None and xv.dtype in DTYPES and xv.device.type in ("cpu", "cuda") and xv.dim() >= 1


def _norm_params_ok(norm: _Norm, xv: torch.Tensor) -> bool:
    """The norm's weight and bias are 1-D over x's last dimension, of x's dtype or fp32, and of one dtype."""
    if not (param_ok(norm.weight, xv) and param_ok(norm.bias, xv)):
        return False
    return norm.weight is None or norm.bias is None or value_of(norm.weight).dtype == value_of(norm.bias).dtype


def _promotion(head: torch.fx.Node, residual: Any, s: torch.fx.Node, xv: torch.Tensor) -> Optional[str]:
    """Which operand the op takes converted to fp32 ("branch", "residual"), or None. A 16-bit operand added to an
    fp32 one (autocast's matmuls produce the branch, the residual stream stays fp32) sums in fp32: the op then takes
    that operand converted to fp32 (exact), and everything after is fp32 as in the unfused graph."""
    sv, rv = value_of(s), value_of(residual)
    if sv is None or rv is None or sv.dtype != torch.float32 or not xv.shape == rv.shape == sv.shape:
        return None
    if xv.dtype in (torch.float16, torch.bfloat16) and same_like(residual, sv):
        return "branch"
    if rv.dtype in (torch.float16, torch.bfloat16) and same_like(head, sv):
        return "residual"
    return None


def _anchor(order: dict, s: torch.fx.Node, inputs: list, readers: list) -> Optional[torch.fx.Node]:
    """Where the op goes: where the sum was, or right after its last input when that is computed later (Gemma's
    `1 + weight` between the sum and the norm); every other reader of the sum must then come after it (else None)."""
    if not any(order[n] >= order[s] for n in inputs):
        return s
    anchor = max(inputs, key=order.__getitem__).next
    return None if any(order[u] < order[anchor] for u in readers) else anchor


def _insert_dropout_add_norm(graph, s, norm, head, residual, promote, views, dropout, prenorm):
    """The dropout_add_norm call of a matched site, at the graph's insertion point: the operand `promote` names
    converted to fp32 first, the output reshaped back through the views. Returns (out, sum), sum None unless
    prenorm."""
    x, r = head, residual
    if promote == "branch":
        x = graph.call_method("to", (head, torch.float32))
        x.meta.update(s.meta)
    elif promote == "residual":
        r = graph.call_method("to", (residual, torch.float32))
        r.meta.update(s.meta)
    p, training = dropout
    args = (x, r, norm.weight, norm.bias, norm.rms, p, training, norm.eps, prenorm)
    new = graph.call_function(_dropout_add_norm, args)
    total = None
    if prenorm:
        out = graph.call_function(operator.getitem, (new, 0))
        total = graph.call_function(operator.getitem, (new, 1))
        total.meta.update(s.meta)
    else:
        out = new
    if views:
        out.meta.update(s.meta)
        out = graph.call_method("reshape", (out, tuple(value_of(norm.result).shape)))
    return out, total


def rewrite_norm_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    """A norm of dropout(h) + residual, h + residual or dropout(h), through row views: one dropout_add_norm call
    (prenorm, the sum an output too, when something else reads the sum)."""
    norm = _match_norm(node)
    if norm is None:
        return False
    s, views = _row_views(norm.source)
    site = _sum_site(s) if isinstance(s, torch.fx.Node) else None
    if site is None or not isinstance(site[0], torch.fx.Node) or not _rows_ok(value_of(site[0])):
        return False
    head, residual, p, training, consumed, pattern = site
    xv = value_of(head)
    promote = _promotion(head, residual, s, xv)
    if promote:
        xv = value_of(s)
    if residual is not None and promote != "residual" and not same_like(residual, xv):
        return False
    if not (same_like(s, xv) and _same_rows(norm.result, xv)):
        return False  # broadcasting, type promotion or a result in another dtype: not the same function
    if views and tuple(value_of(norm.result).shape) != tuple(value_of(views[0]).shape):
        return False
    if not _norm_params_ok(norm, xv):
        return False
    # the views between the sum and the norm go with the norm, unless something else reads them (they then read
    # the op's sum output instead)
    dead = set(consumed) | set(norm.nodes)
    for v in views:
        if not set(v.users) <= dead:
            break
        dead.add(v)
    others = [u for u in s.users if u not in dead]
    prenorm = bool(others)
    order = {n: i for i, n in enumerate(graph.nodes)}
    inputs = [n for n in (head, residual, norm.weight, norm.bias) if isinstance(n, torch.fx.Node)]
    anchor = _anchor(order, s, inputs, others)
    results = [norm.result, s] if prenorm else [norm.result]
    if anchor is None or not provably_same(graph, dead, inputs, anchor, results):
        return False
    with graph.inserting_before(anchor):
        out, total = _insert_dropout_add_norm(graph, s, norm, head, residual, promote, views, (p, training), prenorm)
    out.meta.update(norm.result.meta)
    norm.result.replace_all_uses_with(out)
    for u in others:
        u.replace_input_with(s, total)
    for n in sorted(dead, key=order.__getitem__, reverse=True):
        graph.erase_node(n)
    kind = "rms_norm" if norm.rms else "layer_norm"
    pattern = (f"16-bit {promote} → fp32 " if promote else "") + pattern
    log.append(
        f"{pattern}{'view → ' if views else ''}{norm.kind} ({norm.result.name}, p={p}, training={training}"
        f"{', prenorm' if prenorm else ''}) -> gpuopt::dropout_add_norm ({kind})"
    )
    return True


def rewrite_norm_dropout_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    """norm → dropout (→ relu), and for RMSNorm also norm → relu (→ dropout): one norm_dropout call."""
    norm = _match_norm(node)
    if norm is None or not isinstance(norm.source, torch.fx.Node):
        return False
    first = only_user(norm.result)
    if first is None:
        return False

    def dropout(n):  # (p, training) of a constant-parameter, out-of-place dropout node, else None
        params = dropout_params(n) if n is not None else None
        if params is None or n.kwargs.get("inplace", False) or arg_at(n, 3, "inplace", False):
            return None
        return params

    second = only_user(first)
    p, training = 0.0, False
    first_drop = dropout(first)
    if first_drop is not None:
        (p, training), relu = first_drop, second is not None and is_relu(second)
        chain, steps = ([first, second], "dropout → relu") if relu else ([first], "dropout")
    elif norm.rms and is_relu(first):
        relu = True
        chain, steps = [first], "relu"
        second_drop = dropout(second)
        if second_drop is not None:
            (p, training), chain, steps = second_drop, [first, second], "relu → dropout"
    else:
        return False
    xv = value_of(norm.source)
    if not _rows_ok(xv):
        return False
    if not all(same_like(n, xv) for n in (norm.result, *chain)):
        return False  # a result in another dtype or shape: not the same function
    if not _norm_params_ok(norm, xv):
        return False
    last = chain[-1]
    act = "relu" if relu else None
    if not provably_same(graph, {*norm.nodes, *chain}, (norm.source, norm.weight, norm.bias), last, [last]):
        return False
    args = (norm.source, norm.weight, norm.bias, norm.rms, act, p, training, norm.eps)
    replace(graph, last, {*norm.nodes, *chain}, _norm_dropout, args)
    kind = "rms_norm" if norm.rms else "layer_norm"
    log.append(
        f"{norm.kind} → {steps} ({last.name}, p={p}, training={training}) -> gpuopt::norm_dropout ({kind}"
        f"{', relu' if relu else ''})"
    )
    return True

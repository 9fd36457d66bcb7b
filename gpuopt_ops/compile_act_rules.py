"""The activation rules of the "gpuopt" Dynamo backend (compile_backend.py): linear → relu into bias_relu, linear /
addmm with a bias → an activation into bias_act, and the gated MLP's act(gate) * up into gated_act."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from .backends import has_kernel
from .compile_graph import (
    ADD,
    ADDMM,
    CHUNK,
    DTYPES,
    GELU,
    LINEAR,
    MUL,
    POW,
    SIGMOID,
    SILU,
    SPLIT,
    TANH,
    arg_at,
    calls,
    const_value,
    is_relu,
    mutated,
    node_and_const,
    nodes_between,
    only_user,
    operands_of,
    provably_same,
    replace,
    rounds_to_16_bit,
    same_like,
    tensor_ok,
    value_of,
)
from .ops import bias_act, bias_relu, gated_act

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _bias_like(y, bias):
    """The bias as the unfused linear / addmm uses it: under autocast it is cast to the matmul's dtype with x and
    the weight (outside autocast a bias of another dtype than y's is an error there, so this changes nothing)."""
    return bias if bias.dtype == y.dtype else bias.to(y.dtype)


def _linear_bias_relu(x, weight, bias):
    y = F.linear(x, weight)
    return bias_relu(y, _bias_like(y, bias))


def _linear_bias_act(x, weight, bias, act):
    y = F.linear(x, weight)
    return bias_act(y, _bias_like(y, bias), act=act)


def _addmm_bias_act(bias, a, w, shape, act):
    y = torch.mm(a, w)
    return bias_act(y if shape is None else y.view(shape), _bias_like(y, bias), act=act)


def _gated(gate, up, act):
    return gated_act(gate, up, act=act, p=0.0, training=False)


# ---------------------------------------------------------------------------------------------- linear → relu
def rewrite_linear_relu_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    """linear (with bias, an fp32 / fp64 result) → relu: a bias-free linear and one bias_relu call."""
    if node.op != "call_function" or node.target not in LINEAR:
        return False
    x = node.args[0]
    weight, bias = arg_at(node, 1, "weight", None), arg_at(node, 2, "bias", None)
    if bias is None or not isinstance(weight, torch.fx.Node) or not tensor_ok(x, [weight, bias]):
        return False
    bv = value_of(bias)
    if bv.dim() != 1 or rounds_to_16_bit(node):
        return False
    relu = only_user(node)
    if relu is None or not is_relu(relu):
        return False
    if not provably_same(graph, [node, relu], (x, weight, bias), relu, [relu]):
        return False
    replace(graph, relu, [node, relu], _linear_bias_relu, (x, weight, bias))
    log.append(f"linear → relu ({node.name}) -> linear + gpuopt::bias_relu")
    return True


# ---------------------------------------------------------------------------------------------- bias-act
def _match_activation(node: torch.fx.Node):
    """(act name, last node of the activation) when node is the activation's input and it has no other user."""
    users = list(node.users)
    if len(users) == 1:
        u = users[0]
        if calls(u, GELU) and len(u.args) == 1 and set(u.kwargs) <= {"approximate"}:
            approx = u.kwargs.get("approximate", "none")
            if approx in ("none", "tanh"):
                return ("gelu" if approx == "none" else "gelu_tanh"), u
        if calls(u, SILU) and len(u.args) == 1 and not u.kwargs.get("inplace", False):
            if set(u.kwargs) <= {"inplace"}:
                return "silu", u
        return None
    if len(users) == 4:
        return _match_bloom_gelu(node, users)
    if len(users) != 3:
        return None
    # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))
    half = cube = inner = None
    for u in users:
        if node_and_const(u, MUL, "mul", 0.5) is node:
            half = u
        elif calls(u, POW, ("pow",)) and len(u.args) == 2 and u.args[0] is node and const_value(u.args[1]) == 3.0:
            cube = u
        elif operands_of(u, ADD, "add") is not None and node in u.args:
            inner = u
    if half is None or cube is None or inner is None or len(cube.users) != 1 or len(inner.users) != 1:
        return None
    scaled_cube = next(iter(cube.users))
    if node_and_const(scaled_cube, MUL, "mul", 0.044715) is not cube or set(inner.args) != {node, scaled_cube}:
        return None
    scaled = next(iter(inner.users))
    if node_and_const(scaled, MUL, "mul", _SQRT_2_OVER_PI, rel=1e-6) is not inner or len(scaled.users) != 1:
        return None
    th = next(iter(scaled.users))
    if not calls(th, TANH, ("tanh",)) or th.args != (scaled,) or th.kwargs or len(th.users) != 1:
        return None
    one_plus = next(iter(th.users))
    if node_and_const(one_plus, ADD, "add", 1.0) is not th or len(one_plus.users) != 1 or len(half.users) != 1:
        return None
    last = next(iter(one_plus.users))
    ops = operands_of(last, MUL, "mul")
    if ops is None or set(ops) != {half, one_plus}:
        return None
    return "gelu_tanh", last


def _match_bloom_gelu(node: torch.fx.Node, users: list):
    """("gelu_tanh", last node) for 0.5 * x * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))) (BLOOM's form of
    the tanh GELU: the same function, the cube factored), else None. Other users of the inner nodes are checked
    when the site is rewritten."""

    def sole(n):
        return next(iter(n.users)) if len(n.users) == 1 else None

    half = scaled = c1 = None
    for u in users:
        if node_and_const(u, MUL, "mul", 0.5) is node:
            half = u
        elif node_and_const(u, MUL, "mul", _SQRT_2_OVER_PI, rel=1e-6) is node:
            scaled = u
        elif node_and_const(u, MUL, "mul", 0.044715) is node:
            c1 = u
    if half is None or scaled is None or c1 is None:
        return None
    c2 = sole(c1)  # (0.044715 * x) * x
    if c2 is None or c2 not in users or set(operands_of(c2, MUL, "mul") or ()) != {c1, node}:
        return None
    inner = sole(c2)  # 1 + 0.044715 * x * x
    if inner is None or node_and_const(inner, ADD, "add", 1.0) is not c2:
        return None
    arg = sole(inner)  # 0.79788456 * x * (1 + ...)
    if arg is None or set(operands_of(arg, MUL, "mul") or ()) != {scaled, inner} or sole(scaled) is not arg:
        return None
    th = sole(arg)
    if th is None or not calls(th, TANH, ("tanh",)) or th.args != (arg,) or th.kwargs:
        return None
    one_plus = sole(th)
    if one_plus is None or node_and_const(one_plus, ADD, "add", 1.0) is not th:
        return None
    last = sole(one_plus)
    if last is None or sole(half) is not last or set(operands_of(last, MUL, "mul") or ()) != {half, one_plus}:
        return None
    return "gelu_tanh", last


def rewrite_bias_act_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    if calls(node, LINEAR):
        x, weight, bias = node.args[0], arg_at(node, 1, "weight", None), arg_at(node, 2, "bias", None)
        if bias is None or not isinstance(weight, torch.fx.Node) or not tensor_ok(x, [weight, bias]):
            return False
        if value_of(bias).dim() != 1 or rounds_to_16_bit(node):
            return False
        src, view, shape = node, None, None
    elif calls(node, ADDMM) and len(node.args) == 3 and not node.kwargs:
        bias, a, w = node.args
        if not all(isinstance(n, torch.fx.Node) for n in (bias, a, w)) or not tensor_ok(a, [w, bias]):
            return False
        bv = value_of(bias)
        if bv.dim() != 1 or rounds_to_16_bit(node):
            return False
        src, view, shape = node, None, None
        if len(node.users) == 1:
            u = next(iter(node.users))
            if u.op == "call_method" and u.target in ("view", "reshape") and u.args[0] is node and not u.kwargs:
                shp = u.args[1] if len(u.args) == 2 and isinstance(u.args[1], (tuple, list)) else u.args[1:]
                # only a view that keeps the last (bias) dimension: bias_act adds the bias along it
                if all(type(d) is int for d in shp) and len(shp) >= 1 and shp[-1] == bv.shape[0]:
                    src, view, shape = u, u, tuple(shp)
    else:
        return False
    found = _match_activation(src)
    if found is None:
        return False
    act, last = found
    yv, lv = value_of(src), value_of(last)
    if yv is None or lv is None or not same_like(last, yv):
        return False
    # the nodes from src to last are the activation: they go, with the matmul and its view
    dead = nodes_between(src, last, {n: i for i, n in enumerate(graph.nodes)}) | {src, node}
    inputs = (bias, a, w) if node.target in ADDMM else (x, weight, bias)
    if not provably_same(graph, dead, inputs, last, [last]):
        return False
    if node.target in ADDMM:
        replace(graph, last, dead, _addmm_bias_act, (bias, a, w, shape, act))
    else:
        replace(graph, last, dead, _linear_bias_act, (x, weight, bias, act))
    if node.target in ADDMM:
        what, into = "addmm" + (" → view" if view is not None else ""), "mm"
    else:
        what, into = "linear", "linear"
    log.append(f"{what} → {act} ({node.name}) -> {into} + gpuopt::bias_act ({act})")
    return True


# ---------------------------------------------------------------------------------------------- gated MLP
def _gated_activation(a: Any, order: dict):
    """(act name, gate, the activation's nodes) when a = act(gate): F.silu, F.gelu (either approximation), relu
    (out of place), SiLU written out as `g * sigmoid(g)` (either order, function or method), or the tanh GELU
    written out (_match_activation's two forms, gate with no user outside them); else None. Other users of the
    nodes are checked by the proof obligations when the site is rewritten."""
    if not isinstance(a, torch.fx.Node) or a.op not in ("call_function", "call_method") or not a.args:
        return None
    src = a.args[0]
    if isinstance(src, torch.fx.Node) and len(a.args) == 1 and not mutated(a):
        if is_relu(a):
            return "relu", src, [a]
        if calls(a, GELU) and set(a.kwargs) <= {"approximate"}:
            approx = a.kwargs.get("approximate", "none")
            if approx in ("none", "tanh"):
                return ("gelu" if approx == "none" else "gelu_tanh"), src, [a]
        if calls(a, SILU) and set(a.kwargs) <= {"inplace"}:
            return "silu", src, [a]
    ops = operands_of(a, MUL, "mul")
    if ops is None:
        return None
    for g, s in (ops, ops[::-1]):  # g * sigmoid(g)
        if (
            isinstance(g, torch.fx.Node)
            and calls(s, SIGMOID, ("sigmoid",))
            and len(s.args) == 1
            and not s.kwargs
            and s.args[0] is g
        ):
            return "silu", g, [s, a]
    for o in ops:  # the tanh GELU written out: 0.5 * g * (1 + tanh(...)), rooted at its gate
        g = node_and_const(o, MUL, "mul", 0.5) if isinstance(o, torch.fx.Node) else None
        if g is None:
            continue
        found = _match_activation(g)
        if found is None or found[1] is not a:
            continue
        return found[0], g, sorted(nodes_between(g, a, order), key=order.__getitem__)
    return None


def _last_dim(node: torch.fx.Node, dim: Any) -> bool:
    v = value_of(node)
    return v is not None and type(dim) is int and dim in (-1, v.dim() - 1)


def _halves(gate: torch.fx.Node, up: torch.fx.Node):
    """(y, views) when gate and up are the first and the second half of y's last dimension: getitem 0 and 1 of one
    `y.chunk(2, -1)` / `y.split(F, -1)` (or [F, F]), or `y[..., :F]` and `y[..., F:]`; views are the nodes that
    take them apart. Else None."""
    if not all(n.op == "call_function" and n.target is operator.getitem and len(n.args) == 2 for n in (gate, up)):
        return None
    c, i = gate.args
    if up.args[0] is c and isinstance(c, torch.fx.Node) and i == 0 and up.args[1] == 1 and c.args:
        y = c.args[0]
        yv = value_of(y)
        if not isinstance(y, torch.fx.Node) or yv is None or yv.dim() < 1 or yv.shape[-1] % 2:
            return None
        half = yv.shape[-1] // 2
        if calls(c, CHUNK, ("chunk",)) and set(c.kwargs) <= {"dim", "chunks"}:
            ok = arg_at(c, 1, "chunks", None) == 2 and _last_dim(y, arg_at(c, 2, "dim", 0))
        elif calls(c, SPLIT, ("split",)) and set(c.kwargs) <= {"dim", "split_size", "split_size_or_sections"}:
            size = arg_at(c, 1, "split_size", None) if c.op == "call_method" else None
            size = size if size is not None else arg_at(c, 1, "split_size_or_sections", None)
            sizes = list(size) if isinstance(size, (list, tuple)) else [size, size]
            ok = sizes == [half, half] and _last_dim(y, arg_at(c, 2, "dim", 0))
        else:
            ok = False
        return (y, [c]) if ok else None
    y = gate.args[0]
    if up.args[0] is not y or not isinstance(y, torch.fx.Node):
        return None
    yv = value_of(y)
    if yv is None or yv.dim() < 1 or yv.shape[-1] % 2:
        return None
    half = yv.shape[-1] // 2

    def last_slice(index):  # the slice of the last dimension when the index leaves every other one whole
        if not isinstance(index, tuple) or not index or not isinstance(index[-1], slice):
            return None
        lead = index[:-1]
        whole = slice(None, None, None)
        if lead == (Ellipsis,) or (len(lead) == yv.dim() - 1 and all(s == whole for s in lead)):
            return index[-1]
        return None

    g, u = last_slice(gate.args[1]), last_slice(up.args[1])
    if g is None or u is None or g.step not in (None, 1) or u.step not in (None, 1):
        return None
    if g.start in (None, 0) and g.stop == half and u.start == half and u.stop in (None, 2 * half):
        return y, []
    return None


def rewrite_gated_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    """act(gate) * up (either order) → one gated_act call; [gate | up] halves of one tensor → its packed layout."""
    ops = operands_of(node, MUL, "mul")
    if ops is None or not all(isinstance(o, torch.fx.Node) for o in ops):
        return False
    order = {n: i for i, n in enumerate(graph.nodes)}
    for a, up in (ops, ops[::-1]):
        found = _gated_activation(a, order)
        if found is None:
            continue
        act, gate, act_nodes = found
        if up is a or up in act_nodes or gate is up:
            continue
        gv, uv = value_of(gate), value_of(up)
        if gv is None or uv is None or gv.dtype not in DTYPES or gv.device.type not in ("cpu", "cuda"):
            continue
        if gv.device.type == "cuda" and not has_kernel("gated_act", "CUDA"):
            return False  # a build without the op's CUDA kernels: the site stays as it is
        if gv.dim() < 1 or gv.shape[-1] < 1 or not same_like(up, gv):
            continue  # gate and up of one shape, dtype and device: no broadcasting, no type promotion
        if not (same_like(a, gv) and same_like(node, gv)):
            continue  # the activation and the product in gate's dtype and shape
        dead = {*act_nodes, node}
        packed = _halves(gate, up)
        if packed is not None:
            y, views = packed
            yv = value_of(y)
            if yv.dtype != gv.dtype or yv.device != gv.device or tuple(yv.shape[:-1]) != tuple(gv.shape[:-1]):
                continue
            for n in (gate, up, *views):  # the getitems / chunk go too, unless something else reads them
                if set(n.users) <= dead:
                    dead.add(n)
            inputs = [y]
        else:
            inputs = [gate, up]
        if not provably_same(graph, dead, inputs, node, [node]):
            continue
        replace(graph, node, dead, _gated, (inputs[0], inputs[1] if len(inputs) == 2 else None, act))
        what = "[gate | up] halves" if packed is not None else "gate, up"
        log.append(f"{act}(gate) * up ({node.name}, {what}) -> gpuopt::gated_act ({act})")
        return True
    return False

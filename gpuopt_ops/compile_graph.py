"""What the rewrite rules of the "gpuopt" Dynamo backend (compile_backend.py) ask of an FX graph: the functions
each rule recognises, the proof obligations a rewrite must meet to compute the same function, and the small
matchers (a node's arguments, its example value, its users) the rules are built from."""

from __future__ import annotations

import operator
from typing import Any, Optional

import torch
import torch.fx
import torch.nn.functional as F

LAYER_NORM = {F.layer_norm, torch.layer_norm}
DROPOUT = {F.dropout, torch.dropout}
_RELU_FUNCTIONS = {F.relu, torch.relu, torch.relu_, F.relu_}
_RELU_METHODS = {"relu", "relu_"}
LINEAR = {F.linear, torch._C._nn.linear}
DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64}
ADD = {operator.add, torch.add}
MUL = {operator.mul, torch.mul}
RMS_NORM = {F.rms_norm, torch.rms_norm}
GELU = {F.gelu, torch._C._nn.gelu}
SILU = {F.silu, torch._C._nn.silu}
TANH = {torch.tanh, F.tanh}
POW = {torch.pow, operator.pow}
RSQRT = {torch.rsqrt}
ADDMM = {torch.addmm}
SIGMOID = {torch.sigmoid, F.sigmoid}
CHUNK = {torch.chunk}
SPLIT = {torch.split, torch.functional.split}


# ---------------------------------------------------------------------------------------------- proof obligations
# A rewrite replaces a set of nodes (`dead`) by one call placed before an anchor node. It computes the same function
# only if (1) no erased node has a user outside the erased set, except the results, whose uses go to the new call;
# (2) no input of the new call is erased, and every input exists at the anchor; (3) between the first and the last
# of those nodes (the anchor included) nothing mutates a tensor or changes a mode (autocast, grad mode): the new
# call then reads the same values, in the same mode, as the nodes it replaces, wherever in that span it sits;
# (4) nothing after that span mutates an input, an erased node or a result, or a view of one: autograd would see a
# tensor our op saved for the backward change (eager saves other tensors, so it could train where we fail).
_INPLACE_OPERATORS = {
    operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
    operator.imatmul,
}  # fmt: skip


# methods / functions that return a view of their first argument: a mutation of the view mutates the base
_VIEWS = {
    "view", "view_as", "reshape", "reshape_as", "expand", "expand_as", "transpose", "t", "T", "mT", "permute",
    "squeeze", "unsqueeze", "flatten", "unflatten", "narrow", "select", "split", "chunk", "unbind", "diagonal",
    "detach", "as_strided", "movedim", "swapaxes", "swapdims", "unfold", "contiguous", "getitem", "__getitem__",
    "real", "imag", "view_as_real", "view_as_complex", "tensor_split", "split_with_sizes", "alias", "to", "type",
    "type_as", "float", "half", "bfloat16", "double",
}  # fmt: skip


_SIGNATURES: dict = {}


def _name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", "") or ""


def _inplace_arg(node: torch.fx.Node) -> bool:
    """inplace=True given by keyword or by position (F.relu(x, True), F.dropout(x, p, training, True))."""
    if node.kwargs.get("inplace", False) is True:
        return True
    target = node.target
    if node.op != "call_function" or not callable(target) or not node.args:
        return False
    if target not in _SIGNATURES:
        try:
            import inspect

            sig = inspect.signature(target)
            _SIGNATURES[target] = sig if "inplace" in sig.parameters else None
        except (TypeError, ValueError):
            _SIGNATURES[target] = None
    sig = _SIGNATURES[target]
    if sig is None:
        return False
    try:
        bound = sig.bind(*node.args, **node.kwargs)
    except TypeError:
        return True  # cannot tell: assume the worst
    return bound.arguments.get("inplace", False) is True


def mutated(node: torch.fx.Node) -> list:
    """The tensors (graph nodes) a node writes in place; [] when it writes none."""
    if node.op not in ("call_function", "call_method"):
        return []
    name = _name(node)
    first = [node.args[0]] if node.args and isinstance(node.args[0], torch.fx.Node) else []
    out = [v for k, v in node.kwargs.items() if k == "out" and isinstance(v, torch.fx.Node)]
    if node.op == "call_function" and node.target in _INPLACE_OPERATORS:
        return first + out
    schema = getattr(node.target, "_schema", None)
    if schema is not None and getattr(schema, "is_mutable", False):
        return list(node.all_input_nodes)
    if name.endswith("_") and not name.startswith("_") or name.startswith("__i") and name.endswith("__"):
        return first + out
    if _inplace_arg(node):
        return first + out
    return out


def _changes_mode(node: torch.fx.Node) -> bool:
    """A node that enters or leaves a context: autocast, grad mode, inference mode, or any other `_set_*` state."""
    if node.op == "call_module":
        return True  # not inlined by Dynamo: what it does is not known here
    if node.op != "call_function":
        return False
    name = _name(node)
    module = getattr(node.target, "__module__", "") or ""
    return (
        "autocast" in name
        or "grad_enabled" in name
        or "inference_mode" in name
        or name.startswith("_set_")
        or name.startswith("_enter_")
        or name.startswith("_exit_")
        or module.startswith("torch.amp")
    )


def _base(node: Any) -> Any:
    """The tensor a view was taken of (through any chain of views), else the node itself."""
    while isinstance(node, torch.fx.Node) and node.op in ("call_function", "call_method") and node.args:
        if _name(node) not in _VIEWS or not isinstance(node.args[0], torch.fx.Node):
            break
        node = node.args[0]
    return node


def provably_same(graph: torch.fx.Graph, dead, inputs, anchor: torch.fx.Node, results) -> bool:
    """Proof obligations (1)-(4) above for replacing `dead` by one call of `inputs`, placed before `anchor`, whose
    result(s) take the uses of `results`."""
    dead, results = set(dead), set(results)
    inputs = [n for n in inputs if isinstance(n, torch.fx.Node)]
    order = {n: i for i, n in enumerate(graph.nodes)}
    for n in dead - results:  # (1)
        if any(u not in dead for u in n.users):
            return False
    if any(n in dead or order[n] >= order[anchor] for n in inputs):  # (2)
        return False
    lo = min(order[n] for n in (*dead, anchor))
    hi = max(order[n] for n in (*dead, anchor))
    protected = {_base(n) for n in (*inputs, *dead)}
    for n in list(graph.nodes)[lo:]:
        written = mutated(n)
        if order[n] <= hi:  # (3); an erased in-place node may only write erased values (relu_ on the chain)
            if n in dead:
                if any(w not in dead for w in written) or _changes_mode(n):
                    return False
            elif written or _changes_mode(n):
                return False
        elif any(_base(w) in protected for w in written):  # (4)
            return False
    return True


# ---------------------------------------------------------------------------------------------- matching
def is_relu(node: torch.fx.Node) -> bool:
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS:
        return (
            len(node.args) == 1
            and set(node.kwargs) <= {"inplace"}
            and isinstance(node.kwargs.get("inplace", False), bool)
        )
    return node.op == "call_method" and node.target in _RELU_METHODS and len(node.args) == 1 and not node.kwargs


def arg_at(node: torch.fx.Node, i: int, name: str, default: Any) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def dropout_params(node: torch.fx.Node):
    """(p, training) of a dropout node with constant arguments, else None."""
    if node.op != "call_function" or node.target not in DROPOUT:
        return None
    if node.target is torch.dropout:  # torch.dropout(input, p, train)
        p, training = arg_at(node, 1, "p", None), arg_at(node, 2, "train", None)
    else:
        p, training = arg_at(node, 1, "p", 0.5), arg_at(node, 2, "training", True)
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not isinstance(training, bool):
        return None
    if not 0.0 <= float(p) <= 1.0:
        return None
    return float(p), training


def value_of(node: Any) -> Optional[torch.Tensor]:
    if not isinstance(node, torch.fx.Node):
        return None
    v = node.meta.get("example_value", node.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def tensor_ok(x: torch.fx.Node, params) -> bool:
    """x and the parameters are tensors our ops take: dtype, device, params of x's dtype or fp32."""
    xv = value_of(x)
    if xv is None or xv.dtype not in DTYPES or xv.device.type not in ("cpu", "cuda"):
        return False
    for prm in params:
        if prm is None:
            continue
        pv = value_of(prm)
        if pv is None or pv.device != xv.device or pv.dtype not in (xv.dtype, torch.float32):
            return False
    return True


def rounds_to_16_bit(matmul: torch.fx.Node) -> bool:
    """A linear / addmm whose result is bf16 / fp16 (its inputs', or autocast's) keeps its bias: it adds the bias in
    its fp32 accumulation and rounds once, where a bias-free matmul's rounded result plus the bias carries the
    rounding error of x @ w.T, large against the result where the bias cancels it (modules.matmul_rounds_to_16_bit)."""
    v = value_of(matmul)
    return v is None or v.dtype in (torch.float16, torch.bfloat16)


def only_user(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].args and users[0].args[0] is node else None


def calls(node: Any, functions, methods=()) -> bool:
    if not isinstance(node, torch.fx.Node):
        return False
    if node.op == "call_function":
        return node.target in functions
    return node.op == "call_method" and node.target in methods


def const_value(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def operands_of(node: torch.fx.Node, functions, method: str):
    """The two operands of a binary add / mul node (function or method form, no other arguments), else None."""
    if not calls(node, functions, (method,)) or len(node.args) != 2 or node.kwargs:
        return None
    return node.args[0], node.args[1]


def node_and_const(node: torch.fx.Node, functions, method: str, const: float, rel: float = 1e-9):
    """The tensor operand of `t op const` / `const op t` when the constant is `const`, else None."""
    ops = operands_of(node, functions, method)
    if ops is None:
        return None
    for a, b in (ops, ops[::-1]):
        c = const_value(b)
        if isinstance(a, torch.fx.Node) and c is not None and abs(c - const) <= rel * abs(const):
            return a
    return None


def users_of(node: torch.fx.Node) -> set:
    return set(node.users)


def same_like(node: Any, ref: torch.Tensor) -> bool:
    v = value_of(node)
    return v is not None and v.dtype == ref.dtype and v.device == ref.device and tuple(v.shape) == tuple(ref.shape)


def param_ok(node: Any, xv: torch.Tensor) -> bool:
    if node is None:
        return True
    pv = value_of(node)
    return (
        pv is not None
        and pv.dim() == 1
        and pv.shape[0] == xv.shape[-1]
        and pv.device == xv.device
        and pv.dtype in (xv.dtype, torch.float32)
    )


def nodes_between(first: torch.fx.Node, last: torch.fx.Node, order: dict) -> set:
    """The nodes `last` is computed from that come after `first` in the graph (`order`: node -> position), `last`
    included and `first` excluded: the body of a pattern that starts at first and ends at last."""
    nodes, stack = set(), [last]
    while stack:
        n = stack.pop()
        if n in nodes or n is first:
            continue
        nodes.add(n)
        stack.extend(i for i in n.all_input_nodes if order[i] > order[first])
    return nodes


def replace(graph: torch.fx.Graph, result: torch.fx.Node, dead, function, args: tuple) -> torch.fx.Node:
    """Puts `function(*args)` before `result`, gives it result's uses and metadata, then erases the `dead` nodes
    (result among them), users first. The caller has checked the proof obligations (`provably_same`)."""
    with graph.inserting_before(result):
        new = graph.call_function(function, args)
    new.meta.update(result.meta)
    result.replace_all_uses_with(new)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for n in sorted(dead, key=order.__getitem__, reverse=True):
        graph.erase_node(n)
    return new

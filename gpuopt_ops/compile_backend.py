"""The Dynamo backend "gpuopt": `torch.compile(model_or_fn, backend="gpuopt")`.

Registered on `import gpuopt_ops`. In the FX graph Dynamo captures it rewrites

- layer_norm → dropout → relu, layer_norm → relu → dropout and layer_norm → relu into one call of
  `gpuopt_ops.layer_norm_dropout_relu` (dropout's p and `training` flag kept: training=False fuses with p = 0);
- linear (with bias) → relu into a bias-free linear and `gpuopt_ops.bias_relu`, when the linear's result is fp32
  or fp64 (a bf16 / fp16 linear adds its bias before its one rounding; split, the sum would round twice);
- the residual blocks of transformers into one call of `gpuopt_ops.dropout_add_norm`: a norm whose input is
  `dropout(h) + residual` (either operand order), `h + residual` or `dropout(h)`. The norm is `F.layer_norm`
  over the last dimension, `F.rms_norm` / `nn.RMSNorm`, or RMSNorm written out as
  `w * (h * rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)` with h = x or x.to(float32). When the
  sum has other users (the next residual of a pre-norm block), they take the op's `sum` output (prenorm);
- a norm (the same three forms) followed by dropout, by dropout → relu, or (RMSNorm) by relu → dropout or relu,
  where no residual add comes before it (BERT's embeddings: layer_norm → dropout), into one call of
  `gpuopt_ops.norm_dropout` (the LayerNorm → ... → relu chains are the first rule's);
- linear / addmm with a bias (addmm optionally through one view; fp32 / fp64 results, as above) → an activation
  into a bias-free matmul and `gpuopt_ops.bias_act`: `F.gelu` (both approximations), the tanh GELU written out as
  `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`, and `F.silu`;
- the gated MLP of LLaMA-style models, `act(gate) * up` (either operand order) with act `F.silu`, `F.gelu` (both
  approximations), relu, SiLU written out as `g * torch.sigmoid(g)`, or the tanh GELU written out (both forms above),
  into one call of `gpuopt_ops.gated_act` (p = 0): two tensors of the same shape, dtype and device, or, when gate and
  up are the two halves of one tensor's last dimension (`y.chunk(2, -1)`, `y.split(F, -1)`, `y[..., :F]` /
  `y[..., F:]`: Phi-3's fused `gate_up_proj`), that tensor alone ([gate | up] layout). This rule runs first, so a
  gate projection with a bias keeps its linear and the activation goes into the gated op,

then compiles the graph with Inductor (forward and backward; AOTAutograd traces through the public functions, so
each training call draws a fresh dropout seed from torch's generator on x's device, as in eager mode).

relu is any of F.relu / torch.relu / Tensor.relu (and their in-place forms). A match requires every intermediate
value to have no other user (except the sum of a pre-norm block), constant p / training / eps / normalized_shape,
dtypes and devices our ops take, a residual of the same shape and dtype as h, and a result of x's shape and dtype
(so the rewrite computes the same function); anything else is left to Inductor as it is. Print the rewrites with
`torch.compile(m, backend="gpuopt", options={"verbose": True})`. `options={"inductor": False}` runs the rewritten
graph as it is (eager kernels, no Inductor compile: quick, and handy to debug); any other option goes to Inductor
as a config patch.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Optional

import torch
import torch.fx
import torch.nn.functional as F

from .backends import has_kernel
from .modules import default_rms_eps
from .ops import bias_act, bias_relu, dropout_add_norm, gated_act, layer_norm_dropout_relu, norm_dropout

_LAYER_NORM = {F.layer_norm, torch.layer_norm}
_DROPOUT = {F.dropout, torch.dropout}
_RELU_FUNCTIONS = {F.relu, torch.relu, torch.relu_, F.relu_}
_RELU_METHODS = {"relu", "relu_"}
_LINEAR = {F.linear, torch._C._nn.linear}
_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64}
_ADD = {operator.add, torch.add}
_MUL = {operator.mul, torch.mul}
_RMS_NORM = {F.rms_norm, torch.rms_norm}
_GELU = {F.gelu, torch._C._nn.gelu}
_SILU = {F.silu, torch._C._nn.silu}
_TANH = {torch.tanh, F.tanh}
_POW = {torch.pow, operator.pow}
_RSQRT = {torch.rsqrt}
_ADDMM = {torch.addmm}
_SIGMOID = {torch.sigmoid, F.sigmoid}
_CHUNK = {torch.chunk}
_SPLIT = {torch.split, torch.functional.split}
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _ldr(x, normalized_shape, weight, bias, p, training, eps):
    return layer_norm_dropout_relu(x, normalized_shape, weight, bias, p=p, training=training, eps=eps)


def _bias_like(y, bias):
    """The bias as the unfused linear / addmm uses it: under autocast it is cast to the matmul's dtype with x and
    the weight (outside autocast a bias of another dtype than y's is an error there, so this changes nothing)."""
    return bias if bias.dtype == y.dtype else bias.to(y.dtype)


def _linear_bias_relu(x, weight, bias):
    y = F.linear(x, weight)
    return bias_relu(y, _bias_like(y, bias))


def _dropout_add_norm(x, residual, weight, bias, rms, p, training, eps, prenorm):
    norm = "rms" if rms else "layer"
    return dropout_add_norm(x, residual, weight, bias, norm=norm, p=p, training=training, eps=eps, prenorm=prenorm)


def _norm_dropout(x, weight, bias, rms, activation, p, training, eps):
    norm = "rms" if rms else "layer"
    return norm_dropout(x, weight, bias, norm=norm, activation=activation, p=p, training=training, eps=eps)


def _linear_bias_act(x, weight, bias, act):
    y = F.linear(x, weight)
    return bias_act(y, _bias_like(y, bias), act=act)


def _addmm_bias_act(bias, a, w, shape, act):
    y = torch.mm(a, w)
    return bias_act(y if shape is None else y.view(shape), _bias_like(y, bias), act=act)


def _gated(gate, up, act):
    return gated_act(gate, up, act=act, p=0.0, training=False)


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


def _mutated(node: torch.fx.Node) -> list:
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


def _provably_same(graph: torch.fx.Graph, dead, inputs, anchor: torch.fx.Node, results) -> bool:
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
        written = _mutated(n)
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


def _rounds_to_16_bit(matmul: torch.fx.Node) -> bool:
    """A linear / addmm whose result is bf16 / fp16 (its inputs', or autocast's) keeps its bias: it adds the bias in
    its fp32 accumulation and rounds once, where a bias-free matmul's rounded result plus the bias carries the
    rounding error of x @ w.T, large against the result where the bias cancels it (modules.matmul_rounds_to_16_bit)."""
    v = _value(matmul)
    return v is None or v.dtype in (torch.float16, torch.bfloat16)


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
            if not _provably_same(graph, [node, *chain], (x, weight, bias), last, [last]):
                continue
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
            if bv.dim() != 1 or _rounds_to_16_bit(node):
                continue
            relu = _only_user(node)
            if relu is None or not _is_relu(relu):
                continue
            if not _provably_same(graph, [node, relu], (x, weight, bias), relu, [relu]):
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


# ---------------------------------------------------------------------------------------------- transformer blocks
def _calls(node: Any, functions, methods=()) -> bool:
    if not isinstance(node, torch.fx.Node):
        return False
    if node.op == "call_function":
        return node.target in functions
    return node.op == "call_method" and node.target in methods


def _const(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _operands(node: torch.fx.Node, functions, method: str):
    """The two operands of a binary add / mul node (function or method form, no other arguments), else None."""
    if not _calls(node, functions, (method,)) or len(node.args) != 2 or node.kwargs:
        return None
    return node.args[0], node.args[1]


def _node_and_const(node: torch.fx.Node, functions, method: str, const: float, rel: float = 1e-9):
    """The tensor operand of `t op const` / `const op t` when the constant is `const`, else None."""
    ops = _operands(node, functions, method)
    if ops is None:
        return None
    for a, b in (ops, ops[::-1]):
        c = _const(b)
        if isinstance(a, torch.fx.Node) and c is not None and abs(c - const) <= rel * abs(const):
            return a
    return None


def _users(node: torch.fx.Node) -> set:
    return set(node.users)


def _same_like(node: Any, ref: torch.Tensor) -> bool:
    v = _value(node)
    return v is not None and v.dtype == ref.dtype and v.device == ref.device and tuple(v.shape) == tuple(ref.shape)


def _param_ok(node: Any, xv: torch.Tensor) -> bool:
    if node is None:
        return True
    pv = _value(node)
    return (
        pv is not None
        and pv.dim() == 1
        and pv.shape[0] == xv.shape[-1]
        and pv.device == xv.device
        and pv.dtype in (xv.dtype, torch.float32)
    )


class _Norm:
    """A matched norm: its input node, parameters, the nodes it consists of and the node giving its result."""

    def __init__(self, source, weight, bias, eps, rms, nodes, result, kind):
        self.source, self.weight, self.bias, self.eps, self.rms = source, weight, bias, eps, rms
        self.nodes, self.result, self.kind = nodes, result, kind


def _match_layer_norm(node: torch.fx.Node) -> Optional[_Norm]:
    if not _calls(node, _LAYER_NORM):
        return None
    shape = _arg(node, 1, "normalized_shape", None)
    shape = (shape,) if isinstance(shape, int) else shape
    weight, bias, eps = _arg(node, 2, "weight", None), _arg(node, 3, "bias", None), _arg(node, 4, "eps", 1e-5)
    xv = _value(node.args[0])
    if xv is None or not isinstance(shape, (tuple, list)) or len(shape) != 1 or type(shape[0]) is not int:
        return None
    if _const(eps) is None or eps <= 0 or xv.dim() < 1 or xv.shape[-1] != shape[0]:
        return None
    return _Norm(node.args[0], weight, bias, float(eps), False, [node], node, "layer_norm")


def _match_rms_norm(node: torch.fx.Node) -> Optional[_Norm]:
    if not _calls(node, _RMS_NORM):
        return None
    shape = _arg(node, 1, "normalized_shape", None)
    shape = (shape,) if isinstance(shape, int) else shape
    weight, eps = _arg(node, 2, "weight", None), _arg(node, 3, "eps", None)
    xv = _value(node.args[0])
    if xv is None or not isinstance(shape, (tuple, list)) or len(shape) != 1 or type(shape[0]) is not int:
        return None
    if xv.dim() < 1 or xv.shape[-1] != shape[0] or xv.dtype not in _DTYPES:
        return None
    eps = default_rms_eps(xv.dtype) if eps is None else eps  # F.rms_norm's default, as ATen resolves it
    if _const(eps) is None or eps <= 0:
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
    if not _calls(rsqrt, _RSQRT, ("rsqrt",)) or len(rsqrt.args) != 1 or rsqrt.kwargs:
        return None
    add_eps = rsqrt.args[0]
    ops = _operands(add_eps, _ADD, "add")
    if ops is None:
        return None
    var, eps = (ops[0], _const(ops[1])) if _const(ops[1]) is not None else (ops[1], _const(ops[0]))
    if eps is None or eps <= 0 or not _calls(var, {torch.mean}, ("mean",)):
        return None
    dim = _arg(var, 1, "dim", None)
    if _arg(var, 2, "keepdim", False) is not True or dim not in (-1, (-1,), [-1]) or len(var.args) > 3:
        return None
    sq = var.args[0]
    if _calls(sq, _POW, ("pow",)) and len(sq.args) == 2 and _const(sq.args[1]) == 2.0:
        h = sq.args[0]
    elif _operands(sq, _MUL, "mul") is not None and sq.args[0] is sq.args[1]:
        h = sq.args[0]
    else:
        return None
    if not isinstance(h, torch.fx.Node):
        return None
    x = h.args[0] if _is_to_float32(h) else h
    normed = next(iter(rsqrt.users)) if len(rsqrt.users) == 1 else None
    ops = _operands(normed, _MUL, "mul") if normed is not None else None
    if ops is None or rsqrt not in ops:
        return None
    m = ops[1] if ops[0] is rsqrt else ops[0]
    if m is not h and m is not x:
        return None
    xv = _value(x)
    if xv is None or xv.dtype not in _DTYPES or (x is not h and xv.dtype == torch.float64):
        return None
    nodes = ([h] if x is not h else []) + [sq, var, add_eps, rsqrt, normed]
    result = normed

    def sole_user(n):
        return next(iter(n.users)) if len(n.users) == 1 else None

    def cast(n):  # n's only user when it is a cast to x's dtype (the rounding step the op does once, at its end)
        c = sole_user(n)
        if c is None or c.op != "call_method" or c.target not in ("to", "type_as") or len(c.args) != 2 or c.kwargs:
            return None
        cv = _value(c)
        return c if cv is not None and cv.dtype == xv.dtype else None

    def weighted(n):  # (mul, weight) when n's only user multiplies it by a 1-D parameter of x's last dimension
        mul = sole_user(n)
        ops = _operands(mul, _MUL, "mul") if mul is not None else None
        if ops is None:
            return None
        other = ops[1] if ops[0] is n else ops[0]
        if isinstance(other, torch.fx.Node) and other is not n and _param_ok(other, xv):
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
    if not isinstance(node, torch.fx.Node) or _users(node) != {user}:
        return None
    params = _dropout_params(node)
    if params is None or node.args[0] is None or node.kwargs.get("inplace", False) or _arg(node, 3, "inplace", False):
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
        v, src = _value(node), _value(node.args[0])
        if v is None or src is None or v.dim() < 1 or src.dim() < 1 or v.shape[-1] != src.shape[-1]:
            break
        if not all(type(d) is int for d in v.shape):
            break  # the op's output is reshaped to these sizes: constants only
        views.append(node)
        node = node.args[0]
    return node, views


def _same_rows(node: Any, ref: torch.Tensor) -> bool:
    """node's value has ref's dtype, device, element count and last dimension (the same rows, maybe reshaped)."""
    v = _value(node)
    return (
        v is not None
        and v.dtype == ref.dtype
        and v.device == ref.device
        and v.numel() == ref.numel()
        and v.dim() >= 1
        and v.shape[-1] == ref.shape[-1]
    )


def _rewrite_norm_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    norm = _match_norm(node)
    if norm is None:
        return False
    s, views = _row_views(norm.source)
    if not isinstance(s, torch.fx.Node):
        return False
    head, residual, p, training, consumed = None, None, 0.0, False, []
    ops = _operands(s, _ADD, "add")
    if ops is not None and all(isinstance(o, torch.fx.Node) for o in ops):
        for a, b in (ops, ops[::-1]):
            d = _dropout_only_into(a, s)
            if d is not None:
                head, p, training = d
                residual, consumed = b, [a, s]
                pattern = "dropout → add → "
                break
        else:
            head, residual, consumed = ops[0], ops[1], [s]
            hv, rv = _value(head), _value(residual)
            if hv is not None and rv is not None and hv.dtype == torch.float32 and rv.dtype != torch.float32:
                head, residual = residual, head  # the 16-bit operand is the branch (IEEE addition commutes)
            pattern = "add → "
    elif _calls(s, _DROPOUT):
        params = _dropout_params(s)
        if params is None or s.kwargs.get("inplace", False) or _arg(s, 3, "inplace", False):
            return False
        head, (p, training), consumed = s.args[0], params, [s]
        pattern = "dropout → "
    if head is None or not isinstance(head, torch.fx.Node):
        return False
    xv = _value(head)
    if xv is None or xv.dtype not in _DTYPES or xv.device.type not in ("cpu", "cuda") or xv.dim() < 1:
        return False
    # A 16-bit operand added to an fp32 one (autocast's matmuls produce the branch, the residual stream stays fp32)
    # sums in fp32: the op then takes that operand converted to fp32 (exact), and everything after is fp32 as in
    # the unfused graph.
    sv, rv = _value(s), _value(residual)
    promote = None
    if sv is not None and rv is not None and sv.dtype == torch.float32 and xv.shape == rv.shape == sv.shape:
        if xv.dtype in (torch.float16, torch.bfloat16) and _same_like(residual, sv):
            promote = "branch"
        elif rv.dtype in (torch.float16, torch.bfloat16) and _same_like(head, sv):
            promote = "residual"
    if promote:
        xv = sv
    if residual is not None and promote != "residual" and not _same_like(residual, xv):
        return False
    if not (_same_like(s, xv) and _same_rows(norm.result, xv)):
        return False  # broadcasting, type promotion or a result in another dtype: not the same function
    if views and tuple(_value(norm.result).shape) != tuple(_value(views[0]).shape):
        return False
    if not (_param_ok(norm.weight, xv) and _param_ok(norm.bias, xv)):
        return False
    if norm.weight is not None and norm.bias is not None and _value(norm.weight).dtype != _value(norm.bias).dtype:
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
    # the op goes where the sum was, or right after its last input when that is computed later (Gemma's
    # `1 + weight` between the sum and the norm); every reader of the sum must then come after it
    anchor = s
    if any(order[n] >= order[s] for n in inputs):
        anchor = max(inputs, key=order.__getitem__).next
        if any(order[u] < order[anchor] for u in others):
            return False
    results = [norm.result, s] if prenorm else [norm.result]
    if not _provably_same(graph, dead, inputs, anchor, results):
        return False
    with graph.inserting_before(anchor):
        x, r = head, residual
        if promote == "branch":
            x = graph.call_method("to", (head, torch.float32))
            x.meta.update(s.meta)
        elif promote == "residual":
            r = graph.call_method("to", (residual, torch.float32))
            r.meta.update(s.meta)
        args = (x, r, norm.weight, norm.bias, norm.rms, p, training, norm.eps, prenorm)
        new = graph.call_function(_dropout_add_norm, args)
        if prenorm:
            out = graph.call_function(operator.getitem, (new, 0))
            total = graph.call_function(operator.getitem, (new, 1))
            total.meta.update(s.meta)
        else:
            out = new
        if views:
            out.meta.update(s.meta)
            out = graph.call_method("reshape", (out, tuple(_value(norm.result).shape)))
    out.meta.update(norm.result.meta)
    norm.result.replace_all_uses_with(out)
    if prenorm:
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


def _rewrite_norm_dropout_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    """norm → dropout (→ relu), and for RMSNorm also norm → relu (→ dropout): one norm_dropout call."""
    norm = _match_norm(node)
    if norm is None or not isinstance(norm.source, torch.fx.Node):
        return False
    first = _only_user(norm.result)
    if first is None:
        return False

    def dropout(n):  # (p, training) of a constant-parameter, out-of-place dropout node, else None
        params = _dropout_params(n) if n is not None else None
        if params is None or n.kwargs.get("inplace", False) or _arg(n, 3, "inplace", False):
            return None
        return params

    second = _only_user(first)
    p, training = 0.0, False
    first_drop = dropout(first)
    if first_drop is not None:
        (p, training), relu = first_drop, second is not None and _is_relu(second)
        chain, steps = ([first, second], "dropout → relu") if relu else ([first], "dropout")
    elif norm.rms and _is_relu(first):
        relu = True
        chain, steps = [first], "relu"
        second_drop = dropout(second)
        if second_drop is not None:
            (p, training), chain, steps = second_drop, [first, second], "relu → dropout"
    else:
        return False
    xv = _value(norm.source)
    if xv is None or xv.dtype not in _DTYPES or xv.device.type not in ("cpu", "cuda") or xv.dim() < 1:
        return False
    if not all(_same_like(n, xv) for n in (norm.result, *chain)):
        return False  # a result in another dtype or shape: not the same function
    if not (_param_ok(norm.weight, xv) and _param_ok(norm.bias, xv)):
        return False
    if norm.weight is not None and norm.bias is not None and _value(norm.weight).dtype != _value(norm.bias).dtype:
        return False
    last = chain[-1]
    act = "relu" if relu else None
    if not _provably_same(graph, {*norm.nodes, *chain}, (norm.source, norm.weight, norm.bias), last, [last]):
        return False
    with graph.inserting_before(last):
        new = graph.call_function(
            _norm_dropout, (norm.source, norm.weight, norm.bias, norm.rms, act, p, training, norm.eps)
        )
    new.meta.update(last.meta)
    last.replace_all_uses_with(new)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for dead in sorted({*norm.nodes, *chain}, key=order.__getitem__, reverse=True):
        graph.erase_node(dead)
    kind = "rms_norm" if norm.rms else "layer_norm"
    log.append(
        f"{norm.kind} → {steps} ({last.name}, p={p}, training={training}) -> gpuopt::norm_dropout ({kind}"
        f"{', relu' if relu else ''})"
    )
    return True


def _match_activation(node: torch.fx.Node):
    """(act name, last node of the activation) when node is the activation's input and it has no other user."""
    users = list(node.users)
    if len(users) == 1:
        u = users[0]
        if _calls(u, _GELU) and len(u.args) == 1 and set(u.kwargs) <= {"approximate"}:
            approx = u.kwargs.get("approximate", "none")
            if approx in ("none", "tanh"):
                return ("gelu" if approx == "none" else "gelu_tanh"), u
        if _calls(u, _SILU) and len(u.args) == 1 and not u.kwargs.get("inplace", False):
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
        if _node_and_const(u, _MUL, "mul", 0.5) is node:
            half = u
        elif _calls(u, _POW, ("pow",)) and len(u.args) == 2 and u.args[0] is node and _const(u.args[1]) == 3.0:
            cube = u
        elif _operands(u, _ADD, "add") is not None and node in u.args:
            inner = u
    if half is None or cube is None or inner is None or len(cube.users) != 1 or len(inner.users) != 1:
        return None
    scaled_cube = next(iter(cube.users))
    if _node_and_const(scaled_cube, _MUL, "mul", 0.044715) is not cube or set(inner.args) != {node, scaled_cube}:
        return None
    scaled = next(iter(inner.users))
    if _node_and_const(scaled, _MUL, "mul", _SQRT_2_OVER_PI, rel=1e-6) is not inner or len(scaled.users) != 1:
        return None
    th = next(iter(scaled.users))
    if not _calls(th, _TANH, ("tanh",)) or th.args != (scaled,) or th.kwargs or len(th.users) != 1:
        return None
    one_plus = next(iter(th.users))
    if _node_and_const(one_plus, _ADD, "add", 1.0) is not th or len(one_plus.users) != 1 or len(half.users) != 1:
        return None
    last = next(iter(one_plus.users))
    ops = _operands(last, _MUL, "mul")
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
        if _node_and_const(u, _MUL, "mul", 0.5) is node:
            half = u
        elif _node_and_const(u, _MUL, "mul", _SQRT_2_OVER_PI, rel=1e-6) is node:
            scaled = u
        elif _node_and_const(u, _MUL, "mul", 0.044715) is node:
            c1 = u
    if half is None or scaled is None or c1 is None:
        return None
    c2 = sole(c1)  # (0.044715 * x) * x
    if c2 is None or c2 not in users or set(_operands(c2, _MUL, "mul") or ()) != {c1, node}:
        return None
    inner = sole(c2)  # 1 + 0.044715 * x * x
    if inner is None or _node_and_const(inner, _ADD, "add", 1.0) is not c2:
        return None
    arg = sole(inner)  # 0.79788456 * x * (1 + ...)
    if arg is None or set(_operands(arg, _MUL, "mul") or ()) != {scaled, inner} or sole(scaled) is not arg:
        return None
    th = sole(arg)
    if th is None or not _calls(th, _TANH, ("tanh",)) or th.args != (arg,) or th.kwargs:
        return None
    one_plus = sole(th)
    if one_plus is None or _node_and_const(one_plus, _ADD, "add", 1.0) is not th:
        return None
    last = sole(one_plus)
    if last is None or sole(half) is not last or set(_operands(last, _MUL, "mul") or ()) != {half, one_plus}:
        return None
    return "gelu_tanh", last


def _rewrite_bias_act_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    if _calls(node, _LINEAR):
        x, weight, bias = node.args[0], _arg(node, 1, "weight", None), _arg(node, 2, "bias", None)
        if bias is None or not isinstance(weight, torch.fx.Node) or not _tensor_ok(x, [weight, bias]):
            return False
        if _value(bias).dim() != 1 or _rounds_to_16_bit(node):
            return False
        src, view, shape = node, None, None
    elif _calls(node, _ADDMM) and len(node.args) == 3 and not node.kwargs:
        bias, a, w = node.args
        if not all(isinstance(n, torch.fx.Node) for n in (bias, a, w)) or not _tensor_ok(a, [w, bias]):
            return False
        bv = _value(bias)
        if bv.dim() != 1 or _rounds_to_16_bit(node):
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
    yv, lv = _value(src), _value(last)
    if yv is None or lv is None or not _same_like(last, yv):
        return False
    # the nodes from src to last are the activation; collect them to erase
    order = {n: i for i, n in enumerate(graph.nodes)}
    dead, stack = set(), [last]
    while stack:
        n = stack.pop()
        if n in dead or n is src:
            continue
        dead.add(n)
        stack.extend(a for a in n.all_input_nodes if order[a] > order[src])
    inputs = (bias, a, w) if node.target in _ADDMM else (x, weight, bias)
    if not _provably_same(graph, dead | {src, node}, inputs, last, [last]):
        return False
    with graph.inserting_before(last):
        if node.target in _ADDMM:
            new = graph.call_function(_addmm_bias_act, (bias, a, w, shape, act))
        else:
            new = graph.call_function(_linear_bias_act, (x, weight, bias, act))
    new.meta.update(last.meta)
    last.replace_all_uses_with(new)
    for n in sorted(dead | {src, node}, key=order.__getitem__, reverse=True):
        graph.erase_node(n)
    if node.target in _ADDMM:
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
    if isinstance(src, torch.fx.Node) and len(a.args) == 1 and not _mutated(a):
        if _is_relu(a):
            return "relu", src, [a]
        if _calls(a, _GELU) and set(a.kwargs) <= {"approximate"}:
            approx = a.kwargs.get("approximate", "none")
            if approx in ("none", "tanh"):
                return ("gelu" if approx == "none" else "gelu_tanh"), src, [a]
        if _calls(a, _SILU) and set(a.kwargs) <= {"inplace"}:
            return "silu", src, [a]
    ops = _operands(a, _MUL, "mul")
    if ops is None:
        return None
    for g, s in (ops, ops[::-1]):  # g * sigmoid(g)
        if (
            isinstance(g, torch.fx.Node)
            and _calls(s, _SIGMOID, ("sigmoid",))
            and len(s.args) == 1
            and not s.kwargs
            and s.args[0] is g
        ):
            return "silu", g, [s, a]
    for o in ops:  # the tanh GELU written out: 0.5 * g * (1 + tanh(...)), rooted at its gate
        g = _node_and_const(o, _MUL, "mul", 0.5) if isinstance(o, torch.fx.Node) else None
        if g is None:
            continue
        found = _match_activation(g)
        if found is None or found[1] is not a:
            continue
        nodes, stack = set(), [a]
        while stack:
            n = stack.pop()
            if n in nodes or n is g:
                continue
            nodes.add(n)
            stack.extend(i for i in n.all_input_nodes if order[i] > order[g])
        return found[0], g, sorted(nodes, key=order.__getitem__)
    return None


def _last_dim(node: torch.fx.Node, dim: Any) -> bool:
    v = _value(node)
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
        yv = _value(y)
        if not isinstance(y, torch.fx.Node) or yv is None or yv.dim() < 1 or yv.shape[-1] % 2:
            return None
        half = yv.shape[-1] // 2
        if _calls(c, _CHUNK, ("chunk",)) and set(c.kwargs) <= {"dim", "chunks"}:
            ok = _arg(c, 1, "chunks", None) == 2 and _last_dim(y, _arg(c, 2, "dim", 0))
        elif _calls(c, _SPLIT, ("split",)) and set(c.kwargs) <= {"dim", "split_size", "split_size_or_sections"}:
            size = _arg(c, 1, "split_size", None) if c.op == "call_method" else None
            size = size if size is not None else _arg(c, 1, "split_size_or_sections", None)
            sizes = list(size) if isinstance(size, (list, tuple)) else [size, size]
            ok = sizes == [half, half] and _last_dim(y, _arg(c, 2, "dim", 0))
        else:
            ok = False
        return (y, [c]) if ok else None
    y = gate.args[0]
    if up.args[0] is not y or not isinstance(y, torch.fx.Node):
        return None
    yv = _value(y)
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


def _rewrite_gated_site(graph: torch.fx.Graph, node: torch.fx.Node, log: list[str]) -> bool:
    """act(gate) * up (either order) → one gated_act call; [gate | up] halves of one tensor → its packed layout."""
    ops = _operands(node, _MUL, "mul")
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
        gv, uv = _value(gate), _value(up)
        if gv is None or uv is None or gv.dtype not in _DTYPES or gv.device.type not in ("cpu", "cuda"):
            continue
        if gv.device.type == "cuda" and not has_kernel("gated_act", "CUDA"):
            return False  # a build without the op's CUDA kernels: the site stays as it is
        if gv.dim() < 1 or gv.shape[-1] < 1 or not _same_like(up, gv):
            continue  # gate and up of one shape, dtype and device: no broadcasting, no type promotion
        if not (_same_like(a, gv) and _same_like(node, gv)):
            continue  # the activation and the product in gate's dtype and shape
        dead = {*act_nodes, node}
        packed = _halves(gate, up)
        if packed is not None:
            y, views = packed
            yv = _value(y)
            if yv.dtype != gv.dtype or yv.device != gv.device or tuple(yv.shape[:-1]) != tuple(gv.shape[:-1]):
                continue
            for n in (gate, up, *views):  # the getitems / chunk go too, unless something else reads them
                if set(n.users) <= dead:
                    dead.add(n)
            inputs = [y]
        else:
            inputs = [gate, up]
        if not _provably_same(graph, dead, inputs, node, [node]):
            continue
        with graph.inserting_before(node):
            new = graph.call_function(_gated, (inputs[0], inputs[1] if len(inputs) == 2 else None, act))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        for n in sorted(dead, key=order.__getitem__, reverse=True):
            graph.erase_node(n)
        what = "[gate | up] halves" if packed is not None else "gate, up"
        log.append(f"{act}(gate) * up ({node.name}, {what}) -> gpuopt::gated_act ({act})")
        return True
    return False


def _rewrite_gated(gm: torch.fx.GraphModule, log: list[str]) -> int:
    """The gated-MLP rule, before the others: a gate projection with a bias keeps its linear (the matmul's bias
    add) and its activation goes into gated_act rather than bias_act / bias_relu."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if (
            node.graph is graph
            and node.op in ("call_function", "call_method")
            and _rewrite_gated_site(graph, node, log)
        ):
            count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count


def _rewrite_blocks(gm: torch.fx.GraphModule, log: list[str]) -> int:
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.graph is not graph or node.op not in ("call_function", "call_method"):
            continue
        if (
            _rewrite_norm_site(graph, node, log)
            or _rewrite_norm_dropout_site(graph, node, log)
            or _rewrite_bias_act_site(graph, node, log)
        ):
            count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count


def rewrite_graph(gm: torch.fx.GraphModule, verbose: bool = False) -> list[str]:
    """Rewrites the patterns in gm in place; returns one line per rewrite (printed when verbose)."""
    log: list[str] = []
    _rewrite_gated(gm, log)
    _rewrite(gm, log)
    _rewrite_blocks(gm, log)
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
    inductor = bool(options.pop("inductor", True))
    rewrite_graph(gm, verbose)
    if not inductor:
        return gm.forward
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

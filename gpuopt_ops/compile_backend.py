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

from typing import Any, Optional

import torch.fx

from .compile_act_rules import rewrite_bias_act_site, rewrite_gated_site, rewrite_linear_relu_site
from .compile_norm_rules import rewrite_ldr_site, rewrite_norm_dropout_site, rewrite_norm_site


def _rewrite_pass(gm: torch.fx.GraphModule, log: list[str], sites) -> int:
    """One walk over the graph: at each call node, the first of `sites` (rule functions of (graph, node, log) that
    rewrite the site and return True, or leave it and return False) that applies. Returns the rewrites' count."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.graph is not graph or node.op not in ("call_function", "call_method"):
            continue
        if any(site(graph, node, log) for site in sites):
            count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count


def rewrite_graph(gm: torch.fx.GraphModule, verbose: bool = False) -> list[str]:
    """Rewrites the patterns in gm in place; returns one line per rewrite (printed when verbose)."""
    log: list[str] = []
    # the gated-MLP rule first: a gate projection with a bias keeps its linear (the matmul's bias add) and its
    # activation goes into gated_act rather than bias_act / bias_relu
    _rewrite_pass(gm, log, (rewrite_gated_site,))
    _rewrite_pass(gm, log, (rewrite_ldr_site, rewrite_linear_relu_site))
    _rewrite_pass(gm, log, (rewrite_norm_site, rewrite_norm_dropout_site, rewrite_bias_act_site))
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

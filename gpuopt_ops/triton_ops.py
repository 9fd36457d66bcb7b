"""Triton twins of the gpuopt ops, registered with torch.library.triton_op + wrap_triton.

    torch.ops.gpuopt.triton_layer_norm_dropout_relu(x, weight, bias, seed, p, eps) -> (out, mean, rstd)
    torch.ops.gpuopt.triton_layer_norm_dropout_relu_backward(grad_out, x, weight, bias, mean, rstd, seed, p)
    torch.ops.gpuopt.triton_norm_dropout(x, weight, bias, seed, p, eps, rms, relu) -> (out, mean, rstd)
    torch.ops.gpuopt.triton_norm_dropout_backward(grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu)
        -> (grad_x, grad_weight, grad_bias)
    torch.ops.gpuopt.triton_bias_relu(x, bias) -> out
    torch.ops.gpuopt.triton_bias_relu_backward(grad_out, out) -> (grad_x, grad_bias)
    torch.ops.gpuopt.triton_bias_act(x, bias, act) -> out
    torch.ops.gpuopt.triton_bias_act_backward(grad_out, saved, bias, act) -> (grad_x, grad_bias)
    torch.ops.gpuopt.triton_dropout_add_norm(x, residual, weight, bias, seed, p, eps, rms, residual_in_fp32)
        -> (out, sum, mean, rstd)
    torch.ops.gpuopt.triton_dropout_add_norm_backward(grad_out, grad_sum, sum, weight, bias, mean, rstd, seed, p,
        rms, has_residual) -> (grad_x, grad_residual, grad_weight, grad_bias)
    torch.ops.gpuopt.triton_gated_act(gate, up, seed, p, act) -> out
    torch.ops.gpuopt.triton_gated_act_backward(grad_out, gate, up, seed, p, act) -> (grad_gate, grad_up)

Same schemas, input checks (gpuopt_ops/checks.py: the C++ messages word for word), outputs and dropout
bits as the C++ ops; autograd is that of the C++ ops (ops.register_ldr_autograd / register_norm_dropout_autograd /
register_bias_relu_autograd / register_bias_act_autograd / register_dropout_add_norm_autograd /
register_gated_act_autograd). norm_dropout runs layer_norm_dropout_relu's kernels with its rms / relu flags as
constexprs (rms=False, relu=True: the same kernels, the same bits).
The kernels are in triton_kernels/ (repository root), installed as gpuopt_ops.triton_kernels.

On a GPU the ops run compiled Triton kernels, and torch.compile decomposes them into the kernels (Inductor sees
into them). Without a GPU they run on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1 set before
triton_kernels is imported). Interpreted kernels cannot run on fake tensors, so in that mode the ops are kept
opaque under torch.compile (not decomposed: Inductor calls the op, which runs the interpreter) and the fake
kernel only computes output metadata.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Optional

import torch

try:
    import triton  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised only without triton
    raise ImportError(
        f"gpuopt_ops.triton_ops needs the `triton` package ({err}). Install it (`pip install triton`; it comes "
        "with CUDA builds of torch on Linux) or use backend='cpu' / backend='cuda'."
    ) from err


def _import_triton_kernels():
    """Import the kernels as gpuopt_ops.triton_kernels (setup.py maps the repository's triton_kernels/ folder
    there). From a source tree on sys.path without an install, load that folder under the same name."""
    name = __package__ + ".triton_kernels"
    try:
        importlib.import_module(name)
        return
    except ModuleNotFoundError as err:
        if err.name != name:
            raise
        pkg = Path(__file__).resolve().parent.parent / "triton_kernels"
        if not (pkg / "__init__.py").is_file():
            raise ImportError(
                "gpuopt_ops.triton_ops: cannot import gpuopt_ops.triton_kernels (reinstall gpuopt with "
                "`pip install --no-build-isolation -e .`)"
            ) from err
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)


_import_triton_kernels()

from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402
from torch._subclasses.functional_tensor import FunctionalTensorMode  # noqa: E402
from torch.library import triton_op, wrap_triton  # noqa: E402

from gpuopt_ops.triton_kernels import bias_act as _BR  # noqa: E402
from gpuopt_ops.triton_kernels import common as _COMMON  # noqa: E402
from gpuopt_ops.triton_kernels import dropout_add_norm as _DAN  # noqa: E402
from gpuopt_ops.triton_kernels import gated_act as _GA  # noqa: E402
from gpuopt_ops.triton_kernels import norm_dropout as _ND  # noqa: E402

from . import checks as V  # noqa: E402
from . import dtensor  # noqa: E402
from .autograd import (  # noqa: E402
    register_bias_act_autograd,
    register_bias_relu_autograd,
    register_dropout_add_norm_autograd,
    register_gated_act_autograd,
    register_ldr_autograd,
    register_norm_dropout_autograd,
)

# Whether the kernels were decorated under TRITON_INTERPRET=1 (tests patch this name to simulate the other case).
INTERPRETED = _COMMON.INTERPRETED


def _launch_wrapper():
    """How the ops launch their kernels: through wrap_triton (so torch.compile/AOT dispatch see into them) wherever
    wrap_triton takes our kernel objects; it always takes compiled kernels (triton.jit JITFunctions). Some torch
    versions (2.11) refuse the interpreter's kernel objects ("wrap_triton only works on functions annotated with
    triton.jit or triton.autotune"): interpreted kernels are then launched directly, kernel[grid](...), which
    loses nothing, since under the interpreter the ops are opaque to torch.compile anyway. Decided by trying
    wrap_triton once (capability, not version)."""
    try:
        wrap_triton(_ND.nd_fwd_fused_kernel)
    except RuntimeError:
        if INTERPRETED:
            return _COMMON.launch_directly
        raise
    return _kept_wrappers(wrap_triton)


def _kept_wrappers(wrap):
    """wrap, its result kept per kernel: wrap_triton(kernel) builds a new wrapper object (a few microseconds a
    launch) that holds only the kernel, so one per kernel serves every launch, traced or not."""
    kept = {}

    def kept_wrap(kernel):
        got = kept.get(id(kernel))
        if got is None:
            got = kept[id(kernel)] = wrap(kernel)  # holds the kernel: its id is never reused
        return got

    return kept_wrap


_WRAP = _launch_wrapper()

_KERNELS = {
    "gpuopt::triton_layer_norm_dropout_relu": [_ND.nd_fwd_fused_kernel, _ND.nd_fwd_looped_kernel],
    "gpuopt::triton_layer_norm_dropout_relu_backward": [
        _ND.nd_bwd_fused_kernel,
        _ND.nd_bwd_row_coef_kernel,
        _ND.nd_bwd_chunk_kernel,
        _COMMON.sum_partials_kernel,
    ],
    "gpuopt::triton_norm_dropout": [_ND.nd_fwd_fused_kernel, _ND.nd_fwd_looped_kernel],
    "gpuopt::triton_norm_dropout_backward": [
        _ND.nd_bwd_fused_kernel,
        _ND.nd_bwd_row_coef_kernel,
        _ND.nd_bwd_chunk_kernel,
        _COMMON.sum_partials_kernel,
    ],
    "gpuopt::triton_bias_relu": [_BR.bias_act_fwd_kernel],
    "gpuopt::triton_bias_relu_backward": [_BR.bias_act_bwd_kernel, _COMMON.sum_partials_kernel],
    "gpuopt::triton_bias_act": [_BR.bias_act_fwd_kernel],
    "gpuopt::triton_bias_act_backward": [_BR.bias_act_bwd_kernel, _COMMON.sum_partials_kernel],
    "gpuopt::triton_dropout_add_norm": [_DAN.dan_fwd_fused_kernel, _DAN.dan_fwd_looped_kernel],
    "gpuopt::triton_dropout_add_norm_backward": [
        _DAN.dan_bwd_fused_kernel,
        _DAN.dan_bwd_row_coef_kernel,
        _DAN.dan_bwd_chunk_kernel,
        _COMMON.sum_partials_kernel,
    ],
    "gpuopt::triton_gated_act": [_GA.gated_act_fwd_kernel],
    "gpuopt::triton_gated_act_backward": [_GA.gated_act_bwd_kernel],
}

SCHEMAS = {
    "gpuopt::triton_layer_norm_dropout_relu": (
        "(Tensor x, Tensor? weight, Tensor? bias, Tensor seed, float p, float eps)"
        " -> (Tensor out, Tensor mean, Tensor rstd)"
    ),
    "gpuopt::triton_layer_norm_dropout_relu_backward": (
        "(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd, Tensor seed,"
        " float p) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)"
    ),
    "gpuopt::triton_norm_dropout": (
        "(Tensor x, Tensor? weight, Tensor? bias, Tensor seed, float p, float eps, bool rms, bool relu)"
        " -> (Tensor out, Tensor mean, Tensor rstd)"
    ),
    "gpuopt::triton_norm_dropout_backward": (
        "(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd,"
        " Tensor seed, float p, bool rms, bool relu) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)"
    ),
    "gpuopt::triton_bias_relu": "(Tensor x, Tensor bias) -> Tensor",
    "gpuopt::triton_bias_relu_backward": "(Tensor grad_out, Tensor out) -> (Tensor grad_x, Tensor grad_bias)",
    "gpuopt::triton_bias_act": "(Tensor x, Tensor bias, int act) -> Tensor",
    "gpuopt::triton_bias_act_backward": (
        "(Tensor grad_out, Tensor saved, Tensor bias, int act) -> (Tensor grad_x, Tensor grad_bias)"
    ),
    "gpuopt::triton_dropout_add_norm": (
        "(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, Tensor seed, float p, float eps, bool rms,"
        " bool residual_in_fp32) -> (Tensor out, Tensor sum, Tensor mean, Tensor rstd)"
    ),
    "gpuopt::triton_dropout_add_norm_backward": (
        "(Tensor grad_out, Tensor? grad_sum, Tensor sum, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd,"
        " Tensor seed, float p, bool rms, bool has_residual)"
        " -> (Tensor grad_x, Tensor grad_residual, Tensor grad_weight, Tensor grad_bias)"
    ),
    "gpuopt::triton_gated_act": "(Tensor gate, Tensor? up, Tensor seed, float p, int act) -> Tensor",
    "gpuopt::triton_gated_act_backward": (
        "(Tensor grad_out, Tensor gate, Tensor? up, Tensor seed, float p, int act)"
        " -> (Tensor grad_gate, Tensor grad_up)"
    ),
}


def _skip_launch(x: torch.Tensor, op: str) -> bool:
    """True when only output metadata is wanted (fake/meta tensors under the interpreter); raises when the
    kernels cannot run on x's device."""
    if x.device.type == "meta":
        return True
    if isinstance(x, FakeTensor):
        return INTERPRETED  # compiled kernels: wrap_triton traces them; interpreted ones cannot run on fakes
    if x.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            f"gpuopt.{op}: the Triton kernels were compiled for the GPU and cannot run on CPU tensors. Set "
            "TRITON_INTERPRET=1 before importing triton (and gpuopt_ops.triton_ops) to run them on the CPU under "
            "Triton's interpreter, or use the C++ op (backend='cpu')."
        )
    return False


def _contig(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.contiguous()


def _triton_op(name: str):
    # The exact schema (named returns, as the C++ ops) where triton_op takes and honours `schema=`; older torch
    # infers it from the annotations below: same arguments and types, unnamed returns.
    if "schema" in inspect.signature(triton_op).parameters:
        return triton_op(name, mutates_args=(), schema=SCHEMAS[name])
    return triton_op(name, mutates_args=())


def _norm_forward(op: str, m: int, x, weight, bias, seed, p: float, eps: float, rms: bool, relu: bool):
    """layer_norm_dropout_relu's / norm_dropout's forward (checked: m rows): outputs, then the launch."""
    acc = V.acc_dtype(x.dtype)
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty((0,) if rms else (m,), dtype=acc, device=x.device)
    rstd = torch.empty((m,), dtype=acc, device=x.device)
    if not _skip_launch(x, op):
        _ND.launch_forward(
            x, _contig(weight), _contig(bias), seed, out, mean, rstd, p, eps, rms=rms, relu=relu, wrap=_WRAP
        )
    return out, mean, rstd


def _norm_backward(op: str, n: int, param_dtype, grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu):
    """layer_norm_dropout_relu's / norm_dropout's backward (checked: n columns, the parameters' dtype)."""
    x = x.contiguous()
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    # the kernels write every element (the launcher zeroes them when M = 0: sums over no rows)
    grad_w = torch.empty((n,) if weight is not None else (0,), dtype=param_dtype, device=x.device)
    grad_b = torch.empty((n,) if bias is not None else (0,), dtype=param_dtype, device=x.device)
    if not _skip_launch(x, op):
        _ND.launch_backward(
            grad_out.contiguous(),
            x,
            _contig(weight),
            _contig(bias),
            mean.contiguous(),
            rstd.contiguous(),
            seed,
            grad_x,
            grad_w,
            grad_b,
            p,
            rms=rms,
            relu=relu,
            wrap=_WRAP,
        )
    return grad_x, grad_w, grad_b


@_triton_op("gpuopt::triton_layer_norm_dropout_relu")
def _ldr_forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    seed: torch.Tensor,
    p: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, _, _ = V.check_ldr_forward(x, weight, bias, seed, p, eps)
    return _norm_forward("layer_norm_dropout_relu", m, x, weight, bias, seed, p, eps, False, True)


@_triton_op("gpuopt::triton_layer_norm_dropout_relu_backward")
def _ldr_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    seed: torch.Tensor,
    p: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, n, param_dtype = V.check_ldr_backward(grad_out, x, weight, bias, mean, rstd, seed, p)
    args = (grad_out, x, weight, bias, mean, rstd, seed, p, False, True)
    return _norm_backward("layer_norm_dropout_relu_backward", n, param_dtype, *args)


@_triton_op("gpuopt::triton_norm_dropout")
def _nd_forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    seed: torch.Tensor,
    p: float,
    eps: float,
    rms: bool,
    relu: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, _, _ = V.check_norm_dropout(x, weight, bias, seed, p, eps, rms, relu)
    return _norm_forward("norm_dropout", m, x, weight, bias, seed, p, eps, rms, relu)


@_triton_op("gpuopt::triton_norm_dropout_backward")
def _nd_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    seed: torch.Tensor,
    p: float,
    rms: bool,
    relu: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, n, param_dtype = V.check_norm_dropout_backward(grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu)
    args = (grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu)
    return _norm_backward("norm_dropout_backward", n, param_dtype, *args)


@_triton_op("gpuopt::triton_bias_relu")
def _bias_relu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    V.check_bias_relu(x, bias)
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not _skip_launch(x, "bias_relu"):
        _BR.launch_forward(x, bias.contiguous(), out, wrap=_WRAP)
    return out


@_triton_op("gpuopt::triton_bias_relu_backward")
def _bias_relu_backward(grad_out: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _, n = V.check_bias_relu_backward(grad_out, out)
    out = out.contiguous()
    grad_x = torch.empty(out.shape, dtype=out.dtype, device=out.device)
    # the unrounded sum, as the C++ op; every element is written (zeroed by the launcher when M = 0)
    grad_b = torch.empty((n,), dtype=V.acc_dtype(out.dtype), device=out.device)
    if not _skip_launch(out, "bias_relu_backward"):
        _BR.launch_backward(grad_out.contiguous(), out, grad_x, grad_b, wrap=_WRAP)
    return grad_x, grad_b


@_triton_op("gpuopt::triton_bias_act")
def _bias_act(x: torch.Tensor, bias: torch.Tensor, act: int) -> torch.Tensor:
    V.check_bias_act(x, bias, act)
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not _skip_launch(x, "bias_act"):
        _BR.launch_forward(x, bias.contiguous(), out, act=act, wrap=_WRAP)
    return out


@_triton_op("gpuopt::triton_bias_act_backward")
def _bias_act_backward(
    grad_out: torch.Tensor, saved: torch.Tensor, bias: torch.Tensor, act: int
) -> tuple[torch.Tensor, torch.Tensor]:
    _, n = V.check_bias_act_backward(grad_out, saved, bias, act)
    saved = saved.contiguous()
    grad_x = torch.empty(saved.shape, dtype=saved.dtype, device=saved.device)
    grad_b = torch.empty((n,), dtype=V.acc_dtype(saved.dtype), device=saved.device)
    if not _skip_launch(saved, "bias_act_backward"):
        _BR.launch_backward(grad_out.contiguous(), saved, grad_x, grad_b, bias=bias.contiguous(), act=act, wrap=_WRAP)
    return grad_x, grad_b


@_triton_op("gpuopt::triton_dropout_add_norm")
def _dan_forward(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    seed: torch.Tensor,
    p: float,
    eps: float,
    rms: bool,
    residual_in_fp32: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    m, _, _, s_dtype = V.check_dropout_add_norm(x, residual, weight, bias, seed, p, eps, rms, residual_in_fp32)
    acc = V.acc_dtype(x.dtype)
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    sum_ = torch.empty(x.shape, dtype=s_dtype, device=x.device)
    mean = torch.empty((0,) if rms else (m,), dtype=acc, device=x.device)
    rstd = torch.empty((m,), dtype=acc, device=x.device)
    if not _skip_launch(x, "dropout_add_norm"):
        _DAN.launch_forward(
            x, _contig(residual), _contig(weight), _contig(bias), seed, out, sum_, mean, rstd, p, eps, rms, wrap=_WRAP
        )
    return out, sum_, mean, rstd


@_triton_op("gpuopt::triton_dropout_add_norm_backward")
def _dan_backward(
    grad_out: torch.Tensor,
    grad_sum: Optional[torch.Tensor],
    sum: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    seed: torch.Tensor,
    p: float,
    rms: bool,
    has_residual: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _, n, param_dtype, s_dtype = V.check_dropout_add_norm_backward(
        grad_out, grad_sum, sum, weight, bias, mean, rstd, seed, p, rms, has_residual
    )
    grad_out = grad_out.contiguous()
    dev = grad_out.device
    grad_x = torch.empty(grad_out.shape, dtype=grad_out.dtype, device=dev)
    grad_res = torch.empty(grad_out.shape if has_residual else (0,), dtype=s_dtype, device=dev)
    # the kernels write every element (the launcher zeroes them when M = 0: sums over no rows)
    grad_w = torch.empty((n,) if weight is not None else (0,), dtype=param_dtype, device=dev)
    grad_b = torch.empty((n,) if bias is not None else (0,), dtype=param_dtype, device=dev)
    if not _skip_launch(grad_out, "dropout_add_norm_backward"):
        _DAN.launch_backward(
            grad_out,
            _contig(grad_sum),
            sum.contiguous(),
            _contig(weight),
            _contig(bias),
            mean.contiguous(),
            rstd.contiguous(),
            seed,
            grad_x,
            grad_res if has_residual else None,
            grad_w,
            grad_b,
            p,
            rms,
            wrap=_WRAP,
        )
    return grad_x, grad_res, grad_w, grad_b


@_triton_op("gpuopt::triton_gated_act")
def _gated_act(gate: torch.Tensor, up: Optional[torch.Tensor], seed: torch.Tensor, p: float, act: int) -> torch.Tensor:
    _, f = V.check_gated_act(gate, up, seed, p, act)
    gate = gate.contiguous()
    out = torch.empty((*gate.shape[:-1], f), dtype=gate.dtype, device=gate.device)
    if not _skip_launch(gate, "gated_act"):
        _GA.launch_forward(gate, _contig(up), seed, out, p, act=act, wrap=_WRAP)
    return out


@_triton_op("gpuopt::triton_gated_act_backward")
def _gated_act_backward(
    grad_out: torch.Tensor, gate: torch.Tensor, up: Optional[torch.Tensor], seed: torch.Tensor, p: float, act: int
) -> tuple[torch.Tensor, torch.Tensor]:
    V.check_gated_act_backward(grad_out, gate, up, seed, p, act)
    gate = gate.contiguous()
    # every element is written; one tensor [grad_gate | grad_up] for the [gate | up] layout, grad_up (0,) there
    grad_gate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    grad_up = torch.empty(up.shape if up is not None else (0,), dtype=gate.dtype, device=gate.device)
    if not _skip_launch(gate, "gated_act_backward"):
        _GA.launch_backward(grad_out.contiguous(), gate, _contig(up), seed, grad_gate, grad_up, p, act=act, wrap=_WRAP)
    return grad_gate, grad_up


_OPDEFS = (
    _ldr_forward,
    _ldr_backward,
    _nd_forward,
    _nd_backward,
    _bias_relu,
    _bias_relu_backward,
    _bias_act,
    _bias_act_backward,
    _dan_forward,
    _dan_backward,
    _gated_act,
    _gated_act_backward,
)


def _register_kernels_for_cache_keys() -> None:
    # triton_op finds the kernels of an op by reading its source for `wrap_triton(name)`; ours are launched by
    # the helpers in triton_kernels/, so list them explicitly (AOTAutograd's cache key hashes their source).
    table = getattr(getattr(torch._library, "triton", None), "triton_ops_to_kernels", None)
    if isinstance(table, dict):
        for name, kernels in _KERNELS.items():
            table[name] = list(kernels)


def _keep_opaque_under_interpreter() -> None:
    # triton_op decomposes the op into its kernels under FunctionalTensorMode (AOTAutograd); interpreted kernels
    # cannot run on the fake tensors that tracing uses, so keep the op opaque, like a plain custom op.
    def opaque(mode, op, types, args, kwargs):
        return mode.__torch_dispatch__(op, types, args, kwargs)

    for opdef in _OPDEFS:
        opdef.register_torch_dispatch(FunctionalTensorMode, opaque)


_register_kernels_for_cache_keys()
if INTERPRETED:
    _keep_opaque_under_interpreter()

triton_layer_norm_dropout_relu = torch.ops.gpuopt.triton_layer_norm_dropout_relu
triton_layer_norm_dropout_relu_backward = torch.ops.gpuopt.triton_layer_norm_dropout_relu_backward
triton_norm_dropout = torch.ops.gpuopt.triton_norm_dropout
triton_norm_dropout_backward = torch.ops.gpuopt.triton_norm_dropout_backward
triton_bias_relu = torch.ops.gpuopt.triton_bias_relu
triton_bias_relu_backward = torch.ops.gpuopt.triton_bias_relu_backward
triton_bias_act = torch.ops.gpuopt.triton_bias_act
triton_bias_act_backward = torch.ops.gpuopt.triton_bias_act_backward
triton_dropout_add_norm = torch.ops.gpuopt.triton_dropout_add_norm
triton_dropout_add_norm_backward = torch.ops.gpuopt.triton_dropout_add_norm_backward
triton_gated_act = torch.ops.gpuopt.triton_gated_act
triton_gated_act_backward = torch.ops.gpuopt.triton_gated_act_backward

register_ldr_autograd("gpuopt::triton_layer_norm_dropout_relu", triton_layer_norm_dropout_relu_backward)
register_norm_dropout_autograd("gpuopt::triton_norm_dropout", triton_norm_dropout_backward)
register_bias_relu_autograd("gpuopt::triton_bias_relu", triton_bias_relu_backward)
register_bias_act_autograd("gpuopt::triton_bias_act", triton_bias_act_backward)
register_dropout_add_norm_autograd("gpuopt::triton_dropout_add_norm", triton_dropout_add_norm_backward)
register_gated_act_autograd("gpuopt::triton_gated_act", triton_gated_act_backward)
dtensor.register("triton_")

__all__ = [
    "triton_layer_norm_dropout_relu",
    "triton_layer_norm_dropout_relu_backward",
    "triton_norm_dropout",
    "triton_norm_dropout_backward",
    "triton_bias_relu",
    "triton_bias_relu_backward",
    "triton_bias_act",
    "triton_bias_act_backward",
    "triton_dropout_add_norm",
    "triton_dropout_add_norm_backward",
    "triton_gated_act",
    "triton_gated_act_backward",
    "INTERPRETED",
]

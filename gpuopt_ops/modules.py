"""nn.Module drop-ins for the fused ops.

Parameter names, shapes and initialisation match the unfused PyTorch modules, so state dicts load both ways:

- `FusedLayerNormDropoutReLU`  ≙ nn.LayerNorm → nn.Dropout → nn.ReLU   (parameters `weight`, `bias`)
- `FusedBiasReLU`              ≙ x + bias → nn.ReLU                    (parameter `bias`)
- `LinearBiasReLU`             ≙ nn.Linear → nn.ReLU                   (parameters `weight`, `bias`)
- `LinearBiasAct`              ≙ nn.Linear → nn.GELU / nn.GELU("tanh") / nn.SiLU / nn.ReLU
- `FusedDropoutAddLayerNorm`   ≙ nn.LayerNorm(dropout(x) + residual)   (parameters `weight`, `bias`)
- `FusedDropoutAddRMSNorm`     ≙ nn.RMSNorm(dropout(x) + residual)     (parameter `weight`)
- `FusedLayerNormDropout`      ≙ nn.LayerNorm → nn.Dropout (→ nn.ReLU) (parameters `weight`, `bias`)
- `FusedRMSNormDropout`        ≙ nn.RMSNorm → nn.Dropout (→ nn.ReLU)   (parameter `weight`)
- `GatedMLP`                   ≙ HF LLaMA's MLP, down(act(gate(x)) * up(x)) (`gate_proj`, `up_proj`, `down_proj`;
                                 fused=True: Phi-3's `gate_up_proj`, `down_proj`)

`backend` is "auto" (CUDA kernels on CUDA tensors, C++ on CPU), "cuda", "cpu" or "triton" (see backends.py).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .backends import resolve_backend
from .dtensor import ShardsAsLinear
from .ops import (
    ACTIVATIONS,
    NORM_ACTIVATIONS,
    bias_act,
    bias_relu,
    dropout_add_norm,
    gated_act,
    layer_norm_dropout_relu,
    norm_dropout,
)
from .reference import activation

_ShapeT = Union[int, Sequence[int]]


def default_rms_eps(dtype: torch.dtype) -> float:
    """The eps that `F.rms_norm` / `nn.RMSNorm` use when eps is None: the machine epsilon of the type they compute
    in, which is fp32 for fp16 and bf16 inputs (not the 16-bit type's own epsilon) and the input's type otherwise."""
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    return torch.finfo(compute).eps


class _FusedNorm(nn.Module):
    """What the fused norm modules share: normalized_shape (one dimension, but for FusedLayerNormDropoutReLU's), p,
    eps (None: nn.RMSNorm's default, `default_rms_eps(x.dtype)`), backend, nn.LayerNorm's / nn.RMSNorm's parameters
    and initialisation, the op's keyword arguments."""

    _norm = "layer"

    def _setup(self, normalized_shape, p, eps, backend, one_dimension: bool = True) -> None:
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (int(normalized_shape),)
        self.normalized_shape = tuple(int(s) for s in normalized_shape)
        if one_dimension and len(self.normalized_shape) != 1:
            raise ValueError(
                f"{type(self).__name__}: normalized_shape must be one dimension (the last of x), "
                f"got {self.normalized_shape}"
            )
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = float(p)
        self.eps = None if eps is None else float(eps)
        self.backend = resolve_backend(backend)

    def _add_parameters(self, elementwise_affine: bool, bias: Optional[bool], device, dtype) -> None:
        """`weight` and `bias` of normalized_shape as nn.LayerNorm registers them (None when not affine or
        bias=False; bias=None: no bias at all, nn.RMSNorm's parameters: `weight` alone), initialised."""
        names = ("weight",) if bias is None else ("weight", "bias")
        for name in names:
            wanted = elementwise_affine and (name == "weight" or bias)
            empty = torch.empty(self.normalized_shape, device=device, dtype=dtype)
            self.register_parameter(name, nn.Parameter(empty) if wanted else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.LayerNorm's / nn.RMSNorm's initialisation: weight ones, bias zeros."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if getattr(self, "bias", None) is not None:
            nn.init.zeros_(self.bias)

    def _op_kwargs(self, x: torch.Tensor) -> dict:
        eps = default_rms_eps(x.dtype) if self.eps is None else self.eps
        return dict(norm=self._norm, p=self.p, training=self.training, eps=eps, backend=self.backend)

    def _params(self) -> tuple:
        return self.weight, getattr(self, "bias", None)

    def _repr(self, extra: str) -> str:
        return (
            f"{self.normalized_shape}, p={self.p}, eps={self.eps}, elementwise_affine={self.weight is not None}, "
            f"{extra}, backend={self.backend!r}"
        )


class FusedLayerNormDropoutReLU(_FusedNorm):
    """relu(dropout(layer_norm(x))) in one kernel; a drop-in for LayerNorm → Dropout(p) → ReLU.

    The dropout seed is drawn from torch's generator on x's device at each training forward, so
    torch.manual_seed reproduces a run and activation checkpointing (which restores the RNG state) recomputes
    the same mask. `eval()` turns dropout off.
    """

    def __init__(
        self,
        normalized_shape: _ShapeT,
        p: float = 0.1,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        backend: str = "auto",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self._setup(normalized_shape, p, float(eps), backend, one_dimension=False)
        self.elementwise_affine = elementwise_affine
        self._add_parameters(elementwise_affine, bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_dropout_relu(
            x,
            self.normalized_shape,
            self.weight,
            self.bias,
            p=self.p,
            training=self.training,
            eps=self.eps,
            backend=self.backend,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, p={self.p}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}, "
            f"backend={self.backend!r}"
        )


class FusedBiasReLU(nn.Module):
    """relu(x + bias) with bias of shape (num_features,) over the last dimension; backward fuses the dbias sum."""

    def __init__(self, num_features: int, backend: str = "auto", device=None, dtype=None) -> None:
        super().__init__()
        self.num_features = int(num_features)
        self.backend = resolve_backend(backend)
        self.bias = nn.Parameter(torch.zeros(self.num_features, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_relu(x, self.bias, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{self.num_features}, backend={self.backend!r}"


def matmul_rounds_to_16_bit(x: torch.Tensor) -> bool:
    """Whether F.linear(x, w) returns bf16 / fp16: x's dtype, or autocast's when autocast is on for x's device.

    Then the bias must stay in the matmul. nn.Linear adds it inside the fp32 accumulation and rounds once; a bias
    added after the matmul's rounding carries that rounding's error, half a 16-bit ulp of x @ w.T, which is large
    against the result where the bias cancels most of it (a 16-bit LayerNorm → Linear → ReLU stack measured 0.054
    from fp64 this way, against eager's 0.015)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type) in (torch.bfloat16, torch.float16)
    return x.dtype in (torch.bfloat16, torch.float16)


class _LinearBias(ShardsAsLinear, nn.Module):
    """What LinearBiasReLU and LinearBiasAct share: nn.Linear(in_features, out_features)'s parameters and
    initialisation, so nn.Linear state dicts load unchanged, and the backend."""

    def __init__(self, in_features: int, out_features: int, backend: str, device, dtype) -> None:
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.backend = resolve_backend(backend)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(self.out_features, self.in_features, **factory))
        self.bias = nn.Parameter(torch.empty(self.out_features, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's initialisation, in the same order (weight, then bias), so a seeded model matches it
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        fan_in = self.in_features
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(self.bias, -bound, bound)


class LinearBiasReLU(_LinearBias):
    """relu(x @ weight.T + bias): a bias-free matmul, then the fused bias-add + ReLU.

    In bf16 / fp16 (the dtype of x, or autocast's) it is nn.Linear then ReLU: the bias is added inside the matmul's
    fp32 accumulation, before its one rounding, as nn.Linear does (see `matmul_rounds_to_16_bit`).

    Same parameters and initialisation as nn.Linear(in_features, out_features), so a state dict of
    nn.Linear (or of nn.Sequential(nn.Linear, nn.ReLU)'s first entry) loads unchanged.
    """

    def __init__(self, in_features: int, out_features: int, backend: str = "auto", device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, backend, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if matmul_rounds_to_16_bit(x):
            return torch.relu(F.linear(x, self.weight, self.bias))
        return bias_relu(F.linear(x, self.weight), self.bias, backend=self.backend)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, backend={self.backend!r}"


class LinearBiasAct(_LinearBias):
    """act(x @ weight.T + bias): a bias-free matmul, then the fused bias-add + activation (gpuopt_ops.bias_act).
    In bf16 / fp16 it is nn.Linear then the activation, as LinearBiasReLU is.

    act is "gelu" (erf), "gelu_tanh", "silu" or "relu". Same parameters and initialisation as
    nn.Linear(in_features, out_features), so nn.Linear state dicts load unchanged.
    """

    def __init__(
        self, in_features: int, out_features: int, act: str = "gelu", backend: str = "auto", device=None, dtype=None
    ) -> None:
        if act not in ACTIVATIONS:
            raise ValueError(f"LinearBiasAct: act must be one of {', '.join(map(repr, ACTIVATIONS))}, got {act!r}")
        super().__init__(in_features, out_features, backend, device, dtype)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if matmul_rounds_to_16_bit(x):
            return activation(F.linear(x, self.weight, self.bias), ACTIVATIONS[self.act])
        return bias_act(F.linear(x, self.weight), self.bias, act=self.act, backend=self.backend)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, act={self.act!r}, "
            f"backend={self.backend!r}"
        )


class _FusedDropoutAddNorm(_FusedNorm):
    """norm(dropout(x) + residual) in one kernel (gpuopt_ops.dropout_add_norm); forward(x, residual=None).

    Returns the normalized output, or (output, sum) with prenorm=True, the sum being the next block's residual
    (kept in fp32 for fp16/bf16 x with residual_in_fp32=True). Dropout is drawn from torch's generator on x's
    device in training and is off in eval(); p = 0 and no residual is the plain norm.
    """

    def _setup_dan(self, normalized_shape, p, eps, prenorm, residual_in_fp32, backend) -> None:
        self._setup(normalized_shape, p, eps, backend)
        self.prenorm = bool(prenorm)
        self.residual_in_fp32 = bool(residual_in_fp32)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        return dropout_add_norm(
            x,
            residual,
            *self._params(),
            prenorm=self.prenorm,
            residual_in_fp32=self.residual_in_fp32,
            **self._op_kwargs(x),
        )

    def extra_repr(self) -> str:
        return self._repr(f"prenorm={self.prenorm}, residual_in_fp32={self.residual_in_fp32}")


class FusedDropoutAddLayerNorm(_FusedDropoutAddNorm):
    """LayerNorm(dropout(x) + residual); nn.LayerNorm's parameters (`weight`, `bias`) and initialisation."""

    def __init__(
        self,
        normalized_shape: _ShapeT,
        p: float = 0.0,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        prenorm: bool = False,
        residual_in_fp32: bool = False,
        backend: str = "auto",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self._setup_dan(normalized_shape, p, float(eps), prenorm, residual_in_fp32, backend)
        self._add_parameters(elementwise_affine, bias, device, dtype)


class FusedDropoutAddRMSNorm(_FusedDropoutAddNorm):
    """RMSNorm(dropout(x) + residual); nn.RMSNorm's parameter (`weight`), initialisation and eps default (None:
    `default_rms_eps(x.dtype)`)."""

    _norm = "rms"

    def __init__(
        self,
        normalized_shape: _ShapeT,
        p: float = 0.0,
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        prenorm: bool = False,
        residual_in_fp32: bool = False,
        backend: str = "auto",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self._setup_dan(normalized_shape, p, eps, prenorm, residual_in_fp32, backend)
        self._add_parameters(elementwise_affine, None, device, dtype)


class _FusedNormDropout(_FusedNorm):
    """act(dropout(norm(x))) in one kernel (gpuopt_ops.norm_dropout), act None (identity) or "relu". Dropout is
    drawn from torch's generator on x's device in training and is off in eval()."""

    def _setup_nd(self, normalized_shape, p, eps, activation, backend) -> None:
        if activation not in NORM_ACTIVATIONS:
            raise ValueError(f"{type(self).__name__}: activation must be None or 'relu', got {activation!r}")
        self._setup(normalized_shape, p, eps, backend)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norm_dropout(x, *self._params(), activation=self.activation, **self._op_kwargs(x))

    def extra_repr(self) -> str:
        return self._repr(f"activation={self.activation!r}")


class FusedLayerNormDropout(_FusedNormDropout):
    """act(dropout(LayerNorm(x))), act None or "relu"; nn.LayerNorm's parameters (`weight`, `bias`) and
    initialisation: a drop-in for nn.LayerNorm → nn.Dropout(p) (→ nn.ReLU)."""

    def __init__(
        self,
        normalized_shape: _ShapeT,
        p: float = 0.1,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        activation: Optional[str] = None,
        backend: str = "auto",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self._setup_nd(normalized_shape, p, float(eps), activation, backend)
        self._add_parameters(elementwise_affine, bias, device, dtype)


class FusedRMSNormDropout(_FusedNormDropout):
    """act(dropout(RMSNorm(x))), act None or "relu"; nn.RMSNorm's parameter (`weight`), initialisation and eps
    default (None: `default_rms_eps(x.dtype)`): a drop-in for nn.RMSNorm → nn.Dropout(p) (→ nn.ReLU)."""

    _norm = "rms"

    def __init__(
        self,
        normalized_shape: _ShapeT,
        p: float = 0.1,
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        activation: Optional[str] = None,
        backend: str = "auto",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self._setup_nd(normalized_shape, p, eps, activation, backend)
        self._add_parameters(elementwise_affine, None, device, dtype)


class GatedMLP(nn.Module):
    """The gated MLP of LLaMA-style models, `down_proj(dropout(act(gate_proj(x)) * up_proj(x)))`, with the
    activation, the product and the dropout in one gpuopt_ops.gated_act call (SwiGLU: act "silu"; GeGLU: "gelu",
    "gelu_tanh"; ReGLU: "relu").

    Parameters and state-dict names are HF transformers' LlamaMLP / MistralMLP / Qwen2MLP / GemmaMLP layout:
    `gate_proj`, `up_proj` (Linear hidden → intermediate) and `down_proj` (intermediate → hidden), each an
    nn.Linear with nn.Linear's initialisation, biases when bias=True (LLaMA's mlp_bias). fused=True keeps Phi-3's
    layout instead: one `gate_up_proj` of 2 * intermediate_size output rows, the gate's rows first, whose output
    the op reads as [gate | up] without splitting it. Dropout (p, on the gated activation, before down_proj) is on
    in training only; its seed is drawn from torch's generator on x's device, so torch.manual_seed reproduces it.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str = "silu",
        bias: bool = False,
        p: float = 0.0,
        fused: bool = False,
        backend: str = "auto",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"GatedMLP: act must be one of {', '.join(map(repr, ACTIVATIONS))}, got {act!r}")
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.act = act
        self.p = float(p)
        self.fused = bool(fused)
        self.backend = resolve_backend(backend)
        factory = {"bias": bool(bias), "device": device, "dtype": dtype}
        if self.fused:
            self.gate_up_proj = nn.Linear(self.hidden_size, 2 * self.intermediate_size, **factory)
        else:
            self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, **factory)
            self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, **factory)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.gate_up_proj(x), None
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        h = gated_act(gate, up, act=self.act, p=self.p, training=self.training, backend=self.backend)
        return self.down_proj(h)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, act={self.act!r}, "
            f"p={self.p}, fused={self.fused}, backend={self.backend!r}"
        )


# ---------------------------------------------------------------------------------------------- unfused twins
class EagerLayerNormDropoutReLU(nn.LayerNorm):
    """The unfused LayerNorm → Dropout → ReLU with FusedLayerNormDropoutReLU's parameter names (for comparisons)."""

    def __init__(
        self,
        normalized_shape: _ShapeT,
        p: float = 0.1,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias, device=device, dtype=dtype
        )
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return F.relu(F.dropout(y, self.p, self.training))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, p={self.p}, backend='eager'"


class EagerLinearReLU(nn.Linear):
    """nn.Linear followed by ReLU, with LinearBiasReLU's parameter names (for comparisons)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(super().forward(x))


def unfused_equivalent(module: nn.Module) -> Optional[nn.Module]:
    """The unfused PyTorch twin of a fused module, with the same parameters copied in (None if not ours)."""
    if isinstance(module, FusedLayerNormDropoutReLU):
        twin = EagerLayerNormDropoutReLU(
            module.normalized_shape, module.p, module.eps, module.elementwise_affine, module.bias is not None
        )
    elif isinstance(module, LinearBiasReLU):
        twin = EagerLinearReLU(module.in_features, module.out_features)
    else:
        return None
    ref = next(module.parameters(), None)
    if ref is not None:
        twin = twin.to(device=ref.device, dtype=ref.dtype)
    twin.load_state_dict(module.state_dict())
    return twin.train(module.training)

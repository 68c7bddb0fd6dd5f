"""Linear layers on oneDNN with the weight packed once, for float32 and bfloat16 on the CPU.

`nn.Linear` on the CPU calls MKL's sgemm, which lays the weight out again on every call and,
on AMD processors, does not run its fastest kernels. `PackedLinear` reorders the weight once,
at load time, into oneDNN's blocked layout and runs oneDNN's matmul on it, with an optional
activation fused as a post-op (no second pass over the output). Measured on this project's
2-core AMD EPYC: bart-base's projections ran at 160-190 GFLOP/s instead of 60-100, and its
50k-word LM head over 64 rows in 35 ms instead of 95.
Results equal `F.linear` up to rounding (a different summation order). In bfloat16 oneDNN
runs the processor's bf16 dot-product instructions (AVX512-BF16, AMX) where it has them.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

# Activation name (Hugging Face config spelling) -> oneDNN post-op and its algorithm.
POST_OPS = {
    "none": ("none", ""),
    "relu": ("relu", ""),
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "silu": ("swish", ""),
    "swish": ("swish", ""),
}

# Rows the packed layout is tuned for: a decode step's batch. Any row count works.
_PACKING_ROWS = 64


def packed_linear_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """float32 or bfloat16 on a CPU whose torch build runs oneDNN's packed linear correctly."""
    return (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and _packed_linear_works(dtype))


@functools.lru_cache(maxsize=2)
def _packed_linear_works(dtype: torch.dtype) -> bool:
    """One small packed linear against F.linear: builds without oneDNN, or whose oneDNN lacks
    the op on this processor, fall back to nn.Linear instead of failing at load."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = (torch.arange(12).view(3, 4) / 8).to(dtype)
        x, bias = torch.ones(2, 4, dtype=dtype), torch.ones(3, dtype=dtype)
        got = PackedLinear(weight, bias)(x)
        return bool(torch.allclose(got, F.linear(x, weight, bias)))
    except (RuntimeError, AttributeError):
        return False


def can_fuse(activation: str) -> bool:
    return activation in POST_OPS


class FusedLinear(nn.Module):
    """What the oneDNN linears share: the shape, the activation fused as a post-op (checked
    against `POST_OPS`), construction from an nn.Linear, the repr."""

    bias: Optional[torch.Tensor]

    def __init__(self, weight: torch.Tensor, activation: str):
        super().__init__()
        if activation not in POST_OPS:
            raise ValueError(f"activation {activation!r} cannot be fused; known: {sorted(POST_OPS)}")
        self.out_features, self.in_features = weight.shape
        self.activation = activation
        self.post_op, self.algorithm = POST_OPS[activation]

    @classmethod
    def from_linear(cls, linear: nn.Module, activation: str = "none") -> "FusedLinear":
        return cls(linear.weight, linear.bias, activation)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation}")


class PackedLinear(FusedLinear):
    """y = activation(x W^T + b) with W packed for oneDNN; x is [..., in_features]."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: str = "none"):
        super().__init__(weight, activation)
        with torch.no_grad():
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(
                weight.detach().contiguous(), _PACKING_ROWS)
        self.bias = None if bias is None else bias.detach().contiguous()

    @property
    def weight(self) -> torch.Tensor:
        """The weight in nn.Linear's [out_features, in_features] layout (a copy)."""
        return self.packed_weight.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, self.post_op,
                                                  [], self.algorithm)

"""Linear layers on oneDNN with the weight packed once, for float32 and bfloat16 on the CPU.

`nn.Linear` on the CPU calls MKL's sgemm, which lays the weight out again on every call and,
on AMD processors, does not run its fastest kernels. `PackedLinear` reorders the weight once,
at load time, into oneDNN's blocked layout and runs oneDNN's matmul on it, with an optional
activation fused as a post-op (no second pass over the output). Measured on this project's
2-core AMD EPYC: bart-base's projections ran at 160-190 GFLOP/s instead of 60-100, and its
50k-word LM head over 64 rows in 35 ms instead of 95.
Results equal `F.linear` up to rounding (a different summation order). In bfloat16 oneDNN
runs the processor's bf16 dot-product instructions (AVX512-BF16, AMX) where it has them. Where
its build refuses bfloat16 (a processor with AVX2 only), `WidenedLinear` runs bfloat16 layers on
float32 weights instead (`packed_linear_for` picks the class).

oneDNN builds a primitive for each row count it meets and caches up to 1024 of them (its
primitive cache and ideep's), each keeping its own scratchpad, which can be as large as the
output: on 2 threads, bart-large's fc1 (1024 -> 4096, gelu) kept rows x 4096 floats for every
row count. A server meets a new row count at almost every prefill step, and its memory grew by
gigabytes before the caches filled. So rows reach oneDNN in a few shapes only (`row_pieces`):
up to `SMALL_ROWS` as they are (decode steps), more in pieces of `ROW_PIECES` rows and a
remainder padded to a multiple of `ROW_STEP`. That bounds what the caches keep: 78 row counts
a linear shape, at most about 130 MB for bart-large's fc1 on 2 threads (by the sizes above). It
costs a few percent on long inputs, less where a whole block runs on each piece
(`encdec.models.layers.by_row_pieces`).

A single row goes to oneDNN as two (a row of zeros added). Its one-row kernel sums in another
order than its kernel for two rows or more (seen with 1536 inputs, Whisper's fc2, on 1 and 2
threads), so a sequence decoding alone got other bits than in a batch; two rows take the same
time as one.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

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
# The row counts oneDNN sees (see the module's docstring).
SMALL_ROWS = 64
ROW_STEP = 16
ROW_PIECES = (1024, 256)


def row_pieces(rows: int) -> list[tuple[int, int]]:
    """(rows, rows as oneDNN gets them) for each piece of `rows` input rows, in order: pieces of
    `ROW_PIECES` rows, then the rest, padded to a multiple of `ROW_STEP` above `SMALL_ROWS`, and a
    single row to two."""
    pieces = []
    for size in ROW_PIECES:
        while rows >= size:
            pieces.append((size, size))
            rows -= size
    if rows or not pieces:
        padded = 2 if rows == 1 else rows if rows <= SMALL_ROWS else rows + -rows % ROW_STEP
        pieces.append((rows, padded))
    return pieces


def in_row_pieces(matmul: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """`matmul` of the 2-D `rows`, applied to them in `row_pieces` (padding rows of zeros)."""
    outs, start = [], 0
    for count, padded in row_pieces(len(rows)):
        piece = rows[start:start + count]
        if padded > count:
            piece = F.pad(piece, (0, 0, 0, padded - count))
        outs.append(matmul(piece)[:count])
        start += count
    return outs[0] if len(outs) == 1 else torch.cat(outs)


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


def packed_linear_for(device: torch.device, dtype: torch.dtype) -> Optional[type["PackedLinear"]]:
    """The packed linear for layers of `dtype` on `device`: `PackedLinear` where oneDNN runs
    that dtype, `WidenedLinear` for bfloat16 where it runs float32 only, else None (nn.Linear)."""
    if packed_linear_supported(device, dtype):
        return PackedLinear
    if dtype == torch.bfloat16 and packed_linear_supported(device, torch.float32):
        return WidenedLinear
    return None


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
        out = in_row_pieces(self._matmul, x.reshape(-1, self.in_features))
        return out.view(*x.shape[:-1], self.out_features)

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, self.post_op,
                                                  [], self.algorithm)


class WidenedLinear(PackedLinear):
    """A bfloat16 layer on a processor without bfloat16 arithmetic (AVX2 only): the weight,
    widened to float32 (exactly), is packed as float32; each call widens its input, multiplies
    in float32 and rounds the output to bfloat16. That is what oneDNN's bfloat16 kernel computes
    (exact products of bfloat16 values, float32 sums, a rounded output), and torch's own
    bfloat16 matmul, emulated there, ran 3-6x slower on 8-1500 rows of Whisper and BART shapes
    (measured on this project's AVX2 EPYC). The price: the weights take float32's memory; the
    activations and the KV cache stay bfloat16."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: str = "none"):
        super().__init__(weight.float(), None if bias is None else bias.float(), activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).to(x.dtype)

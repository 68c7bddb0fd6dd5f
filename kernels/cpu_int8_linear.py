"""Int8 linear layers on oneDNN for the CPU: int8 weights, dynamically quantized activations.

`Int8Linear` stores the weight as int8 with one scale per output channel (symmetric, the
largest magnitude of the row maps to 127), packed once for oneDNN's int8 matmul (VNNI
instructions where the processor has them). Each call quantizes its input to uint8 with one
scale and zero point over the whole input (its minimum and maximum, zero included), multiplies in
int32 and writes float32, with an optional activation fused as a post-op. This is the scheme of
torch's `quantize_dynamic` and of CTranslate2's int8 weights with float activations, on oneDNN's
own ops rather than torch's deprecated quantized tensors. Weights take a quarter of their float32
memory. The input is quantized whole, then reaches oneDNN in `cpu_linear.row_pieces`, for the
reason given there.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from .cpu_linear import FusedLinear, in_row_pieces


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float weight -> (int8 weight, float32 scale per output row); the weight is
    about `int8 * scale[:, None]`."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    quantized = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return quantized, scale


def int8_linear_supported(device: torch.device) -> bool:
    """A CPU whose torch build runs oneDNN's int8 linear and gets a small case right."""
    return device.type == "cpu" and _int8_linear_works()


@functools.lru_cache(maxsize=1)
def _int8_linear_works() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = torch.linspace(-1, 1, 12).view(3, 4)
        x = torch.linspace(-2, 3, 8).view(2, 4)
        got = Int8Linear(weight, torch.ones(3))(x)
        return bool(torch.allclose(got, F.linear(x, weight, torch.ones(3)), atol=0.05))
    except (RuntimeError, AttributeError):
        return False


# Bytes of float32 scratch per quantization chunk: small enough to stay in cache and in the C
# heap (a whole-input float32 temporary, 73 MB for 8 Whisper windows' feed-forward input, is
# fresh memory whose page faults made quantizing it 4x slower than these chunks).
_QUANTIZE_CHUNK_BYTES = 1 << 21


def _quantize_rows(rows: torch.Tensor, inv_scale: float, zero_point: int) -> torch.Tensor:
    """uint8 round-half-up of rows * inv_scale + zero_point, clamped to [0, 255]."""
    out = torch.empty(rows.shape, dtype=torch.uint8)
    chunk = max(1, _QUANTIZE_CHUNK_BYTES // (4 * rows.shape[1]))
    scratch = torch.empty(min(chunk, len(rows)), rows.shape[1])
    for start in range(0, len(rows), chunk):
        part = rows[start:start + chunk]
        buf = scratch[:len(part)]
        # +0.5 and truncation (copy_ to uint8): round half up on values never negative here
        torch.mul(part, inv_scale, out=buf).add_(zero_point + 0.5).clamp_(0, 255)
        out[start:start + chunk].copy_(buf)
    return out


class Int8Linear(FusedLinear):
    """y = activation(x W^T + b) with W in int8 (per-channel scales) and x quantized per call."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: str = "none"):
        super().__init__(weight, activation)
        quantized, self.weight_scale = quantize_weight(weight)
        self.packed_weight = torch.ops.onednn.qlinear_prepack(quantized, None)
        self.weight_zero_point = torch.zeros(self.out_features, dtype=torch.int64)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        low = high = 0.0
        if rows.numel():
            low, high = (float(v) for v in torch.aminmax(rows))
        low, high = min(low, 0.0), max(high, 0.0)
        scale = max((high - low) / 255, torch.finfo(torch.float32).tiny)
        zero_point = round(-low / scale)
        quantized = _quantize_rows(rows, 1 / scale, zero_point)
        out = in_row_pieces(lambda piece: torch.ops.onednn.qlinear_pointwise(
            piece, scale, zero_point, self.packed_weight, self.weight_scale,
            self.weight_zero_point, self.bias, 1.0, 0, torch.float32, self.post_op, [],
            self.algorithm), quantized)
        return out.view(*x.shape[:-1], self.out_features)

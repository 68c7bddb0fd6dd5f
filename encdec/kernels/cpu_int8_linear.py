"""Int8 linear layers on oneDNN for the CPU: int8 weights, dynamically quantized activations.

`Int8Linear` stores the weight as int8 with one scale per output channel (symmetric, the
largest magnitude of the row maps to 127), packed once for oneDNN's int8 matmul (VNNI
instructions where the processor has them). Each call quantizes every input row on its own
scale and zero point (uint8 over the row's minimum to maximum, zero included), multiplies in
int32, and takes each output row back to float32 with its own scale and zero point (minus the
zero point times the weight row's sum), then adds the bias and applies the activation.

A row's result depends on that row alone, never on the others in the batch, so a sequence gets
the same bits batched or alone (the engine's contract), and a row of large values costs the
others no precision. One scale for the whole call (torch's `quantize_dynamic`) broke both. Per
row is what CTranslate2 does (symmetric there) and vLLM's dynamic per-token int8; the zero point
keeps all 8 bits for inputs that are mostly positive, such as the input of a layer after GELU.
On tiny.en's test corpus, 18 of 20 transcripts equal float32's (CTranslate2 int8: 14 of 20).
Weights take a quarter of their float32 memory. Rows reach oneDNN in `cpu_linear.row_pieces`,
for the reason given there.

Without VNNI (AVX2 only), oneDNN multiplies uint8 by int8 with `vpmaddubsw`, which adds two
products into int16 and saturates: 255 * 127 * 2 does not fit, and results come out wrong. There
inputs are quantized to 0..127 instead (PyTorch's `reduce_range`, for the same reason), which
fits: the small case `int8_linear_supported` checks decides, trying the full range first.
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


# The largest quantized input: the full uint8 range, else the range that cannot saturate.
INPUT_RANGES = (255, 127)


def int8_linear_supported(device: torch.device) -> bool:
    """A CPU whose torch build runs oneDNN's int8 linear and gets a small case right."""
    return device.type == "cpu" and input_range() is not None


@functools.lru_cache(maxsize=1)
def input_range() -> Optional[int]:
    """The largest quantized input with which oneDNN gets a small case right (`INPUT_RANGES`),
    or None where none does."""
    if not torch.backends.mkldnn.is_available():
        return None
    weight = torch.linspace(-1, 1, 12).view(3, 4)
    x = torch.linspace(-2, 3, 8).view(2, 4)
    for top in INPUT_RANGES:
        try:
            got = Int8Linear(weight, torch.ones(3), input_top=top)(x)
        except (RuntimeError, AttributeError):
            return None
        if torch.allclose(got, F.linear(x, weight, torch.ones(3)), atol=0.05):
            return top
    return None


# Rows per pass of the quantization: about 2 MB of float32, which stays in cache from one
# elementwise op to the next (whole-input temporaries, 73 MB for 8 Whisper windows' feed-forward
# input, are fresh memory whose page faults made quantizing 4x slower).
_CHUNK_BYTES = 1 << 21

# The smallest scale of a row (an all-zero row): dividing by it stays finite.
_SMALLEST_SCALE = torch.finfo(torch.float32).tiny


def _activate_(out: torch.Tensor, post_op: str, algorithm: str) -> torch.Tensor:
    """oneDNN's post-op (`cpu_linear.POST_OPS`), in place in torch."""
    if post_op == "relu":
        return out.relu_()
    if post_op == "gelu":
        return torch.ops.aten.gelu_(out, approximate=algorithm)
    if post_op == "swish":
        return F.silu(out, inplace=True)
    return out


def quantize_rows(rows: torch.Tensor, top: int = 255) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """2-D float rows -> (uint8 rows, float32 scale per row, float32 zero point per row): row i
    is about `(uint8[i] - zero_point[i]) * scale[i]`, its minimum (or 0) at 0 and its maximum
    (or 0) at `top`, rounded half up."""
    out = torch.empty(rows.shape, dtype=torch.uint8)
    scales, zero_points = torch.empty(len(rows)), torch.empty(len(rows))
    step = max(1, _CHUNK_BYTES // (4 * rows.shape[1]))
    for start in range(0, len(rows), step):
        part = rows[start:start + step]
        # (amin and amax each run far faster than aminmax along a dimension)
        low, high = part.amin(dim=1).clamp_(max=0), part.amax(dim=1).clamp_(min=0)
        scale = torch.div(high - low, top, out=scales[start:start + step]).clamp_(
            min=_SMALLEST_SCALE)
        inverse = scale.reciprocal()
        zero_point = torch.round(low.mul_(inverse).neg_(), out=zero_points[start:start + step])
        # +0.5 and truncation (copy_ to uint8): round half up on values never negative here
        steps = torch.mul(part, inverse[:, None]).add_(zero_point[:, None] + 0.5)
        out[start:start + step].copy_(steps.clamp_(0, top))
    return out, scales, zero_points


class Int8Linear(FusedLinear):
    """y = activation(x W^T + b) with W in int8 (per-channel scales) and x quantized per row."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: str = "none",
                 input_top: Optional[int] = None):
        super().__init__(weight, activation)
        self.input_top = input_top or input_range()
        quantized, self.weight_scale = quantize_weight(weight)
        self.packed_weight = torch.ops.onednn.qlinear_prepack(quantized, None)
        self.weight_zero_point = torch.zeros(self.out_features, dtype=torch.int64)
        # what oneDNN's output holds for an input of all ones: the weight rows' sums, scaled
        self.weight_sums = quantized.sum(dim=1).float() * self.weight_scale
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quantized, scales, zero_points = quantize_rows(x.reshape(-1, self.in_features), self.input_top)
        out = in_row_pieces(lambda piece: torch.ops.onednn.qlinear_pointwise(
            piece, 1.0, 0, self.packed_weight, self.weight_scale, self.weight_zero_point, None,
            1.0, 0, torch.float32, "none", [], ""), quantized)
        out.addr_(zero_points, self.weight_sums, alpha=-1)
        if self.bias is None:
            out.mul_(scales[:, None])
        else:
            torch.addcmul(self.bias, out, scales[:, None], out=out)
        _activate_(out, self.post_op, self.algorithm)
        return out.view(*x.shape[:-1], self.out_features)

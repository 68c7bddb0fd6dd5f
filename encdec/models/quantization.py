"""Lower precision for a loaded model: `quantization="int8"` (faster-whisper's and
CTranslate2's `compute_type="int8"`), and the float32 output projection of bfloat16 models.

int8: every linear inside the encoder and decoder stacks (attention projections, feed-forward
blocks, their activations) becomes an `Int8Linear`: int8 weights with per-channel scales,
activations quantized per row (a row's result never depends on its batch), float32 out. Embeddings, norms, Whisper's convolutions, the
attention itself and the KV cache stay float32, and so does the output projection (`lm_head`,
`proj_out`: a direct child of the model, usually tied to the token embedding), whose logits
decide every greedy token.

bfloat16: the output projection runs in float32 (its weight widened once, a float32 copy) on the
hidden states cast up. Rounding logits to bfloat16 (8 significant bits) flipped greedy choices
between near-equal tokens; with float32 logits, random-weight BART's greedy ids matched
float32's where bfloat16 logits matched on 81% of the tokens. On a processor without bfloat16
arithmetic (AVX2 only) the convolutions (Whisper's) run in float32 on widened weights too:
torch's bfloat16 convolution falls back there to a reference loop, which took 0.59 s of a
tiny.en window (its float32 convolutions take 0.01 s); the linears do the same in
`kernels.cpu_linear.WidenedLinear`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from encdec.config import resolve_dtype
from encdec.kernels.cpu_int8_linear import Int8Linear, int8_linear_supported
from encdec.kernels.cpu_linear import PackedLinear, packed_linear_supported
from encdec.models.layers import convert_linears

# method -> the converter of one nn.Linear (and the activation fused into it)
_CONVERTERS = {"int8": Int8Linear.from_linear}
QUANTIZATION_METHODS = tuple(_CONVERTERS)
# faster-whisper's / CTranslate2's compute_type -> (dtype, quantization); "default" and "auto"
# keep what dtype and quantization say.
COMPUTE_TYPES = {"float32": ("float32", None), "bfloat16": ("bfloat16", None),
                 "float16": ("float16", None), "int8": ("float32", "int8"),
                 "int8_float32": ("float32", "int8")}


def resolve_compute_type(compute_type: Optional[str], dtype: str = "auto",
                         quantization: Optional[str] = None) -> tuple[str, Optional[str]]:
    """(dtype, quantization) for faster-whisper's `compute_type` name; ValueError for an unknown
    name, or one that contradicts a `dtype` or `quantization` also given."""
    if compute_type in (None, "default", "auto"):
        return dtype, quantization
    if not isinstance(compute_type, str) or compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute_type must be one of {[*COMPUTE_TYPES, 'default', 'auto']}, got "
                         f"{compute_type!r} (int8 runs with float32 activations)")
    wanted_dtype, wanted_quantization = COMPUTE_TYPES[compute_type]
    if dtype not in ("auto", None) and resolve_dtype(dtype) != resolve_dtype(wanted_dtype):
        raise ValueError(f"compute_type={compute_type!r} runs in {wanted_dtype}, which contradicts "
                         f"dtype={dtype!r}; give one of the two")
    if quantization not in (None, wanted_quantization):
        raise ValueError(f"compute_type={compute_type!r} contradicts quantization="
                         f"{quantization!r}; give one of the two")
    return wanted_dtype, wanted_quantization


def check_quantization(quantization: Optional[str], dtype: torch.dtype,
                       device: torch.device) -> None:
    """Raise ValueError unless `quantization` is None or a method that runs here with `dtype`."""
    if quantization is None:
        return
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATION_METHODS)} or None, "
                         f"got {quantization!r}")
    if dtype != torch.float32:
        raise ValueError(f"quantization={quantization!r} runs with float32 activations; "
                         f"dtype must be float32 (or auto), got {dtype}")
    if not int8_linear_supported(device):
        raise ValueError(f"quantization={quantization!r} needs a CPU device and torch's oneDNN "
                         f"int8 linear ops, which this {device} / torch build lacks")


def quantize_model(model: nn.Module, quantization: str) -> None:
    """Quantize the linears of `model`'s stacks in place (see the module docstring); the
    caller has checked `quantization` with `check_quantization`."""
    stacks = [child for child in model.children() if not isinstance(child, nn.Linear)]
    convert_linears(stacks, _CONVERTERS[quantization])


class Float32Output(nn.Module):
    """A linear run in float32 on inputs of a lower precision (packed for oneDNN where it can)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = None
        if packed_linear_supported(weight.device, torch.float32):
            self.packed, weight, bias = PackedLinear(weight, bias), None, None
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return self.packed(x) if self.packed is not None else F.linear(x, self.weight, self.bias)


def float32_output_projection(model: nn.Module) -> None:
    """Run `model`'s output projection (its direct nn.Linear children) in float32."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, Float32Output(child))


class WidenedConv1d(nn.Conv1d):
    """A convolution of a lower precision run in float32 on its widened weight; the output is
    rounded to the input's dtype."""

    @classmethod
    def from_conv(cls, conv: nn.Conv1d) -> "WidenedConv1d":
        widened = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                      conv.padding, conv.dilation, conv.groups, conv.bias is not None,
                      conv.padding_mode, device=conv.weight.device, dtype=torch.float32)
        with torch.no_grad():
            widened.weight.copy_(conv.weight)
            if conv.bias is not None:
                widened.bias.copy_(conv.bias)
        return widened.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).to(x.dtype)


def widen_convolutions(model: nn.Module) -> None:
    """Run every nn.Conv1d of `model` in float32 (`WidenedConv1d`)."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Conv1d:
                setattr(module, name, WidenedConv1d.from_conv(child))

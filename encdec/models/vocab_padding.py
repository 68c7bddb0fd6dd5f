"""The output projection's rows padded to a multiple of 64, as vLLM pads its LM head.

On a GPU, half-precision matrix products take cuBLAS's tensor-core kernels only when the
output's leading dimension is a multiple of 8 elements. Vocabularies such as BART's (50265),
Marian's, PEGASUS's and multilingual Whisper's (51865) are not, so their logits would come from
slower kernels. The padding's rows are zeros and their logits are cut off, so the logits are
those of the unpadded projection. A tied token embedding keeps reading the first rows of the
same storage: the weight is not copied twice.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD_TO = 64


def pad_vocab_size(vocab_size: int, pad_to: int = PAD_TO) -> int:
    return -(-vocab_size // pad_to) * pad_to


def pads_lm_head(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model on `device` in `dtype` gets its output projection padded (float32 keeps
    the kernels of an unpadded projection, so its logits stay bit-equal to Hugging Face's)."""
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)


class PaddedLMHead(nn.Module):
    """`linear` with its output rows padded to `pad_vocab_size`; returns the unpadded logits."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.vocab_size, hidden = linear.weight.shape
        rows = pad_vocab_size(self.vocab_size)
        weight = linear.weight.new_zeros(rows, hidden)
        weight[:self.vocab_size] = linear.weight.detach()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None
        if linear.bias is not None:
            bias = linear.bias.new_zeros(rows)
            bias[:self.vocab_size] = linear.bias.detach()
            self.bias = nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)[..., :self.vocab_size]


def pad_lm_head(model: nn.Module) -> None:
    """Pad `model`'s output projection (its direct nn.Linear children) where its vocabulary is
    not a multiple of `PAD_TO`; modules tied to its weight read the padded storage's first rows."""
    for name, child in list(model.named_children()):
        if not isinstance(child, nn.Linear) or child.out_features % PAD_TO == 0:
            continue
        padded = PaddedLMHead(child)
        rows = nn.Parameter(padded.weight[:padded.vocab_size], requires_grad=False)
        for module in model.modules():
            if module is not child and getattr(module, "weight", None) is child.weight:
                module.weight = rows
        setattr(model, name, padded)

"""The attention layer models call: projections stay in the model, the backend does the rest."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from encdec.attention.backends.abstract import AttentionBackend
from encdec.attention.metadata import AttentionMetadata, AttentionType
from encdec.attention.position_bias import RelativePositionBias


class Attention(nn.Module):
    """Multi-head attention over flat token vectors, with paged KV caching by the backend."""

    def __init__(self, num_heads: int, head_size: int, scale: float, backend: AttentionBackend):
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.backend = backend

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor], value: Optional[torch.Tensor],
                kv_cache: Optional[torch.Tensor], attn_metadata: AttentionMetadata,
                attn_type: AttentionType,
                position_bias: Optional[RelativePositionBias] = None) -> torch.Tensor:
        shape = (-1, self.num_heads, self.head_size)
        q = query.view(shape)
        k = key.view(shape) if key is not None else None
        v = value.view(shape) if value is not None else None
        out = self.backend.forward(q, k, v, kv_cache, attn_metadata, attn_type, self.scale,
                                   position_bias)
        return out.reshape(-1, self.num_heads * self.head_size)

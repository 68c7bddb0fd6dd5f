"""The interface every attention backend implements."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import torch

from encdec.attention.metadata import AttentionMetadata, AttentionType
from encdec.attention.position_bias import RelativePositionBias


class AttentionBackend(ABC):
    """Turns one `AttentionMetadata` into attention for each `AttentionType`.

    Tensors are unpadded token vectors shaped [num_tokens, num_heads, head_size]. `kv_cache` is
    one decoder layer's paged cache [2, num_blocks, block_size, num_heads, head_size] holding
    both self- and cross-attention blocks; it is None for the encoder. `position_bias` (T5's
    relative position bias) is added to the scores of ENCODER and DECODER attention.
    """

    name: str = "abstract"

    @abstractmethod
    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor],
                value: Optional[torch.Tensor], kv_cache: Optional[torch.Tensor],
                attn_metadata: AttentionMetadata, attn_type: AttentionType, scale: float,
                position_bias: Optional[RelativePositionBias] = None) -> torch.Tensor:
        """Return the attention output [num_query_tokens, num_heads, head_size]."""

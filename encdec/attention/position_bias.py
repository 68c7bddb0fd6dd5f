"""Relative position bias: an additive attention bias that depends only on how far a key is from
its query (T5). The model looks its values up once per step; backends turn them into what their
kernels take (a dense matrix for prefills, a bias by distance for paged decode) once per step and
reuse that in every layer (`AttentionMetadata.backend_cache`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RelativePositionBias:
    """`bias[h, q, k] = values[h, k - q + span - 1]`: one value per head and offset of the key
    from the query, for offsets -(span - 1) .. span - 1; `span` covers every sequence of the step.
    """

    values: torch.Tensor  # [num_heads, 2 * span - 1]

    @property
    def span(self) -> int:
        return (self.values.shape[-1] + 1) // 2

    def matrix(self, length: int, causal: bool) -> torch.Tensor:
        """[num_heads, length, length] for queries and keys at positions 0 .. length - 1 (a
        prefill); with `causal`, keys after their query get -inf. Its top-left [q_len, k_len]
        corner is the bias of any shorter sequence."""
        positions = torch.arange(length, device=self.values.device)
        offsets = positions[None, :] - positions[:, None]
        bias = self.values[:, offsets + self.span - 1]
        return bias.masked_fill(offsets > 0, float("-inf")) if causal else bias

    def by_distance(self) -> torch.Tensor:
        """[num_heads, span]: entry d is the bias of the key d positions before the query (a
        decode step, whose query is its sequence's last token)."""
        return self.values[:, :self.span].flip(-1).contiguous()

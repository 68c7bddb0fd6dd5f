"""Attention types and the per-step attention metadata (docs/design.md, "Model runner").

Decoder tokens of one step are one unpadded vector: the prefill sequences' tokens first, then
one token per decode sequence. Encoder tokens (only for groups in their first step) are a second
unpadded vector, one encoder sequence per prefill sequence.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch


class AttentionType(enum.Enum):
    ENCODER = "encoder"  # non-causal, over encoder tokens
    DECODER = "decoder"  # causal decoder self-attention, through the self cache
    ENCODER_DECODER = "encoder_decoder"  # non-causal, decoder queries over the cross cache


@dataclass
class AttentionMetadata:
    """Everything an attention backend needs to run one step.

    Per decoder sequence (prefills first): `seq_lens`, `block_tables`, `encoder_seq_lens`,
    `cross_block_tables`, and `query_start_loc` (num_seqs + 1 entries: where each sequence's
    tokens start in the step's token vector). `encoder_seq_start_loc` covers only the
    prefills' encoder tokens (num_prefills + 1).
    """

    num_prefills: int
    num_prefill_tokens: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor
    seq_lens: list[int]
    seq_lens_tensor: torch.Tensor
    query_start_loc: torch.Tensor
    block_tables: torch.Tensor
    encoder_seq_lens: list[int]
    encoder_seq_lens_tensor: torch.Tensor
    encoder_seq_start_loc: torch.Tensor
    num_encoder_tokens: int
    cross_slot_mapping: torch.Tensor
    cross_block_tables: torch.Tensor
    # Per-step state a backend derives once and reuses in every layer (masks, biases).
    backend_cache: dict[Any, Any] = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

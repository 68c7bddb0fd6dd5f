"""CUDA attention backend: xformers memory-efficient attention over unpadded token vectors.

Only the selector's CUDA path imports this module (xformers has no CPU kernel). Each step
builds one xformers bias per attention type and phase, keeps it in `backend_cache`, and every
layer reuses it:
- ENCODER: `BlockDiagonalMask` over the prefills' encoder lengths (square, non-causal blocks).
- DECODER prefill: `BlockDiagonalCausalMask` over the prefills' decoder lengths (no chunked
  prefill, so query and key lengths are equal).
- ENCODER_DECODER prefill: `BlockDiagonalMask` from decoder query lengths to encoder key
  lengths (rectangular blocks).
- Decode, self and cross: `gather_kv` copies each sequence's keys/values out of the paged cache
  into one padded vector under `BlockDiagonalCausalWithOffsetPaddedKeysMask`, one query per
  sequence. xformers' `Paged*` biases would skip the copy, but their kernels want pages of 64
  (Triton split-k) or 256 (FlashAttention-2) tokens or a Hopper GPU, and CUTLASS takes none;
  our blocks are small (default 16). A single query with a causal offset sees all its keys, so
  the same bias serves cross-attention, and CUTLASS (any GPU, float32) supports it, while it
  does not support the non-causal `BlockDiagonalPaddedKeysMask`.
New keys/values go into the cache through `reshape_and_cache` (`slot_mapping` for self-attention,
`cross_slot_mapping` for the encoder's keys in a prefill), as in the torch backend.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from encdec.attention.backends.abstract import AttentionBackend
from encdec.attention.metadata import AttentionMetadata, AttentionType

if TYPE_CHECKING:
    from xformers.ops.fmha.attn_bias import AttentionBias
from encdec.kernels.cache_ops import gather_kv, reshape_and_cache

PREFILL, DECODE = "prefill", "decode"


class XFormersBackend(AttentionBackend):
    name = "xformers"

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor],
                value: Optional[torch.Tensor], kv_cache: Optional[torch.Tensor],
                meta: AttentionMetadata, attn_type: AttentionType, scale: float) -> torch.Tensor:
        if attn_type == AttentionType.ENCODER:
            return _attention(query, key, value, step_bias(meta, attn_type, PREFILL, query.device),
                              scale)

        num_prefill_tokens, p = meta.num_prefill_tokens, meta.num_prefills
        is_self = attn_type == AttentionType.DECODER
        if kv_cache is not None and (is_self or p):
            reshape_and_cache(key, value, kv_cache,
                              meta.slot_mapping if is_self else meta.cross_slot_mapping)
        out = torch.empty_like(query)
        if p:
            # Self-attention keys are the prefill tokens; cross keys are all encoder tokens.
            k, v = key, value
            if is_self:
                k, v = key[:num_prefill_tokens], value[:num_prefill_tokens]
            bias = step_bias(meta, attn_type, PREFILL, query.device)
            out[:num_prefill_tokens] = _attention(query[:num_prefill_tokens], k, v, bias, scale)
        if meta.num_decode_tokens:
            tables = (meta.block_tables if is_self else meta.cross_block_tables)[p:]
            lens = (meta.seq_lens_tensor if is_self else meta.encoder_seq_lens_tensor)[p:]
            max_len = max((meta.seq_lens if is_self else meta.encoder_seq_lens)[p:])
            k, v = (_flatten(t).to(query.dtype) for t in gather_kv(kv_cache, tables, lens, max_len))
            bias = step_bias(meta, attn_type, DECODE, query.device)
            out[num_prefill_tokens:] = _attention(query[num_prefill_tokens:], k, v, bias, scale)
        return out


def step_bias(meta: AttentionMetadata, attn_type: AttentionType, phase: str,
              device: torch.device) -> AttentionBias:
    """The step's bias for one attention type and phase: built on first use, then cached."""
    cache_key = ("xformers_bias", attn_type, phase)
    if cache_key not in meta.backend_cache:
        meta.backend_cache[cache_key] = build_bias(meta, attn_type, phase, device)
    return meta.backend_cache[cache_key]


def build_bias(meta: AttentionMetadata, attn_type: AttentionType, phase: str,
               device: Optional[torch.device] = None) -> AttentionBias:
    """The xformers bias over this step's concatenated queries and keys (see module docstring)."""
    from xformers.ops.fmha.attn_bias import (BlockDiagonalCausalMask,
                                             BlockDiagonalCausalWithOffsetPaddedKeysMask,
                                             BlockDiagonalMask)

    p = meta.num_prefills
    if phase == PREFILL:
        if attn_type == AttentionType.ENCODER:
            return BlockDiagonalMask.from_seqlens(meta.encoder_seq_lens[:p], device=device)
        if attn_type == AttentionType.DECODER:
            return BlockDiagonalCausalMask.from_seqlens(meta.seq_lens[:p], device=device)
        return BlockDiagonalMask.from_seqlens(meta.seq_lens[:p], meta.encoder_seq_lens[:p],
                                              device=device)
    assert attn_type != AttentionType.ENCODER, "the encoder only runs in prefills"
    lens = (meta.seq_lens if attn_type == AttentionType.DECODER else meta.encoder_seq_lens)[p:]
    return BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(
        q_seqlen=[1] * len(lens), kv_padding=max(lens), kv_seqlen=lens, device=device)


def _flatten(padded: torch.Tensor) -> torch.Tensor:
    """gather_kv's [num_seqs, H, max_len, D] as one padded vector [num_seqs * max_len, H, D]."""
    num_heads, head_size = padded.shape[1], padded.shape[3]
    return padded.transpose(1, 2).reshape(-1, num_heads, head_size)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: AttentionBias,
               scale: float) -> torch.Tensor:
    """xformers attention over one concatenated batch (B=1): [M, H, D] x [N, H, D] -> [M, H, D]."""
    from xformers.ops import memory_efficient_attention_forward

    return memory_efficient_attention_forward(q[None], k[None], v[None], attn_bias=attn_bias,
                                              scale=scale)[0]

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

A relative position bias (T5, ENCODER and DECODER attention) becomes an additive bias tensor, built
once per step: prefills run one sequence at a time, each with its corner of one [1, H, L, L]
tensor (causal masking included); decodes run as a batch of one-query sequences over their
padded keys with a [num_seqs, H, 1, max_len] tensor (-inf on the padding). Tensor rows are
allocated to a multiple of 8 elements and sliced, as xformers' kernels want them aligned.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from encdec.attention.backends.abstract import AttentionBackend
from encdec.attention.metadata import AttentionMetadata, AttentionType
from encdec.attention.position_bias import RelativePositionBias

if TYPE_CHECKING:
    from xformers.ops.fmha.attn_bias import AttentionBias
from encdec.kernels.cache_ops import gather_kv, reshape_and_cache

PREFILL, DECODE = "prefill", "decode"


class XFormersBackend(AttentionBackend):
    name = "xformers"

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor],
                value: Optional[torch.Tensor], kv_cache: Optional[torch.Tensor],
                meta: AttentionMetadata, attn_type: AttentionType, scale: float,
                position_bias: Optional[RelativePositionBias] = None) -> torch.Tensor:
        if attn_type == AttentionType.ENCODER:
            if position_bias is not None:
                bias = step_tensor_bias(meta, attn_type, PREFILL, position_bias, query.dtype)
                return _per_sequence(query, key, value, meta.encoder_seq_lens[:meta.num_prefills],
                                     bias, scale)
            bias = step_bias(meta, attn_type, PREFILL, query.device)
            return _attention(query[None], key[None], value[None], bias, scale)[0]

        num_prefill_tokens, p = meta.num_prefill_tokens, meta.num_prefills
        is_self = attn_type == AttentionType.DECODER
        if kv_cache is not None and (is_self or p):
            reshape_and_cache(key, value, kv_cache,
                              meta.slot_mapping if is_self else meta.cross_slot_mapping)
        out = torch.empty_like(query)
        if p:
            # Self-attention keys are the prefill tokens; cross keys are all encoder tokens.
            q, k, v = query[:num_prefill_tokens], key, value
            if is_self:
                k, v = key[:num_prefill_tokens], value[:num_prefill_tokens]
            if position_bias is not None:
                bias = step_tensor_bias(meta, attn_type, PREFILL, position_bias, query.dtype)
                out[:num_prefill_tokens] = _per_sequence(q, k, v, meta.seq_lens[:p], bias, scale)
            else:
                bias = step_bias(meta, attn_type, PREFILL, query.device)
                out[:num_prefill_tokens] = _attention(q[None], k[None], v[None], bias, scale)[0]
        if meta.num_decode_tokens:
            tables = (meta.block_tables if is_self else meta.cross_block_tables)[p:]
            lens = (meta.seq_lens_tensor if is_self else meta.encoder_seq_lens_tensor)[p:]
            max_len = max((meta.seq_lens if is_self else meta.encoder_seq_lens)[p:])
            k, v = (t.transpose(1, 2).to(query.dtype)
                    for t in gather_kv(kv_cache, tables, lens, max_len))  # [seqs, max_len, H, D]
            q = query[num_prefill_tokens:]
            if position_bias is not None:
                bias = step_tensor_bias(meta, attn_type, DECODE, position_bias, query.dtype)
                out[num_prefill_tokens:] = _attention(q[:, None], k, v, bias, scale)[:, 0]
            else:
                bias = step_bias(meta, attn_type, DECODE, query.device)
                out[num_prefill_tokens:] = _attention(q[None], _flatten(k), _flatten(v), bias,
                                                      scale)[0]
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


def step_tensor_bias(meta: AttentionMetadata, attn_type: AttentionType, phase: str,
                     position_bias: RelativePositionBias, dtype: torch.dtype) -> torch.Tensor:
    """The step's relative position bias tensor for one attention type and phase: built on
    first use, then cached."""
    cache_key = ("xformers_tensor_bias", attn_type, phase)
    if cache_key not in meta.backend_cache:
        meta.backend_cache[cache_key] = build_tensor_bias(meta, attn_type, phase,
                                                          position_bias).to(dtype)
    return meta.backend_cache[cache_key]


def build_tensor_bias(meta: AttentionMetadata, attn_type: AttentionType, phase: str,
                      position_bias: RelativePositionBias) -> torch.Tensor:
    """[1, H, L, L] over the prefills' longest sequence (PREFILL), or [num_decodes, H, 1, max_len]
    with -inf past each sequence's length (DECODE); see the module docstring."""
    p = meta.num_prefills
    if phase == PREFILL:
        lens = (meta.encoder_seq_lens if attn_type == AttentionType.ENCODER else meta.seq_lens)[:p]
        matrix = position_bias.matrix(max(lens), causal=attn_type == AttentionType.DECODER)
        return _aligned(matrix[None])
    assert attn_type == AttentionType.DECODER, "only self-attention decodes with a position bias"
    by_distance = position_bias.by_distance()
    lens = torch.tensor(meta.seq_lens[p:], device=by_distance.device)
    distance = (lens - 1)[:, None] - torch.arange(int(lens.max()), device=lens.device)
    bias = by_distance[:, distance.clamp(min=0)].transpose(0, 1)  # [seqs, H, max_len]
    return _aligned(bias.masked_fill((distance < 0)[:, None], float("-inf"))[:, :, None])


def _aligned(bias: torch.Tensor) -> torch.Tensor:
    """A copy of `bias` whose rows start at multiples of 8 elements (a slice of a wider tensor)."""
    width = bias.shape[-1]
    out = bias.new_empty(*bias.shape[:-1], -(-width // 8) * 8)
    out[..., :width] = bias
    return out[..., :width]


def _per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int],
                  bias: torch.Tensor, scale: float) -> torch.Tensor:
    """Square (prefill) attention one sequence at a time, each with the [:L, :L] corner of
    `bias` ([1, H, >= L, >= L])."""
    out = torch.empty_like(q)
    start = 0
    for n in lens:
        s = slice(start, start + n)
        out[s] = _attention(q[None, s], k[None, s], v[None, s], bias[:, :, :n, :n], scale)[0]
        start += n
    return out


def _flatten(padded: torch.Tensor) -> torch.Tensor:
    """[num_seqs, max_len, H, D] keys as one padded batch [1, num_seqs * max_len, H, D]."""
    return padded.reshape(1, -1, padded.shape[2], padded.shape[3])


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attn_bias: AttentionBias | torch.Tensor, scale: float) -> torch.Tensor:
    """xformers attention: [B, M, H, D] x [B, N, H, D] -> [B, M, H, D]."""
    from xformers.ops import memory_efficient_attention_forward

    return memory_efficient_attention_forward(q, k, v, attn_bias=attn_bias, scale=scale)

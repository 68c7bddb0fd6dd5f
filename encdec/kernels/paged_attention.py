"""Attention over a paged KV cache (reference: gather + SDPA)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .cache_ops import Lengths, as_lengths, gather_kv


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: Lengths,
    scale: float | None = None,
    query_lens: Lengths | None = None,
    causal: bool = True,
    distance_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attend queries to the first ``seq_lens[i]`` cached tokens of each sequence.

    ``query`` is ``[num_seqs, num_heads, head_size]`` (one token per sequence, the usual
    decode step) and the result has the same shape. ``query`` may instead be padded
    ``[num_seqs, q_len, num_heads, head_size]`` with ``query_lens[i] <= q_len`` real tokens
    (default: all). If ``causal``, token ``j`` of sequence ``i`` sits at absolute position
    ``seq_lens[i] - query_lens[i] + j`` and sees keys up to that position; otherwise it
    sees all ``seq_lens[i]`` keys (cross-attention). Outputs at padded query rows are
    finite but meaningless. ``scale`` defaults to ``head_size ** -0.5``. ``distance_bias``
    (``[num_heads, >= max(seq_lens)]``, causal attention only) adds ``distance_bias[h, d]`` to
    the score of the key ``d`` positions before the query.
    """
    single = query.dim() == 3
    q = query[:, None] if single else query
    _check_shapes(q, kv_cache, block_tables)
    if q.shape[0] == 0:
        return torch.empty_like(query)
    lens = as_lengths(seq_lens, q.device)
    if bool((lens < 1).any()):
        raise ValueError("paged_attention needs seq_lens >= 1")
    keys, values = gather_kv(kv_cache, block_tables, lens)
    mask = _attention_mask(lens, q.shape[1], query_lens, causal and not single)
    if distance_bias is not None:
        mask = _distance_bias_mask(mask, distance_bias, lens, q.shape[1], query_lens)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=scale
    )
    out = out.transpose(1, 2)
    return out[:, 0] if single else out


def _check_shapes(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor) -> None:
    """Validate ``q`` ``[num_seqs, q_len, num_heads, head_size]`` against the cache and tables."""
    if q.dim() != 4:
        raise ValueError(f"query must be 3-D or 4-D, got shape {tuple(q.shape)}")
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"kv_cache must be [2, blocks, block_size, heads, head_size], got {tuple(kv_cache.shape)}")
    if q.shape[2:] != kv_cache.shape[3:]:
        raise ValueError(f"query heads/head_size {tuple(q.shape[2:])} != cache {tuple(kv_cache.shape[3:])}")
    if block_tables.shape[0] != q.shape[0]:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {q.shape[0]} sequences")


def _attention_mask(
    lens: torch.Tensor,
    q_len: int,
    query_lens: Lengths | None,
    causal: bool,
) -> torch.Tensor:
    """Boolean mask (True = attend): ``[num_seqs, 1, 1, max_len]`` or ``[num_seqs, 1, q_len, max_len]``."""
    key_pos = torch.arange(int(lens.max()), device=lens.device)
    mask = key_pos[None, None, None, :] < lens[:, None, None, None]
    if not causal:
        return mask
    qlens = lens.new_full(lens.shape, q_len) if query_lens is None else as_lengths(query_lens, lens.device)
    if bool((qlens > lens).any()) or bool((qlens > q_len).any()):
        raise ValueError("query_lens must not exceed seq_lens or the padded query length")
    return mask & (key_pos[None, None, None, :] <= _query_positions(lens, q_len, qlens)[:, None, :, None])


def _query_positions(lens: torch.Tensor, q_len: int, qlens: torch.Tensor) -> torch.Tensor:
    """``[num_seqs, q_len]``: each query token's position (the last ``qlens[i]`` of ``lens[i]``)."""
    return (lens - qlens)[:, None] + torch.arange(q_len, device=lens.device)


def _distance_bias_mask(mask: torch.Tensor, distance_bias: torch.Tensor, lens: torch.Tensor,
                        q_len: int, query_lens: Lengths | None) -> torch.Tensor:
    """The boolean ``mask`` as an additive float mask with the distance bias of every visible key:
    ``[num_seqs, num_heads, q_len, max_len]``."""
    qlens = lens.new_full(lens.shape, q_len) if query_lens is None else as_lengths(query_lens, lens.device)
    key_pos = torch.arange(mask.shape[-1], device=lens.device)
    distance = _query_positions(lens, q_len, qlens)[:, :, None] - key_pos
    bias = distance_bias[:, distance.clamp(0, distance_bias.shape[1] - 1)].transpose(0, 1)
    return bias.masked_fill(~mask, float("-inf"))

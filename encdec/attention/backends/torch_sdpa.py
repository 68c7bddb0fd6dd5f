"""CPU attention backend: per-sequence (or equal-length batched) attention, never a dense
(tokens)^2 mask; decode steps read the paged caches with the compiled kernel of
`kernels/cpu_decode.py` (float32) or the torch reference (other dtypes).

- ENCODER: non-causal attention inside each encoder sequence (`dense_attention`).
- DECODER: new keys/values go into the paged self cache by `slot_mapping`; prefill sequences
  attend causally to their own tokens, decode tokens read the cache through `block_tables`.
- ENCODER_DECODER: in a prefill step the encoder's keys/values go into the cross cache by
  `cross_slot_mapping` and prefill queries attend to them directly; decode queries read the
  cross cache through `cross_block_tables` for `encoder_seq_lens` tokens.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from encdec.attention.backends.abstract import AttentionBackend
from encdec.attention.metadata import AttentionMetadata, AttentionType
from encdec.kernels.cache_ops import reshape_and_cache
from encdec.kernels.cpu_decode import paged_decode_attention
from encdec.kernels.paged_attention import paged_attention


class TorchSDPABackend(AttentionBackend):
    name = "torch"

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor],
                value: Optional[torch.Tensor], kv_cache: Optional[torch.Tensor],
                meta: AttentionMetadata, attn_type: AttentionType, scale: float) -> torch.Tensor:
        if attn_type == AttentionType.ENCODER:
            lens = _lens(meta, "encoder", meta.encoder_seq_lens[:meta.num_prefills])
            return varlen_attention(query, key, value, lens, lens, False, scale)

        num_prefill_tokens = meta.num_prefill_tokens
        out = torch.empty_like(query)
        if attn_type == AttentionType.DECODER:
            if kv_cache is not None:
                reshape_and_cache(key, value, kv_cache, meta.slot_mapping)
            if meta.num_prefills:
                lens = _lens(meta, "decoder", meta.seq_lens[:meta.num_prefills])
                out[:num_prefill_tokens] = varlen_attention(
                    query[:num_prefill_tokens], key[:num_prefill_tokens],
                    value[:num_prefill_tokens], lens, lens, True, scale)
            if meta.num_decode_tokens:
                out[num_prefill_tokens:] = self._decode(
                    query[num_prefill_tokens:], kv_cache, meta, "self", meta.block_tables,
                    meta.seq_lens, scale)
            return out

        # ENCODER_DECODER
        if meta.num_prefills:
            if kv_cache is not None:
                reshape_and_cache(key, value, kv_cache, meta.cross_slot_mapping)
            q_lens = _lens(meta, "decoder", meta.seq_lens[:meta.num_prefills])
            kv_lens = _lens(meta, "encoder", meta.encoder_seq_lens[:meta.num_prefills])
            out[:num_prefill_tokens] = varlen_attention(
                query[:num_prefill_tokens], key, value, q_lens, kv_lens, False, scale)
        if meta.num_decode_tokens:
            out[num_prefill_tokens:] = self._decode(
                query[num_prefill_tokens:], kv_cache, meta, "cross", meta.cross_block_tables,
                meta.encoder_seq_lens, scale)
        return out

    def _decode(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                kind: str, block_tables: torch.Tensor, lens: list[int], scale: float) -> torch.Tensor:
        """One query token per decode sequence, over its cached keys (self or cross table)."""
        key = ("torch_decode", kind)
        if key not in meta.backend_cache:
            meta.backend_cache[key] = (block_tables[meta.num_prefills:].to(torch.int32),
                                       np.asarray(lens[meta.num_prefills:], dtype=np.int64))
        tables, decode_lens = meta.backend_cache[key]
        if query.dtype == kv_cache.dtype == torch.float32 and query.device.type == "cpu":
            return paged_decode_attention(query, kv_cache, tables, decode_lens, scale)
        return paged_attention(query, kv_cache, tables, decode_lens, scale)


def _lens(meta: AttentionMetadata, kind: str, lens: list[int]) -> tuple[int, ...]:
    """Lengths as a tuple, computed once per step and shared by every layer."""
    key = ("torch_lens", kind)
    if key not in meta.backend_cache:
        meta.backend_cache[key] = tuple(lens)
    return meta.backend_cache[key]


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lens: tuple[int, ...],
                     kv_lens: tuple[int, ...], causal: bool, scale: float) -> torch.Tensor:
    """Attention of each query sequence over its own key sequence, on unpadded vectors.

    q: [sum(q_lens), H, D]; k, v: [sum(kv_lens), H, D]. With `causal`, q_lens == kv_lens.
    Sequences of one length run as one batched call, others one call per sequence.
    """
    num_heads, head_size = q.shape[1], q.shape[2]
    attend = _causal_attention if causal else dense_attention
    if len(set(q_lens)) == 1 and len(set(kv_lens)) == 1:
        b, lq, lk = len(q_lens), q_lens[0], kv_lens[0]
        qb = q.view(b, lq, num_heads, head_size).transpose(1, 2)
        kb = k.view(b, lk, num_heads, head_size).transpose(1, 2)
        vb = v.view(b, lk, num_heads, head_size).transpose(1, 2)
        return attend(qb, kb, vb, scale).transpose(1, 2).reshape(-1, num_heads, head_size)
    outs = []
    q_start = k_start = 0
    for lq, lk in zip(q_lens, kv_lens):
        qs = q[q_start:q_start + lq].transpose(0, 1)
        ks = k[k_start:k_start + lk].transpose(0, 1)
        vs = v[k_start:k_start + lk].transpose(0, 1)
        outs.append(attend(qs, ks, vs, scale).transpose(0, 1))
        q_start += lq
        k_start += lk
    return torch.cat(outs)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[-2] > 1, scale=scale)


# dense_attention works in blocks of query rows of a few (batch, head) pairs whose scores fit in
# about this many bytes, so a block's scores stay in the core's L2 cache between its two matmuls.
_SCORE_BLOCK_BYTES = 1 << 20
_ROW_CHUNK = 256


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Non-causal softmax(q k^T * scale) v over [..., L, D] tensors (e.g. [batch, heads, L, D]),
    as matmuls over cache-sized blocks. On CPU this beats SDPA's flash kernel about twice for
    encoder lengths of a few hundred tokens and more; blocking across (batch, head) pairs
    matters most for many Whisper windows at once (24 windows: 46 -> 64-89 GFLOP/s here)."""
    *lead, q_len, head_size = q.shape
    k_len = k.shape[-2]
    pairs = math.prod(lead)
    queries = (q * scale).reshape(pairs, q_len, head_size)
    keys_t = k.transpose(-1, -2).reshape(pairs, head_size, k_len)
    values = v.reshape(pairs, k_len, head_size)
    rows = min(q_len, _ROW_CHUNK)
    group = max(1, _SCORE_BLOCK_BYTES // (rows * k_len * queries.element_size()))
    out = torch.empty_like(queries)
    for p in range(0, pairs, group):
        keys_p, values_p = keys_t[p:p + group], values[p:p + group]
        for r in range(0, q_len, rows):
            scores = torch.matmul(queries[p:p + group, r:r + rows], keys_p)
            torch.matmul(scores.softmax(-1), values_p, out=out[p:p + group, r:r + rows])
    return out.view(*lead, q_len, head_size)

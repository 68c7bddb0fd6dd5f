"""CPU attention backend: per-sequence (or equal-length batched) attention, never a dense
(tokens)^2 mask; decode steps read the paged caches with the compiled kernel of
`encdec/kernels/cpu_decode.py` (float32, bfloat16) or the torch reference (other dtypes). Attention
over bfloat16 (or float16) tensors computes its scores, softmax and sums in float32. Prefills
without a causal mask or bias (encoders, cross-attention) run `encdec/kernels/cpu_attention.py` in
float32 and bfloat16 where it runs, torch's SDPA elsewhere.

- ENCODER: non-causal attention inside each encoder sequence (the C kernel or torch's SDPA;
  `dense_attention` where a position bias is added).
- DECODER: new keys/values go into the paged self cache by `slot_mapping`; prefill sequences
  attend causally to their own tokens, decode tokens read the cache through `block_tables`.
- ENCODER_DECODER: in a prefill step the encoder's keys/values go into the cross cache by
  `cross_slot_mapping` and prefill queries attend to them directly; decode queries read the
  cross cache through `cross_block_tables` for `encoder_seq_lens` tokens.

A relative position bias (T5) is added to ENCODER and DECODER scores: prefills take slices of one
[heads, L, L] matrix per step (causal ones with -inf above the diagonal, in place of the causal
mask), decode steps take its values by distance back from the query.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from encdec.attention.backends.abstract import AttentionBackend
from encdec.attention.metadata import AttentionMetadata, AttentionType
from encdec.attention.position_bias import RelativePositionBias
from encdec.kernels import cpu_attention
from encdec.kernels.cache_ops import reshape_and_cache
from encdec.kernels.cpu_decode import paged_decode_attention
from encdec.kernels.paged_attention import paged_attention


class TorchSDPABackend(AttentionBackend):
    name = "torch"

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor],
                value: Optional[torch.Tensor], kv_cache: Optional[torch.Tensor],
                meta: AttentionMetadata, attn_type: AttentionType, scale: float,
                position_bias: Optional[RelativePositionBias] = None) -> torch.Tensor:
        if attn_type == AttentionType.ENCODER:
            lens = _lens(meta, "encoder", meta.encoder_seq_lens[:meta.num_prefills])
            bias = _prefill_bias(meta, attn_type, position_bias, lens)
            return varlen_attention(query, key, value, lens, lens, False, scale, bias)

        num_prefill_tokens = meta.num_prefill_tokens
        out = torch.empty_like(query)
        if attn_type == AttentionType.DECODER:
            if kv_cache is not None:
                reshape_and_cache(key, value, kv_cache, meta.slot_mapping)
            if meta.num_prefills:
                lens = _lens(meta, "decoder", meta.seq_lens[:meta.num_prefills])
                bias = _prefill_bias(meta, attn_type, position_bias, lens)
                out[:num_prefill_tokens] = varlen_attention(
                    query[:num_prefill_tokens], key[:num_prefill_tokens],
                    value[:num_prefill_tokens], lens, lens, True, scale, bias)
            if meta.num_decode_tokens:
                out[num_prefill_tokens:] = self._decode(
                    query[num_prefill_tokens:], kv_cache, meta, "self", meta.block_tables,
                    meta.seq_lens, scale, _distance_bias(meta, position_bias))
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
                kind: str, block_tables: torch.Tensor, lens: list[int], scale: float,
                distance_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One query token per decode sequence, over its cached keys (self or cross table)."""
        key = ("torch_decode", kind)
        if key not in meta.backend_cache:
            meta.backend_cache[key] = (block_tables[meta.num_prefills:].to(torch.int32),
                                       np.asarray(lens[meta.num_prefills:], dtype=np.int64))
        tables, decode_lens = meta.backend_cache[key]
        if query.dtype == kv_cache.dtype and query.dtype in (torch.float32, torch.bfloat16) \
                and query.device.type == "cpu":
            return paged_decode_attention(query, kv_cache, tables, decode_lens, scale, distance_bias)
        return paged_attention(query, kv_cache, tables, decode_lens, scale,
                               distance_bias=distance_bias)


def _lens(meta: AttentionMetadata, kind: str, lens: list[int]) -> tuple[int, ...]:
    """Lengths as a tuple, computed once per step and shared by every layer."""
    key = ("torch_lens", kind)
    if key not in meta.backend_cache:
        meta.backend_cache[key] = tuple(lens)
    return meta.backend_cache[key]


def _prefill_bias(meta: AttentionMetadata, attn_type: AttentionType,
                  position_bias: Optional[RelativePositionBias],
                  lens: tuple[int, ...]) -> Optional[torch.Tensor]:
    """The step's [heads, L, L] bias matrix for the prefills' `lens` (None without a bias)."""
    if position_bias is None:
        return None
    key = ("torch_bias", attn_type)
    if key not in meta.backend_cache:
        meta.backend_cache[key] = position_bias.matrix(max(lens),
                                                       causal=attn_type == AttentionType.DECODER)
    return meta.backend_cache[key]


def _distance_bias(meta: AttentionMetadata,
                   position_bias: Optional[RelativePositionBias]) -> Optional[torch.Tensor]:
    """The step's decode bias by distance back from the query (None without a bias)."""
    if position_bias is None:
        return None
    key = ("torch_distance_bias",)
    if key not in meta.backend_cache:
        meta.backend_cache[key] = position_bias.by_distance()
    return meta.backend_cache[key]


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lens: tuple[int, ...],
                     kv_lens: tuple[int, ...], causal: bool, scale: float,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention of each query sequence over its own key sequence, on unpadded vectors.

    q: [sum(q_lens), H, D]; k, v: [sum(kv_lens), H, D]. With `causal`, q_lens == kv_lens.
    `bias` ([H, >= max(q_lens), >= max(kv_lens)], causal masking included) is added to every
    sequence's scores. Sequences of one length run as one batched call, others one call per
    sequence. Without a causal mask or bias, float32 and bfloat16 on the CPU run the kernel of
    `encdec/kernels/cpu_attention.py` where it runs. Other dtypes than float32 are computed in float32
    and returned in their own.
    """
    if not causal and bias is None:
        out = cpu_attention.attention(q, k, v, q_lens, kv_lens, scale)
        if out is not None:
            return out
    if q.dtype != torch.float32:
        return varlen_attention(q.float(), k.float(), v.float(), q_lens, kv_lens, causal, scale,
                                bias).to(q.dtype)
    num_heads, head_size = q.shape[1], q.shape[2]
    if len(set(q_lens)) == 1 and len(set(kv_lens)) == 1:
        b, lq, lk = len(q_lens), q_lens[0], kv_lens[0]
        qb = q.view(b, lq, num_heads, head_size).transpose(1, 2)
        kb = k.view(b, lk, num_heads, head_size).transpose(1, 2)
        vb = v.view(b, lk, num_heads, head_size).transpose(1, 2)
        out = _attend(qb, kb, vb, scale, causal, bias)
        return out.transpose(1, 2).reshape(-1, num_heads, head_size)
    outs = []
    q_start = k_start = 0
    for lq, lk in zip(q_lens, kv_lens):  # as a batch of one: the kernel a batch of many runs
        qs = q[q_start:q_start + lq].transpose(0, 1)[None]
        ks = k[k_start:k_start + lk].transpose(0, 1)[None]
        vs = v[k_start:k_start + lk].transpose(0, 1)[None]
        outs.append(_attend(qs, ks, vs, scale, causal, bias)[0].transpose(0, 1))
        q_start += lq
        k_start += lk
    return torch.cat(outs)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
            bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Attention over [B, H, L, D] tensors; a `bias` carries the causal mask itself.

    Always 4-D: torch runs SDPA on 3-D inputs through another kernel whose sums round
    differently, and a sequence's result must not depend on whether its step batched it.

    Without a bias torch's SDPA (its CPU flash kernel) runs: 1.3-2.4x the speed of
    `dense_attention` at 2 threads here, from BART's 150-token articles to 24 Whisper windows of
    1500 (benchmarks/RESULTS.md, "Encoder attention on SDPA"). With a bias it is the other way
    round (SDPA's additive mask ran at 0.5-0.8x), so biased attention stays on `dense_attention`.
    """
    if bias is not None:
        return dense_attention(q, k, v, scale, bias[:, :q.shape[-2], :k.shape[-2]])
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal and q.shape[-2] > 1,
                                          scale=scale)


# dense_attention works in blocks of query rows of a few (batch, head) pairs whose scores fit in
# about this many bytes, so a block's scores stay in the core's L2 cache between its two matmuls.
_SCORE_BLOCK_BYTES = 1 << 20
_ROW_CHUNK = 256


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v over [..., heads, L, D] tensors (e.g. [batch, heads, L, D]),
    as matmuls over cache-sized blocks; `bias` ([heads, q_len, k_len]) is optional. With a bias
    this beats SDPA's additive mask (1.3-2x for T5 encoders of 150-1024 tokens here)."""
    *lead, q_len, head_size = q.shape
    k_len = k.shape[-2]
    pairs = math.prod(lead)
    queries = (q * scale).reshape(pairs, q_len, head_size)
    keys_t = k.transpose(-1, -2).reshape(pairs, head_size, k_len)
    values = v.reshape(pairs, k_len, head_size)
    rows = min(q_len, _ROW_CHUNK)
    group = max(1, _SCORE_BLOCK_BYTES // (rows * k_len * queries.element_size()))
    out = torch.empty_like(queries)
    heads = None if bias is None else torch.arange(pairs) % bias.shape[0]  # pair -> its head
    for p in range(0, pairs, group):
        keys_p, values_p = keys_t[p:p + group], values[p:p + group]
        for r in range(0, q_len, rows):
            scores = torch.matmul(queries[p:p + group, r:r + rows], keys_p)
            if bias is not None:
                scores += bias[heads[p:p + group], r:r + rows]
            torch.matmul(scores.softmax(-1), values_p, out=out[p:p + group, r:r + rows])
    return out.view(*lead, q_len, head_size)

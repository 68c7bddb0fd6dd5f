"""CPU attention backend: PyTorch scaled_dot_product_attention, never a dense (tokens)^2 mask.

- ENCODER: non-causal attention inside each encoder sequence.
- DECODER: new keys/values go into the paged self cache by `slot_mapping`; prefill sequences
  attend causally to their own tokens, decode tokens read the cache through `block_tables`.
- ENCODER_DECODER: in a prefill step the encoder's keys/values go into the cross cache by
  `cross_slot_mapping` and prefill queries attend to them directly; decode queries read the
  cross cache through `cross_block_tables` for `encoder_seq_lens` tokens.
Sequences of equal length run as one batched call; otherwise one call per sequence.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import torch
import torch.nn.functional as F

from encdec.attention.backends.abstract import AttentionBackend
from encdec.attention.metadata import AttentionMetadata, AttentionType
from encdec.kernels.cache_ops import reshape_and_cache
from encdec.kernels.paged_attention import (block_runs, paged_attention, paged_attention_per_seq,
                                            uniform_runs_attention)

# Decode reads longer than this run one sequence at a time on views of the cache; shorter
# ones are gathered into one padded batch (cheaper per sequence when there are many).
_PER_SEQ_MIN_LEN = 64


class TorchSDPABackend(AttentionBackend):
    name = "torch"

    def __init__(self):
        # Workers for per-sequence decode attention, one per intra-op thread.
        self.num_workers = torch.get_num_threads()
        self.executor = ThreadPoolExecutor(self.num_workers) if self.num_workers > 1 else None

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
            tables = block_tables[meta.num_prefills:]
            decode_lens = lens[meta.num_prefills:]
            runs = None
            if max(decode_lens) > _PER_SEQ_MIN_LEN:
                runs = block_runs(tables, decode_lens, kv_cache.shape[2])
            meta.backend_cache[key] = (tables, decode_lens, torch.tensor(decode_lens), runs)
        tables, decode_lens, lens_tensor, runs = meta.backend_cache[key]
        if runs is None:
            return paged_attention(query, kv_cache, tables, lens_tensor, scale)
        if len(set(decode_lens)) == 1:
            out = uniform_runs_attention(query, kv_cache, runs, decode_lens[0], scale)
            if out is not None:
                return out
        return paged_attention_per_seq(query, kv_cache, tables, decode_lens, scale, runs=runs,
                                       executor=self.executor, num_workers=self.num_workers)


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
    """
    num_heads, head_size = q.shape[1], q.shape[2]
    if len(set(q_lens)) == 1 and len(set(kv_lens)) == 1:
        b, lq, lk = len(q_lens), q_lens[0], kv_lens[0]
        qb = q.view(b, lq, num_heads, head_size).transpose(1, 2)
        kb = k.view(b, lk, num_heads, head_size).transpose(1, 2)
        vb = v.view(b, lk, num_heads, head_size).transpose(1, 2)
        out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal and lq > 1, scale=scale)
        return out.transpose(1, 2).reshape(-1, num_heads, head_size)
    outs = []
    q_start = k_start = 0
    for lq, lk in zip(q_lens, kv_lens):
        qs = q[q_start:q_start + lq].transpose(0, 1)
        ks = k[k_start:k_start + lk].transpose(0, 1)
        vs = v[k_start:k_start + lk].transpose(0, 1)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal and lq > 1,
                                                   scale=scale).transpose(0, 1))
        q_start += lq
        k_start += lk
    return torch.cat(outs)

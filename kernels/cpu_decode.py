"""Decode attention on CPU: one compiled pass over each sequence's paged keys and values.

A decode step is bound by memory bandwidth: every sequence reads all of its cached keys and
values (for BART's cross-attention, hundreds of encoder tokens per layer) to attend with one
query token. Torch ops cannot read a paged cache that way without a gather copy, or without
many small strided mat-vecs per sequence, which reach a third of the machine's bandwidth.
This Numba kernel walks the block table itself and reads each token's keys and values once,
as contiguous rows of the cache, so it runs close to the bandwidth. Sequences are spread over
worker threads (the kernel releases the GIL), balanced by length.

Float32 only (NumPy has no bfloat16); callers use the torch reference for other dtypes. Numba compiles on first use and caches the machine code on disk.
"""
from __future__ import annotations

from concurrent.futures import Executor

import numba
import numpy as np
import torch



@numba.njit(nogil=True, fastmath=True, cache=True)
def _decode_attention(query, keys, values, block_tables, seq_lens, block_size, scale, out,
                      seq_indices):
    num_heads, head_size = query.shape[1], query.shape[2]
    for i in seq_indices:
        seq_len = seq_lens[i]
        probs = np.empty((num_heads, seq_len), dtype=query.dtype)
        for pos in range(seq_len):
            slot = block_tables[i, pos // block_size] * block_size + pos % block_size
            for h in range(num_heads):
                dot = np.float32(0)
                for d in range(head_size):
                    dot += query[i, h, d] * keys[slot, h, d]
                probs[h, pos] = dot * scale
        for h in range(num_heads):
            top = probs[h].max()
            total = np.float32(0)
            for pos in range(seq_len):
                e = np.exp(probs[h, pos] - top)
                probs[h, pos] = e
                total += e
            probs[h] /= total
        acc = np.zeros((num_heads, head_size), dtype=query.dtype)
        for pos in range(seq_len):
            slot = block_tables[i, pos // block_size] * block_size + pos % block_size
            for h in range(num_heads):
                p = probs[h, pos]
                for d in range(head_size):
                    acc[h, d] += p * values[slot, h, d]
        out[i] = acc


def balanced_parts(seq_lens: list[int], num_parts: int) -> list[np.ndarray]:
    """Sequence indices split into `num_parts` groups of about equal total length (longest
    first, each to the lightest group)."""
    loads = [0] * num_parts
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    for i in sorted(range(len(seq_lens)), key=lambda i: -seq_lens[i]):
        w = loads.index(min(loads))
        parts[w].append(i)
        loads[w] += seq_lens[i]
    return [np.asarray(p, dtype=np.int64) for p in parts if p]


def paged_decode_attention(query: torch.Tensor, kv_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens, scale: float | None = None,
                           parts: list[np.ndarray] | None = None,
                           executor: Executor | None = None) -> torch.Tensor:
    """softmax(q K^T * scale) V for one query token per sequence, over the first
    `seq_lens[i]` tokens of sequence i's blocks. query: [num_seqs, num_heads, head_size];
    kv_cache: [2, num_blocks, block_size, num_heads, head_size], contiguous, on the CPU.
    `scale` defaults to head_size ** -0.5. `parts` (from `balanced_parts`) run concurrently
    on `executor`'s threads.
    """
    if query.dtype != torch.float32 or kv_cache.dtype != torch.float32:
        raise ValueError(f"paged_decode_attention needs a float32 query and cache, "
                         f"got {query.dtype} and {kv_cache.dtype}")
    lens = np.asarray(seq_lens, dtype=np.int64)
    if (lens < 1).any():
        raise ValueError("paged_decode_attention needs seq_lens >= 1")
    _, _, block_size, num_heads, head_size = kv_cache.shape
    if scale is None:
        scale = head_size ** -0.5
    q = query.detach().contiguous().numpy()
    keys = kv_cache[0].detach().view(-1, num_heads, head_size).numpy()
    values = kv_cache[1].detach().view(-1, num_heads, head_size).numpy()
    tables = block_tables.to(torch.int32).numpy()
    out = np.empty_like(q)
    if parts is None:
        parts = [np.arange(len(lens), dtype=np.int64)]
    args = (q, keys, values, tables, lens, block_size, np.float32(scale), out)
    if executor is None or len(parts) == 1:
        for part in parts:
            _decode_attention(*args, part)
    else:
        for job in [executor.submit(_decode_attention, *args, part) for part in parts]:
            job.result()
    return torch.from_numpy(out)

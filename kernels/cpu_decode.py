"""Decode attention on CPU: one compiled pass over each sequence's paged keys and values.

A decode step is bound by memory bandwidth: every sequence reads all of its cached keys and
values (for BART's cross-attention, hundreds of encoder tokens per layer) to attend with one
query token. Torch ops cannot read a paged cache that way without a gather copy, or without
many small strided mat-vecs per sequence, which reach a third of the machine's bandwidth.
This Numba kernel walks the block table itself and reads each token's keys and values once,
as contiguous rows of the cache. Sequences are spread over torch's thread count with Numba's
parallel loop when its threading layer is thread-safe (TBB or OpenMP; on this project's 2-core
machine that made decode steps about 15% faster than one thread, while a Python thread pool made
them slower); otherwise, and in forked child processes (GNU OpenMP does not survive a fork),
the kernel runs on the calling thread.

An optional `distance_bias[h, d]` is added to the score of the key d positions before the query
(T5's relative position bias, by distance back from the query: `encdec.attention.position_bias`).

The cache is float32 or bfloat16 (read as its uint16 bits: NumPy has no bfloat16; a bfloat16 is
the high half of a float32, so each element widens with one shift); scores, softmax and sums are
float32 either way. Callers use the torch reference for other dtypes. Numba compiles on first use
(once per cache dtype) and caches the machine code on disk.
"""
from __future__ import annotations

import functools
import os

import numba
import numpy as np
import torch
from numba import types
from numba.extending import overload

_CACHE_DTYPES = (torch.float32, torch.bfloat16)


def _widen(x):
    """A cache element as float32 (inside compiled code only)."""
    raise NotImplementedError


@overload(_widen, inline="always")
def _widen_compiled(x):
    if isinstance(x, types.Float):
        return lambda x: np.float32(x)
    return lambda x: np.uint32(np.uint32(x) << 16).view(np.float32)  # bfloat16 bits


@numba.njit(nogil=True, fastmath=True, cache=True)
def _attend(i, query, keys, values, block_tables, seq_lens, block_size, scale, distance_bias, out):
    """Sequence i: scores over its keys (plus their distance bias, if any), softmax, weighted
    sum of its values."""
    num_heads, head_size = query.shape[1], query.shape[2]
    seq_len = seq_lens[i]
    probs = np.empty((num_heads, seq_len), dtype=query.dtype)
    for pos in range(seq_len):
        slot = block_tables[i, pos // block_size] * block_size + pos % block_size
        for h in range(num_heads):
            dot = np.float32(0)
            for d in range(head_size):
                dot += query[i, h, d] * _widen(keys[slot, h, d])
            probs[h, pos] = dot * scale
    if distance_bias.shape[1]:
        for h in range(num_heads):
            for pos in range(seq_len):
                probs[h, pos] += distance_bias[h, seq_len - 1 - pos]
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
                acc[h, d] += p * _widen(values[slot, h, d])
    out[i] = acc


@numba.njit(nogil=True, fastmath=True, cache=True)
def _decode_serial(query, keys, values, block_tables, seq_lens, block_size, scale, distance_bias,
                   out):
    for i in range(query.shape[0]):
        _attend(i, query, keys, values, block_tables, seq_lens, block_size, scale, distance_bias,
                out)


@numba.njit(nogil=True, fastmath=True, cache=True, parallel=True)
def _decode_parallel(query, keys, values, block_tables, seq_lens, block_size, scale,
                     distance_bias, out):
    for i in numba.prange(query.shape[0]):
        _attend(i, query, keys, values, block_tables, seq_lens, block_size, scale, distance_bias,
                out)


_forked_child = False
_NO_BIAS = np.zeros((1, 0), dtype=np.float32)


def _mark_forked_child() -> None:
    global _forked_child
    _forked_child = True


# GNU OpenMP cannot be used again in a child forked from a process that used it (Numba would
# terminate the child), so forked children run the serial loop.
os.register_at_fork(after_in_child=_mark_forked_child)


@functools.lru_cache(maxsize=1)
def _parallel_is_safe() -> bool:
    """Whether Numba's parallel loops run on a thread-safe layer here (TBB or OpenMP; its
    fallback "workqueue" aborts the process if two Python threads launch kernels at once)."""
    try:
        _decode_parallel(*_tiny_inputs())
    except Exception:  # no threading layer could be loaded
        return False
    return numba.threading_layer() in ("tbb", "omp")


def _tiny_inputs(cache_dtype: torch.dtype = torch.float32) -> tuple:
    """Arguments of one one-token sequence, of the types `paged_decode_attention` passes for a
    cache of `cache_dtype` (a kernel is compiled once per argument types)."""
    one = np.ones((1, 1, 1), dtype=np.float32)
    cache = _as_numpy(torch.ones((1, 1, 1), dtype=cache_dtype))
    return (one, cache, cache, np.zeros((1, 1), dtype=np.int32), np.ones(1, dtype=np.int64), 1,
            np.float32(1), _NO_BIAS, np.empty_like(one))


def compile_decode_kernels(cache_dtype: torch.dtype = torch.float32) -> None:
    """Compile the decode kernels for a cache of `cache_dtype` into Numba's on-disk cache (or
    load them from it): `encdec warmup` runs this once after an install, so that the first
    transcription does not spend 10-20 s compiling."""
    if cache_dtype not in _CACHE_DTYPES:
        raise ValueError(f"the decode kernels take a float32 or bfloat16 cache, not {cache_dtype}")
    _decode_serial(*_tiny_inputs(cache_dtype))
    if _parallel_is_safe():
        _decode_parallel(*_tiny_inputs(cache_dtype))


def paged_decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens, scale: float | None = None,
                           distance_bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q K^T * scale + bias) V for one query token per sequence, over the first
    `seq_lens[i]` tokens of sequence i's blocks. query: [num_seqs, num_heads, head_size];
    kv_cache: [2, num_blocks, block_size, num_heads, head_size], contiguous, on the CPU; both
    float32 or bfloat16, the result float32.
    `scale` defaults to head_size ** -0.5. `distance_bias` ([num_heads, >= max(seq_lens)],
    float32) adds `distance_bias[h, d]` to the key d positions before the query (the query is
    the sequence's last token).
    """
    if query.dtype not in _CACHE_DTYPES or kv_cache.dtype not in _CACHE_DTYPES:
        raise ValueError(f"paged_decode_attention needs a float32 or bfloat16 query and cache, "
                         f"got {query.dtype} and {kv_cache.dtype}")
    lens = np.asarray(seq_lens, dtype=np.int64)
    if (lens < 1).any():
        raise ValueError("paged_decode_attention needs seq_lens >= 1")
    _, _, block_size, num_heads, head_size = kv_cache.shape
    if scale is None:
        scale = head_size ** -0.5
    bias = _NO_BIAS
    if distance_bias is not None:
        if distance_bias.dtype != torch.float32 or distance_bias.shape[0] != num_heads or (
                len(lens) and distance_bias.shape[1] < lens.max()):
            raise ValueError(f"distance_bias must be float32 [{num_heads}, >= max(seq_lens)], got "
                             f"{distance_bias.dtype} {tuple(distance_bias.shape)}")
        bias = distance_bias.detach().contiguous().numpy()
    q = query.detach().float().contiguous().numpy()
    keys = _as_numpy(kv_cache[0].detach().view(-1, num_heads, head_size))
    values = _as_numpy(kv_cache[1].detach().view(-1, num_heads, head_size))
    out = np.empty_like(q)
    args = (q, keys, values, block_tables.to(torch.int32).numpy(), lens, block_size,
            np.float32(scale), bias, out)
    threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
    if threads > 1 and len(lens) > 1 and not _forked_child and _parallel_is_safe():
        numba.set_num_threads(threads)
        with numba.parallel_chunksize(1):  # sequences differ in length: hand them out one by one
            _decode_parallel(*args)
    else:
        _decode_serial(*args)
    return torch.from_numpy(out)


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """A view of `t`; bfloat16 as its uint16 bits."""
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()

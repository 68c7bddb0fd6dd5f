"""The Numba loops behind `cpu_decode.paged_decode_attention`: one pass over each sequence's
paged keys and values, on the calling thread (`decode_serial`) or spread over threads
(`decode_parallel`).

Each sequence walks its block table itself and reads each token's keys and values once, as
contiguous rows of the cache; consecutive sequences with the same blocks and length (a
request's beams or samples over its cross cache) walk them together, reading each row once for
all of them. The parallel loop runs only where Numba's threading layer is thread-safe (TBB or
OpenMP; on this project's 2-core machine it made decode steps about 15% faster than one thread,
while a Python thread pool made them slower), and never in a forked child process (GNU OpenMP
does not survive a fork).

Arguments (both loops): query float32 [seqs, heads, head_size]; keys and values [slots, heads,
head_size], float32 or the uint16 bits of bfloat16 (NumPy has no bfloat16; a bfloat16 is the
high half of a float32, so each element widens with one shift); block_tables int32 [seqs,
blocks]; seq_lens int64 [seqs]; block_size; scale float32; distance_bias float32 [heads, >=
max(seq_lens)] or [1, 0] for none; out float32 like query. Scores, softmax and sums are float32.
Importing this module imports Numba; the loops compile on first use (once per cache dtype)
and are cached on disk.
"""
from __future__ import annotations

import functools
import os

import numba
import numpy as np
from numba import types
from numba.extending import overload

NO_BIAS = np.zeros((1, 0), dtype=np.float32)


def _widen(x):
    """A cache element as float32 (inside compiled code only)."""
    raise NotImplementedError


@overload(_widen, inline="always")
def _widen_compiled(x):
    if isinstance(x, types.Float):
        return lambda x: np.float32(x)
    return lambda x: np.uint32(np.uint32(x) << 16).view(np.float32)  # bfloat16 bits


@numba.njit(nogil=True, fastmath=True, cache=True)
def _group_end(i, block_tables, seq_lens, block_size):
    """The end of the run of sequences from i that read the same blocks: the beams or samples of
    one request over its cross cache. Each key and value is then read once for all of them."""
    blocks = (seq_lens[i] + block_size - 1) // block_size
    end = i + 1
    while end < seq_lens.shape[0] and seq_lens[end] == seq_lens[i]:
        for b in range(blocks):
            if block_tables[end, b] != block_tables[i, b]:
                return end
        end += 1
    return end


@numba.njit(nogil=True, fastmath=True, cache=True)
def _group_starts(block_tables, seq_lens, block_size):
    starts = [0]
    while starts[-1] < seq_lens.shape[0]:
        starts.append(_group_end(starts[-1], block_tables, seq_lens, block_size))
    return np.array(starts, dtype=np.int64)


@numba.njit(nogil=True, fastmath=True, cache=True)
def _attend(first, last, query, keys, values, block_tables, seq_lens, block_size, scale,
            distance_bias, out):
    """Sequences first..last-1, which share their blocks: scores over the keys (plus their
    distance bias, if any), softmax, weighted sum of the values; each sequence's sums run in
    the same order as alone."""
    num_heads, head_size = query.shape[1], query.shape[2]
    seq_len = seq_lens[first]
    probs = np.empty((last - first, num_heads, seq_len), dtype=query.dtype)
    for pos in range(seq_len):
        slot = block_tables[first, pos // block_size] * block_size + pos % block_size
        for g in range(last - first):
            for h in range(num_heads):
                dot = np.float32(0)
                for d in range(head_size):
                    dot += query[first + g, h, d] * _widen(keys[slot, h, d])
                probs[g, h, pos] = dot * scale
    for g in range(last - first):
        if distance_bias.shape[1]:
            for h in range(num_heads):
                for pos in range(seq_len):
                    probs[g, h, pos] += distance_bias[h, seq_len - 1 - pos]
        for h in range(num_heads):
            top = probs[g, h].max()
            total = np.float32(0)
            for pos in range(seq_len):
                e = np.exp(probs[g, h, pos] - top)
                probs[g, h, pos] = e
                total += e
            probs[g, h] /= total
    acc = np.zeros((last - first, num_heads, head_size), dtype=query.dtype)
    for pos in range(seq_len):
        slot = block_tables[first, pos // block_size] * block_size + pos % block_size
        for g in range(last - first):
            for h in range(num_heads):
                p = probs[g, h, pos]
                for d in range(head_size):
                    acc[g, h, d] += p * _widen(values[slot, h, d])
    out[first:last] = acc


@numba.njit(nogil=True, fastmath=True, cache=True)
def decode_serial(query, keys, values, block_tables, seq_lens, block_size, scale, distance_bias,
                  out):
    first = 0
    while first < query.shape[0]:
        last = _group_end(first, block_tables, seq_lens, block_size)
        _attend(first, last, query, keys, values, block_tables, seq_lens, block_size, scale,
                distance_bias, out)
        first = last


@numba.njit(nogil=True, fastmath=True, cache=True, parallel=True)
def decode_parallel(query, keys, values, block_tables, seq_lens, block_size, scale,
                    distance_bias, out):
    starts = _group_starts(block_tables, seq_lens, block_size)
    for k in numba.prange(starts.shape[0] - 1):
        _attend(starts[k], starts[k + 1], query, keys, values, block_tables, seq_lens,
                block_size, scale, distance_bias, out)


_forked_child = False


def _mark_forked_child() -> None:
    global _forked_child
    _forked_child = True


# GNU OpenMP cannot be used again in a child forked from a process that used it (Numba would
# terminate the child), so forked children run the serial loop.
os.register_at_fork(after_in_child=_mark_forked_child)


def tiny_inputs(cache_dtype: np.dtype = np.float32) -> tuple:
    """Arguments of one one-token sequence with a cache of `cache_dtype` (float32, or uint16
    for bfloat16): a loop compiles once per argument types."""
    one = np.ones((1, 1, 1), dtype=np.float32)
    cache = np.ones((1, 1, 1), dtype=cache_dtype)
    return (one, cache, cache, np.zeros((1, 1), dtype=np.int32), np.ones(1, dtype=np.int64), 1,
            np.float32(1), NO_BIAS, np.empty_like(one))


@functools.lru_cache(maxsize=1)
def _threading_layer_is_safe() -> bool:
    """Whether Numba's parallel loops run on a thread-safe layer here (TBB or OpenMP; its
    fallback "workqueue" aborts the process if two Python threads launch kernels at once)."""
    try:
        decode_parallel(*tiny_inputs())
    except Exception:  # no threading layer could be loaded
        return False
    return numba.threading_layer() in ("tbb", "omp")


def parallel_is_safe() -> bool:
    """Whether `decode_parallel` may run in this process."""
    return not _forked_child and _threading_layer_is_safe()


def decode_in_parallel(args: tuple, threads: int) -> bool:
    """Run `decode_parallel(*args)` on up to `threads` threads, handing sequences (or groups
    sharing their blocks) out one by one (they differ in length); False, without running it,
    where that is not safe."""
    if not parallel_is_safe():
        return False
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    with numba.parallel_chunksize(1):
        decode_parallel(*args)
    return True

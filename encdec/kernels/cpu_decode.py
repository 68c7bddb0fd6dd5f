"""Decode attention on CPU: one compiled pass over each sequence's paged keys and values.

A decode step is bound by memory bandwidth: every sequence reads all of its cached keys and
values (for BART's cross-attention, hundreds of encoder tokens per layer) to attend with one
query token. Torch ops cannot read a paged cache that way without a gather copy, or without
many small strided mat-vecs per sequence, which reach a third of the machine's bandwidth.
The compiled loops (`cpu_decode_loops`) walk the block table themselves and read each token's
keys and values once. A batch of `PARALLEL_MIN_SEQS` or more sequences on several threads runs
Numba's parallel loop; smaller batches run the serial loop, compiled ahead of time by `encdec
warmup` (`cpu_decode_aot`) so that a short job never loads Numba, or by Numba on first use where
that was not done.

An optional `distance_bias[h, d]` is added to the score of the key d positions before the query
(T5's relative position bias, by distance back from the query: `encdec.attention.position_bias`).
The cache is float32 or bfloat16; scores, softmax and sums are float32 either way. Callers use
the torch reference (`paged_attention`) for other dtypes.
"""
from __future__ import annotations

import numpy as np
import torch

from . import cpu_decode_aot

_CACHE_DTYPES = (torch.float32, torch.bfloat16)
_NO_BIAS = np.zeros((1, 0), dtype=np.float32)
# Fewer sequences than this decode on one thread. The parallel loop is 1.6-2x faster on 2
# threads, but below 8 sequences that saves well under a millisecond per layer and step (5 beams
# over one 30 s Whisper window: 0.36 ms against 0.59), while loading Numba for it costs 0.6-1 s
# of a short transcription. Even over a long file the two were even: tiny.en, 5 beams, a 102 s
# clip, 6.77 s with this threshold against 6.88 s with the parallel loop from 2 sequences
# (medians of 3, interleaved).
PARALLEL_MIN_SEQS = 8


def compile_decode_kernels(cache_dtype: torch.dtype = torch.float32) -> list[str]:
    """Compile the decode loops for a cache of `cache_dtype` once after an install (`encdec
    warmup`): the serial loop ahead of time, or into Numba's on-disk cache where that fails, and
    the parallel loop into Numba's cache. Returns what was made, in words."""
    if cache_dtype not in _CACHE_DTYPES:
        raise ValueError(f"the decode kernels take a float32 or bfloat16 cache, not {cache_dtype}")
    from . import cpu_decode_loops as loops

    made = []
    try:
        made.append(f"serial loop compiled ahead of time: {cpu_decode_aot.build()}")
    except Exception as error:  # no C compiler, a read-only folder: Numba compiles it instead
        loops.decode_serial(*loops.tiny_inputs(_numpy_dtype(cache_dtype)))
        made.append(f"serial loop in Numba's cache (ahead-of-time build failed: {error})")
    if loops.parallel_is_safe():
        loops.decode_parallel(*loops.tiny_inputs(_numpy_dtype(cache_dtype)))
        made.append("parallel loop in Numba's cache")
    return made


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
    lens = np.ascontiguousarray(seq_lens, dtype=np.int64)
    if (lens < 1).any():
        raise ValueError("paged_decode_attention needs seq_lens >= 1")
    _, _, block_size, num_heads, head_size = kv_cache.shape
    if scale is None:
        scale = head_size ** -0.5
    bias = _NO_BIAS
    if distance_bias is not None:
        if not distance_bias.is_floating_point() or distance_bias.shape[0] != num_heads or (
                len(lens) and distance_bias.shape[1] < lens.max()):
            raise ValueError(f"distance_bias must be floating [{num_heads}, >= max(seq_lens)], got "
                             f"{distance_bias.dtype} {tuple(distance_bias.shape)}")
        bias = distance_bias.detach().float().contiguous().numpy()
    q = query.detach().float().contiguous().numpy()
    cache = _as_numpy(kv_cache.detach())  # one conversion: torch's indexing costs microseconds
    keys = cache[0].reshape(-1, num_heads, head_size)
    values = cache[1].reshape(-1, num_heads, head_size)
    out = np.empty_like(q)
    args = (q, keys, values, np.ascontiguousarray(block_tables.to(torch.int32).numpy()), lens,
            block_size, np.float32(scale), bias, out)
    threads = torch.get_num_threads()
    if threads > 1 and len(lens) >= PARALLEL_MIN_SEQS:
        from . import cpu_decode_loops

        if cpu_decode_loops.decode_in_parallel(args, threads):
            return torch.from_numpy(out)
    _serial_loop(kv_cache.dtype)(*args)
    return torch.from_numpy(out)


def _serial_loop(cache_dtype: torch.dtype):
    """The ahead-of-time serial loop where `encdec warmup` built it, else Numba's."""
    loop = cpu_decode_aot.serial_loop(cache_dtype == torch.bfloat16)
    if loop is None:
        from .cpu_decode_loops import decode_serial as loop
    return loop


def _numpy_dtype(cache_dtype: torch.dtype) -> type:
    return np.uint16 if cache_dtype == torch.bfloat16 else np.float32


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """A view of `t`; bfloat16 as its uint16 bits."""
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()

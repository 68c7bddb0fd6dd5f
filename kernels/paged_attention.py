"""Attention over a paged KV cache (reference: gather + SDPA)."""

from __future__ import annotations

import math
from concurrent.futures import Executor
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from .cache_ops import Lengths, as_lengths, gather_kv, gather_sequence_kv


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: Lengths,
    scale: float | None = None,
    query_lens: Lengths | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """Attend queries to the first ``seq_lens[i]`` cached tokens of each sequence.

    ``query`` is ``[num_seqs, num_heads, head_size]`` (one token per sequence, the usual
    decode step) and the result has the same shape. ``query`` may instead be padded
    ``[num_seqs, q_len, num_heads, head_size]`` with ``query_lens[i] <= q_len`` real tokens
    (default: all). If ``causal``, token ``j`` of sequence ``i`` sits at absolute position
    ``seq_lens[i] - query_lens[i] + j`` and sees keys up to that position; otherwise it
    sees all ``seq_lens[i]`` keys (cross-attention). Outputs at padded query rows are
    finite but meaningless. ``scale`` defaults to ``head_size ** -0.5``.
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
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=scale
    )
    out = out.transpose(1, 2)
    return out[:, 0] if single else out


def block_runs(block_tables: torch.Tensor, seq_lens: Lengths, block_size: int) -> list[int | None]:
    """For each sequence, its first block id if its blocks are consecutive ids, else None.

    A consecutive run is one slice of the cache, so attention can read it without a copy.
    """
    tables = block_tables.to("cpu", torch.int64).numpy()
    nblocks = -(-as_lengths(seq_lens).numpy() // block_size)
    cols = np.arange(tables.shape[1] - 1)
    steps_ok = (np.diff(tables, axis=1) == 1) | (cols[None, :] >= nblocks[:, None] - 1)
    consecutive = steps_ok.all(axis=1)
    return [int(t[0]) if ok else None for t, ok in zip(tables, consecutive)]


def uniform_runs_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    runs: list[int | None],
    seq_len: int,
    scale: float,
) -> torch.Tensor | None:
    """Decode attention as ONE batched call when every sequence has `seq_len` keys in a run of
    consecutive blocks and the runs start at `first + slot * run_blocks` (requests prefilled
    together, as Whisper windows are). The runs are read through one strided view of the cache
    over the slots `first..max(slot)`; slots of finished requests in between are computed and
    dropped, sequences sharing a run are query rows of one slot. Returns None when the runs
    are not laid out that way (or too sparsely).
    """
    if any(r is None for r in runs):
        return None
    _, num_blocks, block_size, num_heads, head_size = kv_cache.shape
    run_blocks = -(-seq_len // block_size)
    first = min(runs)
    offsets = [r - first for r in runs]
    if any(o % run_blocks for o in offsets):
        return None
    slots = [o // run_blocks for o in offsets]
    num_slots = max(slots) + 1
    if num_slots > 2 * len(set(slots)):
        return None
    # Sequences sharing a cross table (beams, n > 1) share a slot: each is one query row.
    rows, seen = [], {}
    for slot in slots:
        rows.append(seen.get(slot, 0))
        seen[slot] = rows[-1] + 1
    stride = kv_cache.stride()
    size = (num_slots, num_heads, seq_len, head_size)
    strides = (run_blocks * stride[1], stride[3], stride[2], stride[4])
    keys = kv_cache[0].as_strided(size, strides, kv_cache[0].storage_offset() + first * stride[1])
    values = kv_cache[1].as_strided(size, strides, kv_cache[1].storage_offset() + first * stride[1])
    q = query.new_zeros((num_slots, num_heads, max(rows) + 1, head_size))
    slot_index, row_index = torch.tensor(slots), torch.tensor(rows)
    q[slot_index, :, row_index] = query
    out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), scale=scale)
    return out[slot_index, :, row_index]


def paged_attention_per_seq(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: Lengths,
    scale: float | None = None,
    runs: list[int | None] | None = None,
    executor: Executor | None = None,
    num_workers: int = 1,
) -> torch.Tensor:
    """Single-token decode attention computed one sequence at a time.

    Same contract and result as :func:`paged_attention` for a 3-D ``query``
    ``[num_seqs, num_heads, head_size]``. No padded batch K/V, no mask: a sequence whose
    blocks are consecutive (``runs`` from :func:`block_runs`) is read as a view of the cache,
    any other is gathered on its own. Faster on CPU once sequences are long. Each op runs on
    one thread; with an `executor`, its workers take the sequences in turn (the ops release the
    GIL), `num_workers` of them taking every `num_workers`-th sequence, which uses the cores
    without the hand-offs of threads inside tiny ops.
    """
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_size], got {tuple(query.shape)}")
    _check_shapes(query[:, None], kv_cache, block_tables)
    lens = as_lengths(seq_lens).tolist()
    if min(lens, default=1) < 1:
        raise ValueError("paged_attention_per_seq needs seq_lens >= 1")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if runs is None:
        runs = block_runs(block_tables, lens, kv_cache.shape[2])
    out = torch.empty_like(query)
    with _single_threaded():  # many small ops: thread hand-offs cost more than they save
        if executor is None or num_workers < 2:
            _per_seq(query, kv_cache, block_tables, lens, runs, scale, out, range(len(lens)))
        else:
            inference = torch.is_inference_mode_enabled()  # thread-local: carry it to the workers
            jobs = [executor.submit(_in_mode, inference, query, kv_cache, block_tables, lens, runs,
                                    scale, out, range(w, len(lens), num_workers))
                    for w in range(num_workers)]
            for job in jobs:
                job.result()
    return out


@contextmanager
def _single_threaded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _in_mode(inference: bool, *args) -> None:
    with torch.inference_mode(inference):
        _per_seq(*args)


def _per_seq(query, kv_cache, block_tables, lens, runs, scale, out, indices) -> None:
    _, _, block_size, num_heads, head_size = kv_cache.shape
    for i in indices:
        seq_len, first = lens[i], runs[i]
        if first is None:
            keys, values = gather_sequence_kv(kv_cache, block_tables[i], seq_len)
        else:
            run = kv_cache[:, first:first - (-seq_len // block_size)]
            kv = run.reshape(2, -1, num_heads, head_size)[:, :seq_len].transpose(1, 2)
            keys, values = kv[0], kv[1]
        out[i] = _single_query_attention(query[i], keys.to(query.dtype), values.to(query.dtype), scale)


def _single_query_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v for one query token: q [H, D], keys/values [H, L, D] (strided
    views are fine). Two batched mat-vecs: several times cheaper than SDPA at this size."""
    probs = torch.bmm(keys, q[:, :, None]).squeeze(-1).mul_(scale).softmax(dim=-1)
    return torch.bmm(probs[:, None], values).squeeze(1)


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
    query_pos = (lens - qlens)[:, None] + torch.arange(q_len, device=lens.device)
    return mask & (key_pos[None, None, None, :] <= query_pos[:, None, :, None])

"""Vectorized token layout and slot mapping (docs/design.md, "Model runner", has a worked example).

Request level: `num_computed` and `num_scheduled` per sequence. Token level: which sequence each
scheduled token belongs to, its position, and the cache slot it is written to. No Python loop
runs per token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TokenLayout:
    req_indices: np.ndarray  # token level: index of the sequence each token belongs to
    positions: np.ndarray  # token level: num_computed + offset inside this step's chunk
    query_start_loc: np.ndarray  # request level (+1): cumulative scheduled tokens, from 0
    seq_lens: np.ndarray  # request level: num_computed + num_scheduled


def token_layout(num_computed: np.ndarray, num_scheduled: np.ndarray) -> TokenLayout:
    """Positions and request indices of every scheduled token, via cumsum and a batched arange."""
    num_computed = np.asarray(num_computed, dtype=np.int64)
    num_scheduled = np.asarray(num_scheduled, dtype=np.int64)
    cu_num_tokens = np.cumsum(num_scheduled)
    total = int(cu_num_tokens[-1]) if len(cu_num_tokens) else 0
    req_indices = np.repeat(np.arange(len(num_scheduled)), num_scheduled)
    arange = np.arange(total) - np.repeat(cu_num_tokens - num_scheduled, num_scheduled)
    query_start_loc = np.zeros(len(num_scheduled) + 1, dtype=np.int64)
    query_start_loc[1:] = cu_num_tokens
    return TokenLayout(req_indices=req_indices, positions=num_computed[req_indices] + arange,
                       query_start_loc=query_start_loc, seq_lens=num_computed + num_scheduled)


def slot_mapping(block_table: np.ndarray, req_indices: np.ndarray, positions: np.ndarray,
                 block_size: int) -> np.ndarray:
    """Cache slot of each token: block_table[req, pos // block_size] * block_size + pos % block_size."""
    max_blocks = block_table.shape[1]
    block_table_indices = req_indices * max_blocks + positions // block_size
    block_numbers = block_table.reshape(-1)[block_table_indices]
    return block_numbers.astype(np.int64) * block_size + positions % block_size


def pad_block_tables(tables: list[list[int]]) -> np.ndarray:
    """Block tables as one [num_seqs, max_blocks] array, padded with block 0."""
    width = max(len(t) for t in tables) if tables else 0
    out = np.zeros((len(tables), max(width, 1)), dtype=np.int64)
    for i, table in enumerate(tables):
        out[i, :len(table)] = table
    return out

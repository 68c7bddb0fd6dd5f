"""Paged KV-cache kernels (pure torch, CPU-first)."""

from .cache_ops import copy_blocks, gather_kv, gather_sequence_kv, reshape_and_cache, swap_blocks
from .paged_attention import block_runs, paged_attention, paged_attention_per_seq, uniform_runs_attention

__all__ = [
    "block_runs",
    "copy_blocks",
    "gather_kv",
    "gather_sequence_kv",
    "paged_attention",
    "paged_attention_per_seq",
    "reshape_and_cache",
    "swap_blocks",
    "uniform_runs_attention",
]

"""Paged KV-cache kernels (pure torch, CPU-first)."""

from .cache_ops import copy_blocks, gather_kv, reshape_and_cache, swap_blocks
from .paged_attention import paged_attention

__all__ = ["copy_blocks", "gather_kv", "paged_attention", "reshape_and_cache", "swap_blocks"]

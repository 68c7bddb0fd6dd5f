"""Paged KV-cache kernels: torch references, a compiled CPU decode attention and a C prefill
attention (`cpu_attention`)."""

from .cache_ops import copy_blocks, gather_kv, reshape_and_cache, swap_blocks
from .cpu_decode import paged_decode_attention
from .paged_attention import paged_attention

__all__ = [
    "copy_blocks",
    "gather_kv",
    "paged_attention",
    "paged_decode_attention",
    "reshape_and_cache",
    "swap_blocks",
]

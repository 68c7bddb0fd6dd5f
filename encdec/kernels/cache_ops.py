"""Paged KV-cache operations on plain torch tensors.

Cache layout (one tensor per decoder layer, shared by self- and cross-attention):
``kv_cache[2, num_blocks, block_size, num_heads, head_size]`` where index 0 holds
keys and index 1 values. A slot is ``block_number * block_size + offset``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BlockMapping = torch.Tensor | Sequence[tuple[int, int]]
Lengths = torch.Tensor | Sequence[int]


def _slot_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """View the cache as ``[2, num_blocks * block_size, num_heads, head_size]``."""
    two, num_blocks, block_size, num_heads, head_size = kv_cache.shape
    return kv_cache.view(two, num_blocks * block_size, num_heads, head_size)


def _as_mapping(block_mapping: BlockMapping) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a ``[M, 2]`` tensor or list of ``(src, dst)`` pairs into int64 CPU index tensors."""
    mapping = torch.as_tensor(block_mapping, dtype=torch.int64, device="cpu").reshape(-1, 2)
    return mapping[:, 0], mapping[:, 1]


def as_lengths(lengths: Lengths, device: torch.device | str = "cpu") -> torch.Tensor:
    """Return sequence lengths as an int64 tensor on ``device``."""
    return torch.as_tensor(lengths, dtype=torch.int64).to(device)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_heads, head_size]`` into their cache slots.

    Tokens whose slot is negative (``-1`` = padding) are not written.
    """
    if slot_mapping.shape[0] != key.shape[0] or value.shape != key.shape:
        raise ValueError(
            f"key {tuple(key.shape)}, value {tuple(value.shape)} and "
            f"slot_mapping {tuple(slot_mapping.shape)} disagree on num_tokens"
        )
    slots = slot_mapping.to(device=kv_cache.device, dtype=torch.int64)
    valid = slots >= 0
    if not bool(valid.all()):
        slots, key, value = slots[valid], key[valid], value[valid]
    flat = _slot_view(kv_cache)
    flat[0].index_copy_(0, slots, key.to(kv_cache.dtype))
    flat[1].index_copy_(0, slots, value.to(kv_cache.dtype))


def swap_blocks(src_cache: torch.Tensor, dst_cache: torch.Tensor, block_mapping: BlockMapping) -> None:
    """Copy keys and values of block ``src`` in ``src_cache`` to block ``dst`` in ``dst_cache``.

    The two caches may live on different devices and hold different numbers of blocks.
    """
    src, dst = _as_mapping(block_mapping)
    if src.numel() == 0:
        return
    blocks = src_cache.index_select(1, src.to(src_cache.device))
    blocks = blocks.to(device=dst_cache.device, dtype=dst_cache.dtype)
    dst_cache.index_copy_(1, dst.to(dst_cache.device), blocks)


def copy_blocks(kv_caches: Sequence[torch.Tensor], block_mapping: BlockMapping) -> None:
    """Copy block ``src`` to block ``dst`` (keys and values) inside every layer's cache.

    All sources are read before any destination is written.
    """
    src, dst = _as_mapping(block_mapping)
    if src.numel() == 0:
        return
    for kv_cache in kv_caches:
        blocks = kv_cache.index_select(1, src.to(kv_cache.device))
        kv_cache.index_copy_(1, dst.to(kv_cache.device), blocks)


def gather_kv(
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: Lengths,
    max_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather each sequence's keys and values into padded ``[num_seqs, num_heads, max_len, head_size]``.

    ``max_len`` defaults to ``max(seq_lens)``; passing it (known on the host) avoids reading
    the lengths back from the device. Positions at or beyond a sequence's length are zero.
    The results are strided views of one freshly gathered tensor (not aliases of the cache).
    """
    block_size = kv_cache.shape[2]
    lens = as_lengths(seq_lens, kv_cache.device)
    kv = _gather_tokens(kv_cache, block_tables, lens, block_size, max_len)
    padding = torch.arange(kv.shape[2], device=kv.device) >= lens[:, None]
    kv.masked_fill_(padding[None, :, :, None, None], 0)
    kv = kv.permute(0, 1, 3, 2, 4)
    return kv[0], kv[1]


def _gather_tokens(
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    block_size: int,
    max_len: int | None = None,
) -> torch.Tensor:
    """Index-select table blocks into ``[2, num_seqs, max_len, num_heads, head_size]``."""
    num_seqs = block_tables.shape[0]
    if lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens has shape {tuple(lens.shape)}, expected ({num_seqs},)")
    if max_len is None:
        max_len = int(lens.max()) if num_seqs else 0
    num_blocks = -(-max_len // block_size)
    if num_blocks > block_tables.shape[1]:
        raise ValueError(f"max seq_len {max_len} needs {num_blocks} blocks; table has {block_tables.shape[1]}")
    table = block_tables[:, :num_blocks].to(device=kv_cache.device, dtype=torch.int64)
    blocks = kv_cache.index_select(1, table.reshape(-1))
    _, _, _, num_heads, head_size = kv_cache.shape
    tokens = blocks.view(2, num_seqs, num_blocks * block_size, num_heads, head_size)
    return tokens[:, :, :max_len]

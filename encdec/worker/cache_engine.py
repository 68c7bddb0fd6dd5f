"""Per-layer paged KV caches on the device and in the swap pool, and the block moves between them.

Each decoder layer has one tensor [2, num_blocks, block_size, num_heads, head_size] holding both
self- and cross-attention blocks. Caches are allocated empty (pages are committed as blocks get
used); readers never look past a sequence's length, and padded gathers zero their padding.
"""
from __future__ import annotations

import os

import torch

from encdec.config import CacheConfig, ModelConfig
from encdec.kernels.cache_ops import copy_blocks, gather_kv, swap_blocks

_GIB = 1 << 30


def block_bytes(model_config: ModelConfig, block_size: int) -> int:
    """Bytes one block takes across all decoder layers (keys and values)."""
    elem = torch.tensor([], dtype=model_config.dtype).element_size()
    per_layer = 2 * block_size * model_config.num_decoder_heads * model_config.head_size * elem
    return per_layer * model_config.num_decoder_layers


def num_blocks(cache_config: CacheConfig, model_config: ModelConfig,
               device: torch.device) -> tuple[int, int]:
    """(device blocks, swap blocks) from the explicit count or the GiB budgets. Refuses a budget
    below one block, and caches larger than the memory that holds them: the device's, and this
    machine's for the swap pool (with the device cache on the CPU)."""
    size = block_bytes(model_config, cache_config.block_size)
    if cache_config.num_gpu_blocks is not None:
        gpu, device_field = cache_config.num_gpu_blocks, f"num_gpu_blocks={cache_config.num_gpu_blocks}"
    else:
        gpu, device_field = int(cache_config.kv_cache_space * _GIB // size), f"kv_cache_space={cache_config.kv_cache_space:g}"
        if gpu == 0:
            raise ValueError(f"{device_field} (GiB) holds no KV cache block (one takes {size} bytes)")
    cpu = int(cache_config.swap_space * _GIB // size)
    swap_field = f"swap_space={cache_config.swap_space:g}"
    ram = memory_bytes(torch.device("cpu"))
    if device.type == "cpu":
        _check_room(f"{device_field} and {swap_field}", (gpu + cpu) * size, ram, "this machine's memory")
    else:
        _check_room(device_field, gpu * size, memory_bytes(device), f"the memory of {device}")
        _check_room(swap_field, cpu * size, ram, "this machine's memory")
    return gpu, cpu


def memory_bytes(device: torch.device) -> int:
    """How much memory `device` has (this machine's for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _check_room(fields: str, num_bytes: int, room: int, where: str) -> None:
    if num_bytes > room:
        raise ValueError(f"{fields}: the KV cache would take {num_bytes / _GIB:.1f} GiB, more than "
                         f"{where} ({room / _GIB:.1f} GiB)")


class CacheEngine:
    def __init__(self, cache_config: CacheConfig, model_config: ModelConfig, device: torch.device,
                 num_gpu_blocks: int, num_cpu_blocks: int):
        shape = (cache_config.block_size, model_config.num_decoder_heads, model_config.head_size)
        layers = range(model_config.num_decoder_layers)
        dtype = model_config.dtype
        self.gpu_cache = [torch.empty((2, num_gpu_blocks) + shape, dtype=dtype, device=device)
                          for _ in layers]
        pin = device.type == "cuda"
        self.cpu_cache = [torch.empty((2, num_cpu_blocks) + shape, dtype=dtype, pin_memory=pin)
                          for _ in layers]

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        for cpu, gpu in zip(self.cpu_cache, self.gpu_cache):
            swap_blocks(cpu, gpu, mapping)

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        for gpu, cpu in zip(self.gpu_cache, self.cpu_cache):
            swap_blocks(gpu, cpu, mapping)

    def copy(self, mapping: list[tuple[int, int]]) -> None:
        copy_blocks(self.gpu_cache, mapping)

    def gather(self, block_table: list[int], length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's keys and values in the first `length` slots of a device block table,
        each `[num_heads, length, head_size]` (a copy, not a view of the cache)."""
        table = torch.tensor([block_table], dtype=torch.long, device=self.gpu_cache[0].device)
        layers = [gather_kv(cache, table, [length], length) for cache in self.gpu_cache]
        return [(k[0], v[0]) for k, v in layers]

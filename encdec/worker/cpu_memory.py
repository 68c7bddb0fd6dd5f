"""glibc malloc settings for the engines on CPU.

`keep_freed_memory`: keep freed memory in the C heap, so large activations reuse warm pages.

glibc serves allocations above its mmap threshold (128 KiB to 32 MiB, adaptive) with fresh
mmap pages and unmaps them on free. Every engine step allocates activations of tens of
megabytes, so each step would page-fault and zero them again: measured here, a GELU over a
[4096, 3072] tensor took 27 ms with fresh pages and 7 ms with reused ones, and a whole
BART benchmark run was about 10% faster when first measured. Raising the mmap and trim
thresholds keeps those blocks in the heap for reuse, at the cost of a higher resident size (the
step's peak stays mapped). Measured again with the current kernels (`benchmarks/memory_breakdown.py`),
offline runs were 0-5% faster for 150-400 MB more peak RSS, so `LLM` asks for it only with
`tune_malloc=True`. `encdec serve` asks for it by default: for the same transcription requests
it took about 90% fewer page faults, and 4% fewer CPU-seconds with 32 clients, 13% with one;
requests/s moved within the machine's noise (`benchmarks/RESULTS.md`). Each `AsyncLLMEngine`
gives the pages back once it has been idle for a second (`trim_heap`), and so does the server
once no request has been in flight for as long, so an idle server holds no more than without
it. ENCDEC_KEEP_FREED_MEMORY=0 vetoes it. Other C libraries: no-op.

`use_one_arena`: one malloc arena for all threads, so a server's resident size stays put.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8
_done = False


def keep_freed_memory() -> bool:
    """Tune glibc's malloc once per process; True if the tuning is in effect."""
    global _done
    if _done:
        return True
    if os.environ.get("ENCDEC_KEEP_FREED_MEMORY", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    libc = _libc()
    _done = all(libc.mallopt(option, value) == 1 for option, value in (
        (_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 1 << 40), (_M_TOP_PAD, 256 << 20)))
    return _done


def use_one_arena() -> bool:
    """Cap glibc's malloc arenas at one: threads that start later share the arenas that exist
    (just the main one, early in a process). True if glibc took the setting.

    By default each new thread that calls malloc gets an arena of its own (up to 8 per core),
    whose heaps keep what the thread freed. A server's engine thread frees a step's activations
    between small allocations that live on, and how many pages of those holes stay resident
    depends on how the requests happened to interleave: between two identical rounds of 64
    clients, `encdec serve`'s resident size moved by -56 to +63 MB on a loaded machine. With
    one arena the second round added 5-22 MB and later rounds settled, at the same requests/s
    (`benchmarks/RESULTS.md`, "The server's memory between rounds"). A MALLOC_ARENA_MAX in the
    environment wins; other C libraries: no-op."""
    if "MALLOC_ARENA_MAX" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    return _libc().mallopt(_M_ARENA_MAX, 1) == 1


def release_free_memory() -> None:
    """`trim_heap`, unless `keep_freed_memory` is in effect (it keeps the pages on purpose while
    engines run). glibc keeps what a thread freed for its next allocations, up to tens of
    megabytes a thread: a server's resident size would creep up with each round of uploads
    (decoded in worker threads). So the worker threads call this after their work."""
    if not _done:
        trim_heap()


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`), whatever the
    tuning: `AsyncLLMEngine` calls it once it has been idle for a while, and the server once no
    request has been in flight for as long, so that a server's resident size does not stay at
    its last steps' or uploads' peak."""
    if platform.libc_ver()[0] == "glibc":
        _libc().malloc_trim(0)


@functools.cache
def _libc() -> ctypes.CDLL:
    """One handle (a new CDLL each call would be garbage in a reference cycle)."""
    return ctypes.CDLL("libc.so.6")

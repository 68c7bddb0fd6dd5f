"""Prefill attention without a mask in float32 or bfloat16 on CPUs with AVX-512 and
AVX512_BF16 (`cpu_attention.c`): the encoder's self-attention and the cross-attention of
decoder prompts.

Torch's SDPA reaches about two thirds of float32's multiply-add peak here, and its bfloat16 is
no faster, while rounding the scores or the probabilities to bfloat16 failed the bfloat16 WER
gate (benchmarks/RESULTS.md). The C kernel works on blocks of query rows whose float32 scores
stay in the L2 cache, near the multiply-add peak; in bfloat16 it computes the same float32
scores straight from the bfloat16 inputs with VDPBF16PS (exact products, float32 sums) at twice
float32's rate, keeps the softmax and the probabilities-times-values sums in float32 and rounds
only its output to bfloat16.

The library is built with the system's C compiler (`$CC`, else `cc`; under a second) on first
use or by `encdec warmup`, into the kernels' cache folder, under a name carrying a hash of the
source and of the processor's features. Without AVX512_BF16 or a compiler `attention` returns
None (after one warning where the build failed) and the caller keeps torch's SDPA.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from .cpu_decode_aot import cache_folder, processor

SOURCE = Path(__file__).with_name("cpu_attention.c")
HEAD_SIZE = 64
_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma",
          "-fPIC", "-shared"]
_NEEDED_CPU_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}
_I64 = ctypes.POINTER(ctypes.c_int64)
_L = ctypes.c_long
_P = ctypes.c_void_p
_ARGTYPES = [ctypes.c_int, ctypes.c_int, _I64, _I64, _I64, _I64, _P, _L, _P, _L, _P, _L,
             ctypes.c_float, _P, _L, ctypes.c_int, ctypes.c_int]
_DTYPES = (torch.float32, torch.bfloat16)


def cpu_supported() -> bool:
    """Whether this processor has the AVX-512 and AVX512_BF16 instructions the kernel uses."""
    for line in processor().splitlines():
        if line.startswith("flags"):
            return _NEEDED_CPU_FLAGS <= set(line.split(":", 1)[1].split())
    return False


def library_path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(_FLAGS).encode() + processor().encode())
    return cache_folder() / f"encdec_attention_{digest.hexdigest()[:16]}.so"


def build() -> Path:
    """Compile the kernel for this processor (needs a C compiler) and return the library's path."""
    path = library_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        built = Path(scratch) / path.name
        subprocess.run([os.environ.get("CC", "cc"), *_FLAGS, str(SOURCE), "-o", str(built)],
                       check=True, capture_output=True, text=True)
        os.replace(built, path)  # atomic: a concurrent build or load sees all of it or none
    _library.cache_clear()
    return path


@functools.lru_cache(maxsize=1)
def _library():
    """The kernel's `attend`, built on first use; None where it cannot run here."""
    if not cpu_supported():
        return None
    path = library_path()
    if not path.exists():
        try:
            build()
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", "") or error
            warnings.warn(f"prefill attention stays on torch's SDPA: the C kernel "
                          f"did not build ({str(detail).strip()[:300]})", RuntimeWarning)
            return None
    attend = ctypes.CDLL(str(path)).attend
    attend.argtypes, attend.restype = _ARGTYPES, ctypes.c_int
    return attend


def available() -> bool:
    """Whether `attention` runs here (builds the kernel where it has not been built yet)."""
    return _library() is not None


@functools.lru_cache(maxsize=None)
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="encdec-attention")


os.register_at_fork(after_in_child=_pool.cache_clear)  # a forked child has none of its threads


def _takes(t: torch.Tensor, dtype: torch.dtype) -> bool:
    return (t.dtype == dtype and t.device.type == "cpu" and t.dim() == 3
            and t.shape[2] == HEAD_SIZE and t.stride(2) == 1 and t.stride(1) == HEAD_SIZE)


def shares(costs: np.ndarray, threads: int) -> list[int]:
    """Cuts of consecutive items among `threads`, each item to the share that holds the middle
    of its cost: [0, ..., len(costs)]. Six equal items on two threads split 3 and 3."""
    middles = np.cumsum(costs) - costs / 2
    bounds = costs.sum() * np.arange(1, threads) / threads
    return [0, *np.searchsorted(middles, bounds).tolist(), len(costs)]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lens: Sequence[int],
              kv_lens: Sequence[int], scale: float) -> Optional[torch.Tensor]:
    """Non-causal attention of each query sequence over its own keys, or None where the kernel
    does not run here or does not take these tensors (the caller then computes it otherwise).

    q: [sum(q_lens), H, 64], k, v: [sum(kv_lens), H, 64], all float32 or all bfloat16, each
    token's heads contiguous (a view of a fused projection is fine). Returns [sum(q_lens), H, 64]
    in their dtype. The (sequence, head) pairs are shared among torch's threads by their cost.
    """
    if not (q_lens and q.dtype in _DTYPES and all(_takes(t, q.dtype) for t in (q, k, v))
            and min(kv_lens) > 0):
        return None
    attend = _library()
    if attend is None:
        return None
    heads = q.shape[1]
    q_lens_np = np.asarray(q_lens, dtype=np.int64)
    kv_lens_np = np.asarray(kv_lens, dtype=np.int64)
    q_starts = np.concatenate([[0], np.cumsum(q_lens_np)[:-1]]).astype(np.int64)
    kv_starts = np.concatenate([[0], np.cumsum(kv_lens_np)[:-1]]).astype(np.int64)
    out = torch.empty(q.shape, dtype=q.dtype)
    arrays = [a.ctypes.data_as(_I64) for a in (q_starts, q_lens_np, kv_starts, kv_lens_np)]
    tensors = [value for t in (q, k, v, out) for value in (t.data_ptr(), t.stride(0))]

    def run(first: int, last: int) -> int:
        return attend(q.dtype == torch.bfloat16, heads, *arrays, *tensors[:6], scale,
                      *tensors[6:], first, last)

    pairs = len(q_lens) * heads
    threads = min(torch.get_num_threads(), pairs)
    if threads <= 1:
        statuses = [run(0, pairs)]
    else:
        cuts = shares(np.repeat(q_lens_np * kv_lens_np, heads), threads)
        statuses = list(_pool(threads).map(run, cuts[:-1], cuts[1:]))
    if any(statuses):
        raise MemoryError("prefill attention: no memory for the kernel's scratch buffers")
    return out

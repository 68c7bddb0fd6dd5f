"""The serial decode loop compiled ahead of time into a small extension module.

A process that loads even a cached Numba kernel pays for importing Numba and for its compiler's
type registries (SciPy's BLAS among them): 0.6-1 s, a third of a short transcription's start-up.
`encdec warmup` therefore also compiles `cpu_decode_loops.decode_serial` with Numba's ahead-of-
time compiler (`numba.pycc`, for this processor) into an extension module that needs only NumPy
at run time and imports in about a millisecond; `paged_decode_attention` runs it whenever it
runs the serial loop, and loads Numba only for the parallel one (big batches on several
threads). Without the module (no `encdec warmup` yet, or no C compiler) the serial loop is
Numba's, compiled on first use.

The module is built for the processor's x86-64 level as LLVM finds it (`target_cpu`), not for
Numba's "host": that names the model (znver4, say) and with it all the model's instructions,
AVX-512 included, also in a virtual machine that hides some, where the build dies of SIGILL.
The module's name carries a hash of the loops' source, the NumPy version and the processor's
features, so a changed kernel, NumPy or machine never loads a stale build. It lives where Numba
keeps its cache: `$NUMBA_CACHE_DIR` when set, else the package's `__pycache__`.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

import numpy as np

LOOPS_SOURCE = Path(__file__).with_name("cpu_decode_loops.py")
# Exported functions, by cache element type; every array is C-contiguous.
_EXPORTS = {"decode_float32": "float32", "decode_bfloat16": "uint16"}
# The x86-64 levels (LLVM's CPU names), each with what it adds to the one before.
_X86_LEVELS = (("x86-64-v2", ("cx16", "popcnt", "sse4.2", "ssse3")),
               ("x86-64-v3", ("avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")),
               ("x86-64-v4", ("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl")))


def processor() -> str:
    """The processor's model and instruction-set flags (Linux), else its architecture."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    wanted = ("model name", "flags")
    return "\n".join(dict.fromkeys(line for line in lines if line.startswith(wanted)))


@functools.lru_cache(maxsize=1)
def module_name() -> str:
    digest = hashlib.sha256()
    for part in (LOOPS_SOURCE.read_bytes(), np.__version__.encode(), processor().encode()):
        digest.update(part)
    return f"encdec_decode_{digest.hexdigest()[:16]}"


def target_cpu() -> str:
    """The CPU to compile for: on x86-64 the highest level whose features LLVM finds here,
    elsewhere the host."""
    import llvmlite.binding as llvm

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "host"
    found = {name for name, present in llvm.get_host_cpu_features().items() if present}
    level = "x86-64"
    for name, needs in _X86_LEVELS:
        if not found.issuperset(needs):
            break
        level = name
    return level


def cache_folder() -> Path:
    """Where compiled kernels live: `$NUMBA_CACHE_DIR` when set, else the package's `__pycache__`."""
    return _cache_folder(os.environ.get("NUMBA_CACHE_DIR"))


@functools.lru_cache(maxsize=None)
def _cache_folder(numba_cache_dir: Optional[str]) -> Path:
    # kept: every decode-attention call looks the module up, and building this Path took most
    # of the lookup's 20 µs
    return Path(numba_cache_dir) if numba_cache_dir else Path(__file__).with_name("__pycache__")


def module_path() -> Path:
    return _module_path(cache_folder(), module_name())


@functools.lru_cache(maxsize=None)
def _module_path(folder: Path, name: str) -> Path:
    # kept: every decode-attention call looks the module up (joining the path took 4 µs of it)
    return folder / (name + importlib.machinery.EXTENSION_SUFFIXES[0])


def load() -> Optional[ModuleType]:
    """The compiled module, or None where `build` has not made it for this source and machine."""
    return _load(module_path())


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> Optional[ModuleType]:
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(module_name(), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serial_loop(cache_is_bfloat16: bool):
    """The ahead-of-time serial loop for a float32 or bfloat16 cache, or None without one."""
    module = load()
    if module is None:
        return None
    return getattr(module, "decode_bfloat16" if cache_is_bfloat16 else "decode_float32")


def build() -> Path:
    """Compile the module (about 10 s; needs a C compiler) and return its path."""
    with warnings.catch_warnings():  # pycc is "pending deprecation", with no replacement yet
        warnings.simplefilter("ignore")
        from numba.pycc import CC

    from encdec.kernels.cpu_decode_loops import decode_serial

    path = module_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        compiler = CC(module_name())
        compiler.output_dir = scratch
        compiler.target_cpu = target_cpu()
        for export, cache in _EXPORTS.items():
            signature = (f"void(float32[:,:,::1], {cache}[:,:,::1], {cache}[:,:,::1], int32[:,::1], "
                         f"int64[::1], int64, float32, float32[:,::1], float32[:,:,::1])")
            compiler.export(export, signature)(_calls(decode_serial))
        compiler.compile()
        built = Path(scratch) / path.name
        os.replace(built, path)  # atomic: a concurrent build or load sees all of it or none
    _load.cache_clear()
    return path


def _calls(loop):
    """A function for `CC.export` that runs `loop` (an export needs a function of its own)."""
    def decode(query, keys, values, block_tables, seq_lens, block_size, scale, distance_bias, out):
        loop(query, keys, values, block_tables, seq_lens, block_size, scale, distance_bias, out)
    return decode

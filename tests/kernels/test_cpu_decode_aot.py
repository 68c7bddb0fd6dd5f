"""The serial decode loop compiled ahead of time: Numba's compile of the same loop's results to
float32 rounding (fastmath lets the two compiles vectorize differently), used by `paged_decode_attention` once built, and keyed to the loop's source."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from encdec.kernels import cpu_decode, cpu_decode_aot, cpu_decode_loops
from tests.kernels.test_paged_attention import HEAD_SIZE, NUM_HEADS, build_paged


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The module built into an empty cache folder (NUMBA_CACHE_DIR), loaded from there."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NUMBA_CACHE_DIR", str(tmp_path_factory.mktemp("numba_cache")))
        assert cpu_decode_aot.load() is None
        path = cpu_decode_aot.build()
        assert path.parent == cpu_decode_aot.module_path().parent and path.is_file()
        yield cpu_decode_aot.load()


def _inputs(cache_dtype: torch.dtype, with_bias: bool) -> tuple:
    seq_lens = [1, 300, 17, 64, 5]
    cache, tables, _, _ = build_paged(seq_lens, 16, num_blocks=64, dtype=cache_dtype, seed=11)
    query = torch.randn(len(seq_lens), NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(12))
    as_numpy = (lambda t: t.view(torch.int16).numpy().view(np.uint16)) if cache_dtype == torch.bfloat16 \
        else (lambda t: t.numpy())
    bias = (np.random.default_rng(13).standard_normal((NUM_HEADS, 300), dtype=np.float32)
            if with_bias else cpu_decode_loops.NO_BIAS)
    return (query.numpy(), as_numpy(cache[0].reshape(-1, NUM_HEADS, HEAD_SIZE)),
            as_numpy(cache[1].reshape(-1, NUM_HEADS, HEAD_SIZE)), tables.numpy(),
            np.array(seq_lens, dtype=np.int64), 16, np.float32(0.3), bias,
            np.empty_like(query.numpy()))


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_same_sums_as_numbas_serial_loop(built, cache_dtype, with_bias):
    ahead = _inputs(cache_dtype, with_bias)
    jit = _inputs(cache_dtype, with_bias)
    getattr(built, f"decode_{str(cache_dtype).removeprefix('torch.')}")(*ahead)
    cpu_decode_loops.decode_serial(*jit)
    assert np.isfinite(ahead[-1]).all()
    np.testing.assert_allclose(ahead[-1], jit[-1], rtol=1e-5, atol=1e-6)


def test_paged_decode_attention_runs_it(built, monkeypatch, tmp_path):
    """With the module in the cache folder the serial path calls it; a changed loop source
    names another module, which is not there, so Numba's loop runs instead."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(Path(built.__file__).parent))
    calls = []
    real = built.decode_float32
    monkeypatch.setattr(built, "decode_float32", lambda *args: calls.append(1) or real(*args))
    seq_lens = [40, 7]
    cache, tables, _, _ = build_paged(seq_lens, 16, num_blocks=8, seed=14)
    query = torch.randn(2, NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(15))
    out = cpu_decode.paged_decode_attention(query, cache, tables, seq_lens, 0.25)
    assert calls == [1]

    source = tmp_path / "cpu_decode_loops.py"
    source.write_text(cpu_decode_aot.LOOPS_SOURCE.read_text() + "\n# changed\n")
    monkeypatch.setattr(cpu_decode_aot, "LOOPS_SOURCE", source)
    cpu_decode_aot.module_name.cache_clear()
    try:
        assert cpu_decode_aot.load() is None
        again = cpu_decode.paged_decode_attention(query, cache, tables, seq_lens, 0.25)
    finally:
        cpu_decode_aot.module_name.cache_clear()
    assert calls == [1]
    torch.testing.assert_close(again, out, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("present, level", [
    ({"cx16", "popcnt", "sse4.2", "ssse3"}, "x86-64-v2"),
    # a Zen 4 in a virtual machine that hides AVX-512: Numba's "host" would still emit it
    ({"cx16", "popcnt", "sse4.2", "ssse3", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"},
     "x86-64-v3"),
    ({"cx16", "popcnt", "sse4.2", "ssse3", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave",
      "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}, "x86-64-v4"),
    ({"avx2", "avx512f"}, "x86-64"),  # a level needs all of its own and the ones below
])
def test_built_for_the_level_the_processor_has(monkeypatch, present, level):
    import llvmlite.binding

    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    everything = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "sse4.2", "amx-tile"}
    monkeypatch.setattr(llvmlite.binding, "get_host_cpu_features",
                        lambda: {name: name in present for name in everything | present})
    assert cpu_decode_aot.target_cpu() == level

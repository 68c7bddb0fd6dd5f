"""The C prefill attention kernel (`kernels/cpu_attention.py`): float64 SDPA's results to float32
rounding (float32) or to one rounding of the output (bfloat16) on unpadded varlen batches and
views of fused projections, batch- and thread-invariant, large scores, the cases it declines,
and its fallbacks: torch's SDPA in `varlen_attention`, a warning where it cannot be built."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from encdec.attention.backends import torch_sdpa
from encdec.attention.backends.torch_sdpa import varlen_attention
from encdec.kernels import cpu_attention
from tests.conftest import torch_threads

needs_kernel = pytest.mark.skipif(not cpu_attention.cpu_supported(),
                                  reason="the kernel needs AVX-512 with AVX512_BF16")
DTYPES = [torch.float32, torch.bfloat16]
# (query lengths, key lengths, heads): tails of every tile size (8-row scores, 6-row sums,
# 24-row blocks, 32-key tiles, 16-key vectors), one key, one query, a Whisper window.
SHAPES = [((5, 37, 1), (33, 1, 17), 3), ((24, 25, 48), (31, 32, 64), 2), ((1,), (1500,), 6),
          ((1500,), (1500,), 1), ((7, 300), (300, 7), 4)]


def _fused(tokens: int, heads: int, parts: int, dtype: torch.dtype, seed: int,
           spread: float = 1.0) -> list[torch.Tensor]:
    """`parts` [tokens, heads, 64] views of one fused projection output, as models pass them."""
    fused = torch.randn(tokens, parts, heads, 64, generator=torch.Generator().manual_seed(seed))
    fused = (fused * spread).to(dtype)
    return [fused[:, i] for i in range(parts)]


def _reference(q, k, v, q_lens, kv_lens, scale) -> torch.Tensor:
    outs, qs, ks = [], 0, 0
    for lq, lk in zip(q_lens, kv_lens):
        a, b, c = (t.double().transpose(0, 1)[None] for t in (q[qs:qs + lq], k[ks:ks + lk], v[ks:ks + lk]))
        outs.append(F.scaled_dot_product_attention(a, b, c, scale=scale)[0].transpose(0, 1))
        qs, ks = qs + lq, ks + lk
    return torch.cat(outs)


def _assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """float32: float32 sums' error (outputs are near 1 here); bfloat16: the float64 result
    rounded once to bfloat16 (half a step), or, at near-ties, its neighbour."""
    if out.dtype == torch.float32:
        torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)
    else:
        assert ((out.double() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-5).all()
        assert (out != ref.to(torch.bfloat16)).float().mean() < 0.01


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("q_lens,kv_lens,heads", SHAPES)
def test_matches_float64_attention(dtype, q_lens, kv_lens, heads):
    (q,) = _fused(sum(q_lens), heads, 1, dtype, seed=1, spread=2.0)
    k, v = _fused(sum(kv_lens), heads, 2, dtype, seed=2)
    out = cpu_attention.attention(q, k, v, q_lens, kv_lens, 0.125)
    assert out.dtype == dtype and out.shape == q.shape
    _assert_close(out, _reference(q, k, v, q_lens, kv_lens, 0.125))


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_scores_far_below_the_maximum_underflow_to_zero(dtype):
    """Scores 100s apart: exp underflows float32 for all but the row's best keys. Float32
    scores that large carry errors of 1e-5 and more, in torch's SDPA as here."""
    q, k, v = _fused(70, 2, 3, dtype, seed=3, spread=6.0)
    out = cpu_attention.attention(q, k, v, (70,), (70,), 1.0)
    ref = _reference(q, k, v, (70,), (70,), 1.0)
    assert torch.isfinite(out.float()).all()
    if dtype == torch.bfloat16:
        _assert_close(out, ref)
        return
    sdpa = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)),
                                          scale=1.0).transpose(0, 1)
    assert (out.double() - ref).abs().max() <= 2 * (sdpa.double() - ref).abs().max()


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_a_sequence_gets_the_same_bits_alone_as_in_any_batch_or_thread_split(dtype):
    lens = (300, 41, 1500, 9)
    q, k, v = _fused(sum(lens), 6, 3, dtype, seed=4)
    batched = cpu_attention.attention(q, k, v, lens, lens, 0.125)
    with torch_threads(1):
        one_thread = cpu_attention.attention(q, k, v, lens, lens, 0.125)
    assert torch.equal(batched, one_thread)
    start = lens[0] + lens[1]
    alone = cpu_attention.attention(*(t[start:start + lens[2]] for t in (q, k, v)), (lens[2],),
                                    (lens[2],), 0.125)
    assert torch.equal(alone, batched[start:start + lens[2]])


@pytest.mark.parametrize("costs, threads, cuts", [
    ([1] * 6, 2, [0, 3, 6]),  # one Whisper window's six heads: three each (the old cut gave 2 and 4)
    ([1] * 24, 2, [0, 12, 24]),
    ([1] * 6, 3, [0, 2, 4, 6]),
    ([10, 1, 1, 1], 2, [0, 1, 4]),  # the large pair alone
    ([1, 1, 1, 10], 2, [0, 3, 4]),
])
def test_threads_share_the_pairs_by_cost(costs, threads, cuts):
    assert cpu_attention.shares(np.asarray(costs, dtype=np.int64), threads) == cuts


@needs_kernel
def test_declines_what_it_does_not_compute():
    q, k, v = _fused(10, 2, 3, torch.float32, seed=5)
    lens = ((10,), (10,))
    assert cpu_attention.attention(q.half(), k.half(), v.half(), *lens, 0.125) is None
    assert cpu_attention.attention(q, k.bfloat16(), v, *lens, 0.125) is None  # mixed dtypes
    assert cpu_attention.attention(q[..., :32], k[..., :32], v[..., :32], *lens, 0.125) is None
    heads_apart = torch.randn(2, 10, 64).transpose(0, 1)  # [tokens, heads, 64], heads not adjacent
    assert cpu_attention.attention(heads_apart, k, v, *lens, 0.125) is None
    assert cpu_attention.attention(q, k, v, (), (), 0.125) is None


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_varlen_attention_runs_the_kernel_and_sdpa_where_it_declines(dtype, monkeypatch):
    lens = (40, 17)
    q, k, v = _fused(sum(lens), 3, 3, dtype, seed=6)
    assert torch.equal(varlen_attention(q, k, v, lens, lens, False, 0.125),
                       cpu_attention.attention(q, k, v, lens, lens, 0.125))
    monkeypatch.setattr(cpu_attention, "attention", lambda *args: None)
    sdpa = varlen_attention(q, k, v, lens, lens, False, 0.125)
    assert sdpa.dtype == dtype
    _assert_close(sdpa, _reference(q, k, v, lens, lens, 0.125))


def test_without_a_compiler_attention_warns_once_and_stays_on_sdpa(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(cpu_attention, "cpu_supported", lambda: True)
    cpu_attention._library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="stays on torch's SDPA"):
            assert not cpu_attention.available()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            q, k, v = _fused(12, 2, 3, torch.bfloat16, seed=7)
            out = torch_sdpa.varlen_attention(q, k, v, (12,), (12,), False, 0.125)
        _assert_close(out, _reference(q, k, v, (12,), (12,), 0.125))
    finally:
        cpu_attention._library.cache_clear()


def test_a_processor_without_avx512_bf16_gets_no_kernel(monkeypatch):
    monkeypatch.setattr(cpu_attention, "processor", lambda: "model name\t: old\nflags\t\t: fpu sse2 avx2 avx512f")
    assert not cpu_attention.cpu_supported()
    monkeypatch.setattr(cpu_attention, "processor", lambda: "x86_64")
    assert not cpu_attention.cpu_supported()

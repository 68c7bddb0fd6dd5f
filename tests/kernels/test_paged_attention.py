import math
import os

import pytest
import torch

import numpy as np

from encdec.kernels import cpu_decode, cpu_decode_loops, paged_attention, paged_decode_attention
from tests.conftest import torch_threads

NUM_HEADS = 4
HEAD_SIZE = 16


DECODE_KERNELS = [paged_attention, paged_decode_attention]


def build_paged(seq_lens, block_size, num_blocks, dtype=torch.float32, seed=0):
    """Random per-sequence K/V plus a NaN-filled cache holding them in shuffled blocks."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.full((2, num_blocks, block_size, NUM_HEADS, HEAD_SIZE), float("nan"), dtype=dtype)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(-(-n // block_size) for n in seq_lens) + 1
    tables = torch.zeros((len(seq_lens), max_blocks), dtype=torch.int32)
    keys, values = [], []
    for i, length in enumerate(seq_lens):
        k = torch.randn(length, NUM_HEADS, HEAD_SIZE, generator=gen).to(dtype)
        v = torch.randn(length, NUM_HEADS, HEAD_SIZE, generator=gen).to(dtype)
        for pos in range(length):
            block, offset = divmod(pos, block_size)
            if offset == 0:
                tables[i, block] = free.pop()
            cache[0, tables[i, block], offset] = k[pos]
            cache[1, tables[i, block], offset] = v[pos]
        keys.append(k)
        values.append(v)
    return cache, tables, keys, values


def reference_attention(q, k, v, scale, visible):
    """softmax(q k^T * scale) v in float64 for q ``[H, D]``, k/v ``[L, H, D]`` over ``k[:visible]``."""
    q, k, v = q.double(), k[:visible].double(), v[:visible].double()
    scores = torch.einsum("hd,lhd->hl", q, k) * scale
    return torch.einsum("hl,lhd->hd", scores.softmax(dim=-1), v)


@pytest.mark.parametrize("attention", DECODE_KERNELS)
@pytest.mark.parametrize("block_size", [4, 16])
def test_single_query_matches_unpaged_attention(attention, block_size):
    seq_lens = [1, 16, 32, 17, 15, 5, 48, 3]
    cache, tables, keys, values = build_paged(seq_lens, block_size, num_blocks=64, seed=block_size)
    query = torch.randn(len(seq_lens), NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(1))
    scale = 1.0 / math.sqrt(HEAD_SIZE)

    out = attention(query, cache, tables, torch.tensor(seq_lens), scale)

    assert out.shape == query.shape and out.dtype == torch.float32
    for i, length in enumerate(seq_lens):
        want = reference_attention(query[i], keys[i], values[i], scale, length).float()
        torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", DECODE_KERNELS)
def test_default_scale_and_int64_tables(attention):
    seq_lens = [7, 20]
    cache, tables, keys, values = build_paged(seq_lens, 8, num_blocks=16, seed=2)
    query = torch.randn(2, NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(3))

    out = attention(query, cache, tables.long(), seq_lens)

    for i, length in enumerate(seq_lens):
        want = reference_attention(query[i], keys[i], values[i], HEAD_SIZE**-0.5, length).float()
        torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-5)


def test_bfloat16_close_to_reference():
    seq_lens = [9, 33]
    cache, tables, keys, values = build_paged(seq_lens, 16, num_blocks=8, dtype=torch.bfloat16, seed=4)
    query = torch.randn(2, NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(5)).bfloat16()

    out = paged_attention(query, cache, tables, seq_lens, 0.25)

    compiled = paged_decode_attention(query, cache, tables, seq_lens, 0.25)

    assert out.dtype == torch.bfloat16 and compiled.dtype == torch.float32
    for i, length in enumerate(seq_lens):
        want = reference_attention(query[i], keys[i], values[i], 0.25, length).float()
        torch.testing.assert_close(out[i].float(), want, atol=2e-2, rtol=2e-2)
        # the kernel widens the bfloat16 values exactly and sums in float32
        torch.testing.assert_close(compiled[i], want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        paged_decode_attention(query.half(), cache.half(), tables, seq_lens, 0.25)


@pytest.mark.parametrize("causal", [True, False])
def test_multi_query_tokens(causal):
    seq_lens, query_lens, q_len = [6, 16, 3], [2, 4, 3], 4
    cache, tables, keys, values = build_paged(seq_lens, 4, num_blocks=16, seed=6)
    query = torch.randn(3, q_len, NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(7))
    scale = 0.3

    out = paged_attention(query, cache, tables, seq_lens, scale, query_lens=query_lens, causal=causal)

    assert out.shape == query.shape
    assert torch.isfinite(out).all()
    for i, (length, n_query) in enumerate(zip(seq_lens, query_lens)):
        for j in range(n_query):
            visible = length - n_query + j + 1 if causal else length
            want = reference_attention(query[i, j], keys[i], values[i], scale, visible).float()
            torch.testing.assert_close(out[i, j], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_kernel_matches_reference_on_long_sequences(threads):
    """One thread runs the serial loop; two, where Numba has a thread-safe layer, the parallel one
    (from PARALLEL_MIN_SEQS sequences on)."""
    seq_lens = [100, 1, 64, 257, 31, 700, 3, 40, 16]
    assert len(seq_lens) >= cpu_decode.PARALLEL_MIN_SEQS
    cache, tables, _, _ = build_paged(seq_lens, 16, num_blocks=128, seed=8)
    query = torch.randn(len(seq_lens), NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(9))
    with torch_threads(threads):
        fast = paged_decode_attention(query, cache, tables, seq_lens, 0.2)
    reference = paged_attention(query, cache, tables, seq_lens, 0.2)

    torch.testing.assert_close(fast, reference, atol=1e-6, rtol=1e-5)


def test_serial_and_parallel_loops_agree():
    """The same sums in both loops; fastmath lets the two compiles vectorize (round) differently,
    so they agree to float32 rounding, not bit for bit."""
    seq_lens = np.array([300, 5, 17, 90], dtype=np.int64)
    cache, tables, _, _ = build_paged(seq_lens.tolist(), 16, num_blocks=64, seed=3)
    query = torch.randn(4, NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(4)).numpy()
    keys = cache[0].reshape(-1, NUM_HEADS, HEAD_SIZE).numpy()
    values = cache[1].reshape(-1, NUM_HEADS, HEAD_SIZE).numpy()
    distance_bias = np.random.default_rng(5).standard_normal((NUM_HEADS, 300), dtype=np.float32)
    for bias in (np.zeros((1, 0), dtype=np.float32), distance_bias):
        outs = []
        for kernel in (cpu_decode_loops.decode_serial, cpu_decode_loops.decode_parallel):
            out = np.empty_like(query)
            kernel(query, keys, values, tables.numpy(), seq_lens, 16, np.float32(0.3), bias, out)
            outs.append(out)
        assert np.isfinite(outs[0]).all()
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", [cpu_decode_loops.decode_serial, cpu_decode_loops.decode_parallel])
def test_sequences_sharing_their_blocks_read_them_once_with_the_same_results(kernel):
    """Beams over one cross cache: rows 1-3 share row 1's blocks and length (one group), row 4
    shares them with a shorter length, row 5 all but its last block (each its own). Each gets the bits
    it gets alone, and the same results as the reference."""
    cache, tables, keys, values = build_paged([70, 37], 16, num_blocks=32, seed=21)
    rows = [1, 0, 0, 0, 0, 0]
    tables = tables[rows].clone()
    tables[5, 4] = tables[0, 0]  # another (filled) last block
    seq_lens = np.array([37, 70, 70, 70, 50, 70], dtype=np.int64)
    assert cpu_decode_loops._group_starts(tables.numpy(), seq_lens, 16).tolist() == [0, 1, 4, 5, 6]
    query = torch.randn(6, NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(22)).numpy()
    args = (cache[0].reshape(-1, NUM_HEADS, HEAD_SIZE).numpy(),
            cache[1].reshape(-1, NUM_HEADS, HEAD_SIZE).numpy())
    bias = np.random.default_rng(23).standard_normal((NUM_HEADS, 70), dtype=np.float32)
    together = np.empty_like(query)
    kernel(query, *args, tables.numpy(), seq_lens, 16, np.float32(0.3), bias, together)
    for i in range(6):
        alone = np.empty_like(query[i:i + 1])
        kernel(query[i:i + 1], *args, tables.numpy()[i:i + 1], seq_lens[i:i + 1], 16, np.float32(0.3),
               bias, alone)
        np.testing.assert_array_equal(alone[0], together[i])
    reference = paged_attention(torch.from_numpy(query), cache, tables, seq_lens.tolist(), 0.3,
                                distance_bias=torch.from_numpy(bias))
    torch.testing.assert_close(torch.from_numpy(together), reference, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("attention", DECODE_KERNELS)
def test_rejects_zero_length(attention):
    cache, tables, _, _ = build_paged([4, 4], 4, num_blocks=4)
    query = torch.zeros(2, NUM_HEADS, HEAD_SIZE)
    with pytest.raises(ValueError):
        attention(query, cache, tables, [4, 0], 1.0)


@pytest.mark.parametrize("attention", DECODE_KERNELS)
def test_empty_batch(attention):
    cache, _, _, _ = build_paged([4], 4, num_blocks=4)
    query = torch.zeros(0, NUM_HEADS, HEAD_SIZE)
    out = attention(query, cache, torch.zeros((0, 2), dtype=torch.int32), [], 1.0)
    assert out.shape == query.shape


def _decode_small() -> float:
    """A batch big enough for the parallel loop (where the threads and Numba allow it)."""
    seq_lens = [30, 45, 9, 12, 3, 60, 7, 22]
    assert len(seq_lens) >= cpu_decode.PARALLEL_MIN_SEQS
    cache, tables, _, _ = build_paged(seq_lens, 16, num_blocks=16, seed=5)
    query = torch.randn(len(seq_lens), NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(6))
    return paged_decode_attention(query, cache, tables, seq_lens, 0.3).sum().item()


def _decode_in_child(queue) -> None:
    queue.put(_decode_small())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_kernel_runs_in_a_child_forked_after_parallel_use():
    """GNU OpenMP does not survive fork(): the child must not die on its first decode."""
    import multiprocessing

    expected = _decode_small()  # the parent uses the kernel (in parallel where it can) first
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_decode_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == expected

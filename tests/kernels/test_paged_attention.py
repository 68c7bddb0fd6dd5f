import math

import pytest
import torch

from encdec.kernels import (block_runs, paged_attention, paged_attention_per_seq,
                            uniform_runs_attention)

NUM_HEADS = 4
HEAD_SIZE = 16


def build_paged(seq_lens, block_size, num_blocks, dtype=torch.float32, seed=0, consecutive=False):
    """Random per-sequence K/V plus a NaN-filled cache holding them in shuffled blocks
    (or, with `consecutive`, in runs of consecutive block ids)."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.full((2, num_blocks, block_size, NUM_HEADS, HEAD_SIZE), float("nan"), dtype=dtype)
    free = list(range(num_blocks - 1, -1, -1)) if consecutive else \
        torch.randperm(num_blocks, generator=gen).tolist()
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


@pytest.mark.parametrize("attention", [paged_attention, paged_attention_per_seq])
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


def test_per_seq_reads_consecutive_runs_as_views():
    seq_lens = [1, 16, 17, 33, 5]
    cache, tables, keys, values = build_paged(seq_lens, 4, num_blocks=64, seed=3, consecutive=True)
    tables[2, 1:5] = torch.tensor([60, 61, 62, 63])  # break one run: that sequence is gathered
    for pos in range(4, 17):
        block, offset = divmod(pos, 4)
        cache[:, tables[2, block], offset] = torch.stack([keys[2][pos], values[2][pos]])
    runs = block_runs(tables, seq_lens, 4)
    assert [r is None for r in runs] == [False, False, True, False, False]
    query = torch.randn(len(seq_lens), NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(4))
    out = paged_attention_per_seq(query, cache, tables, seq_lens, 0.25, runs=runs)
    for i, length in enumerate(seq_lens):
        want = reference_attention(query[i], keys[i], values[i], 0.25, length).float()
        torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-5)


def test_uniform_runs_read_as_one_strided_batch():
    """Equal-length runs at first + slot * run_blocks: one batched call, slot gaps skipped."""
    block_size, length, run_blocks = 4, 10, 3
    gen = torch.Generator().manual_seed(5)
    cache = torch.full((2, 40, block_size, NUM_HEADS, HEAD_SIZE), float("nan"))
    starts = [9, 3, 15]  # slots 2, 0, 4 (slots 1 and 3 hold other data)
    cache[:, 6:9] = torch.randn(2, 3, block_size, NUM_HEADS, HEAD_SIZE, generator=gen)
    keys, values = [], []
    for first in starts:
        kv = torch.randn(2, length, NUM_HEADS, HEAD_SIZE, generator=gen)
        cache[:, first:first + run_blocks].view(2, -1, NUM_HEADS, HEAD_SIZE)[:, :length] = kv
        keys.append(kv[0])
        values.append(kv[1])
    query = torch.randn(3, NUM_HEADS, HEAD_SIZE, generator=gen)
    out = uniform_runs_attention(query, cache, starts, length, 0.25)
    for i in range(3):
        want = reference_attention(query[i], keys[i], values[i], 0.25, length).float()
        torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-5)
    shared = uniform_runs_attention(query, cache, [9, 9, 3], length, 0.25)  # two share a run
    for i, j in enumerate([0, 0, 1]):
        want = reference_attention(query[i], keys[j], values[j], 0.25, length).float()
        torch.testing.assert_close(shared[i], want, atol=1e-5, rtol=1e-5)
    assert uniform_runs_attention(query, cache, [9, 3, 16], length, 0.25) is None  # misaligned
    assert uniform_runs_attention(query, cache, [0, 30, 3], length, 0.25) is None  # too sparse
    assert uniform_runs_attention(query, cache, [9, None, 3], length, 0.25) is None


@pytest.mark.parametrize("attention", [paged_attention, paged_attention_per_seq])
def test_default_scale_and_int64_tables(attention):
    seq_lens = [7, 20]
    cache, tables, keys, values = build_paged(seq_lens, 8, num_blocks=16, seed=2)
    query = torch.randn(2, NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(3))

    out = attention(query, cache, tables.long(), seq_lens)

    for i, length in enumerate(seq_lens):
        want = reference_attention(query[i], keys[i], values[i], HEAD_SIZE**-0.5, length).float()
        torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", [paged_attention, paged_attention_per_seq])
def test_bfloat16_close_to_reference(attention):
    seq_lens = [9, 33]
    cache, tables, keys, values = build_paged(seq_lens, 16, num_blocks=8, dtype=torch.bfloat16, seed=4)
    query = torch.randn(2, NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(5)).bfloat16()

    out = attention(query, cache, tables, seq_lens, 0.25)

    assert out.dtype == torch.bfloat16
    for i, length in enumerate(seq_lens):
        want = reference_attention(query[i], keys[i], values[i], 0.25, length).float()
        torch.testing.assert_close(out[i].float(), want, atol=2e-2, rtol=2e-2)


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


def test_per_seq_matches_reference_on_long_sequences():
    seq_lens = [100, 1, 64, 257, 31]
    cache, tables, _, _ = build_paged(seq_lens, 16, num_blocks=64, seed=8)
    query = torch.randn(len(seq_lens), NUM_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(9))

    fast = paged_attention_per_seq(query, cache, tables, seq_lens, 0.2)
    reference = paged_attention(query, cache, tables, seq_lens, 0.2)

    torch.testing.assert_close(fast, reference, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("attention", [paged_attention, paged_attention_per_seq])
def test_rejects_zero_length(attention):
    cache, tables, _, _ = build_paged([4, 4], 4, num_blocks=4)
    query = torch.zeros(2, NUM_HEADS, HEAD_SIZE)
    with pytest.raises(ValueError):
        attention(query, cache, tables, [4, 0], 1.0)


@pytest.mark.parametrize("attention", [paged_attention, paged_attention_per_seq])
def test_empty_batch(attention):
    cache, _, _, _ = build_paged([4], 4, num_blocks=4)
    query = torch.zeros(0, NUM_HEADS, HEAD_SIZE)
    out = attention(query, cache, torch.zeros((0, 2), dtype=torch.int32), [], 1.0)
    assert out.shape == query.shape

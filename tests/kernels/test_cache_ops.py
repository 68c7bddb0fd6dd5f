import pytest
import torch

from encdec.kernels import copy_blocks, gather_kv, reshape_and_cache, swap_blocks

NUM_HEADS = 3
HEAD_SIZE = 8


def make_cache(num_blocks, block_size, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (2, num_blocks, block_size, NUM_HEADS, HEAD_SIZE)
    return torch.randn(shape, generator=gen).to(dtype)


def random_kv(num_tokens, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (num_tokens, NUM_HEADS, HEAD_SIZE)
    return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)


def loop_reshape_and_cache(key, value, kv_cache, slot_mapping):
    block_size = kv_cache.shape[2]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        kv_cache[0, block, offset] = key[token]
        kv_cache[1, block, offset] = value[token]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_padding", [False, True])
def test_reshape_and_cache_matches_loop(dtype, with_padding):
    num_blocks, block_size, num_tokens = 10, 4, 23
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(1))[:num_tokens]
    if with_padding:
        slots[[0, 5, 6, 22]] = -1
    key, value = random_kv(num_tokens, dtype, seed=2)
    cache = make_cache(num_blocks, block_size, dtype)
    expected = cache.clone()

    reshape_and_cache(key, value, cache, slots)
    loop_reshape_and_cache(key, value, expected, slots)

    assert torch.equal(cache, expected)
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    untouched = make_cache(num_blocks, block_size, dtype).view(2, -1, NUM_HEADS, HEAD_SIZE)
    assert torch.equal(cache.view(2, -1, NUM_HEADS, HEAD_SIZE)[:, ~written], untouched[:, ~written])


def test_reshape_and_cache_all_padding_is_noop():
    cache = make_cache(4, 4)
    before = cache.clone()
    key, value = random_kv(3, torch.float32, seed=3)
    reshape_and_cache(key, value, cache, torch.full((3,), -1, dtype=torch.int64))
    assert torch.equal(cache, before)


def test_reshape_and_cache_rejects_length_mismatch():
    key, value = random_kv(3, torch.float32, seed=4)
    with pytest.raises(ValueError):
        reshape_and_cache(key, value, make_cache(4, 4), torch.arange(2))


@pytest.mark.parametrize("as_list", [False, True])
def test_swap_blocks_matches_indexing(as_list):
    src = make_cache(6, 4, seed=5)
    dst = make_cache(9, 4, seed=6)
    pairs = [(0, 8), (3, 1), (5, 2)]
    mapping = pairs if as_list else torch.tensor(pairs, dtype=torch.int64)
    expected = dst.clone()
    for s, d in pairs:
        expected[:, d] = src[:, s]
    src_before = src.clone()

    swap_blocks(src, dst, mapping)

    assert torch.equal(dst, expected)
    assert torch.equal(src, src_before)


def test_swap_blocks_empty_mapping_is_noop():
    src, dst = make_cache(2, 4, seed=7), make_cache(2, 4, seed=8)
    before = dst.clone()
    swap_blocks(src, dst, torch.empty((0, 2), dtype=torch.int64))
    swap_blocks(src, dst, [])
    assert torch.equal(dst, before)


def test_copy_blocks_matches_indexing_in_all_layers():
    caches = [make_cache(8, 4, seed=seed) for seed in range(3)]
    pairs = [(1, 4), (1, 5), (7, 0)]
    expected = [cache.clone() for cache in caches]
    for cache in expected:
        for s, d in pairs:
            cache[:, d] = cache[:, s]

    copy_blocks(caches, torch.tensor(pairs))

    for got, want in zip(caches, expected):
        assert torch.equal(got, want)


def test_gather_kv_matches_concatenation():
    block_size, num_blocks = 4, 20
    cache = make_cache(num_blocks, block_size, seed=9)
    seq_lens = [1, 4, 9, 16, 6]
    gen = torch.Generator().manual_seed(10)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros((len(seq_lens), 5), dtype=torch.int32)
    for i, length in enumerate(seq_lens):
        n = -(-length // block_size)
        tables[i, :n] = torch.tensor([perm.pop() for _ in range(n)])

    keys, values = gather_kv(cache, tables, torch.tensor(seq_lens, dtype=torch.int32))

    max_len = max(seq_lens)
    assert keys.shape == values.shape == (len(seq_lens), NUM_HEADS, max_len, HEAD_SIZE)
    for i, length in enumerate(seq_lens):
        n = -(-length // block_size)
        for kv, got in ((0, keys), (1, values)):
            want = torch.cat([cache[kv, b] for b in tables[i, :n].tolist()])[:length]
            assert torch.equal(got[i, :, :length], want.transpose(0, 1))
            assert torch.all(got[i, :, length:] == 0)


def test_gather_rejects_short_block_table():
    cache = make_cache(4, 4)
    with pytest.raises(ValueError):
        gather_kv(cache, torch.zeros((1, 2), dtype=torch.int64), [9])

"""The xformers backend on CPU: its biases against the masks the runner's metadata implies, and
its code path (with the kernel swapped for a dense reference: `biases_used` in conftest.py)
against the torch backend."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("xformers", reason="xformers not installed")

from encdec.attention.backends import xformers as xf  # noqa: E402
from encdec.attention.backends.torch_sdpa import TorchSDPABackend  # noqa: E402
from encdec.attention.metadata import AttentionType  # noqa: E402
from tests.attention.helpers import (HEAD_SIZE, NUM_HEADS, empty_cache, fill_history,  # noqa: E402
                                     group, layer_inputs, mixed_batch, prepare)

ENC, DEC, CROSS = AttentionType.ENCODER, AttentionType.DECODER, AttentionType.ENCODER_DECODER
SCALE = HEAD_SIZE ** -0.5


# Masks implied by the metadata: 0 where a query may attend to a key, -inf elsewhere.

def _segments(start_loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence index and offset inside the sequence of every token of an unpadded vector."""
    ids = torch.repeat_interleave(torch.arange(len(start_loc) - 1), start_loc.diff())
    return ids, torch.arange(len(ids)) - start_loc[ids]


def _to_bias(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))


def block_diagonal_mask(q_start_loc, k_start_loc, causal: bool) -> torch.Tensor:
    q_ids, q_off = _segments(q_start_loc)
    k_ids, k_off = _segments(k_start_loc)
    allowed = q_ids[:, None] == k_ids[None, :]
    if causal:
        allowed &= q_off[:, None] >= k_off[None, :]
    return _to_bias(allowed)


def padded_keys_mask(kv_lens: torch.Tensor) -> torch.Tensor:
    """One query per sequence over keys padded to max(kv_lens) per sequence."""
    pad = int(kv_lens.max())
    col = torch.arange(len(kv_lens) * pad)
    seq, offset = col // pad, col % pad
    allowed = (seq == torch.arange(len(kv_lens))[:, None]) & (offset < kv_lens[seq])
    return _to_bias(allowed)


def test_cross_prefill_bias_is_rectangular_block_diagonal():
    meta = prepare([group("a", 3, {0: (2, [1])}, [2], is_prompt=True),
                    group("b", 2, {1: (1, [3])}, [4], is_prompt=True)])
    inf = float("-inf")
    expected = torch.tensor([[0, 0, 0, inf, inf],
                             [0, 0, 0, inf, inf],
                             [inf, inf, inf, 0, 0]])
    assert torch.equal(xf.build_bias(meta, CROSS, xf.PREFILL).materialize((3, 5)), expected)


def test_prefill_biases_match_metadata():
    meta = prepare(mixed_batch())
    p = meta.num_prefills
    assert (p, meta.seq_lens[:p], meta.encoder_seq_lens[:p]) == (3, [3, 6, 1], [5, 7, 2])
    dec_loc = meta.query_start_loc[:p + 1]
    expected = {
        ENC: block_diagonal_mask(meta.encoder_seq_start_loc, meta.encoder_seq_start_loc, False),
        DEC: block_diagonal_mask(dec_loc, dec_loc, True),
        CROSS: block_diagonal_mask(dec_loc, meta.encoder_seq_start_loc, False),
    }
    assert expected[CROSS].shape == (meta.num_prefill_tokens, meta.num_encoder_tokens)
    for attn_type, mask in expected.items():
        bias = xf.build_bias(meta, attn_type, xf.PREFILL)
        assert torch.equal(bias.materialize(mask.shape), mask), attn_type


def test_decode_biases_match_metadata():
    meta = prepare(mixed_batch())
    p = meta.num_prefills
    assert meta.seq_lens[p:] == [9, 5, 7, 4] and meta.encoder_seq_lens[p:] == [6, 3, 3, 8]
    for attn_type, lens in ((DEC, meta.seq_lens_tensor), (CROSS, meta.encoder_seq_lens_tensor)):
        mask = padded_keys_mask(lens[p:])
        bias = xf.build_bias(meta, attn_type, xf.DECODE)
        assert torch.equal(bias.materialize(mask.shape), mask), attn_type


def _run_both(meta, attn_type, q, k, v, caches):
    """Outputs of (xformers, torch) for one layer; each backend writes into its own cache."""
    return tuple(backend.forward(q, k, v, cache, meta, attn_type, SCALE)
                 for backend, cache in zip((xf.XFormersBackend(), TorchSDPABackend()), caches))


@pytest.mark.parametrize("attn_type", [ENC, DEC, CROSS], ids=lambda t: t.value)
def test_mixed_step_matches_torch_backend(biases_used, attn_type):
    gen = torch.Generator().manual_seed(0)
    groups = mixed_batch()
    meta = prepare(groups)
    q, k, v = layer_inputs(meta, attn_type, gen)
    caches = (None, None)
    if attn_type != ENC:
        cache = empty_cache()
        fill_history(cache, groups, gen)
        caches = (cache, cache.clone())

    out, ref = _run_both(meta, attn_type, q, k, v, caches)

    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    if attn_type != ENC:
        assert torch.equal(caches[0], caches[1])
    assert len(biases_used) == (1 if attn_type == ENC else 2)


def test_prefill_then_decode_reads_what_prefill_cached(biases_used):
    """Step 1 prefills two requests, step 2 decodes them from each backend's own cache."""
    gen = torch.Generator().manual_seed(1)
    caches = (empty_cache(), empty_cache())
    steps = [
        [group("a", 5, {0: (3, [1])}, [2, 3], is_prompt=True),
         group("b", 7, {1: (6, [4, 5])}, [6, 7], is_prompt=True)],
        [group("a", 5, {0: (4, [1])}, [2, 3], is_prompt=False),
         group("b", 7, {1: (7, [4, 5])}, [6, 7], is_prompt=False)],
    ]
    for groups in steps:
        meta = prepare(groups)
        num_tokens = meta.num_prefill_tokens + meta.num_decode_tokens
        q, k, v = torch.randn(3, num_tokens, NUM_HEADS, HEAD_SIZE, generator=gen)
        out, ref = _run_both(meta, DEC, q, k, v, caches)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)

        enc_k, enc_v = torch.randn(2, meta.num_encoder_tokens, NUM_HEADS, HEAD_SIZE, generator=gen)
        if not meta.num_prefills:
            enc_k = enc_v = None
        out, ref = _run_both(meta, CROSS, q, enc_k, enc_v, caches)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
        assert torch.equal(caches[0], caches[1])
    assert meta.num_prefills == 0 and meta.num_decode_tokens == 2


def test_biases_are_built_once_per_step(monkeypatch, biases_used):
    gen = torch.Generator().manual_seed(2)
    builds = Counter()
    build_bias = xf.build_bias

    def counting_build(meta, attn_type, phase, device=None):
        builds[attn_type, phase] += 1
        return build_bias(meta, attn_type, phase, device)

    monkeypatch.setattr(xf, "build_bias", counting_build)
    meta = prepare(mixed_batch())
    backend = xf.XFormersBackend()
    num_tokens = meta.num_prefill_tokens + meta.num_decode_tokens
    enc_q, enc_k, enc_v = torch.randn(3, meta.num_encoder_tokens, NUM_HEADS, HEAD_SIZE,
                                      generator=gen)
    q, k, v = torch.randn(3, num_tokens, NUM_HEADS, HEAD_SIZE, generator=gen)
    num_layers = 3
    for _ in range(num_layers):
        backend.forward(enc_q, enc_k, enc_v, None, meta, ENC, SCALE)
    for cache in [empty_cache() for _ in range(num_layers)]:
        backend.forward(q, k, v, cache, meta, DEC, SCALE)
        backend.forward(q, enc_k, enc_v, cache, meta, CROSS, SCALE)

    phases = [(ENC, xf.PREFILL), (DEC, xf.PREFILL), (DEC, xf.DECODE),
              (CROSS, xf.PREFILL), (CROSS, xf.DECODE)]
    assert builds == Counter(dict.fromkeys(phases, 1))
    # Every layer got the very same objects: 5 distinct biases, each used once per layer.
    assert len(biases_used) == len(phases) * num_layers
    assert len({id(b) for b in biases_used}) == len(phases)
    cached = [bias for key, bias in meta.backend_cache.items() if key[0] == "xformers_bias"]
    assert {id(b) for b in cached} == {id(b) for b in biases_used}

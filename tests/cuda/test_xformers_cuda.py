"""The xformers backend on cuda (its real kernels) against the torch backend on the same
metadata: a step with prefills and decodes together, a prefill followed by a decode that reads
what it cached, all three attention types, float32 and float16. Both are also held to the torch
backend on the CPU in float32."""
from __future__ import annotations

import pytest
import torch

from encdec.attention.backends.torch_sdpa import TorchSDPABackend
from encdec.attention.backends.xformers import XFormersBackend
from encdec.attention.metadata import AttentionType
from encdec.attention.selector import ENV_VAR, get_attn_backend
from tests.attention.helpers import (HEAD_SIZE, NUM_HEADS, empty_cache, fill_history, group,
                                     layer_inputs, mixed_batch, prepare)
from tests.cuda.helpers import XFORMERS_SKIP

pytestmark = pytest.mark.skipif(bool(XFORMERS_SKIP), reason=XFORMERS_SKIP)

CUDA = torch.device("cuda")
ENC, DEC, CROSS = AttentionType.ENCODER, AttentionType.DECODER, AttentionType.ENCODER_DECODER
SCALE = HEAD_SIZE ** -0.5
# Largest difference allowed from the float32 CPU reference (inputs are N(0, 1)).
ATOL = {torch.float32: 5e-5, torch.float16: 1e-2}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)


def run_step(groups, attn_type, q, k, v, caches, dtype):
    """One layer of one step: (xformers on cuda, torch on cuda, torch on CPU in float32).

    `caches` holds the three backends' caches (CPU float32 for the last); each writes its own.
    """
    meta, cpu_meta = prepare(groups, CUDA), prepare(groups)

    def on_cuda(t):
        return None if t is None else t.to(CUDA, dtype)

    xf_out, torch_out = (backend.forward(on_cuda(q), on_cuda(k), on_cuda(v), cache, meta,
                                         attn_type, SCALE)
                         for backend, cache in zip((XFormersBackend(), TorchSDPABackend()), caches))
    ref = TorchSDPABackend().forward(q, k, v, caches[2], cpu_meta, attn_type, SCALE)
    return xf_out, torch_out, ref


def assert_close(xf_out, torch_out, ref, dtype):
    assert xf_out.device.type == "cuda" and xf_out.dtype == dtype
    torch.testing.assert_close(xf_out, torch_out, atol=ATOL[dtype], rtol=0)
    torch.testing.assert_close(xf_out.float().cpu(), ref, atol=ATOL[dtype], rtol=0)
    torch.testing.assert_close(torch_out.float().cpu(), ref, atol=ATOL[dtype], rtol=0)


def cuda_caches(cpu_cache, dtype):
    """The xformers and torch backends' caches on cuda, and the float32 CPU reference's."""
    return cpu_cache.to(CUDA, dtype), cpu_cache.to(CUDA, dtype), cpu_cache.clone()


@DTYPES
@pytest.mark.parametrize("attn_type", [ENC, DEC, CROSS], ids=lambda t: t.value)
def test_mixed_step_matches_torch_backend(attn_type, dtype):
    """Three prefills and four decode sequences (two forked, sharing a block) in one step."""
    gen = torch.Generator().manual_seed(0)
    groups = mixed_batch()
    q, k, v = (t.to(dtype).float() for t in layer_inputs(prepare(groups), attn_type, gen))
    caches = (None, None, None)
    if attn_type != ENC:
        cache = empty_cache()
        fill_history(cache, groups, gen)
        caches = cuda_caches(cache.to(dtype).float(), dtype)

    xf_out, torch_out, ref = run_step(groups, attn_type, q, k, v, caches, dtype)

    assert_close(xf_out, torch_out, ref, dtype)
    if attn_type != ENC:  # both wrote the same new keys/values
        assert torch.equal(caches[0], caches[1])
        assert torch.equal(caches[0].float().cpu(), caches[2].to(dtype).float())


@DTYPES
def test_prefill_then_decode_reads_what_prefill_cached(dtype):
    """Step 1 prefills two requests, steps 2 and 3 decode them from each backend's own cache."""
    gen = torch.Generator().manual_seed(1)
    caches = cuda_caches(empty_cache(), dtype)
    steps = [
        [group("a", 5, {0: (3, [1])}, [2, 3], is_prompt=True),
         group("b", 7, {1: (6, [4, 5])}, [6, 7], is_prompt=True)],
        [group("a", 5, {0: (4, [1])}, [2, 3], is_prompt=False),
         group("b", 7, {1: (7, [4, 5])}, [6, 7], is_prompt=False)],
        [group("a", 5, {0: (5, [1, 8])}, [2, 3], is_prompt=False),
         group("b", 7, {1: (8, [4, 5])}, [6, 7], is_prompt=False)],
    ]
    for groups in steps:
        meta = prepare(groups)
        num_tokens = meta.num_prefill_tokens + meta.num_decode_tokens
        q, k, v = torch.randn(3, num_tokens, NUM_HEADS, HEAD_SIZE, generator=gen).to(dtype).float()
        assert_close(*run_step(groups, DEC, q, k, v, caches, dtype), dtype)

        enc_k, enc_v = torch.randn(2, meta.num_encoder_tokens, NUM_HEADS, HEAD_SIZE,
                                   generator=gen).to(dtype).float()
        if not meta.num_prefills:
            enc_k = enc_v = None
        assert_close(*run_step(groups, CROSS, q, enc_k, enc_v, caches, dtype), dtype)
        assert torch.equal(caches[0], caches[1])
    assert meta.num_prefills == 0 and meta.num_decode_tokens == 2


def test_selector_picks_xformers_on_cuda(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert isinstance(get_attn_backend(CUDA), XFormersBackend)
    assert isinstance(get_attn_backend(CUDA, "torch"), TorchSDPABackend)

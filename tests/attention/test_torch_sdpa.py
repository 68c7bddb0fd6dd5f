"""The torch backend's prefill attention on unpadded vectors (`varlen_attention`)."""
from __future__ import annotations

import pytest
import torch

from encdec.attention.backends.torch_sdpa import varlen_attention

HEADS, SIZE = 4, 16


def reference(q, k, v, causal: bool, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v for one sequence ([L, H, D]), in float64."""
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double())


def vectors(lens: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(sum(lens), HEADS, SIZE, generator=gen)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_lens", [(5, 5, 5), (5, 9, 1, 33)])
def test_each_sequence_attends_to_its_own_keys(q_lens, causal):
    kv_lens = q_lens if causal else tuple(n + 3 for n in q_lens)  # cross-attention: rectangular
    q, k, v = vectors(q_lens, 0), vectors(kv_lens, 1), vectors(kv_lens, 2)
    out = varlen_attention(q, k, v, q_lens, kv_lens, causal, scale=0.25)
    qs, ks, vs = q.split(q_lens), k.split(kv_lens), v.split(kv_lens)
    want = torch.cat([reference(*seq, causal, 0.25) for seq in zip(qs, ks, vs)])
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_a_sequence_gets_the_same_bits_batched_or_alone(causal):
    """Equal lengths run as one batched call, mixed ones a call per sequence: the first
    sequence's output may not depend on which (offline and served batches differ)."""
    q, k, v = vectors((12, 12), 0), vectors((12, 12), 1), vectors((12, 12), 2)
    batched = varlen_attention(q, k, v, (12, 12), (12, 12), causal, scale=0.25)[:12]
    q2, k2, v2 = (torch.cat([t[:12], t[:7]]) for t in (q, k, v))
    alone = varlen_attention(q2, k2, v2, (12, 7), (12, 7), causal, scale=0.25)[:12]
    assert torch.equal(batched, alone)

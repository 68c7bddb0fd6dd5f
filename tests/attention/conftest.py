"""`biases_used`: the xformers backend's kernel swapped for a dense reference (xformers has no CPU
kernel), recording every bias the backend hands it."""
from __future__ import annotations

import pytest
import torch

from encdec.attention.backends import xformers as xf


def reference_attention(q, k, v, attn_bias, scale):
    """Stand-in for `xf._attention` ([B, M, H, D] x [B, N, H, D]): softmax(Q K^T * scale + bias) V
    in float32, with an xformers bias materialized or a [B or 1, H, M, N] tensor as it is."""
    if isinstance(attn_bias, torch.Tensor):
        bias = attn_bias.float()
    else:
        bias = attn_bias.materialize((q.shape[1], k.shape[1]), dtype=torch.float32)
    scores = torch.einsum("bmhd,bnhd->bhmn", q.float(), k.float()) * scale + bias
    return torch.einsum("bhmn,bnhd->bmhd", scores.softmax(dim=-1), v.float()).to(q.dtype)


@pytest.fixture
def biases_used(monkeypatch):
    """Run the xformers backend with the reference kernel; collects every bias it was handed."""
    used = []

    def kernel(q, k, v, attn_bias, scale):
        used.append(attn_bias)
        return reference_attention(q, k, v, attn_bias, scale)

    monkeypatch.setattr(xf, "_attention", kernel)
    return used

"""T5's relative position bias on its own, against Hugging Face's `T5Attention.compute_bias`: the
model's lookup (`T5RelativeBias`), the torch backend, the xformers backend's code path (its
kernel swapped for a dense reference) and both decode kernels, for prefills and for decode steps.

With 32 buckets and max distance 128, offsets are exact up to 8 (encoder, per direction) or 16
(decoder), logarithmic up to 128 and one bucket beyond: sequences of 40, 130 and 300 tokens
reach every bucket, and their decode steps sit past every boundary.
"""
from __future__ import annotations

import pytest
import torch
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

from encdec.attention.backends import xformers as xf
from encdec.attention.backends.torch_sdpa import TorchSDPABackend
from encdec.attention.metadata import AttentionType
from encdec.kernels import paged_attention, paged_decode_attention
from encdec.kernels.cache_ops import reshape_and_cache
from encdec.models.t5 import T5RelativeBias
from tests.attention.helpers import BLOCK_SIZE, HEAD_SIZE, NUM_HEADS, group, prepare, slots

ENC, DEC = AttentionType.ENCODER, AttentionType.DECODER
NUM_BUCKETS, MAX_DISTANCE = 32, 128
LENGTHS = (40, 130, 300)
SCALE = HEAD_SIZE ** -0.5
ENCODER_LEN = 3  # of the decoder steps' requests (their cross tables are not read here)


def bias_layers(bidirectional: bool, seed: int = 0) -> tuple[T5Attention, T5RelativeBias]:
    """Hugging Face's attention layer with a random bias table, and the model's lookup of it."""
    config = T5Config(d_model=NUM_HEADS * HEAD_SIZE, d_kv=HEAD_SIZE, num_heads=NUM_HEADS,
                      relative_attention_num_buckets=NUM_BUCKETS,
                      relative_attention_max_distance=MAX_DISTANCE, is_decoder=not bidirectional)
    torch.manual_seed(seed)
    hf = T5Attention(config, has_relative_attention_bias=True, layer_idx=0).eval()
    torch.nn.init.normal_(hf.relative_attention_bias.weight)
    ours = T5RelativeBias(config, bidirectional)
    ours.relative_attention_bias.load_state_dict(hf.relative_attention_bias.state_dict())
    return hf, ours


@torch.no_grad()
def hf_bias(hf: T5Attention, q_len: int, k_len: int, causal: bool) -> torch.Tensor:
    """[H, q_len, k_len]: Hugging Face's bias of the last `q_len` of `k_len` positions, with -inf
    on keys after their query where `causal` (as its causal mask adds)."""
    bias = hf.compute_bias(q_len, k_len, past_seen_tokens=k_len - q_len)[0]
    if causal:
        later = torch.arange(k_len)[None, :] > torch.arange(k_len - q_len, k_len)[:, None]
        bias = bias.masked_fill(later, float("-inf"))
    return bias


def expected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T * SCALE + bias) v in float64; q [M, H, D], k and v [N, H, D], bias [H, M, N]."""
    scores = torch.einsum("mhd,nhd->hmn", q.double(), k.double()) * SCALE + bias.double()
    return torch.einsum("hmn,nhd->mhd", scores.softmax(-1), v.double()).float()


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_lookup_equals_compute_bias(bidirectional):
    hf, ours = bias_layers(bidirectional)
    with torch.no_grad():
        looked_up = ours(max(LENGTHS))
    for n in LENGTHS:
        want = hf_bias(hf, n, n, causal=not bidirectional)
        assert torch.equal(looked_up.matrix(n, causal=not bidirectional)[:, :n, :n], want)
        assert torch.equal(looked_up.by_distance()[:, :n], want[:, -1].flip(-1))
    # the longest sequence reaches every bucket (but the encoder's for a later key at offset 0)
    with torch.no_grad():
        reached = hf.compute_bias(300, 300)[0, 0].unique().numel()
    assert reached == NUM_BUCKETS - bidirectional


@pytest.fixture(params=["torch", "xformers"])
def backend(request, biases_used):
    """A backend, and the biases the xformers one handed its (reference) kernel."""
    return TorchSDPABackend() if request.param == "torch" else xf.XFormersBackend()


def check_kernel_biases(backend, biases_used: list) -> None:
    """The xformers path ran its kernel with bias tensors (the torch one never calls it)."""
    if isinstance(backend, xf.XFormersBackend):
        assert biases_used and all(isinstance(b, torch.Tensor) for b in biases_used)
    else:
        assert not biases_used


class Tables:
    """Consecutive block ids for the tables of one step's requests."""

    def __init__(self):
        self.next = 0

    def __call__(self, num_tokens: int) -> list[int]:
        n = -(-num_tokens // BLOCK_SIZE)
        self.next += n
        return list(range(self.next - n, self.next))


@pytest.mark.parametrize("lens", [LENGTHS, (130, 130)], ids=["varied", "equal"])
def test_encoder_prefill(backend, biases_used, lens):
    hf, ours = bias_layers(bidirectional=True)
    tables = Tables()
    meta = prepare([group(f"p{i}", n, {i: (1, tables(1))}, tables(n), is_prompt=True)
                    for i, n in enumerate(lens)])
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, sum(lens), NUM_HEADS, HEAD_SIZE, generator=gen)
    with torch.no_grad():
        out = backend.forward(q, k, v, None, meta, ENC, SCALE, ours(max(lens)))
    start = 0
    for n in lens:
        s = slice(start, start + n)
        torch.testing.assert_close(out[s], expected(q[s], k[s], v[s], hf_bias(hf, n, n, False)),
                                   atol=1e-5, rtol=1e-5)
        start += n
    check_kernel_biases(backend, biases_used)


def decoder_step(prefill_lens: tuple[int, ...], decode_lens: tuple[int, ...]):
    """One decoder step (prefills, then decodes) with its metadata, a paged cache holding the
    decodes' earlier keys and values, this step's q/k/v vectors and every sequence's queries,
    keys and values (from position 0; a decode's last ones are this step's)."""
    tables, groups, seqs = Tables(), [], []
    gen = torch.Generator().manual_seed(2)
    for i, n in enumerate(prefill_lens + decode_lens):
        is_prompt = i < len(prefill_lens)
        groups.append(group(f"r{i}", ENCODER_LEN, {i: (n, tables(n))}, tables(ENCODER_LEN),
                            is_prompt=is_prompt))
        q = torch.randn(n if is_prompt else 1, NUM_HEADS, HEAD_SIZE, generator=gen)
        seqs.append((q, *torch.randn(2, n, NUM_HEADS, HEAD_SIZE, generator=gen)))
    meta = prepare(groups)
    cache = torch.full((2, tables.next, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE), float("nan"))
    for g, (_, k, v) in zip(groups[len(prefill_lens):], seqs[len(prefill_lens):]):
        (table,) = g.block_tables.values()
        reshape_and_cache(k[:-1], v[:-1], cache, slots(table, len(k) - 1))
    step = [(q, k, v) if i < len(prefill_lens) else (q, k[-1:], v[-1:])
            for i, (q, k, v) in enumerate(seqs)]
    q, k, v = (torch.cat(parts) for parts in zip(*step))
    return meta, cache, (q, k, v), seqs


def assert_decoder_outputs(out: torch.Tensor, seqs: list, hf: T5Attention) -> None:
    start = 0
    for q, k, v in seqs:
        bias = hf_bias(hf, len(q), len(k), causal=True)
        torch.testing.assert_close(out[start:start + len(q)], expected(q, k, v, bias),
                                   atol=1e-5, rtol=1e-5)
        start += len(q)


@pytest.mark.parametrize("prefill_lens, decode_lens",
                         [((300, 40), LENGTHS), ((130, 130), (129,)), ((), LENGTHS)],
                         ids=["mixed", "equal-prefills", "decodes"])
def test_decoder_prefill_and_decode(backend, biases_used, prefill_lens, decode_lens):
    hf, ours = bias_layers(bidirectional=False)
    meta, cache, (q, k, v), seqs = decoder_step(prefill_lens, decode_lens)
    with torch.no_grad():
        out = backend.forward(q, k, v, cache, meta, DEC, SCALE, ours(max(meta.seq_lens)))
    assert_decoder_outputs(out, seqs, hf)
    check_kernel_biases(backend, biases_used)


@pytest.mark.parametrize("kernel", [paged_decode_attention, paged_attention])
def test_decode_kernels_take_t5_distance_bias(kernel):
    """The compiled CPU kernel and the torch reference with `distance_bias` alone."""
    hf, ours = bias_layers(bidirectional=False, seed=3)
    meta, cache, (q, k, v), seqs = decoder_step((), LENGTHS)
    reshape_and_cache(k, v, cache, meta.slot_mapping)
    with torch.no_grad():
        distance_bias = ours(max(LENGTHS)).by_distance()
    out = kernel(q, cache, meta.block_tables, meta.seq_lens, SCALE, distance_bias=distance_bias)
    assert_decoder_outputs(out, seqs, hf)

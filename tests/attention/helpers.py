"""Real attention metadata for backend tests: hand-made scheduled groups through the real runner."""
from __future__ import annotations

import torch

from encdec.attention.metadata import AttentionMetadata, AttentionType
from encdec.kernels.cache_ops import reshape_and_cache
from encdec.sampling.params import SamplingParams
from encdec.sequence import SequenceData, SequenceGroupMetadata
from encdec.worker.model_runner import EncoderDecoderModelRunner

BLOCK_SIZE = 4
NUM_BLOCKS = 24
NUM_HEADS = 2
HEAD_SIZE = 8


def group(request_id: str, encoder_len: int, seqs: dict[int, tuple[int, list[int]]],
          cross_block_table: list[int], is_prompt: bool) -> SequenceGroupMetadata:
    """One scheduled group; `seqs` maps seq_id -> (decoder length, self block table).

    A prompt's decoder tokens are all new; a decode has all but its last token cached.
    """
    seq_data = {}
    for seq_id, (length, _) in seqs.items():
        if is_prompt:
            seq_data[seq_id] = SequenceData(list(range(length)))
        else:
            seq_data[seq_id] = SequenceData([0], list(range(1, length)),
                                            num_computed_tokens=length - 1)
    return SequenceGroupMetadata(
        request_id=request_id, is_prompt=is_prompt, seq_data=seq_data,
        sampling_params=SamplingParams(temperature=0.0),
        block_tables={seq_id: table for seq_id, (_, table) in seqs.items()},
        encoder_seq_data=SequenceData(list(range(100, 100 + encoder_len))),
        cross_block_table=cross_block_table)


def mixed_batch() -> list[SequenceGroupMetadata]:
    """Three prefills and three decode groups (one with two forked sequences sharing block 15),
    listed interleaved so the runner has to put the prefills first."""
    return [
        group("d0", 6, {3: (9, [10, 11, 12])}, [13, 14], is_prompt=False),
        group("p0", 5, {0: (3, [1])}, [2, 3], is_prompt=True),
        group("d1", 3, {4: (5, [15, 16]), 5: (7, [15, 17])}, [18], is_prompt=False),
        group("p1", 7, {1: (6, [4, 5])}, [6, 7], is_prompt=True),
        group("d2", 8, {6: (4, [19])}, [20, 21], is_prompt=False),
        group("p2", 2, {2: (1, [8])}, [9], is_prompt=True),
    ]


def prepare(groups: list[SequenceGroupMetadata],
            device: torch.device = torch.device("cpu")) -> AttentionMetadata:
    """The metadata the real runner builds for these groups (it never calls the model), with
    its tensors on `device`."""
    runner = EncoderDecoderModelRunner(torch.nn.Identity(), BLOCK_SIZE, device,
                                       max_num_batched_tokens=64, eos_token_id=None, vocab_size=8)
    return runner.prepare_inputs(groups).attn_metadata


def layer_inputs(meta: AttentionMetadata, attn_type: AttentionType,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random query, key, value for one layer of this step: the encoder's tokens (ENCODER), or
    the decoder's tokens over their own (DECODER) or the prefills' encoder tokens (cross)."""
    num_tokens = meta.num_prefill_tokens + meta.num_decode_tokens
    num_q = meta.num_encoder_tokens if attn_type == AttentionType.ENCODER else num_tokens
    num_kv = num_tokens if attn_type == AttentionType.DECODER else meta.num_encoder_tokens
    q = torch.randn(num_q, NUM_HEADS, HEAD_SIZE, generator=gen)
    k, v = torch.randn(2, num_kv, NUM_HEADS, HEAD_SIZE, generator=gen)
    return q, k, v


def empty_cache() -> torch.Tensor:
    return torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE)


def fill_history(kv_cache: torch.Tensor, groups: list[SequenceGroupMetadata],
                 gen: torch.Generator) -> None:
    """Write random keys/values for what earlier steps of the decode groups cached: the
    computed decoder tokens (self tables) and the encoder tokens (cross table)."""
    for g in groups:
        if g.is_prompt:
            continue
        for seq_id, data in g.seq_data.items():
            _write_random(kv_cache, g.block_tables[seq_id], data.num_computed_tokens, gen)
        _write_random(kv_cache, g.cross_block_table, len(g.encoder_seq_data), gen)


def slots(table: list[int], length: int) -> torch.Tensor:
    """Cache slots of a sequence's first `length` tokens under its block table."""
    pos = torch.arange(length)
    return torch.tensor(table)[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE


def _write_random(kv_cache: torch.Tensor, table: list[int], length: int,
                  gen: torch.Generator) -> None:
    key, value = torch.randn(2, length, NUM_HEADS, HEAD_SIZE, generator=gen)
    reshape_and_cache(key, value, kv_cache, slots(table, length))

"""The worked examples of docs/design.md ("Model runner") and the decoder-only one they grew
from, through the runner's own layout code, plus an encoder/decoder step."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from encdec.sampling.params import SamplingParams
from encdec.sequence import SequenceData, SequenceGroupMetadata
from encdec.worker.input_layout import pad_block_tables, slot_mapping, token_layout
from encdec.worker.model_runner import EncoderDecoderModelRunner


def layout_and_slots(num_computed, num_scheduled, tables, block_size):
    layout = token_layout(np.array(num_computed), np.array(num_scheduled))
    slots = slot_mapping(pad_block_tables(tables), layout.req_indices, layout.positions, block_size)
    return layout, slots


def test_seed_002_step_1_prefill_with_chunk():
    layout, slots = layout_and_slots([0, 0, 0], [3, 2, 5], [[1, 2], [3], [4, 5, 6]], 2)
    assert layout.req_indices.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2, 2]
    assert layout.positions.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 4]
    assert slots.tolist() == [2, 3, 4, 6, 7, 8, 9, 10, 11, 12]
    assert layout.query_start_loc.tolist() == [0, 3, 5, 10]
    assert layout.seq_lens.tolist() == [3, 2, 5]


def test_seed_002_step_2_decodes_and_rest_of_chunk():
    layout, slots = layout_and_slots([3, 2, 5], [1, 1, 3], [[1, 2], [3, 7], [4, 5, 6, 8]], 2)
    assert layout.req_indices.tolist() == [0, 1, 2, 2, 2]
    assert layout.positions.tolist() == [3, 2, 5, 6, 7]
    assert slots.tolist() == [5, 14, 13, 16, 17]
    assert layout.query_start_loc.tolist() == [0, 1, 2, 5]
    assert layout.seq_lens.tolist() == [4, 3, 8]


def test_seed_000_five_requests_block_size_16():
    tables = [list(range(1, 5)), list(range(5, 15)), list(range(15, 21)), list(range(21, 26)), [26, 27]]
    layout, slots = layout_and_slots([54, 145, 0, 0, 0], [1, 1, 93, 75, 30], tables, 16)
    assert layout.query_start_loc.tolist() == [0, 1, 2, 95, 170, 200]
    assert layout.seq_lens.tolist() == [55, 146, 93, 75, 30]
    assert layout.positions[:4].tolist() == [54, 145, 0, 1]
    assert slots[:5].tolist() == [70, 225, 240, 241, 242]
    # Ends of each request's run: 240..332, 336..410, 416..445.
    assert slots[94].item() == 332 and slots[95].item() == 336
    assert slots[169].item() == 410 and slots[170].item() == 416 and slots[199].item() == 445
    assert len(slots) == 200


def group(request_id, seqs, is_prompt, encoder_ids, cross_table, block_tables):
    return SequenceGroupMetadata(
        request_id=request_id, is_prompt=is_prompt, seq_data=seqs,
        sampling_params=SamplingParams(temperature=0.0), block_tables=block_tables,
        encoder_seq_data=SequenceData(encoder_ids), cross_block_table=cross_table)


def test_encoder_decoder_step_metadata():
    """Two prefills (encoder 5 and 3 tokens) and one decode, block_size 4, given decode first."""
    decode = SequenceData([2, 0], [11, 12, 13], num_computed_tokens=4)  # 5 tokens, last not cached
    groups = [
        group("dec", {7: decode}, False, [0] * 9, [20, 21, 22], {7: [30, 31]}),
        group("p0", {1: SequenceData([2, 0])}, True, [0, 5, 6, 7, 2], [10, 11], {1: [12]}),
        group("p1", {2: SequenceData([2, 0, 9])}, True, [0, 8, 2], [13], {2: [14]}),
    ]
    runner = EncoderDecoderModelRunner(nn.Identity(), 4, torch.device("cpu"), 64, 2, 100)
    mi = runner.prepare_inputs(groups)
    meta = mi.attn_metadata
    assert mi.input_ids.tolist() == [2, 0, 2, 0, 9, 13]
    assert mi.positions.tolist() == [0, 1, 0, 1, 2, 4]
    assert meta.num_prefills == 2 and meta.num_prefill_tokens == 5 and meta.num_decode_tokens == 1
    assert meta.slot_mapping.tolist() == [48, 49, 56, 57, 58, 31 * 4 + 0]
    assert meta.seq_lens == [2, 3, 5]
    assert meta.query_start_loc.tolist() == [0, 2, 5, 6]
    assert meta.block_tables.tolist() == [[12, 0], [14, 0], [30, 31]]
    # Encoder side: only the prefills run the encoder; the decode keeps its encoder length.
    assert mi.encoder_input_ids.tolist() == [0, 5, 6, 7, 2, 0, 8, 2]
    assert mi.encoder_positions.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert meta.encoder_seq_lens == [5, 3, 9]
    assert meta.encoder_seq_start_loc.tolist() == [0, 5, 8]
    assert meta.num_encoder_tokens == 8 and max(meta.encoder_seq_lens) == 9
    assert meta.cross_slot_mapping.tolist() == [40, 41, 42, 43, 44, 52, 53, 54]
    assert meta.cross_block_tables.tolist() == [[10, 11, 0], [13, 0, 0], [20, 21, 22]]
    assert mi.logits_indices.tolist() == [1, 4, 5]
    assert runner.num_encoder_runs == 2

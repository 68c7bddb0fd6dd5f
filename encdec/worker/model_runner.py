"""EncoderDecoderModelRunner: scheduled groups -> model inputs + attention metadata -> samples.

Builds, with vectorized numpy over persistent CPU buffers whose numpy views share memory with
torch tensors: decoder `input_ids`/`positions`/`slot_mapping`, and for groups in their
first step the encoder inputs and `cross_slot_mapping`; plus `block_tables`,
`cross_block_tables` and the lengths in `AttentionMetadata`. Prefill sequences come first:
those the encoder runs for, then those whose prompt gave their cross keys and values
(`prompt_cross_kv`, laid out as the cross projections' rows), then the decodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from encdec.attention.metadata import AttentionMetadata
from encdec.sampling.prompt_logprobs import PromptRows, prompt_logprobs
from encdec.sampling.sampler import Sampler, SamplerOutput, SamplingMetadata
from encdec.sequence import SequenceData, SequenceGroupMetadata
from encdec.worker.input_layout import pad_block_tables, slot_mapping, token_layout


class CpuBuffer:
    """A persistent 1-D CPU tensor and its numpy view (same memory); grows when needed."""

    def __init__(self, size: int, dtype: torch.dtype):
        self.tensor = torch.zeros(size, dtype=dtype)
        self.np = self.tensor.numpy()

    def put(self, values: np.ndarray) -> torch.Tensor:
        n = len(values)
        if n > len(self.np):
            self.tensor = torch.zeros(2 * n, dtype=self.tensor.dtype)
            self.np = self.tensor.numpy()
        self.np[:n] = values
        return self.tensor[:n]


@dataclass
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    encoder_input_ids: Optional[torch.Tensor]
    encoder_positions: Optional[torch.Tensor]
    encoder_input_features: Optional[torch.Tensor]
    cross_kv: Optional[list[tuple[torch.Tensor, torch.Tensor]]]  # per layer, [tokens, heads * head_size]
    logits_indices: torch.Tensor
    sampling_metadata: SamplingMetadata
    prompt_rows: list[PromptRows]  # the prefills that ask for prompt_logprobs


def batch_order(metadata_list: list[SequenceGroupMetadata]) -> list[SequenceGroupMetadata]:
    """The scheduled groups in the order their sequences take in a step's batch: prefills the
    encoder runs for, prefills given their cross keys and values, then decodes."""
    return sorted(metadata_list, key=lambda g: (not g.is_prompt, g.prompt_cross_kv is not None))


class EncoderDecoderModelRunner:
    def __init__(self, model: torch.nn.Module, block_size: int, device: torch.device,
                 max_num_batched_tokens: int, eos_token_id: Optional[int], vocab_size: int):
        self.model = model
        self.block_size = block_size
        self.device = device
        sdpa_without_cudnn(device)
        self.sampler = Sampler(eos_token_id, vocab_size)
        self.vocab_size = vocab_size
        self.num_encoder_runs = 0
        n = max_num_batched_tokens
        self._input_ids = CpuBuffer(n, torch.int64)
        self._positions = CpuBuffer(n, torch.int64)
        self._slot_mapping = CpuBuffer(n, torch.int64)
        self._encoder_input_ids = CpuBuffer(n, torch.int64)
        self._encoder_positions = CpuBuffer(n, torch.int64)
        self._cross_slot_mapping = CpuBuffer(n, torch.int64)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def prepare_inputs(self, metadata_list: list[SequenceGroupMetadata]) -> ModelInput:
        """Flatten the scheduled sequences (prefills first) into model inputs and metadata."""
        groups = batch_order(metadata_list)
        rows = [(g, seq_id, data) for g in groups for seq_id, data in g.seq_data.items()]
        num_prefills = sum(1 for g, _, _ in rows if g.is_prompt)
        datas: list[SequenceData] = [data for _, _, data in rows]

        # Decoder side: a prefill schedules every not-yet-computed token, a decode one token.
        num_computed = np.fromiter((d.num_computed_tokens for d in datas), np.int64, len(datas))
        num_tokens = np.fromiter((len(d) for d in datas), np.int64, len(datas))
        layout = token_layout(num_computed, num_tokens - num_computed)
        token_ids = np.concatenate([np.asarray(d.get_token_ids()[d.num_computed_tokens:], np.int64)
                                    if g.is_prompt else np.asarray([d.get_last_token_id()], np.int64)
                                    for (g, _, _), d in zip(rows, datas)])
        block_tables = pad_block_tables([g.block_tables[seq_id] for g, seq_id, _ in rows])
        slots = slot_mapping(block_tables, layout.req_indices, layout.positions, self.block_size)

        # Encoder side: one encoder sequence per prefill row (a group prefilled again after a
        # recompute has a row per sequence, each encoding the group's input; rare enough).
        prefill_groups = [g for g, _, _ in rows[:num_prefills]]
        encoded = [g for g in prefill_groups if g.prompt_cross_kv is None]
        given = prefill_groups[len(encoded):]
        encoder_lens = np.fromiter((len(g.encoder_seq_data) for g, _, _ in rows), np.int64, len(rows))
        cross_tables = pad_block_tables([g.cross_block_table for g, _, _ in rows])
        enc_layout = token_layout(np.zeros(num_prefills, np.int64), encoder_lens[:num_prefills])
        cross_slots = slot_mapping(cross_tables, enc_layout.req_indices, enc_layout.positions,
                                   self.block_size)

        encoder_input_ids = encoder_positions = encoder_features = None
        if encoded:
            self.num_encoder_runs += len(encoded)
            if encoded[0].encoder_features is not None:
                encoder_features = self._to_device(torch.stack([g.encoder_features for g in encoded]))
            else:
                enc_ids = np.concatenate([g.encoder_seq_data.prompt_token_ids for g in encoded])
                encoder_input_ids = self._to_device(self._encoder_input_ids.put(enc_ids))
            num_encoded_tokens = int(encoder_lens[:len(encoded)].sum())
            encoder_positions = self._to_device(
                self._encoder_positions.put(enc_layout.positions[:num_encoded_tokens]))
        cross_kv = _joined_cross_kv(given, self.device) if given else None

        seq_lens = layout.seq_lens.tolist()
        query_lens = (num_tokens - num_computed)
        num_prefill_tokens = int(query_lens[:num_prefills].sum())
        meta = AttentionMetadata(
            num_prefills=num_prefills,
            num_prefill_tokens=num_prefill_tokens,
            num_decode_tokens=len(datas) - num_prefills,
            slot_mapping=self._to_device(self._slot_mapping.put(slots)),
            seq_lens=seq_lens,
            seq_lens_tensor=self._to_device(torch.from_numpy(layout.seq_lens)),
            query_start_loc=self._to_device(torch.from_numpy(layout.query_start_loc)),
            block_tables=self._to_device(torch.from_numpy(block_tables)),
            encoder_seq_lens=encoder_lens.tolist(),
            encoder_seq_lens_tensor=self._to_device(torch.from_numpy(encoder_lens)),
            encoder_seq_start_loc=self._to_device(torch.from_numpy(enc_layout.query_start_loc)),
            num_encoder_tokens=int(encoder_lens[:num_prefills].sum()),
            cross_slot_mapping=self._to_device(self._cross_slot_mapping.put(cross_slots)),
            cross_block_tables=self._to_device(torch.from_numpy(cross_tables)),
        )
        return ModelInput(
            input_ids=self._to_device(self._input_ids.put(token_ids)),
            positions=self._to_device(self._positions.put(layout.positions)),
            attn_metadata=meta,
            encoder_input_ids=encoder_input_ids,
            encoder_positions=encoder_positions,
            encoder_input_features=encoder_features,
            cross_kv=cross_kv,
            logits_indices=self._to_device(torch.from_numpy(layout.query_start_loc[1:] - 1)),
            sampling_metadata=SamplingMetadata.from_groups(groups),
            prompt_rows=_prompt_rows(rows[:num_prefills], layout.query_start_loc.tolist()),
        )

    @torch.inference_mode()
    def execute_model(self, metadata_list: list[SequenceGroupMetadata],
                      kv_caches: list[torch.Tensor]) -> SamplerOutput:
        model_input = self.prepare_inputs(metadata_list)
        kwargs = {}
        if model_input.encoder_input_features is not None:
            kwargs["encoder_input_features"] = model_input.encoder_input_features
        elif model_input.encoder_input_ids is not None:
            kwargs["encoder_input_ids"] = model_input.encoder_input_ids
            kwargs["encoder_positions"] = model_input.encoder_positions
        if model_input.cross_kv is not None:
            kwargs["cross_kv"] = model_input.cross_kv
        hidden = self.model(model_input.input_ids, model_input.positions, kv_caches,
                            model_input.attn_metadata, **kwargs)
        logits = self.model.compute_logits(hidden[model_input.logits_indices])
        outputs = self.sampler(logits.float(), model_input.sampling_metadata)
        if model_input.prompt_rows:
            self._add_prompt_logprobs(hidden, model_input.prompt_rows, outputs)
        return outputs

    def _add_prompt_logprobs(self, hidden: torch.Tensor, prompts: list[PromptRows],
                             outputs: SamplerOutput) -> None:
        """Each prompt's log-probabilities on its group's output, from one logits call."""
        logits = self.model.compute_logits(hidden[torch.cat([
            torch.arange(p.rows.start, p.rows.stop) for p in prompts]).to(hidden.device)])[:, :self.vocab_size]
        by_id = {o.request_id: o for o in outputs}
        start = 0
        for p in prompts:
            count = p.rows.stop - p.rows.start
            by_id[p.request_id].prompt_logprobs = prompt_logprobs(
                logits[start:start + count], p.next_token_ids, p.num_top)
            start += count


def sdpa_without_cudnn(device: torch.device) -> None:
    """On cuda, turn off SDPA's cuDNN kernel for the whole process. torch picks it first for
    half precision on recent GPUs, and it builds a plan for every new shape (tens of ms each);
    a continuous batch's shapes seldom repeat, and a first bart-base run took 7x as long as the
    next (RESULTS.md, "On a GPU, second lease"). torch's `sdpa_kernel` context sets the same
    process-wide flags on entry and exit, which engine threads running at once would undo."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def _prompt_rows(prefills: list[tuple[SequenceGroupMetadata, int, SequenceData]],
                 query_start_loc: list[int]) -> list[PromptRows]:
    """The prefills whose prompt_logprobs are asked for and not given yet (a prefill again after
    preemption by recompute has its outputs): all their rows but the last."""
    return [PromptRows(g.request_id, slice(start, stop - 1), data.get_token_ids()[1:],
                       g.sampling_params.prompt_logprobs)
            for (g, _, data), start, stop in zip(prefills, query_start_loc, query_start_loc[1:])
            if g.sampling_params.prompt_logprobs is not None and not data.output_token_ids]


def _joined_cross_kv(groups: list[SequenceGroupMetadata],
                     device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the groups' given (keys, values) one after another on `device` (wherever each
    was given), as the cross projections lay them out: [tokens, num_heads * head_size] each."""
    def rows(heads: torch.Tensor) -> torch.Tensor:  # [num_heads, tokens, head_size]
        return heads.to(device).transpose(0, 1).reshape(heads.shape[1], -1)

    return [(torch.cat([rows(g.prompt_cross_kv[layer][0]) for g in groups]),
             torch.cat([rows(g.prompt_cross_kv[layer][1]) for g in groups]))
            for layer in range(len(groups[0].prompt_cross_kv))]

"""Sequences, sequence groups and the per-step metadata the scheduler hands the runner.

A request is one `SequenceGroup`: one or more decoder `Sequence`s (n > 1 sampling, beam
search) and one `encoder_seq` that is static after the first step (docs/design.md).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from encdec.outputs import RequestMetrics

if TYPE_CHECKING:
    from encdec.outputs import Logprob, PromptLogprobs, SampleLogprobs
    from encdec.sampling.params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    SWAPPED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> Optional[str]:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
}


@dataclass
class SequenceData:
    """Token ids of one sequence: the prompt, what was generated, and how much is cached."""

    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    cumulative_logprob: float = 0.0
    sample_index: int = 0  # which of the request's n samples (its generator when seeded)

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def get_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def get_last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def is_prefill(self) -> bool:
        return self.num_computed_tokens == 0

    def copy(self) -> "SequenceData":
        return SequenceData(list(self.prompt_token_ids), list(self.output_token_ids),
                            self.num_computed_tokens, self.cumulative_logprob, self.sample_index)


class Sequence:
    """One decoder sequence (or the encoder sequence) of a request."""

    def __init__(self, seq_id: int, prompt_token_ids: list[int], block_size: int,
                 prompt: Optional[str] = None):
        self.seq_id = seq_id
        self.data = SequenceData(list(prompt_token_ids))
        self.prompt = prompt
        self.block_size = block_size
        self.status = SequenceStatus.WAITING
        self.output_logprobs: SampleLogprobs = []

    @classmethod
    def from_inputs(cls, seq_id: int, inputs: "EncoderDecoderInputs", block_size: int,
                    from_decoder_prompt: bool = True) -> "Sequence":
        """Build the decoder sequence (from_decoder_prompt) or the encoder sequence."""
        if from_decoder_prompt:
            return cls(seq_id, inputs.prompt_token_ids, block_size, inputs.prompt)
        return cls(seq_id, inputs.encoder_prompt_token_ids, block_size, inputs.encoder_prompt)

    def __len__(self) -> int:
        return len(self.data)

    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_token_id(self, token_id: int, logprob: float,
                        top_logprobs: Optional[dict[int, Logprob]] = None,
                        score: Optional[float] = None) -> None:
        """Commit a sampled token: every token before it is now in the KV cache. `score`
        replaces the summed log-probability (beam search keeps its own float32 score)."""
        self.data.output_token_ids.append(token_id)
        self.data.cumulative_logprob = self.data.cumulative_logprob + logprob if score is None else score
        self.data.num_computed_tokens = len(self.data) - 1
        if top_logprobs is not None:
            self.output_logprobs.append(top_logprobs)

    def finish(self, status: SequenceStatus) -> None:
        assert status.is_finished, status
        self.status = status

    def fork(self, new_seq_id: int, sample_index: Optional[int] = None) -> "Sequence":
        """A copy with its own id and token data; the request's `sample_index`-th sample (None:
        the same as this one)."""
        child = Sequence.__new__(Sequence)
        child.__dict__.update(self.__dict__)
        child.seq_id = new_seq_id
        child.data = self.data.copy()
        if sample_index is not None:
            child.data.sample_index = sample_index
        child.output_logprobs = list(self.output_logprobs)
        return child

    def reset_for_recompute(self) -> None:
        """After preemption by recompute the whole sequence is prefilled again."""
        self.data.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING

    def __repr__(self) -> str:
        return f"Sequence(id={self.seq_id}, status={self.status.name}, len={len(self)})"


@dataclass
class EncoderDecoderInputs:
    """A preprocessed request: token ids for both sides, plus optional encoder features."""

    encoder_prompt_token_ids: list[int]
    prompt_token_ids: list[int]
    encoder_prompt: Optional[str] = None
    prompt: Optional[str] = None
    encoder_features: Any = None  # e.g. Whisper log-mel [n_mels, frames]; None for text
    cross_kv: Any = None  # a CrossKVPrompt's (keys, values) per layer: the encoder does not run


class SequenceGroup:
    """All sequences of one request: decoder sequences plus the encoder sequence."""

    def __init__(self, request_id: str, seqs: list[Sequence], sampling_params: SamplingParams,
                 arrival_time: float, encoder_seq: Sequence, encoder_features: Any = None,
                 generators: Any = None, beam_search: Any = None, return_cross_kv: Any = False,
                 prompt_cross_kv: Any = None):
        self.request_id = request_id
        self.seqs = {seq.seq_id: seq for seq in seqs}
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.metrics = RequestMetrics(arrival_time)  # its times so far (each output gets a copy)
        self.prompt_logprobs: Optional[PromptLogprobs] = None  # when asked for
        self.encoder_seq = encoder_seq
        self.encoder_features = encoder_features
        self.prompt_cross_kv = prompt_cross_kv  # given in place of the encoder's work (kept for recompute)
        self.generators = generators  # torch.Generator of each of the n samples (one shared if unseeded)
        self.beam_search = beam_search  # the request's BeamSearch state, for beam search
        self.return_cross_kv = return_cross_kv  # True, or a test of the final output (LLMEngine.add_request)

    def get_seqs(self, status: Optional[SequenceStatus] = None) -> list[Sequence]:
        if status is None:
            return list(self.seqs.values())
        return [s for s in self.seqs.values() if s.status == status]

    def get_unfinished_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs.values() if not s.is_finished()]

    def num_seqs(self, status: Optional[SequenceStatus] = None) -> int:
        return len(self.get_seqs(status))

    def get_max_num_running_seqs(self) -> int:
        """The most decoder sequences this group can have running at once from now on."""
        if self.is_prefill():
            return self.sampling_params.max_num_seqs
        return len(self.get_unfinished_seqs())

    def is_prefill(self) -> bool:
        return all(s.data.is_prefill for s in self.get_unfinished_seqs())

    def add(self, seq: Sequence) -> None:
        assert seq.seq_id not in self.seqs
        self.seqs[seq.seq_id] = seq

    def remove(self, seq_id: int) -> None:
        del self.seqs[seq_id]

    def move_to_end(self, seq_id: int) -> None:
        """Beam search keeps its beams in rank order by moving each to the end in turn."""
        self.seqs[seq_id] = self.seqs.pop(seq_id)

    def is_finished(self) -> bool:
        return all(s.is_finished() for s in self.seqs.values())

    def __repr__(self) -> str:
        return f"SequenceGroup(request_id={self.request_id}, seqs={len(self.seqs)})"


@dataclass
class SequenceGroupMetadata:
    """What the runner needs of one scheduled group for one step."""

    request_id: str
    is_prompt: bool
    seq_data: dict[int, SequenceData]
    sampling_params: SamplingParams
    block_tables: dict[int, list[int]]
    encoder_seq_data: Optional[SequenceData] = None
    cross_block_table: Optional[list[int]] = None
    encoder_features: Any = None
    prompt_cross_kv: Any = None
    generators: Any = None

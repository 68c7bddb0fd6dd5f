"""What a request returns, finished or streaming, with both prompts (docs/design.md, "Outputs")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union


@dataclass
class Logprob:
    """vLLM's: a token's log-probability, its rank among all tokens (1: the likeliest) and its
    text alone (`tokenizer.decode([id])`; None without a tokenizer or with `detokenize=False`)."""

    logprob: float
    rank: int
    decoded_token: Optional[str] = None


def logprob_entry(top_ids: list[int], top_values: list[float], token: int, logprob: float,
                  rank: int) -> dict[int, Logprob]:
    """One position's entry, as vLLM's: the likeliest tokens ranked 1 to k, and `token` (the
    sampled or prompt token) with its own rank among all tokens."""
    entry = {t: Logprob(value, place) for place, (t, value) in enumerate(zip(top_ids, top_values), start=1)}
    entry[token] = Logprob(logprob, rank)
    return entry


PromptLogprobs = list[Optional[dict[int, Logprob]]]
SampleLogprobs = list[dict[int, Logprob]]  # a completion's, one entry a generated token


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str]
    stop_reason: Union[int, str, None] = None  # the stop string or stop token id that ended it (vLLM's)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """A request's times (`time.monotonic()`; vLLM's names): when it arrived, was first
    scheduled, sampled its first and its latest token, and finished (None until then);
    `time_in_queue`, from its arrival to its first scheduling."""

    arrival_time: float
    last_token_time: Optional[float] = None
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    time_in_queue: Optional[float] = None
    finished_time: Optional[float] = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    encoder_prompt: Optional[str]
    encoder_prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    # Each decoder layer's cross-attention (keys, values), [heads, encoder_len, head_size], on
    # the final output of a request added with `return_cross_kv` (Whisper's word alignment and
    # temperature fallback: `CrossKVPrompt`).
    cross_kv: Optional[list[tuple[Any, Any]]] = None
    metrics: Optional[RequestMetrics] = None
    # vLLM's: per decoder prompt token (None for the first), the top `prompt_logprobs` tokens and
    # itself; a DELTA request gets them in its first output only.
    prompt_logprobs: Optional[PromptLogprobs] = None

"""What a finished (or streaming) request returns, with both prompts (seed 004)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float
    logprobs: Optional[list[dict[int, float]]]
    finish_reason: Optional[str]

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    encoder_prompt: Optional[str]
    encoder_prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool

"""Sampling parameters of one request, validated at the edge."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

# (output token ids so far, logits row [vocab]) -> logits row; may modify in place.
LogitsProcessor = Callable[[list[int], torch.Tensor], torch.Tensor]

_GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    """How to decode one request (vLLM's names and meanings).

    temperature 0 means greedy. `seed` gives the request its own generator, so its samples do
    not depend on what else is in the batch. `logprobs` asks for that many top log-probabilities
    per generated token (plus the chosen one). `logits_processors` run per sequence, in order,
    after the built-in ones.
    """

    n: int = 1
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: Optional[int] = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    logits_processors: list[LogitsProcessor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        _check(isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}")
        _check(self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
               f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _check(isinstance(self.min_tokens, int) and self.min_tokens >= 0,
               f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens,
               f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}")
        _check(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _check(isinstance(self.top_k, int) and (self.top_k == -1 or self.top_k >= 1),
               f"top_k must be -1 (disabled) or an integer >= 1, got {self.top_k!r}")
        _check(self.seed is None or isinstance(self.seed, int), f"seed must be an int, got {self.seed!r}")
        _check(self.logprobs is None or (isinstance(self.logprobs, int) and self.logprobs >= 0),
               f"logprobs must be an integer >= 0, got {self.logprobs!r}")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
               f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def max_num_seqs(self) -> int:
        """Decoder sequences the request will run at once."""
        return self.n


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)

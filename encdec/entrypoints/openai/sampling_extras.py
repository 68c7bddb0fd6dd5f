"""What OpenAI's completions ask for that the engine does not do itself: stop strings and
`logit_bias`."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from encdec.entrypoints.openai.errors import bad_request
from encdec.outputs import CompletionOutput


class LogitBias:
    """OpenAI's `logit_bias`: add a bias to some tokens' logits (a per-sequence logits processor)."""

    def __init__(self, bias: dict[int, float]):
        self.ids = torch.tensor(list(bias), dtype=torch.long)
        self.values = torch.tensor(list(bias.values()))

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        logits[self.ids.to(logits.device)] += self.values.to(logits.device, logits.dtype)
        return logits


class StopStrings:
    """Cuts each completion's text at its first stop string, also one that spans deltas. As in
    vLLM, a stop string counts only where it ends in the text of a token after the first
    `min_tokens`."""

    def __init__(self, stops: list[str], min_tokens: int = 0):
        self.stops = [s for s in stops if s]
        # each delta's text keeps back what could be the start of a stop string
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.min_tokens = min_tokens
        self.pending: dict[int, str] = {}
        self.sent: dict[int, int] = {}  # per completion: characters given out
        self.floor: dict[int, int] = {}  # per completion: characters no stop string may end in
        self.num_tokens: dict[int, int] = {}
        self.stopped: set[int] = set()

    def cut(self, delta: CompletionOutput) -> Optional[CompletionOutput]:
        """The delta with the text that may go out now (finish_reason "stop" at a stop
        string); None once its completion has stopped."""
        if delta.index in self.stopped:
            return None
        if not self.stops:
            return delta
        index = delta.index
        sent = self.sent.get(index, 0)
        text = self.pending.pop(index, "") + delta.text
        self.num_tokens[index] = self.num_tokens.get(index, 0) + len(delta.token_ids)
        if self.num_tokens[index] <= self.min_tokens:
            self.floor[index] = sent + len(text)
        hit = self._first_stop(text, self.floor.get(index, 0) - sent)
        if hit is not None:
            self.stopped.add(index)
            return dataclasses.replace(delta, text=text[:hit], finish_reason="stop")
        split = len(text) if delta.finish_reason is not None else max(len(text) - self.hold, 0)
        self.pending[index] = text[split:]
        self.sent[index] = sent + split
        return dataclasses.replace(delta, text=text[:split])

    def _first_stop(self, text: str, floor: int) -> Optional[int]:
        """Where the first stop string that ends after `text[:floor]` starts, or None."""
        hits = [at for at in (text.find(s, max(floor - len(s) + 1, 0)) for s in self.stops) if at >= 0]
        return min(hits, default=None)


def logit_bias(bias: dict[str, float], vocab_size: int) -> dict[int, float]:
    parsed = {}
    for token, value in bias.items():
        if not (token.isascii() and token.isdigit() and len(token) <= 9) or int(token) >= vocab_size:
            raise bad_request(f"logit_bias: {token[:20]!r} is not a token id of this model "
                              f"(vocab_size={vocab_size})", "logit_bias")
        if not -100.0 <= value <= 100.0:
            raise bad_request(f"logit_bias: {value} is outside [-100, 100]", "logit_bias")
        parsed[int(token)] = value
    return parsed

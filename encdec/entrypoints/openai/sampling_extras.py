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
    """Cuts each completion's text at its first stop string, also one that spans deltas."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        # each delta's text keeps back what could be the start of a stop string
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending: dict[int, str] = {}
        self.stopped: set[int] = set()

    def cut(self, delta: CompletionOutput) -> Optional[CompletionOutput]:
        """The delta with the text that may go out now (finish_reason "stop" at a stop
        string); None once its completion has stopped."""
        if delta.index in self.stopped:
            return None
        if not self.stops:
            return delta
        text = self.pending.pop(delta.index, "") + delta.text
        hits = [at for at in (text.find(s) for s in self.stops) if at >= 0]
        if hits:
            self.stopped.add(delta.index)
            return dataclasses.replace(delta, text=text[:min(hits)], finish_reason="stop")
        split = len(text) if delta.finish_reason is not None else max(len(text) - self.hold, 0)
        self.pending[delta.index] = text[split:]
        return dataclasses.replace(delta, text=text[:split])


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

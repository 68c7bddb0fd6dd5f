"""Stop strings, by vLLM's rules: a completion ends at the first of its `stop` strings that ends
in the text of a token after its first `min_tokens`. Its text stops before the string (after
it, with `include_stop_str_in_output`); its token ids keep the token that completed it. While
the completion runs, streamed text holds back its last `len(longest stop) - 1` characters,
which may be the start of a stop string.
"""
from __future__ import annotations

from typing import Optional

from encdec.sampling.params import SamplingParams


class StopStrings:
    """The stop strings of one completion, searched in its text as it grows."""

    def __init__(self, params: SamplingParams):
        self.stops = params.stop
        self.include = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens or 0
        self.hold = 0 if self.include else max(map(len, self.stops)) - 1
        self.floor = 0  # characters of text no stop string may end in (the first min_tokens')
        self.searched = 0  # characters of text searched without a hit
        self.hit: Optional[str] = None
        self.end: Optional[int] = None  # where the text ends, after a hit

    def update(self, text: str, num_tokens: int) -> Optional[str]:
        """The stop string that ends in what `text` (the completion's text after `num_tokens`
        tokens) added since the last call, if one does; the completion then stops there."""
        if self.hit is not None:
            return None
        if num_tokens <= self.min_tokens:
            self.floor = len(text)
        start = max(self.floor, self.searched)
        hits = [(at, i) for i, stop in enumerate(self.stops)
                if (at := text.find(stop, max(start - len(stop) + 1, 0))) >= 0]
        self.searched = len(text)
        if not hits:
            return None
        at, i = min(hits)
        self.hit = self.stops[i]
        self.end = at + len(self.hit) if self.include else at
        return self.hit

    def visible(self, text: str, finished: bool) -> str:
        """What of `text` the completion shows: up to its stop string, else all of it once it has
        finished, else all but what may start one."""
        if self.end is not None:
            return text[:self.end]
        return text if finished else text[:max(len(text) - self.hold, 0)]

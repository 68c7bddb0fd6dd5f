"""Whisper's decoding rules on one logits row, as openai-whisper's `decoding.py` spells them.

Every rule sees `sampled`, the tokens generated after the control prefix (the text part of
the transcript so far), and edits the row in place:

* suppress tokens at every step: the model's suppress list plus the control tokens
  (openai's `suppress_tokens="-1"`);
* at the first sampled step, suppress the blank and <|endoftext|> (`begin_suppress_tokens`);
* in timestamp mode, the timestamp rules: no <|notimestamps|>; the first token is a timestamp
  of at most `max_initial_timestamp` seconds; timestamps come in pairs (a lone timestamp is
  followed by text, a closing one by another timestamp or the end); they never decrease;
  and when the timestamps together are likelier than the best text token, a timestamp it is.
  (Monotonic means non-decreasing, as in CTranslate2 / faster-whisper.)
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from encdec.whisper.tokens import WhisperTokens

TIME_PRECISION = 0.02  # seconds per timestamp token
MAX_INITIAL_TIMESTAMP = 1.0  # seconds

_NEG_INF = float("-inf")


def suppressed_token_ids(tokens: WhisperTokens, suppress_tokens: Sequence[int] = (-1,)) -> list[int]:
    """`suppress_tokens` (-1 standing for the model's own suppress list, openai-whisper's "-1")
    plus every control token a transcript must not contain (task, <|startoftranscript|>,
    <|startofprev|>, ...)."""
    chosen = [t for t in suppress_tokens if t != -1]
    if -1 in suppress_tokens:
        chosen += tokens.suppress_tokens
    control = [*tokens.task_to_id.values(), tokens.sot, tokens.sot_prev, tokens.sot_lm,
               tokens.no_speech]
    return sorted({t for t in [*chosen, *control] if t is not None})


class DecodingRules:
    """The rules above for one request; `timestamps` turns the timestamp rules on,
    `suppress_tokens` picks what is suppressed at every step (see `suppressed_token_ids`) and
    `suppress_blank` whether the first step suppresses the blank and <|endoftext|>."""

    def __init__(self, tokens: WhisperTokens, timestamps: bool,
                 max_initial_timestamp: Optional[float] = MAX_INITIAL_TIMESTAMP,
                 suppress_tokens: Sequence[int] = (-1,), suppress_blank: bool = True):
        if timestamps and tokens.timestamp_begin is None:
            raise ValueError("this Whisper vocabulary has no <|notimestamps|>: timestamps unknown")
        self.eot = tokens.eot
        self.no_timestamps = tokens.no_timestamps
        self.timestamp_begin = tokens.timestamp_begin
        self.timestamps = timestamps
        self.suppress = torch.tensor(suppressed_token_ids(tokens, suppress_tokens), dtype=torch.long)
        self.begin_suppress = torch.tensor(tokens.begin_suppress_tokens if suppress_blank else [],
                                           dtype=torch.long)
        self.max_initial = (None if max_initial_timestamp is None
                            else round(max_initial_timestamp / TIME_PRECISION))

    def apply(self, sampled: list[int], logits: torch.Tensor) -> None:
        logits[self.suppress] = _NEG_INF
        if not sampled:
            logits[self.begin_suppress] = _NEG_INF
        if self.timestamps:
            self._timestamp_rules(sampled, logits)

    def _timestamp_rules(self, sampled: list[int], logits: torch.Tensor) -> None:
        begin = self.timestamp_begin
        logits[self.no_timestamps] = _NEG_INF
        if not sampled:
            logits[:begin] = _NEG_INF
            if self.max_initial is not None:
                logits[begin + self.max_initial + 1:] = _NEG_INF
            return
        last = sampled[-1]
        if last >= begin:
            penultimate = sampled[-2] if len(sampled) > 1 else last
            if penultimate >= begin:  # a pair just closed, or the opening one: text next
                logits[begin:] = _NEG_INF
            else:  # a segment's text just ended: its closing timestamp (or the end) next
                logits[:self.eot] = _NEG_INF
        last_time = next((t for t in reversed(sampled) if t >= begin), None)
        if last_time is not None:
            logits[begin:last_time] = _NEG_INF
        # Compared on log-probabilities in openai-whisper; the softmax's shift cancels out.
        if logits[begin:].logsumexp(dim=-1) > logits[:begin].max():
            logits[:begin] = _NEG_INF

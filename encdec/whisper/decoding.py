"""Whisper's decoding rules on one logits row, as openai-whisper's `decoding.py` spells them.

Every rule sees `sampled`, the tokens generated after the control prefix (the text part of
the transcript so far), and edits the row in place:

* suppress tokens at every step: the model's suppress list plus the control tokens
  (openai's `suppress_tokens="-1"`); a list that would leave a step nothing to sample is
  refused up front (`check_suppress_tokens`);
* at the first sampled step, suppress the blank and <|endoftext|> (`begin_suppress_tokens`);
* in timestamp mode, the timestamp rules: no <|notimestamps|>; the first token is a timestamp
  of at most `max_initial_timestamp` seconds; timestamps come in pairs (a lone timestamp is
  followed by text, a closing one by another timestamp or the end); they never decrease, and
  a segment's closing timestamp comes after its opening one (no segment of zero length, which
  could loop forever: openai-whisper's rule); and when the timestamps together are likelier
  than the best text token, a timestamp it is.
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


def check_suppress_tokens(tokens: WhisperTokens, suppress_tokens: Sequence[int], suppress_blank: bool) -> None:
    """Refuse a `suppress_tokens` that leaves a decode nothing to sample: it may not name
    <|endoftext|> (openai-whisper never suppresses it: a decode could not end) nor a timestamp
    (a window's first token is one, and they show where a decode stopped), and it must leave a
    text token (below <|endoftext|>) that a decode may start with (`suppress_blank` bans the
    blank at the first step). Then no rule leaves a row without a token to sample."""
    begin = tokens.timestamp_begin
    for token in suppress_tokens:
        if token == tokens.eot or (begin is not None and token >= begin):
            needed = f"<|endoftext|> ({tokens.eot})" + ("" if begin is None else f" or a timestamp (>= {begin})")
            raise ValueError(f"suppress_tokens may not name {needed}: decoding needs them; got {token}")
    first_step = {*suppressed_token_ids(tokens, suppress_tokens),
                  *(tokens.begin_suppress_tokens if suppress_blank else ())}
    if sum(0 <= t < tokens.eot for t in first_step) >= tokens.eot:
        raise ValueError(f"suppress_tokens suppresses every text token (ids below {tokens.eot}): "
                         f"nothing left to transcribe with")


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
        check_suppress_tokens(tokens, suppress_tokens, suppress_blank)
        self.suppress = tuple(suppressed_token_ids(tokens, suppress_tokens))
        self.begin_suppress = tuple(tokens.begin_suppress_tokens) if suppress_blank else ()
        self.max_initial = (None if max_initial_timestamp is None
                            else round(max_initial_timestamp / TIME_PRECISION))


def apply_rules(scores: torch.Tensor, rows: list[int], sampled: list[list[int]],
                rules: list[DecodingRules]) -> None:
    """`rules[k]` on row `rows[k]` of `scores` [batch, vocab] (rules of one vocabulary), whose
    history is `sampled[k]`: the edits of the rules row by row, made in a few operations for
    all rows at once (a loop over rows would spend its time in per-operation overhead)."""
    banned: dict[tuple[int, ...], list[int]] = {}
    for row, history, r in zip(rows, sampled, rules):
        banned.setdefault(r.suppress, []).append(row)
        if not history:
            banned.setdefault(r.begin_suppress, []).append(row)
    for columns, picked in banned.items():
        if columns:
            scores[torch.tensor(picked)[:, None], torch.tensor(columns)] = _NEG_INF
    timed = [(row, history, r) for row, history, r in zip(rows, sampled, rules) if r.timestamps]
    if timed:
        _timestamp_rules(scores, timed)


def _timestamp_rules(scores: torch.Tensor, timed: list[tuple[int, list[int], DecodingRules]]) -> None:
    """The timestamp rules: per row, whether text may come (none at the first step; after a
    segment's text only <|endoftext|> and what follows it) and the timestamps allowed, [low,
    high); then, where the timestamps together are likelier than the best text token, a
    timestamp it is."""
    first = timed[0][2]
    begin, vocab = first.timestamp_begin, scores.shape[-1]
    no_text, only_end, checked, low, high = [], [], [], [], []
    for row, history, r in timed:
        lo, hi = begin, vocab
        if not history:  # the first token: a timestamp, early enough
            no_text.append(row)
            if r.max_initial is not None:
                hi = begin + r.max_initial + 1
        else:
            checked.append(row)
            last = history[-1]
            closed = False  # the last token closed a segment: the next may open at that time
            if last >= begin:
                penultimate = history[-2] if len(history) > 1 else last
                if penultimate >= begin:  # a pair just closed, or the opening one: text next
                    hi = begin
                else:  # a segment's text just ended: its closing timestamp (or the end) next
                    only_end.append(row)
                    closed = True
            stamp = next((t for t in reversed(history) if t >= begin), None)
            if stamp is not None:
                lo = stamp if closed else stamp + 1
        low.append(lo)
        high.append(hi)
    index = torch.tensor([row for row, _, _ in timed])
    scores[index, first.no_timestamps] = _NEG_INF
    if no_text:
        scores[torch.tensor(no_text), :begin] = _NEG_INF
    if only_end:
        scores[torch.tensor(only_end), :first.eot] = _NEG_INF
    columns = torch.arange(begin, vocab)
    outside = (columns < torch.tensor(low)[:, None]) | (columns >= torch.tensor(high)[:, None])
    scores[index, begin:] = scores[index, begin:].masked_fill(outside.to(scores.device), _NEG_INF)
    if checked:
        # Compared on log-probabilities in openai-whisper; the softmax's shift cancels out.
        picked = torch.tensor(checked)
        stamps = scores[picked, begin:].logsumexp(dim=-1)
        words = scores[:, :begin].amax(dim=-1)[picked]
        winners = picked[(stamps > words).cpu()]
        if len(winners):
            scores[winners, :begin] = _NEG_INF

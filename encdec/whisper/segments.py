"""A window's sampled tokens -> timed segments.

In timestamp mode a window's tokens read `<|t0|> text <|t1|><|t1'|> text <|t2|> ...`: each
segment is text between an opening and a closing timestamp. A trailing segment without its
closing timestamp (the window was cut mid-sentence, or decoding hit the length limit) keeps
its text and ends at the window's end; the other times are as sampled, even past that end
when nothing follows the window in its clip. Without timestamps the window is one segment.
Timestamp ids are not in the tokenizer: `(id - timestamp_begin) * 0.02` s from the window start.
A segment's `tokens` are its ids as decoded, timestamps included, as openai-whisper's are.
"""
from __future__ import annotations

from typing import Any, Optional

from encdec.whisper.decoding import TIME_PRECISION
from encdec.whisper.tokens import WhisperTokens
from encdec.whisper.transcript import Segment

Span = tuple[Optional[float], Optional[float], list[int]]  # (start, end, text ids)


def decode_text(tokenizer: Any, token_ids: list[int], tokens: WhisperTokens) -> str:
    """Text of the ordinary tokens (below <|endoftext|>); control and timestamp ids are skipped."""
    return tokenizer.decode([t for t in token_ids if t < tokens.eot])


def split_spans(sampled: list[int], tokens: WhisperTokens) -> list[Span]:
    """`(start, end, text ids)` per segment, times relative to the window (None = unknown)."""
    begin = tokens.timestamp_begin
    spans = []
    start: Optional[float] = None
    text: list[int] = []
    for token in sampled:
        if token == tokens.eot:
            break
        if begin is None or token < begin:
            text.append(token)
            continue
        time = (token - begin) * TIME_PRECISION
        if text:
            spans.append((start, time, text))
            start, text = None, []
        else:  # an opening timestamp (or a repeated one before any text)
            start = time
    if text:
        spans.append((start, None, text))
    return spans


def span_tokens(span: Span, tokens: WhisperTokens) -> list[int]:
    """A span's ids as decoded: its opening timestamp (the window's start for a text before
    any), its text and its closing timestamp, if any; its text alone without timestamp ids."""
    start, end, text = span
    if tokens.timestamp_begin is None:
        return list(text)
    times = [start or 0.0, *([] if end is None else [end])]
    opening, *closing = [tokens.timestamp_begin + round(time / TIME_PRECISION) for time in times]
    return [opening, *text, *closing]


def window_segments(spans: list[Span], tokens: WhisperTokens, tokenizer: Any, offset: float, duration: float,
                    limit: Optional[float] = None, timestamps: bool = True, from_start: bool = False,
                    **scores: Any) -> list[Segment]:
    """Segments of `split_spans` spans with absolute times: as sampled, also past the window's
    `duration` (as openai-whisper and faster-whisper keep them), up to `limit` seconds from
    `offset` when one is given; an open last segment ends at `duration`, a text before any
    timestamp starts at `offset`. `from_start` (`WindowPlan`): the one span starts at `offset`
    and ends at its last timestamp after 0, else at `duration`. `scores` are the `Segment`
    fields their window's decode gives them all (avg_logprob, ...). Their `tokens` are
    `span_tokens`, or the text alone without `timestamps`."""
    segments = []
    for span in spans:
        start, end, text = span
        ids = span_tokens(span, tokens) if timestamps else list(text)
        if from_start:
            start, end = 0.0, (end or start) or None
        start = start or 0.0
        end = max(duration if end is None else end, start)
        if limit is not None:
            start, end = min(start, limit), min(end, limit)
        segments.append(Segment(offset + start, offset + end, decode_text(tokenizer, text, tokens),
                                ids, **scores))
    return segments


def clear_empty_segments(segments: list[Segment]) -> None:
    """openai-whisper's last rule for a window's segments: one of no length (its word times
    may make it so) or without text keeps its place and times, but no text, tokens or words."""
    for segment in segments:
        if segment.start == segment.end or not segment.text.strip():
            segment.text, segment.tokens, segment.words = "", [], []

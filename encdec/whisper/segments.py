"""A window's sampled tokens -> timed segments.

In timestamp mode a window's tokens read `<|t0|> text <|t1|><|t1'|> text <|t2|> ...`: each
segment is text between an opening and a closing timestamp. A trailing segment without its
closing timestamp (the window was cut mid-sentence, or decoding hit the length limit) keeps
its text and ends at the window's end; the other times are as sampled, even past that end
when nothing follows the window in its clip. Without timestamps the window is one segment.
Timestamp ids are not in the tokenizer: `(id - timestamp_begin) * 0.02` s from the window start.
"""
from __future__ import annotations

from typing import Any, Optional

from encdec.whisper.decoding import TIME_PRECISION
from encdec.whisper.tokens import WhisperTokens
from encdec.whisper.transcript import Segment


def decode_text(tokenizer: Any, token_ids: list[int], tokens: WhisperTokens) -> str:
    """Text of the ordinary tokens (below <|endoftext|>); control and timestamp ids are skipped."""
    return tokenizer.decode([t for t in token_ids if t < tokens.eot])


def split_spans(sampled: list[int], tokens: WhisperTokens) -> list[tuple[Optional[float], Optional[float], list[int]]]:
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


def window_segments(spans: list[tuple[Optional[float], Optional[float], list[int]]],
                    tokens: WhisperTokens, tokenizer: Any, offset: float, duration: float,
                    limit: Optional[float] = None, **scores: Any) -> list[Segment]:
    """Segments of `split_spans` spans with absolute times: as sampled, also past the window's
    `duration` (as openai-whisper and faster-whisper keep them), up to `limit` seconds from
    `offset` when one is given; an open last segment ends at `duration`, a text before any
    timestamp starts at `offset`. `scores` are the `Segment` fields their window's decode
    gives them all (avg_logprob, ...)."""
    segments = []
    for start, end, text in spans:
        start = start or 0.0
        end = max(duration if end is None else end, start)
        if limit is not None:
            start, end = min(start, limit), min(end, limit)
        segments.append(Segment(offset + start, offset + end, decode_text(tokenizer, text, tokens),
                                text, **scores))
    return segments

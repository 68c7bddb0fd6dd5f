"""How much of its audio a window's decode covered, and where the next window starts.

Whisper often ends a window early: it closes a segment, opens the next one (or not) and emits
<|endoftext|> seconds before the window's audio ends. openai-whisper and faster-whisper decode
one window at a time and move their `seek` to the last timestamp, so the rest is decoded next.
encdec does the same (`plan_seek`). It does not decode again what
a window holds after a decode that closed its last segment early, as they do not: on audio
with long pauses or noise that only invited hallucinations, and it changed every later window
(measured against openai-whisper with word timestamps: "My brother plays the guitar..." became
"I'm going to go to the place...", after 12 s of noise). With `windows_at_once`, encdec decodes
all windows of a file at once (its speed on long audio), so it repairs instead (`plan_window`):
when a window's decode stops short, a follow-up window from the resume point to the window's
end joins the same continuous batch, and so on until the window is covered.

Measured on long espeak-ng clips (tests/whisper/test_long_audio.py; numbers in the module
`encdec.whisper.pipeline`'s docstring): the quiet-point cuts of `encdec.whisper.windows` keep
words whole at the window edges; every lost sentence was audio the window held, after an
early end-of-text. Overlapping windows would not bring those back
(the model stops early wherever the window starts) and would need a merge of two decodes of
the same words; the repair loop decodes only what is missing. So: quiet-point cuts plus the
repair loop, no overlap.

The rules of `plan_window`, in seconds from the window's start:

* Timestamp mode. Segments closed by a timestamp are kept. A last segment left open (no
  closing timestamp: the decode hit the token limit, or the model stopped mid-segment) is
  dropped and decoded again from its opening timestamp, as openai-whisper does. A last
  segment whose text repeats itself (compression ratio above 2.4: a loop near the window's
  end) is dropped and decoded again from its start as well. The resume point is the last
  timestamp the kept tokens reached; a follow-up is made when more than `MIN_REMAINDER`
  seconds of the window lie after it.
* Without timestamp tokens a decode shows no point to resume from, so it is kept as it is.
  Such decodes lost whole utterances on the test clips, which is why the pipeline decodes
  with timestamp tokens whenever the vocabulary has them.
* A follow-up must start later than its parent (no progress, no follow-up), and a window
  gets at most `MAX_FOLLOW_UPS` follow-ups in a row, so the loop always ends.
* Seams: a timestamp a little early makes the follow-up hear the end of the last kept
  segment again; words at the follow-up's start that repeat the kept text's last words
  (`repeated_words`, two words or more) are dropped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from encdec.whisper.segments import Span
from encdec.whisper.silence import COMPRESSION_RATIO_THRESHOLD, compression_ratio

MIN_REMAINDER = 1.0  # seconds of a window after the resume point worth a follow-up
MAX_FOLLOW_UPS = 8  # follow-ups of one window at most (each advances by MIN_REMAINDER or more)
MIN_REPEATED_WORDS = 2  # a seam overlap shorter than this is taken for speech
MAX_REPEATED_WORDS = 30


@dataclass
class WindowPlan:
    """The spans to keep, and where to decode again (None: the window is covered).
    `from_start`: the decode holds no pair of timestamps, so its one segment runs from the
    window's start to its last timestamp after 0 (else to the window's end), as openai-whisper
    times it, whatever timestamp opens it."""

    kept: list[Span]
    resume: Optional[float]
    from_start: bool = False


def plan_window(spans: list[Span], texts: list[str], duration: float, timestamps: bool,
                last_timestamp: Optional[float],
                compression_ratio_threshold: Optional[float] = COMPRESSION_RATIO_THRESHOLD) -> WindowPlan:
    """`spans` from `split_spans`, `texts` their decoded text, `last_timestamp` the latest
    timestamp sampled (None: none); see the module docstring for the rules."""
    if not timestamps or not spans:
        return WindowPlan(spans, None)
    kept = list(spans)
    resume = last_timestamp or 0.0
    start, end, _ = kept[-1]
    if end is None or _looping(texts[-1], compression_ratio_threshold):
        kept.pop()
        resume = start or 0.0
    if resume <= 0.0 or duration - resume <= MIN_REMAINDER:
        return WindowPlan(spans, None)  # nothing to gain from decoding again: keep it all
    return WindowPlan(kept, resume)


def plan_seek(spans: list[Span], texts: list[str], timestamps: bool, single_ending: bool,
              compression_ratio_threshold: Optional[float] = COMPRESSION_RATIO_THRESHOLD) -> WindowPlan:
    """The plan of a seek window (one window of an input after another):
    `resume` is where the input's next window starts (None: at this one's end), openai-whisper's
    `seek`. A last segment left open, or looping, is dropped and decoded again from the end of
    the segment before it; a decode that ends in a pair of timestamps resumes at the first of
    them; one that ends in a lone closing timestamp (`single_ending`) moves on to the window's
    end. A decode with no timestamps, or none after 0, keeps everything, as does one of a single
    segment (`from_start`)."""
    if not timestamps or not spans:
        return WindowPlan(spans, None)
    kept = list(spans)
    _, end, _ = kept[-1]
    if len(spans) == 1 and (end is None or single_ending):
        return WindowPlan(spans, None, from_start=True)
    if end is None or _looping(texts[-1], compression_ratio_threshold):
        kept.pop()
    elif single_ending:
        return WindowPlan(spans, None)
    resume = kept[-1][1] if kept else None  # only a last segment is ever open
    if not resume or resume <= 0.0:
        return WindowPlan(spans, None)
    return WindowPlan(kept, resume)


def _looping(text: str, compression_ratio_threshold: Optional[float]) -> bool:
    return compression_ratio_threshold is not None and compression_ratio(text) > compression_ratio_threshold


def words(text: str) -> list[str]:
    """Lowercase words without punctuation, for comparing texts at a seam."""
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def repeated_words(previous: str, text: str) -> int:
    """How many leading words of `text` repeat the last words of `previous` (0 if fewer than
    `MIN_REPEATED_WORDS`); the longest such overlap counts."""
    tail, head = words(previous)[-MAX_REPEATED_WORDS:], words(text)[:MAX_REPEATED_WORDS]
    for k in range(min(len(tail), len(head)), MIN_REPEATED_WORDS - 1, -1):
        if tail[-k:] == head[:k]:
            return k
    return 0

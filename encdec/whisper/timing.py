"""Word-level timestamps from cross-attention, as openai-whisper's `timing.py` describes.

Some cross-attention heads of Whisper's decoder (the alignment heads) look at the audio frame
a text token is spoken in. Given their attention weights for a window's text tokens (one
teacher-forced decoder pass over the prompt, the text and <|endoftext|>), each head's
weights are normalized per frame over all the pass's tokens, median-filtered along time, and
averaged over the heads; dynamic time warping then finds the monotonic path through (token, frame) that
collects the most attention, and a word's start and end are where the path enters its first
token and leaves its last one. Tokens are grouped into words at spaces (or per character for
languages written without spaces), punctuation joins the neighbouring word, and overlong words
at sentence and segment boundaries are trimmed with the median word duration.
"""
from __future__ import annotations

import functools
import string
from typing import Any, Optional

import numpy as np

from encdec.audio import CHUNK_LENGTH
from encdec.whisper.transcript import Segment, Word

FRAMES_PER_SECOND = 50  # encoder positions per second of audio
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
NO_SPACE_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over a sliding window of `width` (odd) along the last axis, edges reflected."""
    if width <= 1 or x.shape[-1] <= width // 2:
        return x
    pad = width // 2
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.median(windows, axis=-1)


def _dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover (compiled)
    rows, cols = cost.shape
    total = np.full((rows + 1, cols + 1), np.inf)
    move = np.zeros((rows + 1, cols + 1), dtype=np.int8)  # 0 diagonal, 1 up a row, 2 left a column
    total[0, 0] = 0.0
    for j in range(1, cols + 1):
        for i in range(1, rows + 1):
            diagonal, up, left = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
            if diagonal < up and diagonal < left:  # ties go left, then up (openai-whisper's order)
                best, step = diagonal, 0
            elif up < diagonal and up < left:
                best, step = up, 1
            else:
                best, step = left, 2
            total[i, j] = cost[i - 1, j - 1] + best
            move[i, j] = step
    move[0, :] = 2
    move[:, 0] = 1
    i, j = rows, cols
    token_path, frame_path = [], []
    while i > 0 or j > 0:
        token_path.append(i - 1)
        frame_path.append(j - 1)
        if move[i, j] == 0:
            i -= 1
            j -= 1
        elif move[i, j] == 1:
            i -= 1
        else:
            j -= 1
    return np.array(token_path[::-1]), np.array(frame_path[::-1])


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path from (0, 0) to the last (row, column) of `cost`, moving
    down, right or diagonally: (row indices, column indices) along it."""
    return _compiled_dtw_path()(np.ascontiguousarray(cost, dtype=np.float64))


@functools.lru_cache(maxsize=1)
def _compiled_dtw_path():
    """`_dtw_path` compiled by Numba (cached on disk), imported only when words are aligned."""
    import numba

    return numba.njit(cache=True)(_dtw_path)


def token_frames(weights: np.ndarray, rows: slice, num_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """`weights` [heads, tokens, frames] of the alignment heads over the whole pass (softmax
    over the window's `num_frames` encoder frames; each frame normalised over all the pass's
    tokens, the prompt's and <|endoftext|>'s too, as openai-whisper normalises it) -> the DTW
    path (token index, frame index) of the tokens in `rows`. A window of one encoder frame
    (the last 20-39 ms of an input) gives every token the same weight, 1: 0 / 0 makes the
    matrix NaN and the path then runs through frame -1 (20 ms before the window), as in
    openai-whisper."""
    w = weights[:, :, :num_frames]
    std, mean = w.std(axis=-2, keepdims=True), w.mean(axis=-2, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = (w - mean) / std
    matrix = median_filter(w[:, rows], MEDIAN_FILTER_WIDTH).mean(axis=0)
    return dtw(-matrix)


def split_words(tokenizer: Any, tokens: list[int], language: str) -> list[tuple[str, list[int]]]:
    """(word text, its tokens) for text tokens: words start at a space or a punctuation mark;
    per character for languages written without spaces. A token is grouped with the next
    ones until their text is whole characters."""
    pieces, current = [], []
    for token in tokens:
        current.append(token)
        text = tokenizer.decode(current)
        if "\ufffd" not in text:
            pieces.append((text, current))
            current = []
    if current:
        pieces.append((tokenizer.decode(current), current))
    if language in NO_SPACE_LANGUAGES:
        return pieces
    words: list[tuple[str, list[int]]] = []
    for text, ids in pieces:
        starts_word = text.startswith(" ") or text.strip() in string.punctuation
        if not words or starts_word:
            words.append((text, list(ids)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + ids)
    return words


def align_words(tokenizer: Any, text_tokens: list[int], weights: np.ndarray, first_row: int,
                token_probs: np.ndarray, num_frames: int, language: str) -> list[Word]:
    """Words of one window's `text_tokens` with times from the window's start: `weights`
    [heads, tokens, frames] are the alignment heads' attention over the pass (its prompt, the
    text tokens and the end of text), the rows from `first_row` on predicting the text tokens
    and the end of text; `token_probs` each text token's probability."""
    if not text_tokens:
        return []
    rows = slice(first_row, first_row + len(text_tokens) + 1)
    token_index, frame_index = token_frames(weights, rows, num_frames)
    jumps = np.diff(token_index, prepend=-1).astype(bool)
    jump_times = frame_index[jumps] / FRAMES_PER_SECOND  # when each token (and the end) starts
    words, position = [], 0
    for text, ids in split_words(tokenizer, text_tokens, language):
        start, end = jump_times[position], jump_times[min(position + len(ids), len(jump_times) - 1)]
        probability = float(np.mean(token_probs[position:position + len(ids)]))
        words.append(Word(text, float(start), float(end), probability, list(ids)))
        position += len(ids)
    return words


def merge_punctuation(words: list[Word], prepend: str = PREPEND_PUNCTUATIONS,
                      append: str = APPEND_PUNCTUATIONS) -> None:
    """In place: an opening mark (one of `prepend`, a word of its own after a space) goes to
    the word after it, a closing mark (one of `append`) to the word before it; the mark's entry
    is left empty (no text, no tokens) and each word keeps its own times."""
    following = len(words) - 1
    for i in range(len(words) - 2, -1, -1):
        mark, word = words[i], words[following]
        if mark.word.startswith(" ") and mark.word.strip() in prepend:
            word.word, word.tokens = mark.word + word.word, mark.tokens + word.tokens
            mark.word, mark.tokens = "", []
        else:
            following = i
    previous = 0
    for j in range(1, len(words)):
        word, mark = words[previous], words[j]
        if not word.word.endswith(" ") and mark.word in append:
            word.word, word.tokens = word.word + mark.word, word.tokens + mark.tokens
            mark.word, mark.tokens = "", []
        else:
            previous = j


def words_into_segments(words: list[Word], segments: list[Segment], eot: int, offset: float,
                        last_speech: float,
                        punctuations: tuple[str, str] = (PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)) -> float:
    """Give each segment its words (`align_words`' of the window at `offset` seconds, in the
    order of its text tokens, the ids below `eot`), trim overlong words at sentence and segment
    boundaries with the median word duration, join the marks of `punctuations` (prepended,
    appended) to their words, and fit segment and word times to each other. As openai-whisper
    does it: word times are rounded to 10 ms once placed in the input, before the fitting, which
    gives a segment its first word's start and its last word's end. Returns the end of the last
    speech, for the next window."""
    durations = np.array([w.end - w.start for w in words])
    durations = durations[durations > 0]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = 2 * median
    for previous, word in zip(words, words[1:]):
        if word.end - word.start > longest:  # the word as it is: " ." (a space first) is no mark
            if word.word in SENTENCE_END_MARKS:
                word.end = word.start + longest
            elif previous.word in SENTENCE_END_MARKS:
                word.start = word.end - longest
    merge_punctuation(words, *punctuations)
    position = 0
    for segment in segments:
        taken, mine = 0, []
        num_text = sum(t < eot for t in segment.tokens)
        while position < len(words) and taken < num_text:
            word = words[position]
            if word.word:
                mine.append(Word(word.word, round(offset + word.start, 2), round(offset + word.end, 2),
                                 word.probability, word.tokens))
            taken += len(word.tokens)
            position += 1
        if mine:
            _fit(segment, mine, median, longest, last_speech)
            last_speech = segment.end
        segment.words = mine
    return last_speech


def _fit(segment: Segment, words: list[Word], median: float, longest: float, last_speech: float) -> None:
    """openai-whisper's boundary rules for one segment and its words."""
    first = words[0]
    if first.end - last_speech > 4 * median and (
            first.end - first.start > longest or (len(words) > 1 and words[1].end - first.start > 2 * longest)):
        if len(words) > 1 and words[1].end - words[1].start > longest:
            first.end = words[1].start = max(words[1].end / 2, words[1].end - longest)
        first.start = max(0.0, first.end - longest)
    if segment.start < first.end and segment.start - 0.5 > first.start:
        first.start = max(0.0, min(first.end - median, segment.start))
    else:
        segment.start = first.start
    last = words[-1]
    if segment.end > last.start and segment.end + 0.5 < last.end:
        last.end = max(last.start + median, segment.end)
    else:
        segment.end = last.end


def word_anomaly(word: Word) -> float:
    """How unlike speech a word looks: improbable, very short or very long (openai-whisper)."""
    duration = word.end - word.start
    score = 1.0 if word.probability < 0.15 else 0.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_anomaly(segment: Optional[Segment]) -> bool:
    """A segment whose first (up to 8) words mostly look like a hallucination."""
    if segment is None or not segment.words:
        return False
    words = [w for w in segment.words if w.word not in PREPEND_PUNCTUATIONS + APPEND_PUNCTUATIONS][:8]
    score = sum(word_anomaly(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def speech_end(segments: list[Segment]) -> Optional[float]:
    """openai-whisper's `get_end`: the end of the last word of `segments`, else of the last
    segment (None: no segments)."""
    ends = [word.end for segment in segments for word in segment.words]
    return ends[-1] if ends else segments[-1].end if segments else None


def hallucination_index(segments: list[Segment], threshold: float, last_speech: float,
                        window_start: float, window_duration: float) -> Optional[int]:
    """openai-whisper's `hallucination_silence_threshold` test: the index of the first segment
    that looks like a hallucination (`is_anomaly`) with silence on both sides (more than
    `threshold` seconds, or a window's edge: its start, 30 s after it or its audio's end), or
    None. `last_speech` is where the speech before the window ended."""
    for i, segment in enumerate(segments):
        if not segment.words:
            continue
        if is_anomaly(segment):
            following = next((s for s in segments[i + 1:] if s.words), None)
            next_start = following.words[0].start if following is not None else window_start + window_duration
            silence_before = (segment.start - last_speech > threshold or segment.start < threshold
                              or segment.start - window_start < 2.0)
            silence_after = (next_start - segment.end > threshold or is_anomaly(following)
                             or window_start + CHUNK_LENGTH - segment.end < 2.0)
            if silence_before and silence_after:
                return i
        last_speech = segment.end
    return None

"""What a transcription may ask for: openai-whisper's (and faster-whisper's) `transcribe`
options with their defaults, every value checked before any work (`TranscribeOptions`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import numpy as np

from encdec.checks import flag, is_number, number, text
from encdec.sampling.params import REPETITION_PENALTY_RANGE, max_candidates
from encdec.whisper.silence import COMPRESSION_RATIO_THRESHOLD, LOGPROB_THRESHOLD, NO_SPEECH_THRESHOLD
from encdec.whisper.timing import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS
from encdec.whisper.vad import VadOptions

MAX_SEED = 2**32 - 1  # openai-whisper's and numpy's legacy seeds
FLAGS = ("timestamps", "carry_initial_prompt", "suppress_blank", "condition_on_previous_text",
         "windows_at_once", "vad_filter", "word_timestamps")  # the options that are True or False

InitialPrompt = Union[str, Sequence[int], None]  # text, or token ids (faster-whisper's)


@dataclass
class TranscribeOptions:
    """How the windows of a job are decoded (openai-whisper's `transcribe` options and defaults).

    `language` None detects it (once per input). Temperature fallback: a window is decoded at
    `temperature[0]`, and again at the next temperature (`best_of` samples, the likeliest
    kept) while its decode is too repetitive (compression ratio above
    `compression_ratio_threshold`) or too unsure (average log-probability below
    `logprob_threshold`), unless it is unsure because there is no speech (`no_speech_prob`
    above `no_speech_threshold`). Prompts: `initial_prompt` opens each input's context (kept
    in every window's prompt with `carry_initial_prompt`), faster-whisper's `hotwords` come
    first in every prompt. `suppress_tokens` ("-1": the
    model's list; None or "": none) and `suppress_blank` as in openai-whisper (what may be
    suppressed: `encdec.whisper.decoding.check_suppress_tokens`); `clip_timestamps`
    ("start,end,start,...", seconds, or a list of them; an open last clip runs to the end, so
    a lone number is where transcription starts) limits the audio transcribed.
    `word_timestamps` gives each segment its `words` (`encdec.whisper.timing`; the marks of
    `prepend_punctuations` and `append_punctuations` join the next and the previous word, as in
    openai-whisper); with them, `hallucination_silence_threshold` (seconds) drops a segment that
    looks like a hallucination between silences and the rest of its window, and (unless
    `windows_at_once`) decodes again from there and skips the silence before one, by
    openai-whisper's rules.
    Sampling is seeded per window and fallback from `seed` (in [0, `MAX_SEED`]), so a transcript
    does not depend on what else shares the batch; `seed=None` (or vLLM's -1) samples from the
    engine's generator, as `SamplingParams(seed=None)`. `vad_filter`
    transcribes only the speech regions Silero VAD finds (`vad_parameters`: `VadOptions` or
    a dict of its fields; `encdec.whisper.vad`).
    At temperature 0 a window is decoded greedily, or with beam search of `beam_size` beams
    (openai-whisper's `patience`). A window's candidates (beams, or `best_of` samples) are
    ranked as openai-whisper ranks them: by their log-probability over their length, or with
    `length_penalty` over ((5 + length) / 6) ** length_penalty. faster-whisper's
    `repetition_penalty` and `no_repeat_ngram_size` (0: none), and vLLM's `presence_penalty` and
    `frequency_penalty`, act on what each decode has decoded, not its prompt
    (`encdec.whisper.penalties`). A decode makes at most `max_new_tokens` tokens after its
    control tokens, its timestamps and end counted (openai-whisper's `sample_len`, by
    faster-whisper's name; None: 224), and never more than the decoder has room for. vLLM's `top_k` (0 or -1: none), `top_p` and `min_p` limit the
    sampled decodes. Each window of an input starts
    where the last decode left off (openai-whisper's seek), so an input's windows run one after
    another (other inputs' windows fill the batch), prompted with the text before them
    (`condition_on_previous_text`; off, as in openai-whisper, only an input's first window is
    prompted with `initial_prompt`, every window with `carry_initial_prompt`). A decode
    sampled hotter than `prompt_reset_on_temperature` (in [0, 2], as temperatures are) is not
    passed on. `windows_at_once` cuts an input at quiet points and decodes all its windows at
    once, not conditioned (as faster-whisper's `BatchedInferencePipeline`): faster on one long
    input, about a point of WER worse (measured in `encdec.whisper.pipeline`'s docstring).

    Every value is checked here, before any work: flags are True or False, prompts and
    punctuation marks strings, numbers real numbers (not bools, not NaN) within their ranges.
    """

    language: Optional[str] = None
    task: str = "transcribe"
    timestamps: bool = True
    initial_prompt: InitialPrompt = None
    carry_initial_prompt: bool = False
    hotwords: Optional[str] = None
    suppress_tokens: Union[str, Sequence[int], None] = "-1"
    suppress_blank: bool = True
    clip_timestamps: Union[str, float, Sequence[float]] = "0"
    temperature: Union[float, Sequence[float]] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    best_of: int = 5
    beam_size: Optional[int] = None
    patience: Optional[float] = None
    length_penalty: Optional[float] = None
    compression_ratio_threshold: Optional[float] = COMPRESSION_RATIO_THRESHOLD
    logprob_threshold: Optional[float] = LOGPROB_THRESHOLD
    no_speech_threshold: Optional[float] = NO_SPEECH_THRESHOLD
    condition_on_previous_text: bool = True
    windows_at_once: bool = False
    prompt_reset_on_temperature: float = 0.5
    seed: Optional[int] = 0
    vad_filter: bool = False
    vad_parameters: Union[VadOptions, dict, None] = None
    word_timestamps: bool = False
    prepend_punctuations: str = PREPEND_PUNCTUATIONS
    append_punctuations: str = APPEND_PUNCTUATIONS
    hallucination_silence_threshold: Optional[float] = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None
    max_new_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        for name in FLAGS:
            setattr(self, name, flag(name, getattr(self, name)))
        ids = self.initial_prompt
        if not (ids is None or isinstance(ids, str)):  # faster-whisper's token ids
            if not (isinstance(ids, (list, tuple, np.ndarray)) and all(is_number(t, integer=True) for t in ids)):
                raise ValueError(f"initial_prompt must be a string, a list of token ids or None, got {ids!r}")
            self.initial_prompt = [int(t) for t in ids]
        text("hotwords", self.hotwords, none=True)
        text("prepend_punctuations", self.prepend_punctuations)
        text("append_punctuations", self.append_punctuations)
        expected = "a number or a non-empty sequence of numbers in [0, 2]"
        self.temperature = tuple(_numbers("temperature", self.temperature, float, expected, strings=False))
        if not self.temperature or any(not 0.0 <= t <= 2.0 for t in self.temperature):
            raise ValueError(f"temperature must be {expected}, got {self.temperature!r}")
        self.best_of = number("best_of", self.best_of, 1, integer=True)
        self.beam_size = number("beam_size", self.beam_size, 1, integer=True, none=True)
        if self.patience is not None and (not is_number(self.patience) or not self.patience > 0
                                          or self.beam_size is None):
            raise ValueError(f"patience must be a number > 0, with beam_size set; got "
                             f"patience={self.patience!r}, beam_size={self.beam_size!r}")
        if self.patience is not None and max_candidates(self.beam_size, self.patience) < 1:
            raise ValueError(f"patience={self.patience} with beam_size={self.beam_size} waits for no "
                             f"finished beam: round(beam_size * patience) must be >= 1")
        for name in ("length_penalty", "compression_ratio_threshold", "logprob_threshold",
                     "no_speech_threshold"):
            setattr(self, name, number(name, getattr(self, name), none=True))
        self.prompt_reset_on_temperature = number("prompt_reset_on_temperature",
                                                  self.prompt_reset_on_temperature, 0, 2)
        if self.seed is not None:
            if not (is_number(self.seed, integer=True) and -1 <= self.seed <= MAX_SEED):
                raise ValueError(f"seed must be an integer in [0, {MAX_SEED}], or -1 or None (unseeded), "
                                 f"got {self.seed!r}")
            self.seed = None if self.seed == -1 else int(self.seed)
        self.repetition_penalty = number("repetition_penalty", self.repetition_penalty, *REPETITION_PENALTY_RANGE)
        self.no_repeat_ngram_size = number("no_repeat_ngram_size", self.no_repeat_ngram_size, 0, integer=True)
        self.max_new_tokens = number("max_new_tokens", self.max_new_tokens, 1, integer=True, none=True)
        for name in ("presence_penalty", "frequency_penalty"):
            setattr(self, name, number(name, getattr(self, name), -2, 2))
        if self.top_k is not None:
            if not (is_number(self.top_k, integer=True) and self.top_k >= -1):
                raise ValueError(f"top_k must be an integer >= 1, or 0, -1 or None (no top-k), got {self.top_k!r}")
            self.top_k = None if self.top_k in (0, -1) else int(self.top_k)
        self.top_p = number("top_p", self.top_p, 0, 1, above=True, none=True)
        self.min_p = number("min_p", self.min_p, 0, 1, none=True)
        self.vad_parameters = VadOptions.of(self.vad_parameters)
        suppress = [] if self.suppress_tokens is None else self.suppress_tokens
        self.suppress_tokens = _numbers("suppress_tokens", suppress, int,
                                        "token ids: integers, or a comma-separated string of them")
        self.clip_timestamps = _numbers("clip_timestamps", self.clip_timestamps, float,
                                        "seconds: numbers, or a comma-separated string of them")
        if any(not 0 <= t < math.inf for t in self.clip_timestamps) or any(
                b <= a for a, b in zip(self.clip_timestamps[::2], self.clip_timestamps[1::2])):
            raise ValueError(f"clip_timestamps must be start,end,start,end,... seconds with each "
                             f"end after its start, got {self.clip_timestamps}")
        if self.vad_filter and self.clip_timestamps not in ([], [0.0]):
            raise ValueError("clip_timestamps and vad_filter exclude each other")
        self.hallucination_silence_threshold = number(
            "hallucination_silence_threshold", self.hallucination_silence_threshold, 0, none=True)
        if self.hallucination_silence_threshold is not None and not self.word_timestamps:
            raise ValueError("hallucination_silence_threshold needs word_timestamps=True")


def _numbers(name: str, value: Any, kind: type, expected: str, strings: bool = True) -> list:
    """One number, a sequence of numbers or (with `strings`) a comma-separated string of them ->
    a list of `kind` (integers for int)."""
    if strings and isinstance(value, str):
        items = [v for v in value.split(",") if v.strip()]
    elif is_number(value):
        items = [value]
    else:
        items = value if isinstance(value, (list, tuple, range, np.ndarray)) else None
    try:
        return [kind(v) if strings and isinstance(v, str) else number(name, v, integer=kind is int)
                for v in items]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {expected}, got {value!r}") from None

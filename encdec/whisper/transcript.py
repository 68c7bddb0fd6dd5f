"""What `LLM.transcribe` returns for one audio input."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Word:
    """One word of a transcript with its time (seconds from the input's start) and the
    probability of its tokens (word timestamps)."""

    word: str
    start: float
    end: float
    probability: float
    tokens: list[int] = field(default_factory=list, repr=False)


@dataclass
class Segment:
    """A stretch of speech with absolute times (seconds from the start of the input)."""

    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list, repr=False)
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    temperature: float = 0.0  # of the decode the segment comes from (temperature fallback)
    compression_ratio: float = 0.0  # of that decode's text
    seek: int = 0  # where the segment's window starts, in 10 ms frames (openai-whisper's seek)
    words: list[Word] = field(default_factory=list)  # with word timestamps
    # its place among the input's segments, from 0 (openai-whisper's and OpenAI's; faster-whisper
    # counts from 1)
    id: int = 0


@dataclass
class Transcription:
    """One input's transcript: full text, detected or given language, ordered segments."""

    text: str
    language: Optional[str]
    segments: list[Segment]
    duration: float
    source: Optional[str] = None  # the file path, when the input was a file
    # the detection's probability of `language` (faster-whisper's); 1 when it was not detected
    language_probability: float = 1.0

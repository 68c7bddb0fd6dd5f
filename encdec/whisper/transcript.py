"""What `LLM.transcribe` returns for one audio input."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional


class _ReadByKey:
    """Fields read as `item["text"]` too, so that code written for openai-whisper's result
    dicts (`result["segments"][0]["start"]`, `"words" in segment`, `dict(segment)`, its
    writers) runs unchanged. As there, a segment has the key "words" only when its words were
    timed. For JSON, `dataclasses.asdict(item)`."""

    def keys(self) -> list[str]:
        return [name for name in self.__dataclass_fields__ if name != "words" or getattr(self, name)]

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def copy(self) -> dict[str, Any]:
        """A dict of the keys (shallow), as copying openai-whisper's dict gives."""
        return dict(self)


@dataclass
class Word(_ReadByKey):
    """One word of a transcript with its time (seconds from the input's start) and the
    probability of its tokens (word timestamps)."""

    word: str
    start: float
    end: float
    probability: float
    tokens: list[int] = field(default_factory=list, repr=False)


@dataclass
class Segment(_ReadByKey):
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
class Transcription(_ReadByKey):
    """One input's transcript: full text, detected or given language, ordered segments."""

    text: str
    language: Optional[str]
    segments: list[Segment]
    duration: float
    source: Optional[str] = None  # the file path, when the input was a file
    # the detection's probability of `language` (faster-whisper's); 1 when it was not detected
    language_probability: float = 1.0

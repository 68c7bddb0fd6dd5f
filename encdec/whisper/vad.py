"""Voice activity detection with Silero VAD, so that long silences and noise are not decoded.

Whisper invents text for stretches without speech ("Thank you.", repeated phrases). With
`vad_filter`, a transcription keeps only the speech regions Silero VAD finds, joins them into one
shorter audio, transcribes that, and maps every time back to the original audio
(`SpeechMap.to_original`), as faster-whisper does.

The model is Silero VAD's TorchScript file from the `silero-vad` package, loaded by path: the
package's own import sets torch's thread count to 1 for the whole process. It scores 512-sample
frames (32 ms at 16 kHz). Regions follow faster-whisper's `VadOptions` (names and defaults):
speech starts at a frame scoring `threshold` or more and ends after `min_silence_duration_ms` of
frames below `neg_threshold` (default `threshold - 0.15`); regions shorter than
`min_speech_duration_ms` are dropped, regions longer than `max_speech_duration_s` are cut at
their least speech-like frame, and every region is padded by `speech_pad_ms` on both sides (gaps
too short for both pads are shared).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from encdec.audio import SAMPLE_RATE
from encdec.checks import number

FRAME = 512  # samples Silero VAD scores at a time, at 16 kHz
MIN_SPLIT_S = 2 * FRAME / SAMPLE_RATE  # 0.064 s, the least max_speech_duration_s: two frames are not cut


@dataclass
class VadOptions:
    """faster-whisper's VAD parameters (same names, same defaults). The thresholds are
    probabilities in (0, 1), the `_ms` fields integers >= 0, and `max_speech_duration_s` at
    least `MIN_SPLIT_S`: a region is cut no finer than two frames."""

    threshold: float = 0.5
    neg_threshold: Optional[float] = None
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = math.inf
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400

    def __post_init__(self) -> None:
        number("vad threshold", self.threshold, 0, 1, above=True, below=True)
        number("vad neg_threshold", self.neg_threshold, 0, 1, above=True, below=True, none=True)
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            number(f"vad {name}", getattr(self, name), 0, integer=True)
        number("vad max_speech_duration_s", self.max_speech_duration_s, MIN_SPLIT_S)

    @classmethod
    def of(cls, value: Any) -> Optional[VadOptions]:
        """`vad_parameters` as given: a `VadOptions`, a dict of its fields (or a dataclass with
        them, such as faster-whisper's `VadOptions`), or None."""
        if value is None or isinstance(value, VadOptions):
            return value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if not isinstance(value, dict):
            raise ValueError(f"vad_parameters must be a VadOptions, a dict of its fields or None, "
                             f"got {type(value).__name__}")
        unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)}, key=str)
        if unknown:
            raise ValueError(f"vad_parameters: unknown fields {unknown}; VadOptions has "
                             f"{[f.name for f in dataclasses.fields(cls)]}")
        return cls(**value)


@functools.lru_cache(maxsize=1)
def silero_model() -> torch.jit.ScriptModule:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("vad_filter needs the silero-vad package (pip install silero-vad)")
    path = os.path.join(spec.submodule_search_locations[0], "data", "silero_vad.jit")
    return torch.jit.load(path, map_location="cpu").eval()


def speech_probabilities(audio: np.ndarray) -> np.ndarray:
    """Silero VAD's speech probability of every 512-sample frame (the last one zero-padded)."""
    model = silero_model()
    frames = -(-len(audio) // FRAME)
    padded = np.zeros(frames * FRAME, dtype=np.float32)
    padded[:len(audio)] = audio
    chunks = torch.from_numpy(padded).view(frames, FRAME)
    model.reset_states()
    with torch.inference_mode():
        return np.array([model(chunk[None], SAMPLE_RATE).item() for chunk in chunks], dtype=np.float32)


def speech_regions(probs: np.ndarray, num_samples: int, options: VadOptions) -> list[tuple[int, int]]:
    """`[(start, end), ...]` sample ranges of speech, from per-frame probabilities."""
    off = options.neg_threshold if options.neg_threshold is not None else max(options.threshold - 0.15, 0.01)
    runs, start = [], None
    for i, p in enumerate(probs):
        if start is None and p >= options.threshold:
            start = i
        elif start is not None and p < off:
            runs.append([start, i])
            start = None
    if start is not None:
        runs.append([start, len(probs)])
    min_gap = options.min_silence_duration_ms * SAMPLE_RATE / 1000 / FRAME
    merged: list[list[int]] = []
    for run in runs:
        if merged and run[0] - merged[-1][1] < min_gap:
            merged[-1][1] = run[1]
        else:
            merged.append(run)
    longest = options.max_speech_duration_s * SAMPLE_RATE / FRAME
    split = [piece for run in merged for piece in _split_long(run, probs, longest)]
    shortest = options.min_speech_duration_ms * SAMPLE_RATE / 1000 / FRAME
    regions = [(s * FRAME, min(e * FRAME, num_samples)) for s, e in split if e - s >= shortest]
    return _pad(regions, options.speech_pad_ms * SAMPLE_RATE // 1000, num_samples)


def _split_long(run: list[int], probs: np.ndarray, longest: float) -> list[list[int]]:
    """Cut a run longer than `longest` frames at its least speech-like frame, recursively."""
    start, end = run
    if end - start <= longest:
        return [run]
    margin = max(1, (end - start) // 10)
    cut = start + margin + int(np.argmin(probs[start + margin:end - margin]))
    return _split_long([start, cut], probs, longest) + _split_long([cut, end], probs, longest)


def _pad(regions: list[tuple[int, int]], pad: int, num_samples: int) -> list[tuple[int, int]]:
    padded = []
    for i, (start, end) in enumerate(regions):
        before = regions[i - 1][1] if i else 0
        after = regions[i + 1][0] if i + 1 < len(regions) else num_samples
        padded.append((max(start - pad, (before + start) // 2 if i else 0),
                       min(end + pad, (end + after) // 2 if i + 1 < len(regions) else num_samples)))
    return padded


class SpeechMap:
    """The speech regions of one audio joined into one, and the way back to original times."""

    def __init__(self, audio: np.ndarray, options: VadOptions):
        self.regions = speech_regions(speech_probabilities(audio), len(audio), options)
        self.audio = (np.concatenate([audio[s:e] for s, e in self.regions]).astype(np.float32)
                      if self.regions else np.zeros(0, dtype=np.float32))
        lengths = [e - s for s, e in self.regions]
        self.joined_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) \
            if lengths else np.zeros(0, np.int64)

    def to_original(self, seconds: float, is_end: bool = False) -> float:
        """A time in the joined audio -> the same moment in the original audio. A time on the
        seam of two regions is the end of the first when `is_end`, else the start of the next."""
        if not self.regions:
            return seconds
        sample = seconds * SAMPLE_RATE
        side = "left" if is_end else "right"
        index = max(0, int(np.searchsorted(self.joined_starts, sample, side=side)) - 1)
        return float(self.regions[index][0] + sample - self.joined_starts[index]) / SAMPLE_RATE

"""Voice activity detection with Silero VAD, so that long silences and noise are not decoded.

Whisper invents text for stretches without speech ("Thank you.", repeated phrases). With
`vad_filter`, a transcription keeps only the speech regions Silero VAD finds, joins them into one
shorter audio, transcribes that, and maps every time back to the original audio
(`SpeechMap.to_original`), as faster-whisper does: a word by the region its middle is in, both
its ends (so that it never spans a removed stretch), a segment with words from its first word's
start to its last word's end, times rounded to 10 ms.

The model is Silero VAD's TorchScript file from the `silero-vad` package, loaded by path: the
package's own import sets torch's thread count to 1 for the whole process. It scores 512-sample
frames (32 ms at 16 kHz). Regions follow Silero VAD's rules as faster-whisper applies them, with
its `VadOptions` (names and defaults): speech starts at a frame scoring `threshold` or more; a
frame below `neg_threshold` (default `threshold - 0.15`) starts a silence, which a frame at
`threshold` or more cancels (frames in between go on with what is in progress), and a silence
that lasts `min_silence_duration_ms` ends the region where it began; speech still going at the
end of the audio runs to its end. Regions not longer than `min_speech_duration_ms` are dropped;
one that outgrows `max_speech_duration_s` (padding included) ends at its last silence over
LONG_PAUSE_S, else where it is. Every region is padded by `speech_pad_ms` on both sides (gaps
too short for both pads are shared).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from encdec.audio import SAMPLE_RATE
from encdec.checks import number
from encdec.whisper.transcript import Segment

FRAME = 512  # samples Silero VAD scores at a time, at 16 kHz
MIN_SPLIT_S = 2 * FRAME / SAMPLE_RATE  # 0.064 s, the least max_speech_duration_s: two frames are not cut
LONG_PAUSE_S = 0.098  # a silence this long inside a region too long is where it may end


@dataclass
class VadOptions:
    """faster-whisper's VAD parameters (same names, same defaults). The thresholds are
    probabilities in [0, 1] (OpenAI's range for `server_vad`), the `_ms` fields numbers >= 0, and
    `max_speech_duration_s` at least `MIN_SPLIT_S`: a region is cut no finer than two frames."""

    threshold: float = 0.5
    neg_threshold: Optional[float] = None
    min_speech_duration_ms: float = 0
    max_speech_duration_s: float = math.inf
    min_silence_duration_ms: float = 2000
    speech_pad_ms: float = 400

    def __post_init__(self) -> None:
        number("vad threshold", self.threshold, 0, 1)
        number("vad neg_threshold", self.neg_threshold, 0, 1, none=True)
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            number(f"vad {name}", getattr(self, name), 0)
        number("vad max_speech_duration_s", self.max_speech_duration_s, MIN_SPLIT_S)

    @classmethod
    def of(cls, value: Any) -> Optional[VadOptions]:
        """`vad_parameters` as given: a `VadOptions`, a dict of its fields (or a dataclass with
        them, such as faster-whisper's `VadOptions`), or None."""
        if value is None:
            return value
        if isinstance(value, VadOptions):
            return dataclasses.replace(value)  # checked again: its fields may have changed since
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


_thread_models = threading.local()


def silero_model() -> torch.jit.ScriptModule:
    """This thread's Silero VAD model. The model carries its state from frame to frame, so each
    thread (the server sets up several uploads at once) loads its own."""
    model = getattr(_thread_models, "model", None)
    if model is None:
        spec = importlib.util.find_spec("silero_vad")
        if spec is None or not spec.submodule_search_locations:
            raise ValueError("vad_filter needs the silero-vad package (pip install silero-vad)")
        path = os.path.join(spec.submodule_search_locations[0], "data", "silero_vad.jit")
        model = _thread_models.model = torch.jit.load(path, map_location="cpu").eval()
    return model


def speech_probabilities(audio: np.ndarray) -> np.ndarray:
    """Silero VAD's speech probability of every 512-sample frame, the audio padded with zeros
    to a whole frame more, as faster-whisper pads it (a full frame when it ends on one)."""
    model = silero_model()
    frames = len(audio) // FRAME + 1
    padded = np.zeros(frames * FRAME, dtype=np.float32)
    padded[:len(audio)] = audio
    chunks = torch.from_numpy(padded).view(frames, FRAME)
    model.reset_states()
    with torch.inference_mode():
        return np.array([model(chunk[None], SAMPLE_RATE).item() for chunk in chunks], dtype=np.float32)


def speech_regions(probs: np.ndarray, num_samples: int, options: VadOptions) -> list[tuple[int, int]]:
    """`[(start, end), ...]` sample ranges of speech, from per-frame probabilities (see the
    module docstring)."""
    off = options.neg_threshold if options.neg_threshold is not None else max(options.threshold - 0.15, 0.01)
    pad = SAMPLE_RATE * options.speech_pad_ms / 1000
    shortest = SAMPLE_RATE * options.min_speech_duration_ms / 1000
    min_silence = SAMPLE_RATE * options.min_silence_duration_ms / 1000
    longest = SAMPLE_RATE * options.max_speech_duration_s - FRAME - 2 * pad
    regions: list[tuple[int, int]] = []
    start: Optional[int] = None  # of the region in progress
    silence = 0  # where the silence in progress began (0: none)
    cut = resume = 0  # a region too long: where it may end (its last long pause) and speech came back after it
    for i, p in enumerate(probs):
        at = i * FRAME
        if p >= options.threshold and silence:
            silence = 0
            if resume < cut:
                resume = at
        if p >= options.threshold and start is None:
            start = at
            continue
        if start is not None and at - start > longest:
            if cut:
                regions.append((start, cut))
                start = resume if resume >= cut else None
                silence = cut = resume = 0
            else:
                regions.append((start, at))
                start = None
                silence = cut = resume = 0
                continue
        if start is not None and p < off:
            silence = silence or at
            if at - silence > LONG_PAUSE_S * SAMPLE_RATE:
                cut = silence
            if at - silence >= min_silence:
                if silence - start > shortest:
                    regions.append((start, silence))
                start = None
                silence = cut = resume = 0
    if start is not None and num_samples - start > shortest:
        regions.append((start, num_samples))
    return _pad(regions, pad, num_samples)


def _pad(regions: list[tuple[int, int]], pad: float, num_samples: int) -> list[tuple[int, int]]:
    """Each region `pad` samples wider on both sides, within the audio; two regions closer than
    two pads share the gap between them."""
    padded = [list(region) for region in regions]
    for i, region in enumerate(padded):
        if i == 0:
            region[0] = int(max(0, region[0] - pad))
        if i + 1 == len(padded):
            region[1] = int(min(num_samples, region[1] + pad))
            continue
        after = padded[i + 1]
        gap = after[0] - region[1]
        if gap < 2 * pad:
            region[1], after[0] = region[1] + gap // 2, after[0] - gap // 2
        else:  # both pads fit in the gap, so inside the audio
            region[1], after[0] = int(region[1] + pad), int(after[0] - pad)
    return [(start, end) for start, end in padded]


class SpeechMap:
    """The speech regions of one audio joined into one, and the way back to original times."""

    def __init__(self, audio: np.ndarray, options: VadOptions):
        self.regions = speech_regions(speech_probabilities(audio), len(audio), options)
        self.audio = (np.concatenate([audio[s:e] for s, e in self.regions]).astype(np.float32)
                      if self.regions else np.zeros(0, dtype=np.float32))
        lengths = [e - s for s, e in self.regions]
        self.joined_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) \
            if lengths else np.zeros(0, np.int64)

    def region_at(self, seconds: float, is_end: bool = False) -> int:
        """The region a time in the joined audio falls in; on the seam of two, the first when
        `is_end`, else the next."""
        side = "left" if is_end else "right"
        sample = int(seconds * SAMPLE_RATE)  # as faster-whisper: 8.06 s is 128960.00000000001 samples
        return max(0, int(np.searchsorted(self.joined_starts, sample, side=side)) - 1)

    def to_original(self, seconds: float, is_end: bool = False, region: Optional[int] = None) -> float:
        """A time in the joined audio -> the same moment in the original audio (to 10 ms), by
        `region` if given, else by the region it falls in (`region_at`)."""
        if not self.regions:
            return seconds
        index = self.region_at(seconds, is_end) if region is None else region
        shift = int(self.regions[index][0] - self.joined_starts[index])
        return round(shift / SAMPLE_RATE + seconds, 2)  # a Python float, as the times without VAD

    def segment_to_original(self, segment: Segment) -> Segment:
        """A segment of the joined audio in the original's times (see the module docstring)."""
        if not segment.words:
            return dataclasses.replace(segment, start=self.to_original(segment.start),
                                       end=self.to_original(segment.end, is_end=True))
        words = []
        for word in segment.words:
            region = self.region_at((word.start + word.end) / 2)
            words.append(dataclasses.replace(word, start=self.to_original(word.start, region=region),
                                             end=self.to_original(word.end, region=region)))
        return dataclasses.replace(segment, start=words[0].start, end=words[-1].end, words=words)

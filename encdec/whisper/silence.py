"""When a window holds no speech, so that silence gives an empty transcript.

Two checks, no extra model:

* `is_silent`: no 20 ms frame of the window is louder than -84 dBFS (RMS, two steps of 16-bit
  audio): digital silence or dither. Such windows are not decoded at all (Whisper invents text
  for them, " you"). Quiet speech is far louder (speech peaking at -52 dBFS is transcribed).
* `is_no_speech`: openai-whisper's rule (and faster-whisper's): a no-speech probability above
  0.6 drops the window unless its average log-probability is above -1. So text the model is
  sure of stays, also wordless (" .") or repetitive (a chorus, a list read twice).
"""
from __future__ import annotations

import zlib
from typing import Optional

import numpy as np

from encdec.whisper.windows import HOP

SILENCE_DBFS = -84.0
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0
COMPRESSION_RATIO_THRESHOLD = 2.4


def is_silent(audio: np.ndarray, threshold_dbfs: float = SILENCE_DBFS) -> bool:
    frames = max(1, len(audio) // HOP)
    padded = np.zeros(frames * HOP, dtype=np.float64)
    padded[:min(len(audio), len(padded))] = audio[:len(padded)]
    loudest = np.sqrt(np.square(padded).reshape(frames, HOP).mean(axis=1).max())
    return loudest < 10.0 ** (threshold_dbfs / 20.0)


def compression_ratio(text: str) -> float:
    """openai-whisper's repetitiveness measure: text bytes over zlib-compressed bytes."""
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def is_no_speech(no_speech_prob: float, avg_logprob: float,
                 no_speech_threshold: Optional[float] = NO_SPEECH_THRESHOLD,
                 logprob_threshold: Optional[float] = LOGPROB_THRESHOLD) -> bool:
    """The rule above with the transcription's thresholds: `no_speech_threshold` None never
    finds silence; `logprob_threshold` None never vouches for a decode (as in openai-whisper,
    only an average log-probability above it keeps a window that seems silent)."""
    unsure = logprob_threshold is None or not avg_logprob > logprob_threshold
    return no_speech_threshold is not None and no_speech_prob > no_speech_threshold and unsure

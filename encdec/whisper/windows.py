"""Cut long audio into windows of at most 30 s at quiet points, with no extra model.

Each cut lies in the last `search` seconds before the 30 s limit of its window (its zone; earlier
if the last window would get less than `search` seconds), in the longest quiet stretch there:
frame power (20 ms hops) smoothed over `smooth` seconds, "quiet" meaning within twice the
minimum (plus a -100 dBFS floor, so digital silence ties). The cut keeps speech away from both
windows' edges, where Whisper tends to drop words: in the middle of the quiet stretch, but in
a long silence (below -60 dBFS) about `lead` seconds before the speech that ends it, or at the
zone's end when it goes on past it. So a window starts close to its speech: given seconds of
silence first, Whisper invents text (" 1. 1. 1."). Short audio is one window.
"""
from __future__ import annotations

import numpy as np

from encdec.audio import N_SAMPLES, SAMPLE_RATE

HOP = SAMPLE_RATE // 50  # 20 ms frames
_POWER_FLOOR = 1e-10  # -100 dBFS
_SILENT_POWER = 1e-6  # -60 dBFS: below the quietest speech Whisper transcribes


def split_windows(audio: np.ndarray, max_samples: int = N_SAMPLES, search: float = 5.0,
                  smooth: float = 0.2, lead: float = 0.5) -> list[tuple[int, int]]:
    """`[(start, end), ...]` sample ranges that tile `audio`, each at most `max_samples` long."""
    search_samples = min(int(search * SAMPLE_RATE), max_samples // 2)
    windows, start = [], 0
    while len(audio) - start > max_samples:
        high = min(start + max_samples, len(audio) - search_samples)
        low = high - search_samples
        cut = low + quiet_cut(audio[low:high], smooth, lead)
        windows.append((start, cut))
        start = cut
    windows.append((start, len(audio)))
    return windows


def quiet_cut(stretch: np.ndarray, smooth: float, lead: float) -> int:
    """Offset (in samples) of the cut in the longest quiet part of `stretch` (latest on ties):
    its middle; if it is silent, `lead` seconds before its end when that is later, or the end
    of `stretch` when it reaches it."""
    frames = len(stretch) // HOP
    if frames == 0:
        return len(stretch) // 2
    power = np.square(stretch[:frames * HOP].astype(np.float64)).reshape(frames, HOP).mean(axis=1)
    width = max(1, min(frames, round(smooth * SAMPLE_RATE / HOP)))
    smoothed = np.convolve(power, np.ones(width) / width, mode="valid")
    quiet = np.concatenate([[0], smoothed <= 2 * smoothed.min() + _POWER_FLOOR, [0]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(quiet))
    starts, ends = edges[0::2], edges[1::2]  # runs [start, end) of quiet positions
    longest = len(starts) - 1 - int(np.argmax((ends - starts)[::-1]))
    first, end = starts[longest], ends[longest]
    cut = (first + end - 1) // 2
    if smoothed[first:end].max() <= _SILENT_POWER:
        if end == len(smoothed):
            return len(stretch)
        cut = max(cut, end - 1 - round(lead * SAMPLE_RATE / HOP))
    return int(cut) * HOP + width * HOP // 2

"""Cut long audio into windows of at most 30 s at quiet points, with no extra model.

Each cut lies in the last `search` seconds before the 30 s limit of its window, in the middle
of the longest quiet stretch there: frame power (20 ms hops) smoothed over `smooth` seconds,
"quiet" meaning within twice the minimum (plus a -100 dBFS floor, so digital silence ties).
The middle of the longest pause keeps speech away from both windows' edges, where Whisper
tends to drop words. Short audio is one window.
"""
from __future__ import annotations

import numpy as np

from encdec.audio import N_SAMPLES, SAMPLE_RATE

HOP = SAMPLE_RATE // 50  # 20 ms frames
_POWER_FLOOR = 1e-10  # -100 dBFS


def split_windows(audio: np.ndarray, max_samples: int = N_SAMPLES, search: float = 5.0,
                  smooth: float = 0.2) -> list[tuple[int, int]]:
    """`[(start, end), ...]` sample ranges that tile `audio`, each at most `max_samples` long."""
    search_samples = min(int(search * SAMPLE_RATE), max_samples // 2)
    windows, start = [], 0
    while len(audio) - start > max_samples:
        low = start + max_samples - search_samples
        cut = low + quietest_point(audio[low:start + max_samples], smooth)
        windows.append((start, cut))
        start = cut
    windows.append((start, len(audio)))
    return windows


def quietest_point(stretch: np.ndarray, smooth: float) -> int:
    """Offset (in samples) of the middle of the longest quiet part of `stretch` (latest on ties)."""
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
    middle = (starts[longest] + ends[longest] - 1) // 2
    return int(middle) * HOP + width * HOP // 2

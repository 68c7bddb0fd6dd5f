"""Cut long audio into windows of at most 30 s at quiet points, with no extra model.

Each cut lies in the last `search` seconds before the 30 s limit of its window, at the
centre of the quietest stretch there: frame RMS (20 ms hops) smoothed over `smooth` seconds,
the latest minimum (which keeps windows long). Short audio is one window.
"""
from __future__ import annotations

import numpy as np

from encdec.audio import N_SAMPLES, SAMPLE_RATE

HOP = SAMPLE_RATE // 50  # 20 ms RMS frames


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
    """Offset (in samples) of the centre of the quietest `smooth`-second part of `stretch`."""
    frames = len(stretch) // HOP
    if frames == 0:
        return len(stretch) // 2
    power = np.square(stretch[:frames * HOP].astype(np.float64)).reshape(frames, HOP).mean(axis=1)
    width = max(1, min(frames, round(smooth * SAMPLE_RATE / HOP)))
    smoothed = np.convolve(power, np.ones(width) / width, mode="valid")
    best = len(smoothed) - 1 - int(np.argmin(smoothed[::-1]))  # the latest minimum
    return best * HOP + width * HOP // 2

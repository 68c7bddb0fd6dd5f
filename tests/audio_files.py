"""Audio files in the formats soundfile does not write (M4A, WebM), encoded with PyAV."""
from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

FRAME = 1024  # samples handed to the encoder at a time
LAYOUTS = {1: "mono", 2: "stereo", 6: "5.1"}  # channels -> FFmpeg's layout


def av_encoded(audio: np.ndarray, rate: int, container: str, codec: str, channels: int = 1) -> bytes:
    """`audio` (mono float32 at `rate`) encoded with `codec` in `container` ("mp4": M4A,
    "webm"), the same signal in each of `channels` channels."""
    import av

    layout = LAYOUTS[channels]
    pcm = np.repeat(audio.astype(np.float32)[None, :], channels, axis=0)
    out = io.BytesIO()
    with av.open(out, "w", format=container) as file:
        stream = file.add_stream(codec, rate=rate, layout=layout)
        for start in range(0, pcm.shape[1], FRAME):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm[:, start:start + FRAME]),
                                               format="fltp", layout=layout)
            frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
            for packet in stream.encode(frame):
                file.mux(packet)
        for packet in stream.encode(None):
            file.mux(packet)
    return out.getvalue()

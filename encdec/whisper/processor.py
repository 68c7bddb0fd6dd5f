"""The audio hook of Whisper models: an audio prompt -> log-mel features + encoder length."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from encdec.audio import N_FRAMES, N_SAMPLES, SAMPLE_RATE, load_audio, pad_or_trim, whisper_features


class WhisperAudioProcessor:
    """`(waveform, sample_rate)` or a file path -> ([n_mels, 3000] float32 features, 1500).

    The engine reserves `encoder_len` cross-attention slots per request: the encoder's output
    length (max_source_positions), whatever the clip's length. One request holds at most 30 s.
    The front end is openai-whisper's and faster-whisper's: the log-mel of the clip,
    zero-padded to 3000 frames (`encdec.audio`'s "whisper" style). `features`
    takes log-mel frames already made (a window cut from an input's `input_features`).
    """

    def __init__(self, n_mels: int, encoder_len: int):
        self.n_mels = n_mels
        self.encoder_len = encoder_len

    def __call__(self, audio: Any) -> tuple[torch.Tensor, int]:
        waveform = load_audio(audio)
        if len(waveform) > N_SAMPLES:
            raise ValueError(f"audio is {len(waveform) / SAMPLE_RATE:.1f} s long; one Whisper "
                             f"request takes at most {N_SAMPLES // SAMPLE_RATE} s (split it into windows)")
        features = whisper_features(waveform, self.n_mels, "whisper")
        return features, self.encoder_len

    def features(self, frames: Any) -> tuple[torch.Tensor, int]:
        """`[n_mels, up to 3000]` log-mel frames (a tensor or array of finite numbers), zero-padded
        to 3000 as both references pad a window's."""
        if isinstance(frames, np.ndarray):
            frames = torch.from_numpy(frames)
        expected = f"a float tensor [n_mels={self.n_mels}, frames <= {N_FRAMES}] of finite log-mel values"
        if not (isinstance(frames, torch.Tensor) and frames.dim() == 2 and frames.shape[0] == self.n_mels
                and frames.shape[1] <= N_FRAMES and frames.is_floating_point()):
            shape = tuple(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
            raise ValueError(f"multi_modal_data['audio_features'] must be {expected}, got {shape}")
        frames = frames.to(torch.float32)
        if not bool(torch.isfinite(frames).all()):
            raise ValueError(f"multi_modal_data['audio_features'] must be {expected}: it holds NaN or inf")
        return pad_or_trim(frames, N_FRAMES).contiguous(), self.encoder_len

"""The audio hook of Whisper models: an audio prompt -> log-mel features + encoder length."""
from __future__ import annotations

from typing import Any

import torch

from encdec.audio import N_SAMPLES, SAMPLE_RATE, load_audio, whisper_features


class WhisperAudioProcessor:
    """`(waveform, sample_rate)` or a file path -> ([n_mels, 3000] float32 features, 1500).

    The engine reserves `encoder_len` cross-attention slots per request: the encoder's output
    length (max_source_positions), whatever the clip's length. One request holds at most 30 s.
    `style` picks the front end: "whisper" (the default: openai-whisper / faster-whisper, the
    log-mel of the clip zero-padded to 3000 frames; it reproduces faster-whisper's text) or
    "hf" (WhisperFeatureExtractor: the clip padded to 30 s before the log-mel).
    """

    def __init__(self, n_mels: int, encoder_len: int, style: str = "whisper"):
        self.n_mels = n_mels
        self.encoder_len = encoder_len
        self.style = style

    def __call__(self, audio: Any) -> tuple[torch.Tensor, int]:
        waveform = load_audio(audio)
        if len(waveform) > N_SAMPLES:
            raise ValueError(f"audio is {len(waveform) / SAMPLE_RATE:.1f} s long; one Whisper "
                             f"request takes at most {N_SAMPLES // SAMPLE_RATE} s (split it into windows)")
        features = whisper_features(waveform, self.n_mels, self.style)
        return features, self.encoder_len

"""Whisper: special tokens, the audio hook, decoding rules and `transcribe` (see `transcribe.py`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from encdec.whisper.processor import WhisperAudioProcessor
from encdec.whisper.tokens import WhisperTokens, whisper_tokens
from encdec.whisper.transcript import Segment, Transcription


@dataclass
class WhisperInputHooks:
    """What the engine needs to turn audio prompts into Whisper requests."""

    tokens: WhisperTokens
    default_decoder_prompt: list[int]
    audio_processor: WhisperAudioProcessor


def whisper_input_hooks(hf_config: Any, tokenizer: Any = None,
                        generation_config: Optional[dict] = None,
                        style: str = "whisper") -> WhisperInputHooks:
    """Tokens from the tokenizer / generation config / config; the default prefix transcribes
    English without timestamps; features are [num_mel_bins, 3000], 1500 encoder positions,
    from openai-whisper's front end by default (see `encdec.whisper.processor`)."""
    tokens = whisper_tokens(hf_config, tokenizer, generation_config)
    processor = WhisperAudioProcessor(hf_config.num_mel_bins, hf_config.max_source_positions, style)
    return WhisperInputHooks(tokens, tokens.decoder_prefix(), processor)


__all__ = ["Segment", "Transcription", "WhisperAudioProcessor", "WhisperInputHooks",
           "WhisperTokens", "whisper_input_hooks", "whisper_tokens"]

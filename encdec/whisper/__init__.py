"""Whisper: special tokens, the audio hook, decoding rules and `transcribe` (see `transcribe.py`).

The engine gets Whisper's tokens, default decoder prompt and audio processor through the model
registry (`encdec.models.whisper_inputs`)."""
from encdec.whisper.processor import WhisperAudioProcessor
from encdec.whisper.tokens import WhisperTokens, whisper_tokens
from encdec.whisper.transcript import Segment, Transcription

__all__ = ["Segment", "Transcription", "WhisperAudioProcessor", "WhisperTokens", "whisper_tokens"]

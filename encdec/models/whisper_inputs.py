"""Whisper's input hooks: its special tokens, the control-token prefix as the default decoder
prompt, and log-mel features for audio prompts."""
from __future__ import annotations

from typing import Any, Optional

from encdec.models.registry import InputHooks
from encdec.whisper.processor import WhisperAudioProcessor
from encdec.whisper.tokens import whisper_tokens


def whisper_input_hooks(hf_config: Any, tokenizer: Any = None,
                        generation_config: Optional[dict] = None) -> InputHooks:
    """Tokens from the tokenizer / generation config / config (a `WhisperTokens`); the default
    prefix transcribes English without timestamps; features are [num_mel_bins, 3000] for
    max_source_positions (1500) encoder positions, from openai-whisper's front end."""
    tokens = whisper_tokens(hf_config, tokenizer, generation_config)
    processor = WhisperAudioProcessor(hf_config.num_mel_bins, hf_config.max_source_positions)
    return InputHooks(tokens, tokens.decoder_prefix(), processor)

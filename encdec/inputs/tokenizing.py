"""Encoding text from several threads at once.

The server tokenizes prompts on its own threads while the engine's thread tokenizes decoder
prompts and bad words. Hugging Face's tokenizers switch shared state to encode a target text
(`text_target=`: Marian's target SentencePiece model and vocabulary, mBART-50's target language
prefix), which an encode running meanwhile in another thread would read: so every encode of
encdec's goes through `encode`, one at a time (decoding switches nothing).
"""
from __future__ import annotations

import threading
from typing import Any, Optional

_LOCK = threading.Lock()


def encode(tokenizer: Any, **text_and_options: Any) -> list[int]:
    """`tokenizer(text=..., ...)` or `tokenizer(text_target=..., ...)`'s input ids."""
    with _LOCK:
        return list(tokenizer(**text_and_options)["input_ids"])


class TokenizerGroup:
    """vLLM's tokenizer group around the model's tokenizer: its encoder/decoder example encodes
    with `llm.llm_engine.get_tokenizer_group().encode(prompt=...)`."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def encode(self, prompt: str, request_id: Optional[str] = None, lora_request: None = None,
               add_special_tokens: Optional[bool] = None) -> list[int]:
        """`prompt`'s token ids as the encoder reads it (special tokens added unless False);
        vLLM's `request_id` plays no part, and there is no LoRA adapter to ask for."""
        if lora_request is not None:
            raise ValueError(f"lora_request: encdec runs no LoRA adapters, got {lora_request!r}")
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: give token ids")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        return encode(self.tokenizer, text=prompt, add_special_tokens=add_special_tokens is not False)

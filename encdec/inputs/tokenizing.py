"""Encoding text from several threads at once.

The server tokenizes prompts on its own threads while the engine's thread tokenizes decoder
prompts and bad words. Hugging Face's tokenizers switch shared state to encode a target text
(`text_target=`: Marian's target SentencePiece model and vocabulary, mBART-50's target language
prefix), which an encode running meanwhile in another thread would read: so every encode of
encdec's goes through `encode`, one at a time (decoding switches nothing).
"""
from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.Lock()


def encode(tokenizer: Any, **text_and_options: Any) -> list[int]:
    """`tokenizer(text=..., ...)` or `tokenizer(text_target=..., ...)`'s input ids."""
    with _LOCK:
        return list(tokenizer(**text_and_options)["input_ids"])

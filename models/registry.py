"""`config.architectures` -> model class, imported on first use."""
from __future__ import annotations

import importlib

_MODELS = {
    "BartForConditionalGeneration": ("encdec.models.bart", "BartForConditionalGeneration"),
    "WhisperForConditionalGeneration": ("encdec.models.whisper", "WhisperForConditionalGeneration"),
}


def get_model_class(architectures: list[str] | None):
    for arch in architectures or []:
        if arch in _MODELS:
            module, name = _MODELS[arch]
            return getattr(importlib.import_module(module), name)
    raise ValueError(f"unsupported model architectures {architectures}; supported: {sorted(_MODELS)}")

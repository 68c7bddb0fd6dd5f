"""encdec: continuous batching and paged self/cross KV caches for encoder/decoder transformers."""
from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

# The public names are imported on first use (module `__getattr__`), so that `import encdec`
# (and `encdec --version`) does not pay for torch and Numba up front.
_EXPORTS = {
    "LLM": "encdec.llm",
    "AsyncLLMEngine": "encdec.engine.async_engine",
    "EngineDeadError": "encdec.engine.async_engine",
    "EngineOverloaded": "encdec.engine.async_engine",
    "SamplingParams": "encdec.sampling.params",
    "RequestOutputKind": "encdec.sampling.params",
    "BeamSearchParams": "encdec.beam_search",
    "TextPrompt": "encdec.inputs",
    "TokensPrompt": "encdec.inputs",
    "ExplicitEncoderDecoderPrompt": "encdec.inputs",
    "CrossKVPrompt": "encdec.inputs",
    "zip_enc_dec_prompts": "encdec.inputs",
    "RequestOutput": "encdec.outputs",
    "CompletionOutput": "encdec.outputs",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from encdec.beam_search import BeamSearchParams
    from encdec.engine.async_engine import AsyncLLMEngine, EngineDeadError, EngineOverloaded
    from encdec.inputs import CrossKVPrompt, ExplicitEncoderDecoderPrompt, TextPrompt, TokensPrompt, zip_enc_dec_prompts
    from encdec.llm import LLM
    from encdec.outputs import CompletionOutput, RequestOutput
    from encdec.sampling.params import RequestOutputKind, SamplingParams


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


try:
    __version__ = version("encdec")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

"""encdec: continuous batching and paged self/cross KV caches for encoder/decoder transformers."""
from importlib.metadata import PackageNotFoundError, version

from encdec.engine.async_engine import AsyncLLMEngine, EngineDeadError, EngineOverloaded
from encdec.inputs import ExplicitEncoderDecoderPrompt, TextPrompt, TokensPrompt, zip_enc_dec_prompts
from encdec.llm import LLM
from encdec.outputs import CompletionOutput, RequestOutput
from encdec.sampling.params import RequestOutputKind, SamplingParams

__all__ = ["LLM", "AsyncLLMEngine", "SamplingParams", "RequestOutputKind", "TextPrompt",
           "TokensPrompt", "ExplicitEncoderDecoderPrompt", "RequestOutput", "CompletionOutput",
           "EngineOverloaded", "EngineDeadError", "zip_enc_dec_prompts"]

try:
    __version__ = version("encdec")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

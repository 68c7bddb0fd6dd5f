"""encdec: continuous batching and paged self/cross KV caches for encoder/decoder transformers."""
from encdec.inputs import ExplicitEncoderDecoderPrompt, TextPrompt, TokensPrompt, zip_enc_dec_prompts
from encdec.llm import LLM
from encdec.outputs import CompletionOutput, RequestOutput
from encdec.sampling.params import SamplingParams

__all__ = ["LLM", "SamplingParams", "TextPrompt", "TokensPrompt", "ExplicitEncoderDecoderPrompt",
           "RequestOutput", "CompletionOutput", "zip_enc_dec_prompts"]

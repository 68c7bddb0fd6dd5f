"""Prompt forms accepted by `LLM.generate` (docs/design.md, "Requests") and how to tell them apart."""
from __future__ import annotations

from typing import Any, Iterable, Optional, TypedDict, Union

from typing_extensions import NotRequired


class TextPrompt(TypedDict):
    """Text, tokenized by the engine; `multi_modal_data` may carry {"audio": (waveform, sr)}."""

    prompt: str
    multi_modal_data: NotRequired[dict[str, Any]]


class TokensPrompt(TypedDict):
    """Token ids passed through unchanged."""

    prompt_token_ids: list[int]
    multi_modal_data: NotRequired[dict[str, Any]]


class CrossKVPrompt(TypedDict):
    """An encoder side already run: every decoder layer's cross-attention (keys, values), each
    `[num_heads, encoder_len, head_size]`, as an earlier request's `RequestOutput.cross_kv`
    gives them. The encoder and the cross projections are skipped (Whisper: a window decoded
    again at another temperature)."""

    cross_kv: list


SingletonPrompt = Union[str, TextPrompt, TokensPrompt, list]


class ExplicitEncoderDecoderPrompt(TypedDict):
    """Both sides given; each is any singleton form, the decoder side may be None."""

    encoder_prompt: Union[SingletonPrompt, CrossKVPrompt]
    decoder_prompt: Optional[SingletonPrompt]


PromptType = Union[SingletonPrompt, ExplicitEncoderDecoderPrompt]


def zip_enc_dec_prompts(encoder_prompts: Iterable[SingletonPrompt],
                        decoder_prompts: Iterable[Optional[SingletonPrompt]]
                        ) -> list[ExplicitEncoderDecoderPrompt]:
    """Pair encoder and decoder prompts into explicit prompts."""
    encoder_prompts, decoder_prompts = list(encoder_prompts), list(decoder_prompts)
    if len(encoder_prompts) != len(decoder_prompts):
        raise ValueError(f"zip_enc_dec_prompts got {len(encoder_prompts)} encoder prompts and "
                         f"{len(decoder_prompts)} decoder prompts; the counts must match")
    return [ExplicitEncoderDecoderPrompt(encoder_prompt=e, decoder_prompt=d)
            for e, d in zip(encoder_prompts, decoder_prompts)]


def is_explicit_encoder_decoder_prompt(prompt: Any) -> bool:
    return isinstance(prompt, dict) and "encoder_prompt" in prompt

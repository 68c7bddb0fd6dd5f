"""Marian (Helsinki-NLP opus-mt): BART without `layernorm_embedding`, with static sinusoidal
positions and, where the checkpoint has them (`share_encoder_decoder_embeddings` false), separate
source and target vocabularies. The decoder starts with the pad token.

A checkpoint translates one language pair, or into several target languages chosen by a token
such as `>>fr<<` in front of the source text.
"""
from __future__ import annotations

from typing import Any, Optional

from encdec.inputs.tokenizing import encode
from encdec.models.bart import BartForConditionalGeneration, BartVariant
from encdec.models.registry import LanguageError, TranslationInputs


class MarianMTModel(BartForConditionalGeneration):
    variant = BartVariant(layernorm_embedding=False, sinusoidal_positions=True)


def marian_translation(tokenizer: Any, hf_config: Any, text: str, source_lang: Optional[str],
                       target_lang: Optional[str]) -> TranslationInputs:
    """The language pair is the checkpoint's; a multilingual target takes `>>{target_lang}<<`."""
    codes = getattr(tokenizer, "supported_language_codes", None) or []
    unused = [("source_lang", "a Marian model reads the source language it was trained on")] \
        if source_lang else []
    if codes:
        token = f">>{target_lang}<<"
        if token not in codes:
            known = sorted(c[2:-2] for c in codes)
            raise LanguageError("target_lang", f"this Marian model translates into several languages: "
                                               f"give the target language, one of {known}" if not target_lang else
                                               f"unknown target language {target_lang!r} for this Marian model; "
                                               f"it translates into {known}")
        text = f"{token} {text}"
    elif target_lang and target_lang != getattr(tokenizer, "target_lang", None):
        own = getattr(tokenizer, "target_lang", None)
        unused.append(("target_lang", f"this Marian model translates into the one language it was "
                                      f"trained on{f' ({own})' if own else ''}"))
    return TranslationInputs(encode(tokenizer, text=text, verbose=False), unused=tuple(unused))

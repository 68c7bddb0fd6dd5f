"""mBART (mBART-50): BART with pre-LayerNorm layers and a final `layer_norm` on each stack.

mBART-50 translates between the languages its tokenizer has codes for ("en_XX", "fr_XX", ...):
the encoder reads `[source code] text </s>`, and the decoder starts with </s> followed by the
target code, forced as the first generated token (`forced_bos_token_id`).
"""
from __future__ import annotations

from typing import Any, Optional

from encdec.models.bart import BartForConditionalGeneration, BartVariant
from encdec.models.registry import TranslationInputs


class MBartForConditionalGeneration(BartForConditionalGeneration):
    variant = BartVariant(normalize_before=True)


def language_code_id(tokenizer: Any, language: str) -> int:
    """The token id of an mBART-50 language code: "fr_XX", or "fr" if one code starts so."""
    codes = getattr(tokenizer, "lang_code_to_id", None)
    if not codes:
        raise ValueError("this tokenizer has no mBART-50 language codes")
    matches = [code for code in codes if code == language] or [
        code for code in codes if code.split("_")[0] == language]
    if len(matches) != 1:
        raise ValueError(f"unknown language {language!r} for mBART-50; known: {sorted(codes)}")
    return codes[matches[0]]


def mbart50_translation(tokenizer: Any, hf_config: Any, text: str, source_lang: Optional[str],
                        target_lang: Optional[str]) -> TranslationInputs:
    if not source_lang or not target_lang:
        missing = [name for name, lang in (("source", source_lang), ("target", target_lang)) if not lang]
        raise ValueError(f"mBART-50 translates with a source and a target language (e.g. en_XX, "
                         f"fr_XX): give the {' and '.join(missing)} language{'s' * (len(missing) - 1)}")
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return TranslationInputs([language_code_id(tokenizer, source_lang), *ids, tokenizer.eos_token_id],
                             language_code_id(tokenizer, target_lang))

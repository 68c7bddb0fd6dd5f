"""mBART (mBART-50): BART with pre-LayerNorm layers and a final `layer_norm` on each stack.

mBART-50 translates between the languages its tokenizer has codes for ("en_XX", "fr_XX", ...):
the encoder reads `[source code] text </s>`, and the decoder starts with </s> followed by the
target code, forced as the first generated token (`forced_bos_token_id`).
"""
from __future__ import annotations

from typing import Any, Optional

from encdec.inputs.tokenizing import encode
from encdec.models.bart import BartForConditionalGeneration, BartVariant
from encdec.models.registry import LanguageError, TranslationInputs


class MBartForConditionalGeneration(BartForConditionalGeneration):
    variant = BartVariant(normalize_before=True)


def language_code_id(tokenizer: Any, field: str, language: str) -> int:
    """The token id of an mBART-50 language code: "fr_XX", or "fr" if one code starts so
    (LanguageError naming `field` otherwise)."""
    codes = tokenizer.lang_code_to_id
    matches = [code for code in codes if code == language] or [
        code for code in codes if code.split("_")[0] == language]
    if len(matches) != 1:
        raise LanguageError(field, f"unknown language {language!r} for mBART-50; known: {sorted(codes)}")
    return codes[matches[0]]


def mbart50_translation(tokenizer: Any, hf_config: Any, text: str, source_lang: Optional[str],
                        target_lang: Optional[str]) -> TranslationInputs:
    if not type(tokenizer).__name__.startswith("MBart50Tokenizer"):
        # mBART-cc25's tokenizer reads `text </s> en_XX`, another layout
        raise ValueError(f"translation takes mBART-50 checkpoints (MBart50Tokenizer); this one's tokenizer "
                         f"is {type(tokenizer).__name__}: give it prompts as its model card says")
    if not source_lang or not target_lang:
        missing = [name for name, lang in (("source", source_lang), ("target", target_lang)) if not lang]
        raise LanguageError(f"{missing[0]}_lang", f"mBART-50 translates with a source and a target language "
                            f"(e.g. en_XX, fr_XX): give the {' and '.join(missing)} "
                            f"language{'s' * (len(missing) - 1)}")
    ids = encode(tokenizer, text=text, add_special_tokens=False, verbose=False)
    return TranslationInputs([language_code_id(tokenizer, "source_lang", source_lang), *ids,
                              tokenizer.eos_token_id], language_code_id(tokenizer, "target_lang", target_lang))

"""Whisper's languages by code ("en", "yue") or by name in any case ("English", "castilian"), as
openai-whisper's `LANGUAGES` / `TO_LANGUAGE_CODE` take them (the tables transformers ships)."""
from __future__ import annotations

import difflib
import functools
from typing import Any, Optional

from encdec.whisper.tokens import WhisperTokens

AUTO = "auto"  # detect the language


@functools.cache
def _tables() -> tuple[dict[str, str], dict[str, str]]:
    """(code -> name, every accepted spelling in lower case -> its code)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

    return LANGUAGES, {**TO_LANGUAGE_CODE, **{code: code for code in LANGUAGES}}


def language_names() -> dict[str, str]:
    """Code -> name in lower case ("en" -> "english")."""
    return _tables()[0]


def language_code(language: str, field: str = "language") -> str:
    """The code of `language`; a ValueError naming `field` and the closest languages otherwise."""
    if not isinstance(language, str):
        raise ValueError(f"{field} must be a language code or name, got {language!r}")
    names, codes = _tables()
    key = language.strip().lower()
    if key in codes:
        return codes[key]
    close = dict.fromkeys(codes[c] for c in difflib.get_close_matches(key, codes, n=3, cutoff=0.8))
    hint = (f"did you mean {' or '.join(f'{c} ({names[c].title()})' for c in close)}?" if close
            else "give a code such as en or a name such as English")
    raise ValueError(f"{field}: {language!r} is not a language Whisper knows; {hint}")


def requested_language(language: Optional[str], field: str = "language") -> Optional[str]:
    """`language` as a code, `AUTO` kept as is, None (not given) as None."""
    return language if language in (None, AUTO) else language_code(language, field)


def english_only_warning(tokens: Any, model: str, language: Optional[str]) -> Optional[str]:
    """What to tell someone who asks the English-only Whisper `model` (its special `tokens`) for
    `language` (a code or `AUTO`): it writes every language as English. None when there is
    nothing to tell: English or nothing asked, a multilingual or a non-Whisper model."""
    if language in (None, "en") or not isinstance(tokens, WhisperTokens) or tokens.multilingual:
        return None
    asked = ("cannot detect the language" if language == AUTO
             else f"cannot transcribe {_tables()[0][language].title()}")
    return f"{model} is an English-only model: it {asked} and writes all speech as English"

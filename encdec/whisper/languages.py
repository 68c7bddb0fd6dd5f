"""Whisper's languages by code ("en", "yue") or by name in any case ("English", "castilian"), as
openai-whisper's `LANGUAGES` / `TO_LANGUAGE_CODE` take them. The tables are written out here
(transformers ships the same ones, and a test holds them equal) because importing them from
transformers cost a transcription about a second."""
from __future__ import annotations

import difflib
from typing import Optional

AUTO = "auto"  # detect the language

# Code -> name, in the order of Whisper's language tokens.
LANGUAGES = dict(zip(
    ("en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no "
     "th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw "
     "gl mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl "
     "mg as tt haw ln ha ba jw su yue").split(),
    ["english", "chinese", "german", "spanish", "russian", "korean", "french", "japanese",
     "portuguese", "turkish", "polish", "catalan", "dutch", "arabic", "swedish", "italian",
     "indonesian", "hindi", "finnish", "vietnamese", "hebrew", "ukrainian", "greek", "malay",
     "czech", "romanian", "danish", "hungarian", "tamil", "norwegian", "thai", "urdu", "croatian",
     "bulgarian", "lithuanian", "latin", "maori", "malayalam", "welsh", "slovak", "telugu",
     "persian", "latvian", "bengali", "serbian", "azerbaijani", "slovenian", "kannada",
     "estonian", "macedonian", "breton", "basque", "icelandic", "armenian", "nepali",
     "mongolian", "bosnian", "kazakh", "albanian", "swahili", "galician", "marathi", "punjabi",
     "sinhala", "khmer", "shona", "yoruba", "somali", "afrikaans", "occitan", "georgian",
     "belarusian", "tajik", "sindhi", "gujarati", "amharic", "yiddish", "lao", "uzbek",
     "faroese", "haitian creole", "pashto", "turkmen", "nynorsk", "maltese", "sanskrit",
     "luxembourgish", "myanmar", "tibetan", "tagalog", "malagasy", "assamese", "tatar",
     "hawaiian", "lingala", "hausa", "bashkir", "javanese", "sundanese", "cantonese"],
    strict=True))
# Other names openai-whisper accepts.
_OTHER_NAMES = {"burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht",
                "letzeburgesch": "lb", "pushto": "ps", "panjabi": "pa", "moldavian": "ro",
                "moldovan": "ro", "sinhalese": "si", "castilian": "es", "mandarin": "zh"}
# Every accepted spelling in lower case -> its code.
_CODES = {**{name: code for code, name in LANGUAGES.items()}, **_OTHER_NAMES,
          **{code: code for code in LANGUAGES}}


def language_code(language: str, field: str = "language") -> str:
    """The code of `language`; a ValueError naming `field` and the closest languages otherwise."""
    if not isinstance(language, str):
        raise ValueError(f"{field} must be a language code or name, got {language!r}")
    key = language.strip().lower()
    if key in _CODES:
        return _CODES[key]
    close = dict.fromkeys(_CODES[c] for c in difflib.get_close_matches(key, _CODES, n=3, cutoff=0.8))
    hint = (f"did you mean {' or '.join(f'{c} ({LANGUAGES[c].title()})' for c in close)}?" if close
            else "give a code such as en or a name such as English")
    raise ValueError(f"{field}: {language!r} is not a language Whisper knows; {hint}")


def requested_language(language: Optional[str], field: str = "language") -> Optional[str]:
    """`language` as a code, `AUTO` kept as is, None (not given) as None."""
    return language if language in (None, AUTO) else language_code(language, field)


def english_only_warning(multilingual: bool, model: str, language: Optional[str]) -> Optional[str]:
    """What to tell someone who asks the Whisper `model` for `language` (a code or `AUTO`) when
    it is English-only: it writes every language as English. None when there is nothing to
    tell: English or nothing asked, or a multilingual model."""
    if language in (None, "en") or multilingual:
        return None
    asked = ("cannot detect the language" if language == AUTO
             else f"cannot transcribe {LANGUAGES[language].title()}")
    return f"{model} is an English-only model: it {asked} and writes all speech as English"

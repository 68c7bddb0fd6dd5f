"""Whisper base: language detection and translation inside the batch, one encoder run per window."""
from __future__ import annotations

import numpy as np

from encdec.audio import SAMPLE_RATE
from tests.conftest import assert_all_blocks_free
from tests.speech_corpus import wer


def test_detects_english_french_german_spanish(base, language_clips):
    runs = base.llm_engine.stats.num_encoder_runs
    results = base.transcribe([clip.pair for _, clip in language_clips], temperature=0.0)
    assert base.llm_engine.stats.num_encoder_runs - runs == len(language_clips)
    for (language, clip), result in zip(language_clips, results):
        print(f"{language}: detected {result.language}: {result.text!r}")
        assert result.language == language and result.text
    assert wer([language_clips[0][1].text], [results[0].text]) < 0.3
    assert_all_blocks_free(base)


def test_translation(base, language_clips):
    (french,) = [clip for lang, clip in language_clips if lang == "fr"]
    (translated,) = base.transcribe([french.pair], task="translate")
    # base translates espeak-ng French poorly (faster-whisper, greedy: " I'm going to the the")
    assert translated.language == "fr" and translated.text.isascii() and translated.text
    assert_all_blocks_free(base)


def test_language_tables_equal_openai_whispers():
    """encdec's own tables, against the ones transformers copies from openai-whisper."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

    from encdec.whisper.languages import language_code, language_names

    assert list(language_names().items()) == list(LANGUAGES.items())
    for spelling, code in [*TO_LANGUAGE_CODE.items(), *((c, c) for c in LANGUAGES)]:
        assert language_code(spelling.title()) == code


def test_silence_still_has_a_language(base):
    """openai-whisper detects the language on the first window, sound or not (English on
    silence): a silent input gets it too, with no text."""
    (result,) = base.transcribe((np.zeros(5 * SAMPLE_RATE, np.float32), SAMPLE_RATE))
    assert (result.language, result.text, result.segments) == ("en", "", [])
    assert_all_blocks_free(base)

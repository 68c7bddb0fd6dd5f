"""Whisper base: language detection and translation inside the batch, one encoder run per window."""
from __future__ import annotations

import numpy as np
import pytest

from encdec.audio import SAMPLE_RATE
from encdec.whisper.options import TranscribeOptions
from encdec.whisper.transcribe import run_job
from tests.conftest import assert_all_blocks_free
from tests.openai_whisper_ref import assert_words_equal, openai_whisper_model
from tests.speech_corpus import wer
from tests.whisper.recording_job import RecordingJob

PROMPTS = {  # an initial prompt in a language other than the speech's
    "fr": "Voici une longue introduction en français sur la réunion, la météo, la plage et la ville.",
    "de": "Dies ist eine lange deutsche Einleitung zu dem Treffen über das Wetter und den Strand.",
}


def test_detects_english_french_german_spanish(base, base_assets, ct2_dir, language_clips):
    """The language and its probability among the language tokens, as faster-whisper's
    `language_probability` (its features include the input's last partial frame, which moves
    the probability by up to 0.03 on these clips); 1 for a language given, as there."""
    faster_whisper = pytest.importorskip("faster_whisper")
    reference = faster_whisper.WhisperModel(ct2_dir(base_assets), device="cpu", compute_type="float32")
    runs = base.llm_engine.stats.num_encoder_runs
    results = base.transcribe([clip.pair for _, clip in language_clips], temperature=0.0)
    assert base.llm_engine.stats.num_encoder_runs - runs == len(language_clips)
    for (language, clip), result in zip(language_clips, results):
        _, info = reference.transcribe(clip.audio, beam_size=1)  # detects; its segments are never decoded
        print(f"{language}: detected {result.language} ({result.language_probability:.3f}, faster-whisper "
              f"{info.language_probability:.3f}): {result.text!r}")
        assert result.language == language == info.language and result.text
        assert result.language_probability == pytest.approx(info.language_probability, abs=0.05)
    assert wer([language_clips[0][1].text], [results[0].text]) < 0.3
    (given,) = base.transcribe(language_clips[1][1].pair, language="en", temperature=0.0)
    assert given.language_probability == 1.0
    (auto,) = base.transcribe(language_clips[1][1].pair, language="auto", temperature=0.0)  # as None: detect
    assert (auto.language, auto.text) == (results[1].language, results[1].text)
    assert_all_blocks_free(base)


def test_translation(base, language_clips):
    (french,) = [clip for lang, clip in language_clips if lang == "fr"]
    (translated,) = base.transcribe([french.pair], task="translate")
    # base translates espeak-ng French poorly (faster-whisper, greedy: " I'm going to the the")
    assert translated.language == "fr" and translated.text.isascii() and translated.text
    assert_all_blocks_free(base)


def test_translated_words_equal_openai_whisper(base, language_clips, tmp_path):
    """Word timestamps of a translation: aligned under the translate task, as openai-whisper
    aligns them. The language is given: on this short clip openai-whisper detects Thai (it
    detects on the log-mel of the clip and 30 s of silence; faster-whisper and encdec on the
    clip's frames padded with zeros, as both decode)."""
    whisper = pytest.importorskip("whisper")
    reference = openai_whisper_model("base", tmp_path)
    audio = dict(language_clips)["fr"].audio
    (ours,) = base.transcribe((audio, SAMPLE_RATE), task="translate", word_timestamps=True, temperature=0.0,
                             language="fr")
    expected = whisper.transcribe(reference, audio, fp16=False, task="translate", word_timestamps=True,
                                  temperature=0.0, language="fr")
    assert ours.text == expected["text"].strip() and ours.segments[0].words
    assert_words_equal(ours, expected)
    assert_all_blocks_free(base)


def test_language_tables_equal_openai_whispers():
    """encdec's own tables, against the ones transformers copies from openai-whisper."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

    from encdec.whisper import languages
    from encdec.whisper.languages import language_code

    assert list(languages.LANGUAGES.items()) == list(LANGUAGES.items())
    for spelling, code in [*TO_LANGUAGE_CODE.items(), *((c, c) for c in LANGUAGES)]:
        assert language_code(spelling.title()) == code


def test_a_language_the_model_lacks_is_named(base):
    with pytest.raises(ValueError, match=r"^language: 'yue' is not one of this model's 99 languages$"):
        base.transcribe((np.zeros(SAMPLE_RATE, np.float32), SAMPLE_RATE), language="yue")
    assert_all_blocks_free(base)


def test_silence_still_has_a_language(base):
    """Both references detect the language on the first 30 s, sound or not (English on
    silence): a silent input gets it too, with no text and no window decoded."""
    runs = base.llm_engine.stats.num_encoder_runs
    (result,) = base.transcribe((np.zeros(5 * SAMPLE_RATE, np.float32), SAMPLE_RATE))
    assert (result.language, result.text, result.segments) == ("en", "", [])
    assert base.llm_engine.stats.num_encoder_runs - runs == 1  # the detection's
    assert_all_blocks_free(base)


@pytest.mark.extended
def test_a_prompt_does_not_sway_the_detected_language(base, base_assets, ct2_dir, language_clips):
    """The language is read after <|startoftranscript|> alone, as both references read it,
    not after the prompt (a French prompt before English speech used to make it French)."""
    faster_whisper = pytest.importorskip("faster_whisper")
    reference = faster_whisper.WhisperModel(ct2_dir(base_assets), device="cpu", compute_type="float32")
    clips = dict(language_clips)
    for spoken, prompted in (("en", "fr"), ("fr", "de")):
        audio = clips[spoken].audio
        (ours,) = base.transcribe((audio, SAMPLE_RATE), initial_prompt=PROMPTS[prompted], temperature=0.0)
        segments, info = reference.transcribe(audio, initial_prompt=PROMPTS[prompted], temperature=0.0,
                                              beam_size=1)
        assert (ours.language, ours.text) == (info.language, "".join(s.text for s in segments).strip())
        assert ours.language == spoken
    assert_all_blocks_free(base)


@pytest.mark.parametrize("at_once", [False, True])
def test_an_input_has_the_language_of_its_first_30_seconds(base, language_clips, at_once):
    """One detection an input, on its first 30 s, as openai-whisper and faster-whisper
    detect (unless told `multilingual`): Spanish speech then English is decoded as Spanish
    throughout, windows decoded at once included (each used to detect its own)."""
    clips = dict(language_clips)
    pause = np.zeros(SAMPLE_RATE // 2, np.float32)
    spanish, english = ([part for _ in range(5) for part in (clips[language].audio, pause)] for language in ("es", "en"))
    # 26 s of Spanish, a 2 s pause, then English: windows at once are cut at the pause
    audio = np.concatenate([*spanish, np.zeros(2 * SAMPLE_RATE, np.float32), *english])
    engine = base.llm_engine
    job = RecordingJob(engine.model_config.special_tokens, engine.tokenizer, engine.model_config.max_decoder_len,
                       [audio], TranscribeOptions(windows_at_once=at_once, temperature=0.0))
    run_job(engine, job)
    tokens = engine.model_config.special_tokens
    detections = [r for r in job.requests_made if r.detects]
    decodes = [r for r in job.requests_made if not r.detects]
    forced = {r.params.logits_processors[0].prefix[0] for r in decodes}
    assert len(detections) == 1 and len({r.window.start for r in decodes}) >= 2
    assert forced == {tokens.lang_to_id["es"]}
    assert job.results([None])[0].language == "es"
    assert_all_blocks_free(base)


@pytest.mark.extended
def test_verbose_announces_the_detected_language_as_openai_whisper_does(base, language_clips, tmp_path, capsys):
    """`verbose=True`: openai-whisper's two lines on the language, then the segments; `False`:
    its one line (the bar goes to stderr). The Spanish clip, where both detect Spanish, greedy
    (openai-whisper's fallback samples from its own generator)."""
    whisper = pytest.importorskip("whisper")
    reference = openai_whisper_model("base", tmp_path)
    audio = dict(language_clips)["es"].audio
    for verbose in (True, False):
        whisper.transcribe(reference, audio, fp16=False, verbose=verbose, temperature=0.0)
        expected = capsys.readouterr().out
        assert "Detected language: Spanish" in expected
        base.transcribe((audio, SAMPLE_RATE), fp16=False, verbose=verbose, temperature=0.0)
        assert capsys.readouterr().out == expected
    assert_all_blocks_free(base)

"""The audio endpoints' form fields as `transcribe` options (no server: the mapping alone)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from encdec.entrypoints.openai.errors import OpenAIError, validation_error
from encdec.entrypoints.openai.protocol import TranscriptionRequest, TranslationRequest
from encdec.entrypoints.openai.serving_transcription import request_options
from encdec.whisper.options import TranscribeOptions


def options(model=TranscriptionRequest, **fields) -> TranscribeOptions:
    return TranscribeOptions(**request_options(model.model_validate({"model": "tiny.en", **fields})))


def test_openai_fields():
    o = options()
    assert (o.temperature, o.initial_prompt, o.word_timestamps) == ((0.0, 0.2, 0.4, 0.6, 0.8, 1.0), None, False)
    o = options(temperature="0.5", prompt="Names: Ada.", **{"timestamp_granularities[]": ["word", "segment"]})
    assert (o.temperature, o.initial_prompt, o.word_timestamps) == ((0.5, 0.7, 0.9), "Names: Ada.", True)
    assert options(timestamp_granularities="word").word_timestamps  # a hand-written form's, no brackets


def test_extra_fields():
    o = options(TranslationRequest, temperature_increment_on_fallback="0", beam_size="3", patience="2",
                best_of="2", compression_ratio_threshold="3", logprob_threshold="-2",
                no_speech_threshold="0.4", condition_on_previous_text="false", hotwords="Ada",
                vad_filter="true")
    assert (o.temperature, o.beam_size, o.patience, o.best_of) == ((0.0,), 3, 2.0, 2)
    assert (o.compression_ratio_threshold, o.logprob_threshold, o.no_speech_threshold) == (3.0, -2.0, 0.4)
    assert (o.condition_on_previous_text, o.hotwords, o.vad_filter) == (False, "Ada", True)
    # unset fields keep TranscribeOptions' defaults
    assert options().beam_size is None and options().best_of == 5
    assert options(seed="4419").seed == 4419 and options().seed == TranscribeOptions().seed  # vLLM's
    o = options(repetition_penalty="1.3", no_repeat_ngram_size="3")  # faster-whisper's (and vLLM's first)
    assert (o.repetition_penalty, o.no_repeat_ngram_size) == (1.3, 3)
    assert (options().repetition_penalty, options().no_repeat_ngram_size) == (1.0, 0)
    o = options(TranslationRequest, top_k="0", top_p="0.6", min_p="0.1", presence_penalty="0.5",
                frequency_penalty="-0.5")  # vLLM's
    assert (o.top_k, o.top_p, o.min_p, o.presence_penalty, o.frequency_penalty) == (None, 0.6, 0.1, 0.5, -0.5)
    assert options(top_k="5").top_k == 5
    assert options(TranslationRequest, max_completion_tokens="12").max_new_tokens == 12  # vLLM's name
    assert options().max_new_tokens is None
    with pytest.raises(OpenAIError) as err:
        request_error(max_completion_tokens="0")
    assert (err.value.param, str(err.value)) == ("max_completion_tokens",
                                                 "max_completion_tokens: Input should be greater than or equal to 1")
    for value in ("2.0", "2e0", "two"):  # a whole number only, as in the JSON endpoints
        with pytest.raises(OpenAIError) as err:
            request_error(max_completion_tokens=value)
        assert (err.value.param, str(err.value)) == ("max_completion_tokens", "max_completion_tokens: "
                                                     f"expected an integer, got {value!r}")
    assert options(TranslationRequest, max_completion_tokens=" +2 ").max_new_tokens == 2


def test_cross_field_errors_name_the_field():
    with pytest.raises(OpenAIError) as err:
        options(patience="2")
    assert (err.value.status, err.value.param) == (400, "patience")
    with pytest.raises(OpenAIError) as err:
        options(hallucination_silence_threshold="1")
    assert err.value.param == "hallucination_silence_threshold"
    assert options(TranslationRequest, seed="-1").seed is None  # vLLM's: the engine's generator
    with pytest.raises(OpenAIError) as err:
        options(TranslationRequest, seed="-2")
    assert (err.value.param, str(err.value)) == ("seed", "seed must be an integer in [0, 4294967295], or -1 or None (unseeded), got -2")


def test_an_unknown_chunking_strategy_is_refused_in_words():
    for value in ("fixed", 5, ["auto"]):
        with pytest.raises(OpenAIError) as err:
            request_error(chunking_strategy=value)
        assert err.value.param == "chunking_strategy"
        assert str(err.value) == ('chunking_strategy: expected "auto" or a server_vad object '
                                  f'({{"type": "server_vad", ...}}), got {value!r}')


def request_error(**fields) -> None:
    """The server's 400 for `fields` (a ValidationError as the endpoint turns it into one)."""
    try:
        TranscriptionRequest.model_validate({"model": "tiny.en", **fields})
    except ValidationError as err:
        raise validation_error(err) from None


def test_server_vad_takes_openais_defaults():
    """`chunking_strategy` `server_vad` with fields unset: OpenAI's threshold 0.5, silence 200 ms,
    padding 300 ms (not faster-whisper's 2000 ms and 400 ms)."""
    vad = options(chunking_strategy={"type": "server_vad"}).vad_parameters
    assert (vad.threshold, vad.min_silence_duration_ms, vad.speech_pad_ms) == (0.5, 200, 300)
    vad = options(chunking_strategy={"type": "server_vad", "silence_duration_ms": 800}).vad_parameters
    assert (vad.threshold, vad.min_silence_duration_ms, vad.speech_pad_ms) == (0.5, 800, 300)
    assert options(chunking_strategy={"type": "server_vad"}).vad_filter
    assert options(chunking_strategy="auto").vad_parameters is None

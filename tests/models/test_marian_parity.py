"""Marian (static sinusoidal positions, pad as decoder start; one shared vocabulary, or separate
source and target vocabularies) through the engine equals Hugging Face."""
from __future__ import annotations

import pytest

from encdec import LLM
from encdec.models.registry import translation_inputs
from tests.family_parity import FamilyParity


@pytest.fixture(scope="module", params=["marian", "marian-separate"])
def family(request):
    return request.param


class TestMarianParity(FamilyParity):
    def test_vocabularies(self, family_dir, family):
        llm = LLM(model=str(family_dir), num_gpu_blocks=64)
        config, tokenizer = llm.llm_engine.model_config, llm.get_tokenizer()
        assert config.decoder_start_token_id == tokenizer.pad_token_id
        model = llm.llm_engine.model_runner.model.model
        if family == "marian-separate":  # the LM head and decoder read the target vocabulary
            assert config.encoder_vocab_size == len(tokenizer.encoder) != config.vocab_size
            assert config.vocab_size == len(tokenizer.target_encoder)
            assert model.decoder.embed_tokens.num_embeddings == config.vocab_size
        else:
            assert config.encoder_vocab_size == config.vocab_size
            assert model.encoder.embed_tokens is model.decoder.embed_tokens is model.shared

    def test_text_decoder_prompts_use_the_target_side(self, family_dir):
        """As `tokenizer(text_target=...)`: the target SentencePiece model (and vocabulary),
        which segments (and, separate, numbers) this text differently from the source one."""
        llm = LLM(model=str(family_dir), num_gpu_blocks=64)
        tokenizer, start = llm.get_tokenizer(), llm.llm_engine.model_config.decoder_start_token_id
        text = "la ville"
        target = tokenizer(text_target=text, add_special_tokens=False)["input_ids"]
        assert target != tokenizer(text, add_special_tokens=False)["input_ids"]
        inputs = llm.llm_engine.input_preprocessor.preprocess(
            {"encoder_prompt": "Hello world.", "decoder_prompt": text})
        assert inputs.prompt_token_ids == [start] + target


def test_multilingual_target_token(tmp_path):
    from tests.family_checkpoints import marian_tokenizer

    tokenizer = marian_tokenizer(tmp_path, separate_vocabs=False)
    config = type("Config", (), {"architectures": ["MarianMTModel"]})()
    inputs = translation_inputs(tokenizer, config, "The rain in spain.", "en", "fr")
    assert inputs.prompt_token_ids == tokenizer(">>fr<< The rain in spain.")["input_ids"]
    assert inputs.forced_bos_token_id is None
    with pytest.raises(ValueError, match=r"one of \['de', 'fr'\]"):
        translation_inputs(tokenizer, config, "The rain in spain.", "en", "it")

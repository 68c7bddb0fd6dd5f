"""Marian (static sinusoidal positions, pad as decoder start; one shared vocabulary, or separate
source and target vocabularies) through the engine equals Hugging Face."""
from __future__ import annotations

import json
import shutil

import pytest

from encdec import LLM, SamplingParams, TokensPrompt
from encdec.models.registry import translation_inputs
from tests.bart_parity import prompt_text
from tests.conftest import assert_all_blocks_free
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


@pytest.mark.parametrize("renormalize", [True, False])
def test_beam_scores_renormalized_as_opus_mt_asks(family_dir, reference, tmp_path, renormalize):
    """opus-mt's generation config bans pad (`bad_words_ids`) in 4-beam search and sets
    `renormalize_logits`: after the ban each beam's scores are log-probabilities again, which
    ranks beams differently (it used to be ignored, and 1 in 8 of these searches differed)."""
    model_dir = tmp_path / "opus-mt"
    shutil.copytree(family_dir, model_dir)
    pad = json.loads((model_dir / "config.json").read_text())["pad_token_id"]
    (model_dir / "generation_config.json").write_text(json.dumps(
        {"bad_words_ids": [[pad]], "num_beams": 4, "max_length": 31, "renormalize_logits": renormalize}))
    llm = LLM(model=str(model_dir), num_gpu_blocks=512)
    encoder_ids = [llm.get_tokenizer()(prompt_text(i))["input_ids"] for i in range(8)]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in encoder_ids], SamplingParams(),
                           use_tqdm=False)
    expected = reference.beam_search(encoder_ids, 4, 30, bad_words_ids=[[pad]], renormalize_logits=renormalize)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert_all_blocks_free(llm)


def test_multilingual_target_token(tmp_path):
    from tests.family_checkpoints import marian_tokenizer

    tokenizer = marian_tokenizer(tmp_path, separate_vocabs=False)
    config = type("Config", (), {"architectures": ["MarianMTModel"]})()
    inputs = translation_inputs(tokenizer, config, "The rain in spain.", "en", "fr")
    assert inputs.prompt_token_ids == tokenizer(">>fr<< The rain in spain.")["input_ids"]
    assert inputs.forced_bos_token_id is None
    with pytest.raises(ValueError, match=r"unknown target language 'it' for this Marian model; it translates into \['de', 'fr'\]"):
        translation_inputs(tokenizer, config, "The rain in spain.", "en", "it")
    with pytest.raises(ValueError, match=r"give the target language, one of \['de', 'fr'\]"):
        translation_inputs(tokenizer, config, "The rain in spain.", None, None)


def test_a_one_pair_model_takes_its_own_target_only(tmp_path):
    """A one-pair model (opus-mt-en-de's tokenizer names `target_lang` "de") translates into
    its language whether or not it is named; another one is noted as unused."""
    from tests.family_checkpoints import marian_tokenizer

    tokenizer = marian_tokenizer(tmp_path, separate_vocabs=True)
    tokenizer.target_lang = "de"
    config = type("Config", (), {"architectures": ["MarianMTModel"]})()
    for target in (None, "de"):
        inputs = translation_inputs(tokenizer, config, "The rain in spain.", None, target)
        assert inputs.prompt_token_ids == tokenizer("The rain in spain.")["input_ids"] and inputs.unused == ()
    [(field, reason)] = translation_inputs(tokenizer, config, "The rain in spain.", None, "fr").unused
    assert (field, reason) == ("target_lang", "this Marian model translates into the one language it was trained on (de)")

"""mBART-50 (pre-LayerNorm, final layer norms, target language as the forced first token) through
the engine equals Hugging Face; translation inputs follow mBART-50's format."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from encdec import LLM, SamplingParams
from encdec.models.registry import translation_inputs
from tests.family_parity import FamilyParity


@pytest.fixture(scope="module")
def family():
    return "mbart-50"


@pytest.fixture(scope="module")
def tokenizer(family_dir):
    return AutoTokenizer.from_pretrained(str(family_dir))


@pytest.fixture(scope="module")
def decoding(tokenizer):
    """Translate into Romanian: its code is every output's first token."""
    return {"forced_bos_token_id": tokenizer.convert_tokens_to_ids("ro_RO")}


class TestMBartParity(FamilyParity):
    def test_outputs_start_with_the_target_language(self, plain_outputs, decoding):
        assert {o.outputs[0].token_ids[0] for o in plain_outputs
                if len(o.prompt_token_ids) == 1} == {decoding["forced_bos_token_id"]}


def test_translation_inputs(family_dir, tokenizer):
    llm = LLM(model=str(family_dir), num_gpu_blocks=64)
    config = llm.llm_engine.model_config.hf_config
    text = "The rain in spain falls mainly on the plain."
    inputs = translation_inputs(tokenizer, config, text, "en_XX", "fr")
    tokenizer.src_lang = "en_XX"
    assert inputs.prompt_token_ids == tokenizer(text)["input_ids"]  # [en_XX] text </s>
    assert inputs.forced_bos_token_id == tokenizer.convert_tokens_to_ids("fr_XX")
    (out,) = llm.generate({"prompt_token_ids": inputs.prompt_token_ids},
                          SamplingParams(temperature=0.0, max_tokens=5,
                                         forced_bos_token_id=inputs.forced_bos_token_id),
                          use_tqdm=False)
    assert out.prompt_token_ids == [2] and out.outputs[0].token_ids[0] == inputs.forced_bos_token_id
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        translation_inputs(tokenizer, config, text, "en_XX", "xx")
    with pytest.raises(ValueError, match="source and a target language .*: give the source language$"):
        translation_inputs(tokenizer, config, text, None, "fr_XX")
    with pytest.raises(ValueError, match=": give the source and target languages$"):
        translation_inputs(tokenizer, config, text, None, None)

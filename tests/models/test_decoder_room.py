"""A decoder fills all its positions as Hugging Face's generate() does: the last new token is
never fed back, so it takes no position, and a decoder of P positions after a prompt of p
tokens makes P + 1 - p. Learned positions (BART, with their offset of 2) and sinusoidal ones
(PEGASUS)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from encdec import LLM, SamplingParams
from tests.bart_checkpoints import make_bart_checkpoint
from tests.conftest import assert_all_blocks_free
from tests.family_checkpoints import make_family_checkpoint
from tests.hf_reference import HFReference

POSITIONS = 24
TEXT = "The rain in spain."


@pytest.fixture(scope="module", params=["bart", "pegasus"])
def model_dir(request, tmp_path_factory):
    """A checkpoint of POSITIONS decoder positions whose generation config asks for all of
    them and more: Hugging Face's max_length counts the decoder start, and min_length keeps
    EOS away until then."""
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "bart":
        make_bart_checkpoint(out, max_position_embeddings=POSITIONS)
    else:
        make_family_checkpoint("pegasus", out, max_position_embeddings=POSITIONS)
    path = out / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(max_length=POSITIONS + 1, min_length=POSITIONS + 1, forced_eos_token_id=None)
    if request.param == "bart":  # as bart-large-cnn's: HF begins [<DEC>, <BOS>], as encdec does
        config.update(forced_bos_token_id=0)
    path.write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model=str(model_dir), num_gpu_blocks=64)


def test_the_config_length_fills_every_position(model_dir, llm):
    output = llm.generate(TEXT, use_tqdm=False)[0]
    decoded = list(output.prompt_token_ids) + list(output.outputs[0].token_ids)
    model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    with torch.inference_mode():
        expected = model.generate(torch.tensor([output.encoder_prompt_token_ids]))[0].tolist()
    assert len(decoded) == POSITIONS + 1
    assert decoded == expected
    assert output.outputs[0].finish_reason == "length"
    assert_all_blocks_free(llm)


def test_a_prompt_of_every_position_makes_one_token(model_dir, llm):
    start = llm.llm_engine.model_config.decoder_start_token_id
    encoder_ids = llm.get_tokenizer()(TEXT)["input_ids"]
    prompt = [start] + [7 + i for i in range(POSITIONS - 1)]
    output = llm.generate({"encoder_prompt": encoder_ids, "decoder_prompt": prompt},
                          SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)[0]
    assert output.outputs[0].token_ids == HFReference(model_dir).greedy(encoder_ids, prompt, 1)
    with pytest.raises(ValueError, match=r"max_tokens=2 .* so at most 1 \(the last new token"):
        llm.generate({"encoder_prompt": encoder_ids, "decoder_prompt": prompt},
                     SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match=rf"decoder_prompt has {POSITIONS + 1} tokens .* "
                                         rf"model's {POSITIONS} decoder positions$"):
        llm.generate({"encoder_prompt": encoder_ids, "decoder_prompt": prompt + [7]},
                     SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    assert_all_blocks_free(llm)


def test_a_forced_bos_leaves_the_decoder_start_alone_in_the_prompt(model_dir, llm):
    """A default decoder prompt of one token ([<DEC>]: BART forcing BOS, as Hugging Face begins,
    and PEGASUS) leaves room for a token per position; BART's room is counted from that prompt,
    not from the [<DEC>, <BOS>] of a BART that forces none."""
    params = SamplingParams(max_tokens=POSITIONS, ignore_eos=True)  # the config: BART forces BOS
    output = llm.generate(TEXT, params, use_tqdm=False)[0]
    assert len(output.prompt_token_ids) == 1 and len(output.outputs[0].token_ids) == POSITIONS
    with pytest.raises(ValueError, match=rf"max_tokens={POSITIONS + 1} .* decoder prompt takes 1 token, "
                                         rf"so at most {POSITIONS} "):
        llm.generate(TEXT, dataclasses.replace(params, max_tokens=POSITIONS + 1), use_tqdm=False)
    assert_all_blocks_free(llm)

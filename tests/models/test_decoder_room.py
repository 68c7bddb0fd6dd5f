"""A decoder fills all its positions as Hugging Face's generate() does: the last new token is
never fed back, so it takes no position, and a decoder of P positions after a prompt of p
tokens makes P + 1 - p. Learned positions (BART, with their offset of 2) and sinusoidal ones
(PEGASUS). vLLM's `max_model_len` cuts the positions a request may take to fewer than the
model's, and then they bound it as the model's own would."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from encdec import LLM, SamplingParams
from encdec.entrypoints.openai.serving_models import load_models
from tests.bart_checkpoints import make_bart_checkpoint
from tests.conftest import assert_all_blocks_free
from tests.family_checkpoints import make_family_checkpoint
from tests.hf_reference import HFReference

POSITIONS = 24
TEXT = "The rain in spain."


def fill_positions(out, positions: int, **settings) -> None:
    """Make the checkpoint's generation config ask for all of `positions` and more (Hugging
    Face's max_length counts the decoder start, and min_length keeps EOS away until then), with
    `settings` besides."""
    path = out / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(max_length=positions + 1, min_length=positions + 1, forced_eos_token_id=None, **settings)
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module", params=["bart", "pegasus"])
def model_dir(request, tmp_path_factory):
    """A checkpoint of POSITIONS decoder positions whose generation config asks for them all."""
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "bart":
        make_bart_checkpoint(out, max_position_embeddings=POSITIONS)
    else:
        make_family_checkpoint("pegasus", out, max_position_embeddings=POSITIONS)
    # BART forces BOS as bart-large-cnn does: HF begins [<DEC>, <BOS>], as encdec does
    fill_positions(out, POSITIONS, **({"forced_bos_token_id": 0} if request.param == "bart" else {}))
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


@pytest.fixture(scope="module")
def longer_dir(tmp_path_factory):
    """A BART of 2 x POSITIONS decoder positions whose generation config asks for them all."""
    out = make_bart_checkpoint(tmp_path_factory.mktemp("longer"), max_position_embeddings=2 * POSITIONS)
    fill_positions(out, 2 * POSITIONS, forced_bos_token_id=0)
    return out


def test_max_model_len_cuts_the_positions_as_a_shorter_model_has_them(longer_dir):
    llm = LLM(model=str(longer_dir), num_gpu_blocks=64, max_model_len=POSITIONS)
    output = llm.generate(TEXT, use_tqdm=False)[0]  # the config's length, capped by the room
    decoded = list(output.prompt_token_ids) + list(output.outputs[0].token_ids)
    model = AutoModelForSeq2SeqLM.from_pretrained(str(longer_dir)).eval()
    with torch.inference_mode():
        expected = model.generate(torch.tensor([output.encoder_prompt_token_ids]),
                                  max_length=POSITIONS + 1, min_length=POSITIONS + 1)[0].tolist()
    assert decoded == expected and output.outputs[0].finish_reason == "length"
    prompt_len = len(output.prompt_token_ids)
    with pytest.raises(ValueError, match=rf"max_tokens={POSITIONS + 2 - prompt_len} .* holds {POSITIONS} positions"):
        llm.generate(TEXT, SamplingParams(max_tokens=POSITIONS + 2 - prompt_len), use_tqdm=False)
    start = llm.llm_engine.model_config.decoder_start_token_id
    with pytest.raises(ValueError, match=rf"decoder_prompt has {POSITIONS + 1} tokens"):
        llm.generate({"encoder_prompt": TEXT, "decoder_prompt": [start] + [7] * POSITIONS}, use_tqdm=False)
    assert_all_blocks_free(llm)


def test_max_model_len_beyond_the_model_is_refused(longer_dir):
    with pytest.raises(ValueError, match=rf"^max_model_len={2 * POSITIONS + 1}: .*longer\S* takes at most "
                                         rf"its {2 * POSITIONS} decoder positions$"):
        LLM(model=str(longer_dir), max_model_len=2 * POSITIONS + 1)
    with pytest.raises(ValueError, match=r"^max_model_len must be an integer >= 1 or None, got 0$"):
        LLM(model=str(longer_dir), max_model_len=0)


def test_a_speech_model_takes_only_its_own_max_model_len(llm):
    """vLLM's Whisper example names Whisper's own 448; fewer would cut its windows' prompts."""
    config = llm.llm_engine.model_config
    assert config.with_max_model_len(POSITIONS, speech=True) is config
    with pytest.raises(ValueError, match=rf"takes only its {POSITIONS} decoder positions$"):
        config.with_max_model_len(POSITIONS - 1, speech=True)


def test_serve_gives_each_model_its_max_model_len_and_lists_it(longer_dir):
    served = load_models([str(longer_dir)] * 2, ["cut", "whole"], None,
                         {"num_gpu_blocks": [32], "max_model_len": [POSITIONS, 2 * POSITIONS]})
    assert [m.card(m.name).max_model_len for m in served] == [POSITIONS, 2 * POSITIONS]

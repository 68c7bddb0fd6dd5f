"""vLLM's `presence_penalty`, `frequency_penalty` and `min_p`: greedy decoding with the penalties
equals Hugging Face's `generate()` with OpenAI's formula as a logits processor; the sampling
filters equal Hugging Face's warpers; every sampled token keeps `min_p`."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import BartForConditionalGeneration
from transformers.generation.logits_process import (
    LogitsProcessor, LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper,
    TopKLogitsWarper, TopPLogitsWarper)

from encdec import LLM, SamplingParams
from encdec.sampling.sampler import sampling_logits
from tests.bart_parity import mixed_prompts
from tests.conftest import assert_all_blocks_free

MAX_TOKENS = 20


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's documented formula, on the tokens generated after a decoder prompt of
    `prompt_len`: logit[j] -= count[j] * frequency + (count[j] > 0) * presence."""

    def __init__(self, prompt_len: int, presence: float, frequency: float):
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for row, ids in enumerate(input_ids[:, self.prompt_len:].tolist()):
            for token in set(ids):
                scores[row, token] -= ids.count(token) * self.frequency + self.presence
        return scores


@pytest.fixture(scope="module")
def llm(tiny_bart_dir):
    return LLM(model=str(tiny_bart_dir), num_gpu_blocks=256)


@torch.inference_mode()
def test_greedy_with_penalties_matches_hugging_face(llm, tiny_bart_dir):
    hf = BartForConditionalGeneration.from_pretrained(str(tiny_bart_dir)).eval()
    settings = [dict(presence_penalty=1.5), dict(frequency_penalty=1.0),
                dict(presence_penalty=-0.5, frequency_penalty=0.7),
                dict(frequency_penalty=2.0, repetition_penalty=1.3), dict(presence_penalty=2.0)]
    prompts = ([p for p in mixed_prompts(llm.get_tokenizer(), count=8) if isinstance(p, str)] * 5)[:len(settings)]
    plain = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
    outputs = llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, **s) for s in settings],
                           use_tqdm=False)  # one batch, each row its own penalties
    for out, s in zip(outputs, settings):
        prompt_len = len(out.prompt_token_ids)
        penalties = OpenAIPenalties(prompt_len, s.get("presence_penalty", 0.0), s.get("frequency_penalty", 0.0))
        expected = hf.generate(
            torch.tensor([out.encoder_prompt_token_ids]), decoder_input_ids=torch.tensor([out.prompt_token_ids]),
            do_sample=False, num_beams=1, max_new_tokens=MAX_TOKENS, forced_eos_token_id=None,
            no_repeat_ngram_size=0, repetition_penalty=s.get("repetition_penalty", 1.0),
            logits_processor=LogitsProcessorList([penalties]))
        assert out.outputs[0].token_ids == expected[0, prompt_len:].tolist(), s
    changed = sum(o.outputs[0].token_ids != p.outputs[0].token_ids for o, p in zip(outputs, plain))
    assert changed >= len(settings) - 1  # the random model repeats itself; penalties stop it
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("settings", [
    dict(temperature=0.7, min_p=0.1), dict(temperature=1.3, top_k=20, top_p=0.9, min_p=0.05),
    dict(temperature=1.0, top_p=0.5, min_p=0.3), dict(temperature=0.5, top_k=5, min_p=1.0)])
def test_sampling_filters_equal_hugging_face_warpers(settings):
    torch.manual_seed(0)
    logits = torch.randn(8, 300) * 3
    params = SamplingParams(**{"top_k": -1, "top_p": 1.0, **settings})
    warpers = LogitsProcessorList([TemperatureLogitsWarper(params.temperature)])
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    warpers.append(MinPLogitsWarper(params.min_p))
    expected = warpers(torch.zeros(8, 1, dtype=torch.long), logits.clone())
    got = sampling_logits(logits, params)
    assert torch.equal(got, expected)
    kept = got.isfinite().sum(dim=-1)
    assert (kept >= 1).all() and (kept < logits.shape[-1]).all()


def test_sampled_tokens_keep_min_p(llm):
    """Each sampled token is at least `min_p` times as likely as the likeliest token then (the
    top log-probability at temperature 1); without `min_p`, some are not."""
    prompts = [p for p in mixed_prompts(llm.get_tokenizer(), count=8) if isinstance(p, str)][:4]

    def ratios(min_p: float) -> list[float]:
        params = SamplingParams(n=4, seed=5, temperature=1.0, max_tokens=MAX_TOKENS, logprobs=1, min_p=min_p)
        return [logprobs[token].logprob - max(e.logprob for e in logprobs.values())
                for out in llm.generate(prompts, params, use_tqdm=False) for c in out.outputs
                for token, logprobs in zip(c.token_ids, c.logprobs)]

    assert min(ratios(0.2)) >= math.log(0.2) - 1e-5
    assert min(ratios(0.0)) < math.log(0.2)
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("field,value,message", [
    ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2], got 2.5"),
    ("frequency_penalty", -3, "frequency_penalty must be in [-2, 2], got -3.0"),
    ("frequency_penalty", None, "frequency_penalty must be in [-2, 2], got None"),
    ("min_p", 1.5, "min_p must be in [0, 1], got 1.5"),
    ("min_p", "0.1", "min_p must be a number, got '0.1'"),
])
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(ValueError) as err:
        SamplingParams(**{field: value})
    assert str(err.value) == message

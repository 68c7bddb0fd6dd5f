"""`encdec serve` end to end with the official `openai` client and httpx: every endpoint gives
what the offline `LLM` gives for the same inputs and seeds, and every block is free after.

One server for the module: a seeded random tiny BART ("bart"), Whisper tiny.en and base.
"""
from __future__ import annotations

import dataclasses
import io
import json
import re
import socket
import time

import httpx
import openai
import pytest
import soundfile

from encdec import LLM, SamplingParams, TokensPrompt
from encdec.config import SchedulerConfig
from encdec.entrypoints.openai.errors import OpenAIError
from encdec.entrypoints.openai.protocol import CompletionRequest
from encdec.entrypoints.openai.serving_completions import LogprobsBuilder, json_prompt_logprobs, sampling_params
from encdec.generation_config import GenerationDefaults, resolve_sampling_params
from encdec.outputs import Logprob
from encdec.whisper.writers import write_srt, write_vtt
from tests.audio_files import av_encoded
from tests.bart_checkpoints import summary_prompts
from tests.entrypoints.conftest import SAMPLE
from tests.entrypoints.remote_server import HeldUpload, RemoteServer

ARTICLES = ["The rain in spain falls mainly on the plain.",
            "Continuous batching lets new requests join while others are still being decoded."]


@pytest.fixture(scope="module")
def server(tiny_bart_dir):
    remote = RemoteServer(["--model", str(tiny_bart_dir), "--served-model-name", "bart",
                           "--model", "tiny.en", "--served-model-name", "tiny.en", "whisper-1",
                           "--model", "base", "--served-model-name", "base",
                           "--num-gpu-blocks", "2200", "--swap-space", "0.05"],
                          env={"ENCDEC_LOG_STATS_INTERVAL": "0.5"})
    yield remote
    remote.stop()


@pytest.fixture(scope="module")
def bart(tiny_bart_dir):
    return LLM(str(tiny_bart_dir), num_gpu_blocks=512, swap_space=0.05)


@pytest.fixture(scope="module")
def tiny_en():
    return LLM("tiny.en", num_gpu_blocks=2200, swap_space=0.05)


@pytest.fixture(scope="module")
def hello(tiny_en):
    """What the offline LLM makes of the sample."""
    return tiny_en.transcribe(str(SAMPLE))[0]


@pytest.fixture(autouse=True)
def blocks_free_after(server):
    yield
    server.wait_all_blocks_free()


def offline_outputs(llm: LLM, prompts, params: SamplingParams) -> list:
    """What the offline LLM gives with the server's rule: the config fills each unset field."""
    params = dataclasses.replace(params, config_per_field=True)
    return [c for out in llm.generate(prompts, params, use_tqdm=False) for c in out.outputs]


def offline_texts(llm: LLM, prompts, params: SamplingParams) -> list[str]:
    return [c.text for c in offline_outputs(llm, prompts, params)]


AS_IDS = {"return_tokens_as_token_ids": True}  # vLLM's: with logprobs, each token as "token_id:N"


def token_ids(tokens: list[str]) -> list[int]:
    """The ids of logprobs tokens given `AS_IDS` (texts alone would not show them all: many of
    the tiny BART's ids are no text)."""
    return [int(t.removeprefix("token_id:")) for t in tokens]


def test_models(server, bart):
    client = server.client()
    assert [m.id for m in client.models.list().data] == ["bart", "tiny.en", "whisper-1", "base"]
    assert client.models.retrieve("tiny.en").id == "tiny.en"
    assert server.http().get("/version").json()["version"]
    # vLLM's card fields: the decoder's positions, as vLLM counts an encoder/decoder model's
    assert client.models.retrieve("tiny.en").max_model_len == 448
    assert client.models.retrieve("bart").max_model_len == bart.llm_engine.model_config.max_decoder_len


def test_a_model_answers_to_each_of_its_names(server, hello):
    """`--served-model-name tiny.en whisper-1`: the names after the first are aliases, as in
    vLLM: each has its card, a request by either is the model's and says the name it was given,
    and the metrics count both under the first."""
    client = server.client()
    alias, model = client.models.retrieve("whisper-1"), client.models.retrieve("tiny.en")
    assert (alias.id, alias.root, alias.max_model_len) == ("whisper-1", model.root, model.max_model_len)
    key = ("encdec_audio_seconds_total", (("model", "tiny.en"),))
    before = server.metrics().get(key, 0.0)
    with open(SAMPLE, "rb") as f:
        assert client.audio.transcriptions.create(model="whisper-1", file=f).text == hello.text
    assert server.metrics()[key] == pytest.approx(before + hello.duration)
    with server.http() as http:
        assert http.post("/v1/completions", json={"model": "whisper-1", "prompt": "Hi"}).json()["error"][
            "message"] == ("model 'whisper-1' cannot serve this endpoint: it needs a text model (BART, T5, "
                           "PEGASUS, Marian, mBART)")


def test_get_routes_answer_head(server):
    """HEAD gets a GET route's status and headers without its body."""
    with server.http() as http:
        for path in ("/health", "/version", "/metrics", "/v1/models", "/v1/models/tiny.en"):
            got, head = http.get(path), http.head(path)
            assert (head.status_code, head.content) == (200, b""), path
            assert head.headers["content-type"] == got.headers["content-type"]
        assert http.head("/v1/models/nope").status_code == 404
        assert http.head("/v1/completions").status_code == 405


def test_completions_plain_and_token_ids(server, bart):
    ids = bart.get_tokenizer()(ARTICLES[0])["input_ids"]
    result = server.client().completions.create(model="bart", prompt=[*ARTICLES], max_tokens=12,
                                                temperature=0.0, logprobs=0, extra_body=AS_IDS)
    assert [c.index for c in result.choices] == [0, 1]
    outputs = offline_outputs(bart, ARTICLES, SamplingParams(temperature=0.0, max_tokens=12))
    expected = [c.text for c in outputs]
    assert [c.text for c in result.choices] == expected
    assert [token_ids(c.logprobs.tokens) for c in result.choices] == [c.token_ids for c in outputs]
    assert result.usage.completion_tokens == sum(len(c.token_ids) for c in outputs)
    by_ids = server.client().completions.create(model="bart", prompt=[ids], max_tokens=12, temperature=0.0,
                                                logprobs=0, extra_body=AS_IDS)
    assert token_ids(by_ids.choices[0].logprobs.tokens) == outputs[0].token_ids
    limit = bart.llm_engine.model_config.max_encoder_len  # a prompt of exactly the encoder's positions
    at_limit = server.client().completions.create(model="bart", prompt=[[5] * limit], max_tokens=2, temperature=0.0)
    assert at_limit.usage.prompt_tokens > limit


def test_completions_n2_seeded(server, bart):
    result = server.client().completions.create(model="bart", prompt=ARTICLES[1], n=2, seed=7,
                                                temperature=1.0, max_tokens=10, logprobs=2, extra_body=AS_IDS)
    outputs = offline_outputs(bart, ARTICLES[1], SamplingParams(n=2, seed=7, temperature=1.0, max_tokens=10))
    expected = [c.text for c in outputs]
    assert [c.text for c in result.choices] == expected
    assert [token_ids(c.logprobs.tokens) for c in result.choices] == [c.token_ids for c in outputs]
    # several completions sample at OpenAI's default temperature, 1, when none is given
    default = server.client().completions.create(model="bart", prompt=ARTICLES[1], n=2, seed=7, max_tokens=10)
    assert [c.text for c in default.choices] == expected
    # two prompts: choices 0-1 are the first's, 2-3 the second's, streamed or not
    both = dict(model="bart", prompt=ARTICLES, n=2, seed=7, temperature=1.0, max_tokens=10)
    plain = [c.text for c in server.client().completions.create(**both).choices]
    assert plain == offline_texts(bart, ARTICLES, SamplingParams(n=2, seed=7, temperature=1.0, max_tokens=10))
    streamed = [""] * 4
    for chunk in server.client().completions.create(**both, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == plain
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) > 0
    assert all(len(top) <= 3 for top in logprobs.top_logprobs)  # the top 2 and the sampled token
    assert all(token in top for token, top in zip(logprobs.tokens, logprobs.top_logprobs))
    wide = server.client().completions.create(model="bart", prompt=ARTICLES[1], seed=7, temperature=1.0,
                                              max_tokens=4, logprobs=20)  # vLLM's limit, not OpenAI's 5
    assert max(map(len, wide.choices[0].logprobs.top_logprobs)) > 6
    sampled_only = server.client().completions.create(model="bart", prompt=ARTICLES[1], seed=7,
                                                      temperature=1.0, max_tokens=4, logprobs=0)
    tops = sampled_only.choices[0].logprobs.top_logprobs
    assert [list(top) for top in tops] == [[token] for token in sampled_only.choices[0].logprobs.tokens]


def test_best_of_returns_the_likeliest_sample(server):
    """`best_of` samples that many and returns the `n` with the highest cumulative log-probability
    (the same samples as asking for them all, for the same seed)."""
    request = dict(model="bart", prompt=ARTICLES[1], seed=11, temperature=1.0, max_tokens=8, logprobs=0)
    every = server.client().completions.create(**request, n=4).choices
    [best] = server.client().completions.create(**request, best_of=4).choices
    scores = {c.text: sum(c.logprobs.token_logprobs) for c in every}
    assert len(set(scores.values())) > 1
    assert best.text == max(scores, key=scores.get)
    assert sum(best.logprobs.token_logprobs) == pytest.approx(max(scores.values()))


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_of_a_forced_token(server, stream):
    """With no temperature the checkpoint's generation config applies, which forces EOS at the
    last step (forced_eos_token_id): every other token's log-probability is -inf there, and
    those the sampler reports (the other special tokens) share EOS's empty piece."""
    result = server.client().completions.create(model="bart", prompt=ARTICLES[0], max_tokens=2,
                                                logprobs=3, stream=stream)
    choices = [c for chunk in result for c in chunk.choices] if stream else result.choices
    assert [top for c in choices for top in c.logprobs.top_logprobs][-1] == {"": 0.0}


def test_completions_beam_search(server, bart):
    """vLLM's `use_beam_search`, with `best_of` as the beam width: the n best beams, streamed
    (in one chunk each, at the end) or not."""
    expected = offline_texts(bart, ARTICLES[0], SamplingParams(use_beam_search=True, beam_width=3, n=2,
                                                                max_tokens=12, temperature=0))
    for stream in (False, True):
        result = server.client().completions.create(
            model="bart", prompt=ARTICLES[0], n=2, best_of=3, max_tokens=12, temperature=0, stream=stream,
            extra_body={"use_beam_search": True})
        choices = [c for chunk in result for c in chunk.choices] if stream else result.choices
        texts = ["".join(c.text for c in choices if c.index == i) for i in range(2)]
        assert texts == expected, stream


def resolved(request: dict, defaults: GenerationDefaults) -> SamplingParams:
    """The engine's settings for a completions request on a checkpoint with `defaults`."""
    return resolve_sampling_params(sampling_params(CompletionRequest(model="bart", prompt="text", **request),
                                                   1000, defaults, SchedulerConfig()), defaults, 1, 128)


def test_several_completions_of_a_beam_config_are_its_best_beams():
    """A bart-large-cnn-style config searches 4 beams: n completions are its n best (as Hugging
    Face's num_return_sequences), with or without temperature 0; a wider n widens the search (as
    vLLM's), and use_beam_search without a width to search is refused naming best_of."""
    beams = GenerationDefaults.from_dict({"num_beams": 4, "max_length": 20})
    for temperature in ({}, {"temperature": 0}):
        params = resolved({"n": 2, **temperature}, beams)
        assert (params.use_beam_search, params.beam_width, params.n) == (True, 4, 2)
        # OpenAI's default best_of, which clients send, is no width
        params = resolved({"best_of": 1, **temperature}, beams)
        assert (params.use_beam_search, params.beam_width, params.n) == (True, 4, 1)
    with pytest.raises(OpenAIError) as caught:  # the config's width, past --max-num-seqs
        sampling_params(CompletionRequest(model="bart", prompt="text"), 1000, beams, SchedulerConfig(max_num_seqs=3))
    assert caught.value.param == "best_of"
    params = resolved({"n": 5, "temperature": 0}, beams)
    assert (params.use_beam_search, params.beam_width, params.n) == (True, 5, 5)
    sampled = resolved({"n": 2}, GenerationDefaults.from_dict({"max_length": 20}))
    assert (sampled.use_beam_search, sampled.temperature, sampled.n) == (False, 1.0, 2)
    with pytest.raises(OpenAIError) as caught:
        resolved({"use_beam_search": True}, GenerationDefaults.from_dict({"max_length": 20}))
    assert caught.value.param == "best_of"


def test_use_beam_search_false_gives_logprobs_with_a_beam_config():
    """A bart-large-cnn-style config searches 4 beams, which report no logprobs: vLLM's extra
    `use_beam_search: false` decodes greedily instead, and the refusal without it says so."""
    beams = GenerationDefaults.from_dict({"num_beams": 4, "max_length": 20})
    request = dict(logprobs=2, temperature=0)
    greedy = resolved({**request, "use_beam_search": False}, beams)
    assert (greedy.use_beam_search, greedy.beam_width, greedy.logprobs, greedy.max_tokens) == (False, 1, 2, 19)
    with pytest.raises(OpenAIError, match=r"logprobs is not supported with beam search \(use_beam_search=False") as caught:
        resolved(request, beams)
    assert caught.value.param == "logprobs"


def test_a_ruled_out_alternative_gets_vllms_lowest_logprob(bart):
    """JSON has no -inf: the server sends vLLM's -9999.0."""
    tokenizer = bart.get_tokenizer()
    rain = tokenizer(" rain", add_special_tokens=False)["input_ids"][0]
    result = LogprobsBuilder(tokenizer, 2).add([2], [{2: Logprob(0.0, 1), rain: Logprob(float("-inf"), 1000)}],
                                             finished=True)
    assert result.top_logprobs == [{"": 0.0, tokenizer.decode([rain]): -9999.0}] and tokenizer.decode([rain])
    json.dumps(result.model_dump(), allow_nan=False)


def test_a_prompt_token_ruled_out_gets_vllms_lowest_logprob():
    sent = json_prompt_logprobs([None, {7: Logprob(float("-inf"), 1000, "x")}])
    text = json.dumps([None if e is None else {t: v.model_dump() for t, v in e.items()} for e in sent], allow_nan=False)
    assert json.loads(text) == [None, {"7": {"logprob": -9999.0, "rank": 1000, "decoded_token": "x"}}]


def test_an_explicit_temperature_0_keeps_the_generation_config(server):
    """OpenAI clients send temperature=0: it decodes as leaving it unset does, with the
    checkpoint's config (here EOS forced at the last step), as vLLM's server and Hugging Face's
    generate() fill each unset field from the config."""
    request = dict(model="bart", prompt=ARTICLES[0], max_tokens=3, logprobs=0)
    unset, zero = (server.client().completions.create(**request, **extra).choices[0]
                   for extra in ({}, {"temperature": 0}))
    assert zero.logprobs.tokens == unset.logprobs.tokens and zero.text == unset.text
    assert zero.logprobs.top_logprobs[-1] == {"": 0.0}  # the forced EOS (a special token: no text)
    with server.http() as http:
        summaries = [http.post("/v1/summarize", json={"model": "bart", "input": ARTICLES, "max_tokens": 3,
                                                      **extra}).json() for extra in ({}, {"temperature": 0})]
    assert summaries[0]["summaries"] == summaries[1]["summaries"]
    assert summaries[0]["usage"] == summaries[1]["usage"]


def test_completions_penalties_and_min_p(server, bart):
    penalties = dict(presence_penalty=0.8, frequency_penalty=1.2)
    result = server.client().completions.create(model="bart", prompt=[*ARTICLES], max_tokens=16,
                                                temperature=0.0, **penalties)
    expected = offline_texts(bart, ARTICLES, SamplingParams(temperature=0.0, max_tokens=16, **penalties))
    assert [c.text for c in result.choices] == expected
    sampled = server.client().completions.create(model="bart", prompt=ARTICLES[0], n=2, seed=3, temperature=1.0,
                                                 max_tokens=10, extra_body={"min_p": 0.2})
    expected = offline_texts(bart, ARTICLES[0], SamplingParams(n=2, seed=3, temperature=1.0, max_tokens=10, min_p=0.2))
    assert [c.text for c in sampled.choices] == expected


def test_completions_logit_bias_and_vllms_extras(server, bart):
    """OpenAI's logit_bias, and vLLM's ignore_eos, skip_special_tokens, truncate_prompt_tokens and
    allowed_token_ids."""
    ids = bart.get_tokenizer()(ARTICLES[1])["input_ids"]
    result = server.client().completions.create(
        model="bart", prompt=ids, max_tokens=8, temperature=0.0, logit_bias={"7": 30},
        extra_body=dict(ignore_eos=True, skip_special_tokens=False, truncate_prompt_tokens=5))
    params = SamplingParams(temperature=0.0, max_tokens=8, logit_bias={7: 30.0}, ignore_eos=True,
                            skip_special_tokens=False)
    [expected] = bart.generate(TokensPrompt(prompt_token_ids=ids[-5:]), dataclasses.replace(params, config_per_field=True),
                               use_tqdm=False)
    assert result.choices[0].text == expected.outputs[0].text
    assert result.usage.prompt_tokens == 5 + len(expected.prompt_token_ids)  # encoder and decoder prompts
    assert (result.choices[0].finish_reason, result.usage.completion_tokens) == ("length", 8)
    # ignore_eos drops the config's forced_eos_token_id too: 8 tokens of text, no </s> forced last
    assert expected.outputs[0].token_ids[-1] != 2
    forced = server.client().completions.create(
        model="bart", prompt=ids, max_tokens=8, temperature=0.0, logit_bias={"7": 30},
        extra_body=dict(skip_special_tokens=False, truncate_prompt_tokens=5))
    assert forced.choices[0].text.endswith("</s>")
    allowed = dict(temperature=1.0, seed=5, max_tokens=6, allowed_token_ids=[7, 9, 11])  # no forced EOS then
    result = server.client().completions.create(model="bart", prompt=ARTICLES[0], **{
        k: v for k, v in allowed.items() if k != "allowed_token_ids"}, extra_body={"allowed_token_ids": [7, 9, 11]})
    [expected] = bart.generate(ARTICLES[0], SamplingParams(**allowed, config_per_field=True), use_tqdm=False)
    assert result.choices[0].text == expected.outputs[0].text
    assert set(expected.outputs[0].token_ids) <= {7, 9, 11}
    # one token allowed: the beams are one, and so are the choices (as offline), not n
    beams = dict(max_tokens=5, n=2, best_of=4)
    result = server.client().completions.create(model="bart", prompt=ARTICLES[0], **beams,
                                                extra_body=dict(allowed_token_ids=[100], use_beam_search=True))
    [expected] = bart.generate(ARTICLES[0], SamplingParams(max_tokens=5, n=2, beam_width=4, use_beam_search=True,
                                                           allowed_token_ids=[100], config_per_field=True),
                               use_tqdm=False)
    assert [(c.text, c.finish_reason) for c in result.choices] == [(o.text, o.finish_reason) for o in expected.outputs]
    assert len(result.choices) == 1


def test_completions_bad_words(server, bart):
    """vLLM's `bad_words` over HTTP ban what they ban offline; a word with no tokens is a 400."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    [free] = offline_texts(bart, [ARTICLES[0]], params)
    word = bart.get_tokenizer().tokenize(free)[0].lstrip("\u0120")
    result = server.client().completions.create(model="bart", prompt=ARTICLES[0], max_tokens=8, temperature=0.0,
                                                extra_body=dict(ignore_eos=True, bad_words=[word]))
    assert [result.choices[0].text] == offline_texts(bart, [ARTICLES[0]], dataclasses.replace(params, bad_words=word))
    assert result.choices[0].text != free
    with server.http() as http:
        response = http.post("/v1/completions", json=dict(model="bart", prompt="x", bad_words=[" "]))
    assert response.status_code == 400 and response.json()["error"]["param"] == "bad_words"


def test_completions_prompt_logprobs_equal_the_offline_ones(server, bart):
    """vLLM's extra `prompt_logprobs` scores the decoder prompt given each article: every choice
    of a prompt carries them, with vLLM's ranks and decoded tokens, as the offline LLM gives them."""
    decoder = bart.get_tokenizer()(" The rain falls", add_special_tokens=False)["input_ids"]
    decoder = [bart.llm_engine.model_config.decoder_start_token_id, 0, *decoder]
    result = server.client().completions.create(model="bart", prompt=[*ARTICLES], n=2, seed=5, temperature=1.0,
                                                max_tokens=3, extra_body={"decoder_prompt": decoder,
                                                                          "prompt_logprobs": 2})
    offline = bart.generate([{"encoder_prompt": article, "decoder_prompt": {"prompt_token_ids": decoder}}
                             for article in ARTICLES],
                            SamplingParams(n=2, seed=5, temperature=1.0, max_tokens=3, prompt_logprobs=2,
                                           config_per_field=True), use_tqdm=False)
    choices = result.model_dump()["choices"]
    assert len(choices) == 4
    for choice, out in zip(choices, [out for out in offline for _ in range(2)]):
        sent, expected = choice["prompt_logprobs"], out.prompt_logprobs
        assert len(sent) == len(decoder) and sent[0] is None
        for entry, wanted in zip(sent[1:], expected[1:]):
            assert list(entry) == [str(token) for token in wanted]
            assert [e["logprob"] for e in entry.values()] == pytest.approx([w.logprob for w in wanted.values()],
                                                                           abs=1e-5)
            assert [(e["rank"], e["decoded_token"]) for e in entry.values()] == [(w.rank, w.decoded_token)
                                                                                 for w in wanted.values()]
    assert [c["text"] for c in choices] == [c.text for out in offline for c in out.outputs]
    plain = server.client().completions.create(model="bart", prompt=ARTICLES[0], max_tokens=2)
    assert "prompt_logprobs" not in plain.model_dump()["choices"][0]  # only when asked for


def test_completions_streamed_with_usage(server, bart):
    chunks = list(server.client().completions.create(
        model="bart", prompt=ARTICLES, max_tokens=12, temperature=0.0, stream=True,
        stream_options={"include_usage": True}))
    texts = ["", ""]
    for chunk in chunks[:-1]:
        # OpenAI's other chunks carry `"usage": null` when usage is asked for
        assert chunk.object == "text_completion" and chunk.usage is None and "usage" in chunk.model_fields_set
        # one choice per chunk, as OpenAI streams, and none with nothing to say
        assert len(chunk.choices) == 1 and (chunk.choices[0].text or chunk.choices[0].finish_reason)
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    outputs = offline_outputs(bart, ARTICLES, SamplingParams(temperature=0.0, max_tokens=12))
    assert texts == [c.text for c in outputs]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == sum(len(c.token_ids) for c in outputs)
    ids: list[list[str]] = [[], []]  # every token streamed, also those of no text
    for chunk in server.client().completions.create(model="bart", prompt=ARTICLES, max_tokens=12, temperature=0.0,
                                                    stream=True, logprobs=0, extra_body=AS_IDS):
        for choice in chunk.choices:
            ids[choice.index] += choice.logprobs.tokens
    assert [token_ids(tokens) for tokens in ids] == [c.token_ids for c in outputs]
    plain = server.client().completions.create(model="bart", prompt=ARTICLES, max_tokens=12, temperature=0.0)
    assert chunks[-1].usage == plain.usage
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
    # vLLM's continuous_usage_stats: on every chunk its prompt's tokens and its choice's so far;
    # OpenAI's include_obfuscation is taken
    continuous = list(server.client().completions.create(
        model="bart", prompt=ARTICLES, max_tokens=12, temperature=0.0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True, "include_obfuscation": False}))
    offline = bart.generate(ARTICLES, SamplingParams(temperature=0.0, max_tokens=12, config_per_field=True),
                            use_tqdm=False)
    for index, out in enumerate(offline):
        usages = [chunk.usage for chunk in continuous[:-1] if chunk.choices[0].index == index]
        assert {u.prompt_tokens for u in usages} == {len(out.encoder_prompt_token_ids) + len(out.prompt_token_ids)}
        counts = [u.completion_tokens for u in usages]
        assert counts == sorted(counts) and counts[-1] == len(out.outputs[0].token_ids)
    assert continuous[-1].usage == chunks[-1].usage


@pytest.mark.parametrize("stream", [False, True])
def test_completions_stop_string(server, bart, stream):
    """A stop string across two tokens' texts cuts the completion there, streamed or not."""
    [out] = bart.generate(ARTICLES[0], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    full, ids = out.outputs[0].text, out.outputs[0].token_ids
    tokenizer = bart.get_tokenizer()
    ends = [len(tokenizer.decode(ids[:k], skip_special_tokens=True)) for k in range(1, len(ids))]
    end = next(e for e in ends[len(ends) // 2:] if 2 <= e <= len(full) - 2)  # a token boundary
    stop = full[end - 2:end + 2]
    result = server.client().completions.create(model="bart", prompt=ARTICLES[0], max_tokens=12,
                                                temperature=0.0, stop=[stop], stream=stream)
    choices = [c for chunk in result for c in chunk.choices] if stream else result.choices
    assert "".join(c.text for c in choices) == full[:full.index(stop)]
    assert choices[-1].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_wait_for_min_tokens(server, bart, stream):
    """As in vLLM, a stop string ends a completion only where it ends in the text of a token
    after the first `min_tokens`."""
    [out] = bart.generate(ARTICLES[0], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    full, ids = out.outputs[0].text, out.outputs[0].token_ids
    stop, min_tokens = full[:2], 3
    floor = len(bart.get_tokenizer().decode(ids[:min_tokens], skip_special_tokens=True))
    at = full.find(stop, max(floor - len(stop) + 1, 0))
    result = server.client().completions.create(model="bart", prompt=ARTICLES[0], max_tokens=12,
                                                temperature=0.0, stop=[stop], stream=stream,
                                                extra_body={"min_tokens": min_tokens})
    choices = [c for chunk in result for c in chunk.choices] if stream else result.choices
    assert "".join(c.text for c in choices) == (full if at < 0 else full[:at])
    assert choices[-1].finish_reason == ("length" if at < 0 else "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_token_text_is_left_out(server, bart, stream):
    """A token of `stop_token_ids` ends the completion, and its text is not in it (vLLM)."""
    [out] = bart.generate(ARTICLES[0], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    ids, tokenizer = out.outputs[0].token_ids, bart.get_tokenizer()
    result = server.client().completions.create(model="bart", prompt=ARTICLES[0], max_tokens=12,
                                                temperature=0.0, stream=stream,
                                                extra_body={"stop_token_ids": [ids[2]]})
    choices = [c for chunk in result for c in chunk.choices] if stream else result.choices
    stopped = ids[:ids.index(ids[2]) + 1]
    assert "".join(c.text for c in choices) == tokenizer.decode(stopped[:-1], skip_special_tokens=True)
    assert choices[-1].finish_reason == "stop"


def test_streamed_chunks_keep_one_time_and_null_fields(server):
    """Every chunk of a stream has the same `created`; a choice sends `logprobs`, `finish_reason`
    and vLLM's `stop_reason` as null rather than leaving them out (OpenAI's schema requires the
    first two)."""
    body = {"model": "bart", "prompt": ARTICLES, "max_tokens": 6, "temperature": 0.0, "stream": True}
    with server.http() as http:
        events = [line[len("data: "):] for line in http.post("/v1/completions", json=body).text.splitlines()
                  if line.startswith("data: ")][:-1]
        plain = http.post("/v1/completions", json={**body, "stream": False}).json()
    chunks = [json.loads(e) for e in events]
    assert len(chunks) > 2 and len({chunk["created"] for chunk in chunks}) == 1
    for choice in [c for chunk in chunks for c in chunk["choices"]] + plain["choices"]:
        assert list(choice) == ["index", "text", "logprobs", "finish_reason", "stop_reason"]
        assert choice["logprobs"] is None and choice["stop_reason"] is None
    assert chunks[0]["choices"][0]["finish_reason"] is None


def test_stop_reason_names_what_stopped_a_completion(server, bart):
    """vLLM's `stop_reason`: the stop string or stop token id that ended a choice (null for
    EOS or the length limit), streamed or not."""
    params = SamplingParams(temperature=0.0, max_tokens=12, config_per_field=True)
    [greedy] = bart.generate(ARTICLES[0], params, use_tqdm=False)
    ids, text = greedy.outputs[0].token_ids, greedy.outputs[0].text
    assert len(text) > 8
    word = text[4:7]
    cases = [({"stop": ["zzzz", word]}, "stop", word), ({"stop_token_ids": [ids[2]]}, "stop", ids[2]),
             ({}, greedy.outputs[0].finish_reason, None)]
    for extra, finish_reason, stop_reason in cases:
        body = {"model": "bart", "prompt": ARTICLES[0], "max_tokens": 12, "temperature": 0.0, **extra}
        plain = server.client().completions.create(**{k: v for k, v in body.items() if k != "stop_token_ids"},
                                                   extra_body={k: v for k, v in body.items() if k == "stop_token_ids"})
        choice = plain.model_dump()["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == (finish_reason, stop_reason), extra
        with server.http() as http:
            events = [json.loads(line[len("data: "):]) for line in http.post(
                "/v1/completions", json={**body, "stream": True}).text.splitlines() if line.startswith("data: {")]
        last = [c for event in events for c in event["choices"]][-1]
        assert (last["finish_reason"], last["stop_reason"]) == (finish_reason, stop_reason), extra


@pytest.mark.parametrize("temperature", [None, 0.0])  # the config's forced BOS and EOS; plain greedy
def test_logprob_tokens_are_the_texts_pieces(server, temperature):
    """As vLLM shows them: each token is its piece of the text ("" for a special token), the
    pieces add up to the text, and each offset is where its piece starts, streamed or not."""
    request = dict(model="bart", prompt=ARTICLES[0], max_tokens=8, temperature=temperature, logprobs=1, stop="zzzz")
    plain = server.client().completions.create(**request).choices[0]
    logprobs = plain.logprobs
    assert "".join(logprobs.tokens) == plain.text and len(logprobs.tokens) == 8
    assert all(plain.text[o:o + len(t)] == t for o, t in zip(logprobs.text_offset, logprobs.tokens))
    assert all(t in top for t, top in zip(logprobs.tokens, logprobs.top_logprobs))
    streamed = [c.logprobs for chunk in server.client().completions.create(**request, stream=True)
                for c in chunk.choices if c.logprobs]
    assert [t for lp in streamed for t in lp.tokens] == logprobs.tokens
    assert [o for lp in streamed for o in lp.text_offset] == logprobs.text_offset


def test_logprob_tokens_show_special_tokens_or_ids_when_asked(server, bart):
    """With `skip_special_tokens: false` the pieces show special tokens as the text does; with
    vLLM's `return_tokens_as_token_ids` every token is "token_id:{id}", so tokens that decode
    alike keep their own top_logprobs entries."""
    request = dict(model="bart", prompt=ARTICLES[0], max_tokens=8, logprobs=3)
    [offline] = bart.generate(ARTICLES[0], SamplingParams(max_tokens=8, logprobs=3, config_per_field=True),
                              use_tqdm=False)
    shown = server.client().completions.create(**request, extra_body={"skip_special_tokens": False}).choices[0]
    assert shown.text.endswith("</s>")  # the config's forced EOS, shown
    assert "".join(shown.logprobs.tokens) == shown.text and shown.logprobs.tokens[-1] == "</s>"
    as_ids = server.client().completions.create(**request, extra_body={"return_tokens_as_token_ids": True})
    logprobs = as_ids.choices[0].logprobs
    assert logprobs.tokens == [f"token_id:{t}" for t in offline.outputs[0].token_ids]
    for top, entry in zip(logprobs.top_logprobs, offline.outputs[0].logprobs):
        likeliest = sorted(entry.values(), key=lambda e: e.logprob, reverse=True)[:3]
        assert set(top) >= {f"token_id:{t}" for t, e in entry.items() if e in likeliest}
    assert as_ids.choices[0].text == offline.outputs[0].text


def test_summarize_plain_and_streamed(server, bart):
    long_article = " ".join([ARTICLES[1]] * 40)  # over the tiny model's 256 positions
    body = {"model": "bart", "input": [ARTICLES[0], long_article], "max_tokens": 10}
    with server.http() as http:
        plain = http.post("/v1/summarize", json=body)
        assert plain.status_code == 200, plain.text
        streamed = http.post("/v1/summarize", json={**body, "stream": True})
    result = plain.json()
    assert result["object"] == "summary"
    tokenizer = bart.get_tokenizer()
    truncated = tokenizer(long_article, truncation=True, max_length=256)["input_ids"]
    outputs = offline_outputs(bart, summary_prompts(bart, [ARTICLES[0], {"prompt_token_ids": truncated}]),
                              SamplingParams(max_tokens=10))
    expected = [c.text for c in outputs]
    assert [s["text"] for s in result["summaries"]] == expected
    assert result["usage"]["completion_tokens"] == sum(len(c.token_ids) for c in outputs)
    full = len(tokenizer(long_article)["input_ids"])
    assert [(s["input_tokens"], s["truncated_tokens"]) for s in result["summaries"]] == [
        (len(tokenizer(ARTICLES[0])["input_ids"]), 0), (256, full - 256)]

    events = [line[len("data: "):] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = ["", ""]
    for chunk in chunks[:-1]:
        for piece in chunk["summaries"]:
            assert piece["text"] or piece["finish_reason"]  # no piece with nothing to say
            texts[piece["index"]] += piece["text"]
    assert texts == expected
    # each summary's last piece says how it ended and how its input was read, as the plain one does
    ends = {p["index"]: (p["finish_reason"], p["input_tokens"], p["truncated_tokens"])
            for chunk in chunks[:-1] for p in chunk["summaries"] if p.get("finish_reason")}
    assert ends == {s["index"]: (s["finish_reason"], s["input_tokens"], s["truncated_tokens"])
                    for s in result["summaries"]}
    assert chunks[-1]["usage"] == result["usage"]
    usage = result["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert len({chunk["created"] for chunk in chunks}) == 1


def test_summarize_decoding_fields(server, bart):
    """/v1/summarize's decoding fields decode as the offline LLM does with the same settings."""
    assert offline_texts(bart, summary_prompts(bart, ARTICLES), SamplingParams(temperature=0.9, seed=4)) != \
        offline_texts(bart, summary_prompts(bart, ARTICLES), SamplingParams(temperature=0.9, seed=4, top_k=3,
                                                                            top_p=0.6))  # they matter here
    fields = dict(max_tokens=16, min_tokens=6, length_penalty=2.0, no_repeat_ngram_size=2)
    params = dict(max_tokens=16, min_tokens=6, length_penalty=2.0, no_repeat_ngram_size=2)
    cases = [({"num_beams": 3, **fields}, SamplingParams(use_beam_search=True, beam_width=3, **params)),
             ({"temperature": 0, **fields}, SamplingParams(temperature=0.0, **params)),
             ({"temperature": 0.9, "seed": 4, **fields}, SamplingParams(temperature=0.9, seed=4, **params)),
             ({"temperature": 0.9, "seed": 4, "top_k": 3, "top_p": 0.6, **fields},
              SamplingParams(temperature=0.9, seed=4, top_k=3, top_p=0.6, **params)),
             # one candidate is the likeliest; a summary that does not sample ignores them (as HF)
             ({"temperature": 0.9, "seed": 4, "top_k": 1, **fields}, SamplingParams(temperature=0.0, **params)),
             ({"top_k": 3, "top_p": 0.6, **fields}, SamplingParams(temperature=0.0, **params))]
    with server.http() as http:
        for body, expected in cases:
            result = http.post("/v1/summarize", json={"model": "bart", "input": ARTICLES, **body}).json()
            assert [s["text"] for s in result["summaries"]] == offline_texts(bart, summary_prompts(bart, ARTICLES),
                                                                             expected), body
        # the tiny model repeats itself: no_repeat_ngram_size changes what it says
        unset = {k: v for k, v in fields.items() if k != "no_repeat_ngram_size"}
        repeats = http.post("/v1/summarize", json={"model": "bart", "input": ARTICLES, "temperature": 0,
                                                   **unset}).json()
    assert [s["text"] for s in repeats["summaries"]] != offline_texts(bart, summary_prompts(bart, ARTICLES),
                                                                      cases[1][1])


def test_a_streamed_beam_search_answers_at_once(server, bart):
    """A beam search's text comes in one event at its end, but the status line and headers come
    as soon as the request is taken, as vLLM's and OpenAI's streams do (a client's read timeout
    counts from there)."""
    body = {"model": "bart", "input": ARTICLES[1], "num_beams": 4, "min_tokens": 150, "max_tokens": 150}
    with server.http() as http, http.stream("POST", "/v1/summarize", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        load = server.engine_load()  # the search still runs, in blocks of both kinds
        assert all(load.get(("encdec_kv_blocks_in_use", (("attention", kind), ("model", "bart"))), 0) > 0
                   for kind in ("self", "cross")), load
        text = response.read().decode()
        plain = http.post("/v1/summarize", json=body).json()
    events = [json.loads(line[len("data: "):]) for line in text.splitlines()
              if line.startswith("data: {")]
    assert "".join(p["text"] for e in events for p in e["summaries"]) == plain["summaries"][0]["text"]


def test_stream_is_ignored_for_formats_that_cannot_stream(server):
    """As OpenAI ignores `stream` where it cannot stream: subtitles come whole."""
    with server.http() as http:
        answers = [http.post("/v1/audio/transcriptions", files={"file": ("hello.wav", SAMPLE.read_bytes())},
                             data={"model": "tiny.en", "response_format": "srt", **extra})
                   for extra in ({}, {"stream": "true"})]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[1].text == answers[0].text and answers[0].text.startswith("1\n00:00:00,000 --> ")


@pytest.mark.parametrize("suffix, container, codec", [("m4a", "mp4", "aac"), ("webm", "webm", "libopus")])
def test_transcribes_m4a_and_webm(server, tiny_en, tmp_path, suffix, container, codec):
    """Formats OpenAI takes that libsndfile does not read (phones record M4A, browsers WebM)."""
    audio, rate = soundfile.read(SAMPLE, dtype="float32")
    path = tmp_path / f"hello.{suffix}"
    path.write_bytes(av_encoded(audio, rate, container, codec))
    with open(path, "rb") as upload:
        result = server.client().audio.transcriptions.create(model="tiny.en", file=upload)
    assert result.text == tiny_en.transcribe(str(path))[0].text
    assert result.text.startswith("Thank you for calling.")


@pytest.mark.parametrize("response_format", ["json", "text", "srt", "vtt", "verbose_json"])
def test_transcription_formats(server, hello, response_format):
    expected = hello
    with open(SAMPLE, "rb") as audio:
        result = server.client().audio.transcriptions.create(model="tiny.en", file=audio,
                                                             response_format=response_format)
    if response_format == "json":
        assert result.text == expected.text
        assert (result.usage.type, result.usage.seconds) == ("duration", pytest.approx(expected.duration))
    elif response_format == "text":
        assert result == expected.text + "\n"  # as OpenAI's API ends it
    elif response_format in ("srt", "vtt"):
        out = io.StringIO()
        if response_format == "srt":
            write_srt(expected, out)
        else:
            write_vtt(expected, out, always_include_hours=True)
            assert "\n00:00:00.000 --> " in result  # as OpenAI's API: hours under an hour too
        assert result == out.getvalue()
    else:
        assert (result.task, result.language, result.text) == ("transcribe", "english", expected.text)
        assert result.duration == pytest.approx(expected.duration)
        assert (result.usage.type, result.usage.seconds) == ("duration", pytest.approx(expected.duration))
        assert [(s.id, s.seek, s.start, s.end, s.text, s.tokens, s.temperature) for s in result.segments] == [
            (i, s.seek, s.start, s.end, s.text, s.tokens, s.temperature) for i, s in enumerate(expected.segments)]
        for got, want in zip(result.segments, expected.segments):
            assert got.avg_logprob == pytest.approx(want.avg_logprob, abs=1e-4)
            assert got.compression_ratio == pytest.approx(want.compression_ratio)
            assert got.no_speech_prob == pytest.approx(want.no_speech_prob, abs=1e-4)


def test_streamed_transcription_events(server, tiny_en, long_wav):
    expected = tiny_en.transcribe(str(long_wav))[0]
    with open(long_wav, "rb") as audio:
        events = list(server.client().audio.transcriptions.create(model="tiny.en", file=audio, stream=True))
    deltas, done = events[:-1], events[-1]
    assert len(deltas) >= 2 and all(e.type == "transcript.text.delta" for e in deltas)
    assert done.type == "transcript.text.done" and done.text == expected.text
    assert (done.usage.type, done.usage.seconds) == ("duration", pytest.approx(expected.duration))
    assert "".join(e.delta for e in deltas).strip() == expected.text


def test_a_transcription_whose_client_leaves_is_aborted(server, long_wav):
    """A client that closes its connection while its upload is transcribed, plain or after the
    first streamed delta: the window being decoded is aborted in the engine, the request
    counted as 499, and (checked after every test here) every block is free again."""
    def count(name: str, labels: tuple) -> float:
        return server.metrics().get((name, labels), 0.0)

    aborted = ("encdec_num_aborted_requests_total", (("model", "tiny.en"),))
    left = ("encdec_http_requests_total", (("endpoint", "/v1/audio/transcriptions"), ("status", "499")))
    aborted_before, left_before = count(*aborted), count(*left)
    request = httpx.Request("POST", f"{server.url}/v1/audio/transcriptions", data={"model": "tiny.en"},
                            files={"file": ("talk.wav", long_wav.read_bytes(), "audio/wav")})
    with socket.create_connection(("127.0.0.1", server.port)) as sock:  # plain: leave while it runs
        head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
        sock.sendall(f"POST /v1/audio/transcriptions HTTP/1.1\r\n{head}\r\n".encode() + request.read())
        deadline = time.monotonic() + 30
        while not count("encdec_num_requests_running", (("model", "tiny.en"),)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
    with open(long_wav, "rb") as audio:  # streamed: leave after the first window's delta
        stream = server.client().audio.transcriptions.create(model="tiny.en", file=audio, stream=True)
        assert next(iter(stream)).type == "transcript.text.delta"
        stream.close()
    deadline = time.monotonic() + 15
    while not (count(*aborted) >= aborted_before + 2 and count(*left) >= left_before + 2) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert count(*aborted) >= aborted_before + 2 and count(*left) == left_before + 2


@pytest.mark.parametrize("response_format", ["json", "text"])
def test_a_streamed_transcription_is_server_sent_events(server, hello, response_format):
    """Both formats that stream send OpenAI's events, then `data: [DONE]`."""
    with server.http() as http:
        answer = http.post("/v1/audio/transcriptions", files={"file": ("hello.wav", SAMPLE.read_bytes())},
                           data={"model": "tiny.en", "response_format": response_format, "stream": "true"})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2]) == {"type": "transcript.text.done", "text": hello.text,
                                      "usage": {"type": "duration", "seconds": hello.duration}}
    deltas = [json.loads(e) for e in events[:-2]]
    assert deltas and all(d["type"] == "transcript.text.delta" for d in deltas)
    assert "".join(d["delta"] for d in deltas).strip() == hello.text


def finished_lengths(llm: LLM, path) -> list[list[int]]:
    """The tokens of each sequence of each engine request (every window and sample) that `llm`
    makes to transcribe `path`."""
    engine, step, lengths = llm.llm_engine, llm.llm_engine.step, []

    def counting_step():
        outputs = step()
        lengths.extend([len(c.token_ids) for c in o.outputs] for o in outputs if o.finished)
        return outputs

    engine.step = counting_step
    try:
        llm.transcribe(str(path))
    finally:
        del engine.step
    return lengths


def test_metrics_time_to_first_token_and_prompt_tokens(server, bart, tiny_en, hello):
    """/metrics: a completion's prompts each get a time to first token, a queue time and a time
    per output token and count their prompt and generated tokens (usage's); a transcription,
    plain or streamed, gets one time to first token (its first window's), each window's queue
    time and time per output token, and counts its windows' prompt tokens, the tokens the engine
    generated for it and its audio seconds."""
    def changes(before, after, model, names=("encdec_time_to_first_token_seconds_count",
                                             "encdec_time_to_first_token_seconds_sum", "encdec_prompt_tokens_total",
                                             "encdec_audio_seconds_total", "encdec_generation_tokens_total")):
        key = (("model", model),)
        return [after.get((n, key), 0.0) - before.get((n, key), 0.0) for n in names]

    before, start = server.metrics(), time.monotonic()
    result = server.client().completions.create(model="bart", prompt=ARTICLES, max_tokens=4,
                                                extra_body={"min_tokens": 4})
    after, elapsed = server.metrics(), time.monotonic() - start
    count, seconds, prompt, _, generated = changes(before, after, "bart")
    assert (count, prompt, generated) == (2, result.usage.prompt_tokens, result.usage.completion_tokens)
    assert generated == 8  # min_tokens
    assert 0 < seconds < 2 * elapsed
    # each prompt's queue time, and its time per output token: its 3 steps after the first token
    queued, queued_seconds, decoded, decode_seconds = changes(before, after, "bart", tuple(
        f"encdec_{family}_seconds_{part}" for family in ("request_queue_time", "time_per_output_token")
        for part in ("count", "sum")))
    assert (queued, decoded) == (2, 2) and 0 <= queued_seconds < 2 * elapsed and 0 < decode_seconds < elapsed
    latency = [after.get((f"encdec_http_request_duration_seconds_{part}", (("endpoint", "/v1/completions"),)), 0.0)
               - before.get((f"encdec_http_request_duration_seconds_{part}", (("endpoint", "/v1/completions"),)), 0.0)
               for part in ("count", "sum")]
    assert latency[0] == 1 and 0 < latency[1] < time.monotonic() - start

    before, start = server.metrics(), time.monotonic()
    with open(SAMPLE, "rb") as audio:
        server.client().audio.transcriptions.create(model="tiny.en", file=audio)
    with open(SAMPLE, "rb") as audio:
        list(server.client().audio.transcriptions.create(model="tiny.en", file=audio, stream=True))
    after = server.metrics()
    count, seconds, prompt, audio_seconds, generated = changes(before, after, "tiny.en")
    assert count == 2 and 0 < seconds < 2 * (time.monotonic() - start)
    lengths = finished_lengths(tiny_en, SAMPLE)
    windows = changes(before, after, "tiny.en", ("encdec_request_queue_time_seconds_count",
                                                 "encdec_time_per_output_token_seconds_count"))
    assert windows == [2 * len(lengths), 2 * sum(max(n) > 1 for n in lengths)]
    assert prompt >= 2 and prompt % 2 == 0  # the same windows twice
    assert audio_seconds == pytest.approx(2 * hello.duration)
    assert generated == 2 * sum(map(sum, lengths)) > 2 * sum(len(s.tokens) for s in hello.segments)


def test_metrics_show_the_requests_in_flight(server, hello):
    """A transcription counts as in flight from its first byte to its response; /metrics itself
    and /health do not count."""
    server.wait_requests_in_flight(0, timeout=10)  # the last test's response counted off
    held = HeldUpload(server.url, "tiny.en", SAMPLE)
    try:
        server.wait_requests_in_flight(1)
        assert server.http().get("/health").status_code == 200 and server.requests_in_flight() == 1
    finally:
        response = held.finish()
    assert response.status_code == 200 and response.json()["text"] == hello.text
    server.wait_requests_in_flight(0, timeout=10)


def test_metrics_families(server):
    """Every family /metrics is to have (the issue's list), by type and labels, once a completion
    and a transcription have been counted."""
    from prometheus_client.parser import text_string_to_metric_families

    server.client().completions.create(model="bart", prompt=ARTICLES[0], max_tokens=2)
    with open(SAMPLE, "rb") as audio:
        server.client().audio.transcriptions.create(model="tiny.en", file=audio)
    text = server.http().get("/metrics").text
    families = {f.name: (f.type, set().union(*(s.labels for s in f.samples)) - {"le"})
                for f in text_string_to_metric_families(text)}
    per_model = {"model"}
    expected = {
        "encdec_http_requests": ("counter", {"endpoint", "status"}),
        "encdec_http_request_duration_seconds": ("histogram", {"endpoint"}),
        "encdec_http_requests_in_flight": ("gauge", set()),
        "encdec_prompt_tokens": ("counter", per_model), "encdec_generation_tokens": ("counter", per_model),
        "encdec_audio_seconds": ("counter", per_model), "encdec_audio_seconds_in_flight": ("gauge", set()),
        "encdec_time_to_first_token_seconds": ("histogram", per_model),
        "encdec_request_queue_time_seconds": ("histogram", per_model),
        "encdec_time_per_output_token_seconds": ("histogram", per_model),
        "encdec_num_requests_running": ("gauge", per_model), "encdec_num_requests_waiting": ("gauge", per_model),
        "encdec_num_requests_swapped": ("gauge", per_model),
        "encdec_kv_blocks_in_use": ("gauge", {"model", "attention"}),
        "encdec_kv_swap_blocks_in_use": ("gauge", per_model), "encdec_kv_blocks_capacity": ("gauge", per_model),
        "encdec_num_preemptions": ("counter", per_model), "encdec_num_aborted_requests": ("counter", per_model)}
    assert {name: families.get(name) for name in expected} == expected


def test_the_stats_line(server):
    """Every interval in which a model has work ($ENCDEC_LOG_STATS_INTERVAL s, 0.5 here), its
    stats line in the log, as vLLM's server logs its own."""
    line = re.compile(r"encdec\.server: bart: Avg prompt throughput: ([\d.]+) tokens/s, Avg generation "
                      r"throughput: ([\d.]+) tokens/s, Running: \d+ reqs, Swapped: \d+ reqs, Pending: \d+ "
                      r"reqs, KV cache usage: [\d.]+%$", re.MULTILINE)
    logged = len(server.output())
    server.client().completions.create(model="bart", prompt=ARTICLES[0], max_tokens=4, extra_body={"min_tokens": 4})

    def counted(output: str) -> bool:  # a line logged while the request ran has its tokens still to come
        lines = line.findall(output)
        return sum(float(prompt) for prompt, _ in lines) > 0 and sum(float(g) for _, g in lines) > 0

    assert counted(server.wait_output(counted, start=logged))


def test_each_request_has_a_log_line(server):
    """Its id (the client's x-request-id), method, path, status and time."""
    answer = server.http().get("/v1/models", headers={"X-Request-Id": "listed-1"})
    assert (answer.status_code, answer.headers["x-request-id"]) == (200, "listed-1")
    line = re.compile(r"INFO encdec\.server: request listed-1: GET /v1/models -> 200 in \d+\.\d{3} s$", re.MULTILINE)
    assert line.search(server.wait_output(line.search))


def test_metrics_show_the_process(server):
    """The process's own metrics, as vLLM's server has them: resident memory (the server
    process's), CPU time; Python's garbage collections."""
    metrics = server.metrics()
    with open(f"/proc/{server.proc.pid}/status") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    assert metrics[("process_resident_memory_bytes", ())] == pytest.approx(rss_kib * 1024, rel=0.2)
    assert metrics[("process_cpu_seconds_total", ())] > 1  # loading the models, at least
    assert metrics[("python_gc_collections_total", (("generation", "0"),))] > 0


def test_translation(server):
    expected = LLM("base", num_gpu_blocks=240, swap_space=0.05).transcribe(str(SAMPLE), task="translate")[0]
    with open(SAMPLE, "rb") as audio:
        result = server.client().audio.translations.create(model="base", file=audio,
                                                           response_format="verbose_json")
    assert (result.text, result.language) == (expected.text, "english")
    assert [s.text for s in result.segments] == [s.text for s in expected.segments]
    assert "usage" not in result.to_dict()  # OpenAI's is a transcription's, as in the json format


def test_translation_takes_the_speech_language_and_streams(server):
    """vLLM's translation fields: `language` (the speech's, not detected) and `stream`."""
    expected = LLM("base", num_gpu_blocks=240, swap_space=0.05).transcribe(
        str(SAMPLE), task="translate", language="de", temperature=0.0)[0]
    with open(SAMPLE, "rb") as audio:
        result = server.client().audio.translations.create(
            model="base", file=audio, temperature=0.0, extra_body={"language": "de"})
    assert result.text == expected.text
    with pytest.raises(openai.BadRequestError, match="'klingon' is not a language Whisper knows"):
        with open(SAMPLE, "rb") as audio:
            server.client().audio.translations.create(model="base", file=audio, extra_body={"language": "klingon"})
    with server.http() as http:
        streamed = http.post("/v1/audio/translations", files={"file": SAMPLE.read_bytes()},
                             data={"model": "base", "language": "de", "temperature": "0", "stream": "true"})
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert events[-1] == {"type": "transcript.text.done", "text": expected.text}


def test_chunking_strategy(server, tiny_en):
    """OpenAI's `chunking_strategy`: "auto" is the 30 s windows as always; `server_vad` is the VAD
    filter, with its threshold, silence and padding."""
    vad = dict(threshold=0.95, min_silence_duration_ms=100, speech_pad_ms=0)
    filtered = tiny_en.transcribe(str(SAMPLE), vad_filter=True, vad_parameters=vad)[0]
    server_vad = {"type": "server_vad", "threshold": 0.95, "silence_duration_ms": 100, "prefix_padding_ms": 0}
    for strategy, expected in (("auto", tiny_en.transcribe(str(SAMPLE))[0]), (server_vad, filtered)):
        with open(SAMPLE, "rb") as audio:
            result = server.client().audio.transcriptions.create(model="tiny.en", file=audio, chunking_strategy=strategy,
                                                                 response_format="verbose_json")
        assert result.text == expected.text
        assert [(s.start, s.end) for s in result.segments] == [(s.start, s.end) for s in expected.segments]
    assert [(s.start, s.end) for s in filtered.segments] != [(0.0, 4.0)]  # what the filter changes here
    with server.http() as http:  # a hand-written form may send the object as JSON
        result = http.post("/v1/audio/transcriptions", files={"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")},
                           data={"model": "tiny.en", "response_format": "verbose_json",
                                 "chunking_strategy": json.dumps(server_vad)}).json()
    assert [(s["start"], s["end"]) for s in result["segments"]] == [(s.start, s.end) for s in filtered.segments]


def test_transcription_words_and_decoding_fields(server, tiny_en):
    expected = tiny_en.transcribe(str(SAMPLE), word_timestamps=True, beam_size=2)[0]
    expected_words = [w for s in expected.segments for w in s.words]
    for kinds in (["word"], ["word", "segment"]):
        with open(SAMPLE, "rb") as audio:
            result = server.client().audio.transcriptions.create(
                model="tiny.en", file=audio, response_format="verbose_json",
                timestamp_granularities=kinds, extra_body={"beam_size": 2})
        assert result.text == expected.text
        assert [w.word for w in result.words] == [w.word.strip() for w in expected_words]  # OpenAI's: no spaces
        assert [(w.start, w.end) for w in result.words] == [(w.start, w.end) for w in expected_words]
        assert (result.segments is not None) == ("segment" in kinds)


def test_transcription_threshold_fields(server):
    """A window is silence when its no-speech probability passes no_speech_threshold and its
    decode is unsure (average log-probability below logprob_threshold): the sample's speech is
    dropped only when both thresholds say so."""
    def text(**fields) -> str:
        with open(SAMPLE, "rb") as audio:
            return server.client().audio.transcriptions.create(
                model="tiny.en", file=audio, extra_body=dict(best_of=1, **fields)).text

    assert text(no_speech_threshold=0.0, logprob_threshold=0) == ""
    assert text(no_speech_threshold=0.0) != ""
    assert text(logprob_threshold=0) != ""

"""A checkpoint served without tokenizer files: token ids in, token ids out (as logprobs'
"token_id:{id}" tokens), the same ids as the offline `LLM`; text is refused naming the field,
and the engine lives on."""
from __future__ import annotations

import shutil

import openai
import pytest

from encdec import LLM, SamplingParams, TokensPrompt
from tests.entrypoints.remote_server import RemoteServer

PROMPTS = [[0, 31, 47, 5, 9, 2], [0, 8, 8, 120, 2]]


@pytest.fixture(scope="module")
def bare_dir(tiny_bart_dir, tmp_path_factory):
    bare = tmp_path_factory.mktemp("bare")  # weights and config, no tokenizer files
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (tiny_bart_dir / name).exists():
            shutil.copy(tiny_bart_dir / name, bare / name)
    return bare


@pytest.fixture(scope="module")
def server(bare_dir):
    remote = RemoteServer(["--model", str(bare_dir), "--served-model-name", "bare", "--num-gpu-blocks", "300"])
    yield remote
    remote.stop()


def ids_of(logprobs) -> list[int]:
    assert all(token.startswith("token_id:") for token in logprobs.tokens), logprobs.tokens
    return [int(token.removeprefix("token_id:")) for token in logprobs.tokens]


@pytest.mark.parametrize("stream", [False, True])
def test_token_ids_in_and_out_equal_the_offline_ones(server, bare_dir, stream):
    offline = LLM(str(bare_dir), num_gpu_blocks=300)
    params = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=6, logprobs=1, config_per_field=True)
    expected = [c.token_ids for out in offline.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
                                                        params, use_tqdm=False) for c in out.outputs]
    client = server.client()
    request = dict(model="bare", prompt=PROMPTS, n=2, temperature=1.0, seed=7, max_tokens=6, logprobs=1)
    if stream:
        got: dict[int, list[int]] = {}
        for chunk in client.completions.create(**request, stream=True):
            for choice in chunk.choices:
                assert choice.text == ""
                got.setdefault(choice.index, []).extend(ids_of(choice.logprobs))
        assert [got[i] for i in range(4)] == expected
    else:
        choices = client.completions.create(**request).choices
        assert [c.text for c in choices] == [""] * 4
        assert [ids_of(c.logprobs) for c in choices] == expected
        assert all(set(c.logprobs.text_offset) == {0} for c in choices)


def test_text_is_refused_and_the_engine_lives_on(server):
    client = server.client()
    for call, param in ((lambda: client.completions.create(model="bare", prompt="some text"), "prompt"),
                        (lambda: client.completions.create(model="bare", prompt=PROMPTS[0], stop=["x"]), "stop")):
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        assert caught.value.body["param"] == param, caught.value.body
    with server.http() as http:
        refused = http.post("/v1/summarize", json={"model": "bare", "input": "some text"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model", refused.text
    done = client.completions.create(model="bare", prompt=PROMPTS[1], max_tokens=3, temperature=0)
    assert done.choices[0].finish_reason and done.usage.completion_tokens == 3
    server.wait_all_blocks_free()

"""Translations over `/v1/completions`: `source_lang` and `target_lang` make text prompts what
`encdec translate` makes of them (mBART-50's codes with the target forced first, a Marian
model's `>>fr<<`, T5's task prefix and task parameters), and the answers are Hugging Face's
`generate()`'s; a language the checkpoint cannot take is a 400 naming its field."""
from __future__ import annotations

import json

import httpx
import pytest
from transformers import AutoConfig, AutoTokenizer

from tests.entrypoints.remote_server import RemoteServer
from tests.family_checkpoints import make_family_checkpoint
from tests.hf_reference import hf_texts

TEXTS = ["The rain in spain falls mainly on the plain.", "We need more chairs for the meeting room.",
         "Café crème brûlée à Zürich, naïve façade, déjà vu.", "The quick brown fox jumps over the lazy dog.",
         "東京は日本の首都です。", "Hi", "Многие языки используют кириллицу.", "I love pizza and sushi."]
# facebook/mbart-large-50-many-to-many-mmt's beams, shorter
MBART_GENERATION = {"num_beams": 5, "early_stopping": True, "max_length": 120, "decoder_start_token_id": 2,
                    "forced_eos_token_id": 2, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("translators")
    dirs = {family: make_family_checkpoint(family, folder / family, seed=1) for family in ("mbart-50", "marian", "t5")}
    (dirs["mbart-50"] / "generation_config.json").write_text(json.dumps(MBART_GENERATION))
    return dirs


@pytest.fixture(scope="module")
def server(checkpoints):
    args = [arg for family, folder in checkpoints.items() for arg in
            ("--model", str(folder), "--served-model-name", family)]
    remote = RemoteServer([*args, "--num-gpu-blocks", "600"])
    yield remote
    remote.stop()


def translate(server, model: str, **body) -> list[str]:
    result = server.client().completions.create(model=model, prompt=TEXTS, extra_body=body)
    return [choice.text for choice in result.choices]


@pytest.mark.extended
def test_mbart50_beams_rank_as_hugging_faces(server, checkpoints):
    """The target code is the forced first token, counted as generated: the beams' length
    penalty ranks them as Hugging Face's (with the code as decoder prompt it did not)."""
    model_dir = checkpoints["mbart-50"]
    fr = AutoTokenizer.from_pretrained(str(model_dir)).convert_tokens_to_ids("fr_XX")
    expected = hf_texts(model_dir, TEXTS, src_lang="en_XX", forced_bos_token_id=fr)
    assert translate(server, "mbart-50", source_lang="en_XX", target_lang="fr") == expected
    assert len(set(expected)) == len(TEXTS)


def test_marian_and_t5_take_their_own_language_forms(server, checkpoints):
    assert translate(server, "marian", target_lang="de", max_tokens=8) == hf_texts(
        checkpoints["marian"], [f">>de<< {text}" for text in TEXTS], max_new_tokens=8)
    task = dict(AutoConfig.from_pretrained(str(checkpoints["t5"])).task_specific_params["translation_en_to_de"])
    prefix = task.pop("prefix")  # the pipeline's settings: 4 beams
    assert translate(server, "t5", source_lang="en", target_lang="de", max_tokens=20) == hf_texts(
        checkpoints["t5"], [prefix + text for text in TEXTS], **task, max_new_tokens=20)


@pytest.mark.parametrize("model, body, param, message", [
    ("mbart-50", dict(source_lang="zz", target_lang="fr_XX"), "source_lang", "unknown language 'zz'"),
    ("mbart-50", dict(target_lang="fr_XX"), "source_lang", "give the source language"),
    ("mbart-50", dict(source_lang="en_XX", target_lang="fr", prompt=[5, 6]), "target_lang", "text prompts"),
    ("mbart-50", dict(source_lang="en_XX", target_lang="fr", decoder_prompt="fr_XX"), "decoder_prompt",
     "decoder_prompt cannot be combined"),
    ("mbart-50", dict(source_lang="en_XX", target_lang="fr", truncate_prompt_tokens=5), "truncate_prompt_tokens",
     "drop the translation's own"),
    ("marian", dict(target_lang="it"), "target_lang", "unknown target language 'it'"),
    ("marian", dict(source_lang="en"), "target_lang", "give the target language, one of ['de', 'fr']"),
    ("t5", dict(source_lang="en", target_lang="xx"), "target_lang", "has no translation_en_to_xx task"),
    ("t5", dict(source_lang="xx", target_lang="de"), "source_lang", "has no translation_xx_to_de task"),
    ("t5", dict(source_lang="en"), "target_lang", "T5 translates with a source and a target language"),
    ("marian", dict(target_lang="fr", prompt="word " * 60_000), "prompt", "tokens; the model takes 1 to 512"),
])
def test_languages_the_checkpoint_cannot_take_are_refused_by_field(server, model, body, param, message):
    response = httpx.post(f"{server.url}/v1/completions", json={"model": model, "prompt": TEXTS[0], **body},
                          timeout=60)
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["type"]) == (400, param, "invalid_request_error")
    assert message in error["message"]

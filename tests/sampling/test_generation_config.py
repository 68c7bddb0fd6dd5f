"""A checkpoint's generation config fills the sampling params a request leaves unset."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, GenerationConfig

from encdec import LLM, SamplingParams
from encdec.entrypoints.summaries import summary_params
from encdec.generation_config import (GenerationDefaults, load_generation_defaults,
                                      resolve_sampling_params)
from tests.bart_checkpoints import CORPUS, make_bart_checkpoint
from tests.conftest import assert_all_blocks_free

CNN = dict(num_beams=4, length_penalty=2.0, max_length=142, min_length=56, no_repeat_ngram_size=3,
           early_stopping=True, forced_bos_token_id=0, forced_eos_token_id=2)
MAX_DECODER_LEN = 1024


def resolve(params: SamplingParams, config: dict = CNN, prompt_len: int = 1) -> SamplingParams:
    return resolve_sampling_params(params, GenerationDefaults.from_dict(config), prompt_len,
                                   MAX_DECODER_LEN)


def test_cnn_config_means_hugging_face_beam_search():
    p = resolve(SamplingParams())
    assert (p.use_beam_search, p.beam_width, p.temperature, p.n) == (True, 4, 0.0, 1)
    assert (p.length_penalty, p.early_stopping, p.no_repeat_ngram_size) == (2.0, True, 3)
    assert (p.forced_bos_token_id, p.forced_eos_token_id, p.repetition_penalty) == (0, 2, 1.0)
    # max_length / min_length count the decoder prompt: 142 - 1 and 56 - 1 new tokens.
    assert (p.max_tokens, p.min_tokens) == (141, 55)
    longer_prompt = resolve(SamplingParams(), prompt_len=3)
    assert (longer_prompt.max_tokens, longer_prompt.min_tokens) == (139, 53)
    assert p.max_num_seqs == 4


def test_request_settings_override_the_config():
    p = resolve(SamplingParams(beam_width=2, early_stopping=False, no_repeat_ngram_size=0,
                               max_tokens=30, min_tokens=5))
    assert (p.beam_width, p.early_stopping, p.no_repeat_ngram_size) == (2, False, 0)
    assert (p.max_tokens, p.min_tokens, p.length_penalty, p.forced_eos_token_id) == (30, 5, 2.0, 2)
    capped = resolve(SamplingParams(max_tokens=20))  # the config's min_length ends at max_tokens
    assert (capped.max_tokens, capped.min_tokens) == (20, 20)
    greedy = resolve(SamplingParams(use_beam_search=False))
    assert (greedy.use_beam_search, greedy.temperature, greedy.no_repeat_ngram_size) == (False, 0.0, 3)


def test_ignore_eos_drops_the_configs_forced_eos():
    """vLLM's `ignore_eos` asks for no end of sequence: not even the config's forced one at
    max_tokens (a request's own `forced_eos_token_id` stays)."""
    assert resolve(SamplingParams(max_tokens=1)).forced_eos_token_id == 2
    assert resolve(SamplingParams(max_tokens=1, ignore_eos=True)).forced_eos_token_id is None
    assert resolve(SamplingParams(ignore_eos=True, forced_eos_token_id=5)).forced_eos_token_id == 5


def test_allowed_token_ids_drop_the_configs_forced_tokens_they_leave_out():
    """vLLM's `allowed_token_ids` leave no room for a forced token outside them: the config's
    forced BOS and EOS give way (a request's own stay, and fail on the step they are due)."""
    p = resolve(SamplingParams(allowed_token_ids=[7, 9]))
    assert (p.forced_bos_token_id, p.forced_eos_token_id) == (None, None)
    p = resolve(SamplingParams(allowed_token_ids=[0, 2, 7]))
    assert (p.forced_bos_token_id, p.forced_eos_token_id) == (0, 2)
    p = resolve(SamplingParams(allowed_token_ids=[7], forced_eos_token_id=5))
    assert (p.forced_bos_token_id, p.forced_eos_token_id) == (None, 5)


def test_setting_temperature_asks_for_plain_vllm_decoding():
    p = resolve(SamplingParams(temperature=0.0))
    assert (p.use_beam_search, p.max_tokens, p.min_tokens, p.no_repeat_ngram_size) == (False, 16, 0, 0)
    assert p.forced_bos_token_id is None and p.forced_eos_token_id is None
    beams = resolve(SamplingParams(temperature=0.0, beam_width=3))
    assert (beams.use_beam_search, beams.length_penalty, beams.early_stopping) == (True, 1.0, False)


def test_other_configs():
    sample = resolve(SamplingParams(), dict(do_sample=True, temperature=0.7, top_p=0.9))
    assert (sample.temperature, sample.top_k, sample.top_p, sample.min_p) == (0.7, 50, 0.9, 0.0)
    min_p = resolve(SamplingParams(), dict(do_sample=True, min_p=0.05))
    assert (min_p.temperature, min_p.min_p) == (1.0, 0.05)
    assert resolve(SamplingParams(), dict(min_p=0.05)).min_p == 0.0  # greedy: no sampling fields
    assert not sample.use_beam_search
    beams_over_sampling = resolve(SamplingParams(use_beam_search=True),
                                  dict(do_sample=True, num_beams=3))
    assert (beams_over_sampling.beam_width, beams_over_sampling.temperature) == (3, 0.0)
    new_tokens = resolve(SamplingParams(), dict(max_new_tokens=40, max_length=500, min_new_tokens=4))
    assert (new_tokens.max_tokens, new_tokens.min_tokens, new_tokens.temperature) == (40, 4, 0.0)
    hf_default = resolve(SamplingParams(), {})  # a generation config with none of these keys
    # Hugging Face: without max_length, 20 new tokens after the decoder prompt; greedy
    assert (hf_default.max_tokens, hf_default.temperature) == (20, 0.0)
    assert resolve(SamplingParams(), {}, prompt_len=4).max_tokens == 20
    assert resolve(SamplingParams(), dict(max_length=20), prompt_len=4).max_tokens == 16  # a set one counts the prompt
    room = resolve_sampling_params(SamplingParams(), GenerationDefaults(), 10, 14)
    assert (room.max_tokens, room.temperature, room.min_tokens) == (5, 1.0, 0)  # built-in 16, capped
    config_room = resolve_sampling_params(SamplingParams(), GenerationDefaults.from_dict(dict(max_length=500)), 10, 64)
    assert config_room.max_tokens == 55  # a config's length is capped by the decoder's room


def test_max_tokens_past_the_decoders_room_is_refused():
    """As vLLM refuses it: a request's own max_tokens above what the decoder holds after its
    prompt is an error that names the limit, not a silent cap. The last new token is never fed
    back, so it takes no position: 64 positions after 10 prompt tokens hold 55 new ones."""
    assert resolve_sampling_params(SamplingParams(max_tokens=55), GenerationDefaults(), 10, 64).max_tokens == 55
    with pytest.raises(ValueError, match=r"^max_tokens=56 .* 64 positions .* 10 tokens, so at most 55 \(the last"):
        resolve_sampling_params(SamplingParams(max_tokens=56), GenerationDefaults(), 10, 64)


def test_min_tokens_past_the_default_max_tokens_or_the_room_says_which():
    """Only min_tokens set, above the max_tokens it would get: the error says it is the default
    one, not a max_tokens the request never sent; above the decoder's room, it says that."""
    config = GenerationDefaults.from_dict(dict(max_length=40))
    for defaults, max_tokens in ((config, 39), (GenerationDefaults(), 16)):
        with pytest.raises(ValueError, match=rf"^min_tokens=60 is more than the default max_tokens={max_tokens} "
                                             r"\(the checkpoint's generation config, else encdec's\); set max_tokens too$"):
            resolve_sampling_params(SamplingParams(min_tokens=60), defaults, 1, 64)
    with pytest.raises(ValueError, match=r"^min_tokens=60 is more than the decoder has room for: at most 11 "
                                         r"after a decoder prompt of 10$"):
        resolve_sampling_params(SamplingParams(min_tokens=60), config, 10, 20)
    both = resolve_sampling_params(SamplingParams(min_tokens=50, max_tokens=60), config, 1, 64)
    assert (both.min_tokens, both.max_tokens) == (50, 60)


def test_beam_search_without_a_width_names_where_the_width_came_from():
    with pytest.raises(ValueError, match=r"^use_beam_search=True needs beam_width >= 2; the request sets none, "
                                         r"and the default \(the checkpoint's num_beams, else 1\) is 1$"):
        resolve(SamplingParams(use_beam_search=True), config={})
    assert resolve(SamplingParams(use_beam_search=True)).beam_width == 4  # the config's


def test_loading(tmp_path):
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "config.json").write_text(json.dumps(dict(num_beams=2)))
    (tmp_path / "gen" / "generation_config.json").write_text(json.dumps(dict(CNN, pad_token_id=1)))
    assert load_generation_defaults(str(tmp_path / "gen")) == GenerationDefaults(CNN, True)
    (tmp_path / "old").mkdir()  # older checkpoints keep the fields in config.json
    (tmp_path / "old" / "config.json").write_text(json.dumps(dict(CNN, d_model=16, num_beams=None)))
    old = load_generation_defaults(str(tmp_path / "old"))
    assert old.found and old.get("num_beams") == 1 and old.get("min_length") == 56
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "config.json").write_text(json.dumps(dict(d_model=16)))
    assert not load_generation_defaults(str(tmp_path / "none")).found
    assert not load_generation_defaults("tiny.en").found  # a name, not a directory
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "generation_config.json").write_text("{not json")
    assert not load_generation_defaults(str(tmp_path / "bad")).found


T5_TASKS = {"summarization": dict(early_stopping=True, length_penalty=2.0, max_length=200, min_length=30,
                                  no_repeat_ngram_size=3, num_beams=4, prefix="summarize: "),
            "translation_en_to_de": dict(early_stopping=True, max_length=300, num_beams=4,
                                         prefix="translate English to German: ")}


def test_task_parameters_override_the_config_for_requests_that_name_the_task(tmp_path):
    """t5-small's config.json: its generation_config.json sets no decoding, its
    task_specific_params do, for the requests of that task (as Hugging Face's pipelines)."""
    (tmp_path / "config.json").write_text(json.dumps(dict(d_model=16, task_specific_params=T5_TASKS)))
    (tmp_path / "generation_config.json").write_text(json.dumps(dict(decoder_start_token_id=0, eos_token_id=1)))
    defaults = load_generation_defaults(str(tmp_path))
    assert defaults.tasks["translation_en_to_de"] == dict(early_stopping=True, max_length=300, num_beams=4)
    assert defaults.for_task("translation_en_to_fr") is defaults.for_task(None) is defaults

    def resolved(task):
        return resolve_sampling_params(SamplingParams(config_task=task), defaults, 1, 512)

    summary = resolved("summarization")
    assert (summary.use_beam_search, summary.beam_width, summary.max_tokens, summary.min_tokens) == (True, 4, 199, 29)
    assert (summary.length_penalty, summary.no_repeat_ngram_size, summary.early_stopping) == (2.0, 3, True)
    assert (resolved("translation_en_to_de").max_tokens, resolved("translation_en_to_de").min_tokens) == (299, 0)
    plain = resolved(None)
    assert (plain.use_beam_search, plain.max_tokens, plain.no_repeat_ngram_size) == (False, 20, 0)
    # summaries name their task; a checkpoint whose only decoding settings are a task's has them
    assert summary_params(defaults).config_task == "summarization"
    bare = GenerationDefaults(tasks={"summarization": dict(num_beams=2)})
    assert summary_params(bare).max_tokens is None and summary_params(bare, task=None).max_tokens == 128
    (tmp_path / "config.json").write_text(json.dumps(dict(task_specific_params=["summarization"])))
    assert load_generation_defaults(str(tmp_path)).tasks == {}
    with pytest.raises(ValueError, match="config_task must be a task name"):
        SamplingParams(config_task=["summarization"])


def test_engine_reads_the_checkpoint_config(tiny_bart_dir):
    """The tiny checkpoint's generation config only sets forced_eos_token_id: HF-style greedy
    with EOS forced as the last token; an explicit temperature decodes without it."""
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=64)
    text = "The rain in spain falls mainly on the plain."
    (default,) = llm.generate(text, SamplingParams(max_tokens=10), use_tqdm=False)
    (plain,) = llm.generate(text, SamplingParams(temperature=0.0, max_tokens=10), use_tqdm=False)
    assert default.outputs[0].token_ids[:-1] == plain.outputs[0].token_ids[:-1]
    assert default.outputs[0].token_ids[-1] == 2 != plain.outputs[0].token_ids[-1]
    with pytest.raises(ValueError, match="beam_width >= 2"):
        llm.generate(text, SamplingParams(use_beam_search=True), use_tqdm=False)


def test_summaries_with_a_temperature_keep_the_config():
    """A summary (the server's and `encdec summarize`'s settings) takes each unset field from
    the config, also with a set temperature: 0 keeps its beam search; above 0 samples within
    its lengths (counted as Hugging Face counts them: with the default decoder prompt, BART
    <DEC> <BOS>), no_repeat_ngram_size and forced tokens."""
    defaults = GenerationDefaults.from_dict(CNN)

    def summary(**options) -> SamplingParams:
        return resolve_sampling_params(summary_params(defaults, **options), defaults, 2, MAX_DECODER_LEN)

    assert summary(temperature=0.0) == summary()
    assert (summary().use_beam_search, summary().beam_width, summary().no_repeat_ngram_size) == (True, 4, 3)
    p = summary(temperature=0.7, seed=1)
    assert (p.temperature, p.use_beam_search, p.beam_width, p.max_tokens, p.min_tokens) == (0.7, False, 1, 140, 54)
    assert (p.no_repeat_ngram_size, p.forced_bos_token_id, p.forced_eos_token_id) == (3, 0, 2)
    short = summary(temperature=0.0, max_tokens=30)
    assert (short.max_tokens, short.min_tokens, short.beam_width) == (30, 30, 4)
    beams = GenerationDefaults.from_dict(dict(num_beams=2))
    unset = resolve_sampling_params(summary_params(beams, temperature=0.0), beams, 2, MAX_DECODER_LEN)
    assert (unset.max_tokens, unset.min_tokens, unset.beam_width) == (20, 0, 2)  # Hugging Face's 20 new tokens


def test_a_set_temperature_only_decides_sampling_when_each_field_takes_the_config():
    """config_per_field: a sampling config's top_p stays with a request's own temperature, and
    temperature 0 on it decodes greedily; a request's own fields still win."""
    sampling = dict(do_sample=True, temperature=0.6, top_p=0.9, top_k=20, max_new_tokens=30)
    hotter = resolve(SamplingParams(temperature=1.2, config_per_field=True), sampling)
    assert (hotter.temperature, hotter.top_p, hotter.top_k, hotter.max_tokens) == (1.2, 0.9, 20, 30)
    greedy = resolve(SamplingParams(temperature=0.0, config_per_field=True), sampling)
    assert (greedy.temperature, greedy.top_p, greedy.top_k, greedy.max_tokens) == (0.0, 1.0, -1, 30)
    own = resolve(SamplingParams(temperature=0.0, no_repeat_ngram_size=0, use_beam_search=False,
                                 config_per_field=True))
    assert (own.use_beam_search, own.no_repeat_ngram_size, own.forced_eos_token_id) == (False, 0, 2)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_more_generation_config_fields_decode_as_hugging_face(tmp_path, num_beams):
    """Fields real checkpoints ship (opus-mt: bad_words_ids [[pad]]) decode as `generate()`
    decodes them: bad words, suppressed tokens (always and at the start), EOS as a list, a
    decoder_start_token_id that only the generation config has right, no max_length (20 new
    tokens). The banned tokens are the ones the model picks without them, so each rule shows."""
    model_dir = make_bart_checkpoint(tmp_path / "m", seed=3, decoder_start_token_id=0)
    (model_dir / "generation_config.json").unlink(missing_ok=True)
    prompts = CORPUS[:6]
    free = LLM(model=str(model_dir), num_gpu_blocks=128).generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    outputs = [o.outputs[0].token_ids for o in free]
    common = [t for t, _ in Counter(t for ids in outputs for t in ids).most_common() if t not in (0, 1, 2)]
    first = outputs[0][0]
    bigram = next((a, b) for ids in outputs for a, b in zip(ids, ids[1:]) if b not in (common[0], first))
    config = GenerationConfig(decoder_start_token_id=2, bos_token_id=0, pad_token_id=1, num_beams=num_beams,
                              eos_token_id=[2, common[2]], bad_words_ids=[[1], [common[1]], list(bigram)],
                              suppress_tokens=[common[0]], begin_suppress_tokens=[first])
    config.save_pretrained(str(model_dir))

    llm = LLM(model=str(model_dir), num_gpu_blocks=128)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(), use_tqdm=False)]
    hf = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    tokenizer = llm.get_tokenizer()
    expected = []
    with torch.inference_mode():
        for text in prompts:
            ids = hf.generate(**tokenizer(text, return_tensors="pt"),
                              decoder_input_ids=torch.tensor([[2, 0]]))[0].tolist()[2:]
            expected.append(ids[:ids.index(1)] if 1 in ids else ids)  # no padding
    assert got == expected
    assert any(len(ids) == 20 for ids in got)  # 20 new tokens without max_length
    assert any(ids[-1] == common[2] for ids in got)  # the config's second EOS stops
    assert all(common[0] not in ids and common[1] not in ids and ids[0] != first for ids in got)
    # ignore_eos ignores the config's other EOS too (vLLM leaves them out of stop_token_ids)
    ignoring = [o.outputs[0].token_ids for o in llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), use_tqdm=False)]
    assert all(len(ids) == 20 for ids in ignoring) and any(common[2] in ids for ids in ignoring)
    assert_all_blocks_free(llm)

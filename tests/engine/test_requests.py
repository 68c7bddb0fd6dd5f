"""Request-level behaviour: validation at the edge, n > 1 sampling, seeds, aborts."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

from encdec import LLM, SamplingParams, TokensPrompt
from tests.conftest import assert_all_blocks_free

TEXT = "The rain in spain falls mainly on the plain."
RAM_GIB = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


@pytest.fixture(scope="module")
def llm(tiny_bart_dir):
    return LLM(model=str(tiny_bart_dir), num_gpu_blocks=128)


@pytest.mark.parametrize("prompt, params, message", [
    ("", SamplingParams(), "encoder_prompt is empty"),
    (TokensPrompt(prompt_token_ids=[]), SamplingParams(), "encoder_prompt is empty"),
    (TokensPrompt(prompt_token_ids=[5] * 300), SamplingParams(), "more than the model's maximum of 256"),
    (TokensPrompt(prompt_token_ids=[0, 1000, 2]), SamplingParams(), r"outside the vocabulary \[0, 1000\)"),
    (TokensPrompt(prompt_token_ids=[0, -1, 2]), SamplingParams(), "outside the vocabulary"),
    (TokensPrompt(prompt_token_ids=np.zeros((2, 2), dtype=np.int64)), SamplingParams(), "must be 1-D"),
    ("rain \ud800", SamplingParams(), "encoder_prompt is not valid Unicode"),
    ({"encoder_prompt": TEXT, "decoder_prompt": "\udc00"}, SamplingParams(), "decoder_prompt is not valid Unicode"),
    ({"encoder_prompt": TEXT, "decoder_prompt": [7] * 300}, SamplingParams(),
     "decoder_prompt has 301 tokens"),
    ({"prompt_ids": [1, 2]}, SamplingParams(), "unknown keys"),
    (12345, SamplingParams(), "is not a prompt"),
    ({"encoder_prompt": TEXT, "decoder_prompt": TEXT, "extra": 1}, SamplingParams(), "unknown keys"),
    ({"prompt": "", "multi_modal_data": {"audio": ([0.0], 16000)}}, SamplingParams(),
     "takes no audio"),
    ({"prompt": TEXT, "prompt_token_ids": [5, 6]}, SamplingParams(), "takes 'prompt' or 'prompt_token_ids', not both"),
    ({"encoder_prompt": {}, "decoder_prompt": None}, SamplingParams(),
     r"encoder_prompt holds neither 'prompt' nor 'prompt_token_ids'"),
    ({"prompt": TEXT, "mm_processor_kwargs": {"sampling_rate": 8000}}, SamplingParams(),
     r"encoder_prompt\['mm_processor_kwargs'\]: the audio processor takes no options"),
    ({"prompt": TEXT, "lora": 1, "mm_processor_kwargs": {}}, SamplingParams(), r"has unknown keys \['lora'\]"),
])
def test_bad_prompts_raise_and_leave_nothing(llm, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([TEXT, prompt], params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
    (dict(max_tokens=-3), "max_tokens must be an integer >= 1"),
    (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
    (dict(temperature=float("inf")), "temperature must be a finite number >= 0, got inf"),
    (dict(logits_processors=[1]), "logits_processors must be a list of callables"),
    (dict(bad_words_ids=[[]]), "bad_words_ids must be a list of non-empty lists of token ids"),
    (dict(bad_words_ids=[5]), "bad_words_ids must be a list of non-empty lists of token ids"),
    (dict(suppress_tokens=[-1]), "suppress_tokens must be non-negative integers"),
    (dict(begin_suppress_tokens="5"), "begin_suppress_tokens must be a list of token ids"),
    (dict(stop_token_ids=[None]), "stop_token_ids must be a list of token ids"),
    (dict(logits_processors=lambda ids, row: row), "logits_processors must be a list of callables"),
    (dict(allowed_token_ids=[]), "allowed_token_ids must not be empty"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens must be -1 .* or an integer >= 1, got 0"),
    (dict(logit_bias={1: float("nan")}), "logit_bias values must be numbers between -1e10 and 1e10, got nan"),
    (dict(logit_bias={1: 1e39}), "logit_bias values must be numbers between -1e10 and 1e10, got 1e"),
    (dict(logit_bias=[1]), "logit_bias must be a dict of token id -> number"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-2), r"top_k must be -1 or 0 \(disabled\) or an integer >= 1, got -2"),
    (dict(n=0), "n must be an integer >= 1"),
    (dict(n=None), "n must be an integer >= 1, got None"),
    (dict(min_tokens=5, max_tokens=3), "min_tokens must be <= max_tokens"),
    (dict(logprobs=-2), r"logprobs must be -1 \(the whole vocabulary\) or an integer >= 0, got -2"),
    (dict(logprobs=False), "logprobs must be an integer, got False"),
    (dict(seed=2**64), r"seed must be an integer in \[-2\*\*63, 2\*\*64\)"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(max_tokens=True), "max_tokens must be an integer, got True"),
    (dict(temperature="0.5"), "temperature must be a number, got '0.5'"),
    (dict(stop_token_ids=5), "stop_token_ids must be a list of token ids"),
    (dict(ignore_eos="no"), "ignore_eos must be True or False"),
    (dict(skip_special_tokens=None), "skip_special_tokens must be True or False"),
    (dict(beam_width=2, patience=float("inf")), "patience must be a finite number > 0"),
    (dict(beam_width=2, patience=0.01), r"round\(beam_width \* patience\) must be >= 1"),
    (dict(beam_width=2, beam_rules="openai"), r"beam_rules must be one of \['hf', 'whisper'\]"),
    (dict(beam_width=2, n=3, beam_rules="whisper"), r"n=3 must be <= beam_width=2"),
    (dict(beam_width=2, beam_rules="whisper", stop=["."]), r"stop strings are not taken with beam_rules='whisper'"),
    (dict(beam_width=2, patience=2.0, n=5, beam_rules="whisper"),
     r"n=5 must be <= round\(beam_width \* patience\)=4"),
])
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("options, message", [
    (dict(num_gpu_blocks=10.0), r"^num_gpu_blocks must be an integer >= 1 or None, got 10.0$"),
    (dict(num_gpu_blocks=True), r"^num_gpu_blocks must be an integer >= 1 or None, got True$"),
    (dict(block_size=2.5), r"^block_size must be an integer >= 1, got 2.5$"),
    (dict(swap_space=float("nan")), r"^swap_space must be a number >= 0, got nan$"),
    (dict(kv_cache_space=float("inf")), r"^kv_cache_space must be a number > 0, got inf$"),
    (dict(max_num_seqs="8"), r"^max_num_seqs must be an integer >= 1, got '8'$"),
    (dict(kv_cache_space=1e-7), r"^kv_cache_space=1e-07 \(GiB\) holds no KV cache block \(one takes \d+ bytes\)$"),
    (dict(swap_space=1e6), r"^kv_cache_space=2 and swap_space=1e\+06: the KV cache would take 1000002.0 GiB, "
                           r"more than this machine's memory"),
    (dict(num_gpu_blocks=10**12), r"^num_gpu_blocks=1000000000000 and swap_space=1: the KV cache would take "
                                  r"\d+\.\d GiB, more than"),
    # each fits the machine's memory, not both (on the CPU both are in it)
    (dict(kv_cache_space=0.6 * RAM_GIB, swap_space=0.6 * RAM_GIB), r"^kv_cache_space=\S+ and swap_space=\S+: "
                                                                    r"the KV cache would take"),
    (dict(dtype=torch.float64), r"^dtype must be one of \['bfloat16', 'float', 'float16', 'float32', 'half'\] "
                                r"or 'auto', got torch.float64$"),
    (dict(dtype=torch.int8), r"^dtype must be one of .* got torch.int8$"),
    (dict(device="meta"), r"^device must be 'cpu', 'cuda' \(or 'cuda:N'\) or 'auto', got 'meta'$"),
    (dict(device="gpu"), r"^device must be .* got 'gpu'$"),
])
def test_bad_engine_options_name_the_option(tiny_bart_dir, options, message):
    with pytest.raises(ValueError, match=message):
        LLM(model=str(tiny_bart_dir), **options)


@pytest.mark.parametrize("request_id", [7, None, b"x"])
def test_a_request_id_is_a_string(llm, request_id):
    """An id that is not a string could not be aborted (vLLM takes strings only)."""
    with pytest.raises(ValueError, match=f"^request_id must be a string, got {request_id!r}$"):
        llm.llm_engine.add_request(request_id, TEXT, SamplingParams(max_tokens=2))
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.parametrize("prompts", [None, b"rain", 12345])
def test_what_is_not_prompts_is_refused(llm, prompts):
    with pytest.raises(ValueError, match="prompts must be a prompt or a list of prompts"):
        llm.generate(prompts, SamplingParams(max_tokens=2), use_tqdm=False)


def test_vllms_spellings_mean_what_they_mean_there(llm):
    """top_k=0 is no top-k, seed=-1 no seed, logprobs=True one, logprobs=-1 the whole vocabulary."""
    def sample(**kwargs):
        params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, **kwargs)
        [out] = llm.generate(TEXT, params, use_tqdm=False)
        return out.outputs[0]

    assert sample(top_k=0, seed=7).token_ids == sample(top_k=-1, seed=7).token_ids
    assert SamplingParams(seed=-1).seed is None and SamplingParams(logprobs=True).logprobs == 1
    assert SamplingParams(allowed_token_ids=[7, 5, 7, 5]).allowed_token_ids == [7, 5]  # each once
    vocab = llm.llm_engine.model_config.vocab_size
    entries = sample(seed=7, logprobs=-1).logprobs
    assert len(entries) == 8 and all(len(entry) == vocab for entry in entries)
    assert_all_blocks_free(llm)


def test_logit_bias_and_allowed_token_ids(llm):
    """vLLM's: a bias added to some tokens' logits, and a set of tokens no other is chosen from."""
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    def tokens(**kwargs):
        [out] = llm.generate(TEXT, dataclasses.replace(greedy, **kwargs), use_tqdm=False)
        return out.outputs[0].token_ids

    free = tokens()
    assert tokens(logit_bias={free[0]: -100.0})[0] != free[0]
    assert tokens(logit_bias={7: 100.0}) == [7] * 6
    assert set(tokens(allowed_token_ids=[7, 9])) <= {7, 9}
    with pytest.raises(ValueError, match=r"logit_bias: 5000 is not a token id of this model \(vocab_size=1000\)"):
        tokens(logit_bias={5000: 1.0})
    assert_all_blocks_free(llm)


def test_truncate_prompt_tokens_keeps_the_last_ones(llm):
    params = SamplingParams(temperature=0.0, max_tokens=3)
    [cut] = llm.generate(TokensPrompt(prompt_token_ids=[0, 5, 9, 7, 2]),
                         dataclasses.replace(params, truncate_prompt_tokens=3), use_tqdm=False)
    [short] = llm.generate(TokensPrompt(prompt_token_ids=[9, 7, 2]), params, use_tqdm=False)
    assert cut.encoder_prompt_token_ids == [9, 7, 2] and cut.outputs[0].token_ids == short.outputs[0].token_ids
    limit = llm.llm_engine.model_config.max_encoder_len
    [whole] = llm.generate(TokensPrompt(prompt_token_ids=[5] * (limit + 10)),
                           dataclasses.replace(params, truncate_prompt_tokens=-1), use_tqdm=False)
    assert len(whole.encoder_prompt_token_ids) == limit
    with pytest.raises(ValueError, match=f"truncate_prompt_tokens is {limit + 1}, more than the encoder's {limit}"):
        llm.generate(TokensPrompt(prompt_token_ids=[5, 9]),
                     dataclasses.replace(params, truncate_prompt_tokens=limit + 1), use_tqdm=False)
    assert_all_blocks_free(llm)


def test_abort_request_takes_a_list_of_ids(llm):
    """As vLLM's `abort_request(request_ids)`; it used to ignore a list silently."""
    engine = llm.llm_engine
    for request_id in "abc":
        engine.add_request(request_id, TEXT, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    engine.step()
    engine.abort_request(["a", "b"])
    assert engine.get_num_unfinished_requests() == 1
    engine.abort_request("c")
    assert_all_blocks_free(llm)


def test_the_engine_seed_may_be_none(tiny_bart_dir):
    """vLLM's `seed=None`: a fresh seed for unseeded requests; a seed that is no integer is named."""
    with pytest.raises(ValueError, match="seed must be an integer in"):
        LLM(model=str(tiny_bart_dir), num_gpu_blocks=32, seed="1")
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=32, seed=None)
    [out] = llm.generate(TEXT, SamplingParams(temperature=1.0, max_tokens=4), use_tqdm=False)
    assert len(out.outputs[0].token_ids) >= 1
    assert_all_blocks_free(llm)


def test_token_ids_from_numpy_torch_or_a_tuple(llm):
    params = SamplingParams(max_tokens=4, temperature=0.0)
    expected = llm.generate([TokensPrompt(prompt_token_ids=[0, 5, 9, 2])], params, use_tqdm=False)
    for ids in (np.array([0, 5, 9, 2]), torch.tensor([0, 5, 9, 2])):
        got = llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)
        assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
    assert len(llm.generate((0, 5, 9, 2), params, use_tqdm=False)) == 1  # one prompt, not four
    for ids in (np.array([0, 5, 9, 2]), torch.tensor([0, 5, 9, 2])):  # a bare 1-D array: one prompt too
        [got] = llm.generate(ids, params, use_tqdm=False)
        assert got.outputs[0].token_ids == expected[0].outputs[0].token_ids
    rows = llm.generate(np.array([[0, 5, 9, 2], [0, 5, 9, 2]]), params, use_tqdm=False)  # a prompt a row
    assert [r.outputs[0].token_ids for r in rows] == [expected[0].outputs[0].token_ids] * 2
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("waveform", [np.zeros(1600, dtype=np.float32), torch.zeros(1600)])
def test_a_waveform_is_not_taken_for_token_ids(llm, waveform):
    with pytest.raises(ValueError, match=r"encoder_prompt is an array of .*float32, not token ids: "
                                         r"a waveform goes in \{'prompt': '', 'multi_modal_data'"):
        llm.generate(waveform, SamplingParams(max_tokens=2), use_tqdm=False)
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=3), SamplingParams(max_tokens=3, beam_width=2)])
def test_eos_forced_at_max_tokens_is_a_length_cut(llm, params):
    """The checkpoint's forced_eos_token_id ends every request at max_tokens with EOS (as
    Hugging Face's); the request was cut by its limit, so its finish_reason is "length"."""
    [out] = llm.generate(TEXT, params, use_tqdm=False)
    assert llm.llm_engine.model_config.eos_token_id == 2
    assert out.outputs[0].token_ids[-1] == 2 and len(out.outputs[0].token_ids) == 3
    assert out.outputs[0].finish_reason == "length"
    assert_all_blocks_free(llm)


def test_numpy_numbers_are_taken_as_python_ones():
    params = SamplingParams(n=np.int64(2), max_tokens=np.int32(5), temperature=np.float32(0.5),
                            stop_token_ids=np.array([3, 4]), ignore_eos=np.bool_(True))
    assert (params.n, params.max_tokens, params.temperature, params.stop_token_ids, params.ignore_eos) == (
        2, 5, 0.5, [3, 4], True)
    assert all(type(v) is int for v in (params.n, params.max_tokens, *params.stop_token_ids))


def test_greedy_with_n_above_one_is_refused(llm):
    with pytest.raises(ValueError, match="n=2 needs random sampling"):
        llm.generate(TEXT, SamplingParams(n=2, temperature=0.0), use_tqdm=False)
    assert_all_blocks_free(llm)


def test_n3_samples_share_one_encoder_run_and_cross_table(llm):
    engine = llm.llm_engine
    runs_before = engine.stats.num_encoder_runs
    engine.add_request("n3", TEXT, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12))
    engine.step()  # the prefill: one encoder run, then the group forks into three sequences
    group = engine.groups["n3"]
    seqs = group.get_seqs()
    assert len(seqs) == 3
    bm = engine.block_manager
    assert len(bm.cross_block_tables) == 1
    first_blocks = {bm.get_block_table(s)[0] for s in seqs}
    assert len(first_blocks) == 1 and bm.get_ref_count(first_blocks.pop()) == 3  # shared prompt block
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    (out,) = [o for o in outputs if o.finished]
    assert engine.stats.num_encoder_runs - runs_before == 1
    samples = [tuple(o.token_ids) for o in out.outputs]
    assert len(samples) == 3 and len(set(samples)) == 3
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("by", ["stop_token_ids", "stop"])
def test_a_finished_sample_gives_its_blocks_back_at_once(llm, by):
    """A sample that stops (at a stop token, or at a stop string) while its siblings go on frees
    its self blocks then, not when the whole request ends."""
    engine, bm = llm.llm_engine, llm.llm_engine.block_manager
    params = dict(n=4, seed=1, temperature=1.5, max_tokens=40)
    if by == "stop":  # the start of the longest sample's text, which no other sample has
        texts = [c.text for c in llm.generate(TEXT, SamplingParams(**params), use_tqdm=False)[0].outputs]
        longest = max(texts, key=len)
        params["stop"] = [next(longest[i:i + 3] for i in range(1, len(longest) - 3)
                               if not any(longest[i:i + 3] in t for t in texts if t != longest))]
    else:  # a fifth of the vocabulary
        params["stop_token_ids"] = list(range(3, engine.model_config.vocab_size, 5))
    engine.add_request("n4", TEXT, SamplingParams(**params))
    seen = False
    while engine.has_unfinished_requests():
        engine.step()
        group = engine.groups.get("n4")
        if group is not None and not group.is_finished():
            finished = [s for s in group.get_seqs() if s.is_finished()]
            assert all(s.seq_id not in bm.block_tables for s in finished)
            seen = seen or bool(finished)
    assert seen  # some sample stopped before the others
    assert_all_blocks_free(llm)


def test_seeded_request_ignores_the_rest_of_the_batch(llm):
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=1234, max_tokens=16)
    alone = llm.generate(TEXT, params, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=10 + i) for i in range(5)]
    batch = llm.generate(["Numbers like 3 and 14."] * 5 + [TEXT], others + [params], use_tqdm=False)
    assert batch[-1].outputs[0].token_ids == alone
    assert len(set(alone)) > 1


def test_each_sample_of_a_seeded_request_draws_from_its_own_seed(llm):
    """As vLLM's: the i-th of n samples is the one n=1 gives with seed + i, so a sample that
    stops early (here at a stop token) changes none of the others."""
    params = SamplingParams(temperature=1.0, seed=41, max_tokens=12, ignore_eos=True)
    alone = [llm.generate(TEXT, dataclasses.replace(params, seed=41 + i), use_tqdm=False)[0].outputs[0].token_ids
             for i in range(3)]
    together = [c.token_ids for c in llm.generate(TEXT, dataclasses.replace(params, n=3), use_tqdm=False)[0].outputs]
    assert together == alone and len(set(map(tuple, alone))) == 3
    stop = alone[0][4]
    ended = [c.token_ids for c in llm.generate(TEXT, dataclasses.replace(params, n=3, stop_token_ids=[stop]),
                                               use_tqdm=False)[0].outputs]
    assert ended == [ids[:ids.index(stop) + 1] if stop in ids else ids for ids in alone]
    assert len(ended[0]) < len(alone[0])
    assert_all_blocks_free(llm)


def test_unseeded_requests_follow_the_engine_seed(tiny_bart_dir):
    params = SamplingParams(temperature=1.0, max_tokens=12)
    runs = [LLM(model=str(tiny_bart_dir), num_gpu_blocks=64, seed=s).generate(TEXT, params, use_tqdm=False)
            for s in (3, 3, 4)]
    ids = [r[0].outputs[0].token_ids for r in runs]
    assert ids[0] == ids[1] and ids[0] != ids[2]


def test_min_tokens_stop_ids_and_logprobs(llm):
    free = llm.generate(TEXT, SamplingParams(temperature=0.0, max_tokens=10), use_tqdm=False)[0]
    first = free.outputs[0].token_ids[0]
    stopped = llm.generate(TEXT, SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[first]),
                           use_tqdm=False)[0].outputs[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
    assert stopped.text == ""  # as in vLLM: the stop token is in the ids, not in the text
    tokenizer, ids = llm.get_tokenizer(), free.outputs[0].token_ids
    end = next(i for i, t in enumerate(ids) if tokenizer.decode([t])) + 1  # a stop token with text
    shown = llm.generate(TEXT, SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[ids[end - 1]],
                                              include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert shown.token_ids == ids[:end] and shown.text == tokenizer.decode(ids[:end], skip_special_tokens=True)
    held = llm.generate(TEXT, SamplingParams(temperature=0.0, max_tokens=10, min_tokens=3,
                                             stop_token_ids=[first], logprobs=2),
                        use_tqdm=False)[0].outputs[0]
    assert first not in held.token_ids[:3] and len(held.token_ids) >= 3
    shown = held.token_ids[:-1] if held.finish_reason == "stop" else held.token_ids
    assert held.text == llm.get_tokenizer().decode(shown, skip_special_tokens=True)
    assert len(held.logprobs) == len(held.token_ids)
    assert all(tok in lp and len(lp) <= 3 for tok, lp in zip(held.token_ids, held.logprobs))
    bare = llm.generate(TEXT, SamplingParams(temperature=0.0, max_tokens=4, logprobs=0),
                        use_tqdm=False)[0].outputs[0]  # vLLM: just each sampled token's
    assert [list(lp) for lp in bare.logprobs] == [[t] for t in bare.token_ids]
    assert_all_blocks_free(llm)


def test_logprobs_are_vllms_logprob_entries(llm):
    """Each step's entries are `Logprob`s: the top k ranked 1 to k, the sampled token ranked
    one more than the tokens likelier than it (all of them shown here), each with its text."""
    tokenizer, vocab = llm.get_tokenizer(), llm.llm_engine.model_config.vocab_size
    params = SamplingParams(n=2, seed=3, temperature=1.5, max_tokens=6, logprobs=vocab)
    out = llm.generate(TEXT, params, use_tqdm=False)[0]
    for completion in out.outputs:
        for token, entries in zip(completion.token_ids, completion.logprobs):
            chosen = entries[token]
            likelier = [e for e in entries.values() if e.logprob > chosen.logprob]
            assert chosen.rank == len(likelier) + 1
            assert sorted(e.rank for e in entries.values()) == list(range(1, vocab + 1))
            assert chosen.decoded_token == tokenizer.decode([token])
        assert sum(e[t].logprob for t, e in zip(completion.token_ids, completion.logprobs)) == \
            pytest.approx(completion.cumulative_logprob, abs=1e-4)
    bare = llm.generate(TEXT, SamplingParams(temperature=0.0, max_tokens=3, logprobs=0, detokenize=False),
                        use_tqdm=False)[0].outputs[0]
    assert all(e[t].rank == 1 and e[t].decoded_token is None for t, e in zip(bare.token_ids, bare.logprobs))
    assert_all_blocks_free(llm)


def test_a_failing_logits_processor_raises_from_generate_and_leaves_nothing(llm):
    def broken(output_ids, row):
        raise ZeroDivisionError("in the user's processor")

    with pytest.raises(ZeroDivisionError, match="in the user's processor"):
        llm.generate([TEXT, TEXT], [SamplingParams(temperature=0.0, max_tokens=5),
                                    SamplingParams(temperature=0.0, max_tokens=5, logits_processors=[broken])],
                     use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests() and not llm.llm_engine.take_failures()
    assert_all_blocks_free(llm)
    assert len(llm.generate(TEXT, SamplingParams(temperature=0.0, max_tokens=5), use_tqdm=False)[0].outputs[0].token_ids) == 5


def test_a_processor_with_three_parameters_gets_the_decoder_prompt_first(llm):
    """vLLM's `(prompt_token_ids, output_token_ids, logits)` form (it used to fail mid-run)."""
    seen = []

    def ban_token_5(prompt_ids, output_ids, row):
        seen.append((list(prompt_ids), len(output_ids)))
        row[5] = -float("inf")
        return row

    [out] = llm.generate(TEXT, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                              logits_processors=[ban_token_5]), use_tqdm=False)
    assert seen == [([2, 0], step) for step in range(4)] and 5 not in out.outputs[0].token_ids
    assert_all_blocks_free(llm)


BAN_ALL_BUT_EOS = dict(max_tokens=8, suppress_tokens=[t for t in range(1000) if t != 2])  # EOS is 2


@pytest.mark.parametrize("kwargs", [dict(temperature=0.0), dict(temperature=1.0, seed=4), dict(beam_width=2)],
                         ids=["greedy", "sampled", "beam"])
def test_a_request_that_bans_every_token_fails_alone(llm, kwargs):
    """suppress_tokens bans all but EOS, min_tokens bans EOS: no token is left at the first
    step, and the request fails with an error that says so (Hugging Face's greedy search would
    emit token 0). Without min_tokens, EOS is the one token left."""
    with pytest.raises(ValueError, match="^prompt 1: every token is banned at output token 0"):
        llm.generate([TEXT, TEXT], [SamplingParams(temperature=0.0, max_tokens=5),
                                    SamplingParams(**kwargs, **BAN_ALL_BUT_EOS, min_tokens=3)], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests() and not llm.llm_engine.take_failures()
    assert_all_blocks_free(llm)
    only_eos = llm.generate(TEXT, SamplingParams(**kwargs, **BAN_ALL_BUT_EOS), use_tqdm=False)[0].outputs[0]
    assert (only_eos.token_ids, only_eos.finish_reason) == ([2], "stop")
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("kwargs", [dict(temperature=0.0), dict(beam_width=2)], ids=["greedy", "beam"])
def test_nan_logits_fail_the_request_instead_of_sampling_token_0(llm, kwargs):
    def overflows_at_step_two(output_ids, row):
        return row * float("nan") if len(output_ids) == 2 else row

    with pytest.raises(RuntimeError, match="^prompt 1: the logits for output token 2 hold NaN or inf"):
        llm.generate([TEXT, TEXT], [SamplingParams(temperature=0.0, max_tokens=5),
                                    SamplingParams(**kwargs, max_tokens=5, logits_processors=[overflows_at_step_two])],
                     use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests() and not llm.llm_engine.take_failures()
    assert_all_blocks_free(llm)


def test_a_beam_search_goes_on_while_one_beam_has_a_token_left(llm):
    """As Hugging Face's beam search: a beam whose every token is banned drops out, and the
    candidates come from the other beam."""
    banned: list[list[int]] = []

    def bans_the_first_beam_it_sees_at_step_two(output_ids, row):
        if len(output_ids) == 2 and not banned:
            banned.append(list(output_ids))
            return torch.full_like(row, -float("inf"))
        return row

    out = llm.generate(TEXT, SamplingParams(beam_width=2, max_tokens=8, min_tokens=6,
                                            logits_processors=[bans_the_first_beam_it_sees_at_step_two]),
                       use_tqdm=False)[0].outputs[0]
    assert len(banned) == 1 and len(out.token_ids) >= 6 and out.token_ids[:2] != banned[0]
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("one_ends", [False, True])
def test_an_aborted_beam_search_gives_its_best_n(llm, one_ends):
    """At most `n` completions: the finished hypotheses and the running beams ranked together,
    the beams with finish_reason "abort" (before, every beam came back, or the hypotheses alone)."""
    ended: list[list[int]] = []

    def eos_for_the_first_beam_at_step_two(output_ids, row):
        if len(output_ids) == 2 and not ended:
            ended.append(list(output_ids))
            row = row.clone()
            row[2] += 30.0
        return row

    engine = llm.llm_engine
    params = SamplingParams(beam_width=4, n=2, max_tokens=30, ignore_eos=not one_ends,
                            logits_processors=[eos_for_the_first_beam_at_step_two] if one_ends else [])
    engine.add_request("beams", TEXT, params)
    for _ in range(5):
        engine.step()
    group = engine.groups["beams"]
    beams = [(list(seq.data.output_token_ids), seq.data.cumulative_logprob) for seq in group.get_seqs()]
    finished = [(h.token_ids, "stop") for h in group.beam_search.finished]
    outputs = engine.abort_request("beams", final_output=True).outputs
    assert len(finished) == one_ends and len(beams) == 4
    got = [(o.token_ids, o.finish_reason) for o in outputs]
    if one_ends:  # a hypothesis ending in a likely EOS outranks the running beams
        assert got == finished + [(beams[0][0], "abort")] and finished[0][0] == ended[0] + [2]
    else:  # running beams, best first
        assert got == [(ids, "abort") for ids, _ in beams[:2]]
        assert [o.cumulative_logprob for o in outputs] == [score for _, score in beams[:2]]
    assert_all_blocks_free(llm)


def test_abort_frees_self_and_cross_blocks(llm):
    engine = llm.llm_engine
    engine.add_request("a", TEXT, SamplingParams(temperature=0.0, max_tokens=50))
    engine.add_request("b", TEXT, SamplingParams(n=2, temperature=1.0, max_tokens=50))
    engine.step()
    engine.step()
    assert engine.block_manager.get_num_free_gpu_blocks() < engine.block_manager.num_total_gpu_blocks
    engine.abort_request("a")
    engine.abort_request("b")
    assert not engine.has_unfinished_requests()
    assert_all_blocks_free(llm)


def test_outputs_carry_both_prompts_in_input_order(llm):
    prompts = [TEXT, {"encoder_prompt": "Numbers like 3.", "decoder_prompt": "Sum"}]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert outs[0].encoder_prompt == TEXT and outs[0].prompt is None
    assert outs[1].encoder_prompt == "Numbers like 3." and outs[1].prompt == "Sum"
    tok = llm.get_tokenizer()
    assert outs[1].encoder_prompt_token_ids == tok("Numbers like 3.")["input_ids"]
    assert outs[1].prompt_token_ids == [2] + tok("Sum", add_special_tokens=False)["input_ids"]
    assert outs[0].outputs[0].text == tok.decode(outs[0].outputs[0].token_ids, skip_special_tokens=True)


def test_bfloat16_greedy_tokens_start_like_float32s(tiny_bart_dir, llm):
    """A bfloat16 engine keeps its parameters in bfloat16; its greedy tokens start like
    float32's."""
    low = LLM(model=str(tiny_bart_dir), dtype="bfloat16", num_gpu_blocks=64)
    assert {p.dtype for p in low.llm_engine.model_runner.model.parameters()} == {torch.bfloat16}
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = low.generate(TEXT, params, use_tqdm=False)[0].outputs[0].token_ids
    full = llm.generate(TEXT, params, use_tqdm=False)[0].outputs[0].token_ids
    assert len(got) == 12 and got[:3] == full[:3]
    assert_all_blocks_free(low)


def test_vllms_llm_options_for_a_text_model(tiny_bart_dir, llm):
    """vLLM's encoder/decoder example: `LLM(model, dtype="float", enforce_eager=True)` and its
    tokenizer group; `limit_mm_per_prompt` allows no audio for a text model, and `lora_request`
    is None or refused."""
    vllm_style = LLM(model=str(tiny_bart_dir), dtype="float", enforce_eager=True, num_gpu_blocks=16,
                     limit_mm_per_prompt={"audio": 0})
    ids = vllm_style.llm_engine.get_tokenizer_group().encode(prompt="The capital of France is")
    assert ids == vllm_style.get_tokenizer()("The capital of France is")["input_ids"] and ids[0] == 0
    assert vllm_style.llm_engine.get_tokenizer_group().encode("France", add_special_tokens=False)[0] != 0
    assert vllm_style.llm_engine.get_tokenizer_group().encode(prompt="France", request_id="1", lora_request=None)
    with pytest.raises(ValueError, match=r"^max_model_len=1: the model's decoder prompt \[2, 0\] takes 2 positions, "
                                         r"so at least 2$"):
        LLM(model=str(tiny_bart_dir), num_gpu_blocks=16, max_model_len=1)
    with pytest.raises(ValueError, match=r"^enforce_eager must be True or False, got 'yes'$"):
        LLM(model=str(tiny_bart_dir), enforce_eager="yes")
    with pytest.raises(ValueError, match=r"^limit_mm_per_prompt=\{'audio': 1\}: this model takes no audio$"):
        LLM(model=str(tiny_bart_dir), num_gpu_blocks=16, limit_mm_per_prompt={"audio": 1})
    assert llm.generate(TEXT, SamplingParams(max_tokens=3), use_tqdm=False, lora_request=None)[0].outputs[0].token_ids
    assert len(llm.generate([TEXT, TEXT], SamplingParams(max_tokens=3), use_tqdm=False, lora_request=[None] * 2)) == 2
    with pytest.raises(ValueError, match=r"^lora_request: encdec runs no LoRA adapters, got 'sql-lora'$"):
        llm.generate(TEXT, SamplingParams(max_tokens=3), use_tqdm=False, lora_request="sql-lora")
    assert_all_blocks_free(llm)

"""Engine faults found by a randomized run (issue 12), each reproduced on the tiny random BART."""
from __future__ import annotations

import pytest

from encdec import LLM, SamplingParams, TokensPrompt
from tests.conftest import assert_all_blocks_free
from tests.entrypoints.conftest import SAMPLE

TEXT = "The rain in spain falls mainly on the plain."


def encoder_prompt(num_tokens: int) -> TokensPrompt:
    return TokensPrompt(prompt_token_ids=[0] + [5 + i % 50 for i in range(num_tokens - 2)] + [2])


def test_fault1_n2_preempted_by_recompute_keeps_two_seeded_completions(tiny_bart_dir):
    """When one of two siblings has stopped, the other alone may be preempted by recompute;
    its prefill again used to draw n=2 samples from its row (3 completions, other tokens)."""
    def params(stop: list[int]) -> SamplingParams:
        return SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=30, ignore_eos=True,
                              stop_token_ids=stop)

    roomy = LLM(model=str(tiny_bart_dir), num_gpu_blocks=400, block_size=4)
    (free_run,) = roomy.generate("A", params([]), use_tqdm=False)
    stop = [free_run.outputs[0].token_ids[3]]  # a token the first sibling emits early
    (expected,) = roomy.generate("A", params(stop), use_tqdm=False)
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=17, block_size=4, preemption_mode="recompute")
    engine = llm.llm_engine
    engine.add_request("B", "B", SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    engine.step()
    engine.add_request("A", "A", params(stop))
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert engine.stats.num_recomputes > 0
    assert [o.token_ids for o in finished["A"].outputs] == [o.token_ids for o in expected.outputs]
    assert_all_blocks_free(llm)


def test_a_long_decoder_prompt_counts_in_admission(tiny_bart_dir):
    """The blocks a request may hold count its decoder prompt: 4 encoder tokens take 1 block of
    4, a 41-token decoder prompt alone 11: 12 blocks, more than the cache's 11."""
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=11, block_size=4)
    prompt = {"encoder_prompt": encoder_prompt(4), "decoder_prompt": TokensPrompt(prompt_token_ids=[2] + [50] * 40)}
    with pytest.raises(ValueError, match="^prompt 0: decoder_prompt: the request needs 12 KV cache blocks"):
        llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert_all_blocks_free(llm)


def test_a_request_that_fills_the_cache_exactly_is_admitted(tiny_bart_dir):
    """The last new token is never fed back, so it takes no cache slot: 8 encoder tokens and a
    decoder of [2, 0] plus 7 new tokens hold exactly 2 blocks of 8 and run; 8 new tokens do not fit."""
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=2, block_size=8, swap_space=0)
    def params(max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    (output,) = llm.generate(encoder_prompt(8), params(7), use_tqdm=False)
    assert len(output.outputs[0].token_ids) == 7
    with pytest.raises(ValueError, match=r"^prompt 0: max_tokens=8: the request needs 3 KV cache blocks "
                                         r"\(encoder 8 tokens, decoder up to 9 cached tokens"):
        llm.generate(encoder_prompt(8), params(8), use_tqdm=False)
    assert_all_blocks_free(llm)


def test_a_request_that_never_fits_names_what_to_change(tiny_bart_dir):
    """The message starts with the field at fault (the server's `param`): the encoder prompt
    if it never fits alone, else the samples if one would fit, else the length asked for."""
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=11, block_size=4)

    def refusal(encoder_len: int, **params) -> str:
        with pytest.raises(ValueError) as refused:
            llm.generate(encoder_prompt(encoder_len), SamplingParams(temperature=1.0, seed=0, **params), use_tqdm=False)
        return str(refused.value).removeprefix("prompt 0: ")

    assert refusal(48, max_tokens=1).startswith("encoder_prompt: the request needs 13 KV cache blocks")
    assert refusal(4, max_tokens=20, n=2).startswith("n=2: the request needs 13 KV cache blocks")
    assert refusal(4, max_tokens=40).startswith("max_tokens=40: the request needs 12 KV cache blocks "
                                                "(encoder 4 tokens, decoder up to 41 cached tokens, 1 sequence)")
    assert_all_blocks_free(llm)


def test_a_whisper_cache_that_cannot_hold_a_window_is_refused_at_start():
    """Every Whisper request holds a window's 1500 encoder positions (94 blocks of 16) and may
    decode to the decoder's 448 positions (28 more; a window conditioned on the text before
    it): a smaller cache is refused when the engine starts, not request by request (one of 108
    blocks used to start, then refuse every window's 224 tokens)."""
    with pytest.raises(ValueError, match=r"^num_gpu_blocks=122: the KV cache cannot hold one Whisper window, "
                                         r"whose 1500 encoder positions and 448 decoder positions need 122 "
                                         r"blocks of 16 tokens \(and 1 kept free\)$"):
        LLM("tiny.en", num_gpu_blocks=122, swap_space=0.01)
    assert LLM("tiny.en", num_gpu_blocks=123, swap_space=0.01).llm_engine.block_manager.num_total_gpu_blocks == 123


def test_whisper_samples_and_beams_past_the_cache_are_refused_before_any_audio():
    """A window of any audio may decode to the decoder's last position: the fallback's best_of
    samples, or the beams, must fit the cache at that length, checked before any window runs
    (and by the server before it decodes an upload): they used to be refused only when a window
    fell back, after minutes of work."""
    llm = LLM("tiny.en", num_gpu_blocks=200, swap_space=0.01)  # 2 watermark blocks
    with pytest.raises(ValueError, match=r"^best_of=5: the request needs 234 KV cache blocks \(encoder 1500 "
                                         r"tokens, decoder up to 448 cached tokens, 5 sequences\) but the "
                                         r"cache has only num_gpu_blocks=200, less a watermark of 2 kept free$"):
        llm.transcribe(str(SAMPLE))
    with pytest.raises(ValueError, match=r"^beam_size=4: the request needs 206 KV cache blocks"):
        llm.transcribe(str(SAMPLE), beam_size=4, best_of=1)
    (transcript,) = llm.transcribe(str(SAMPLE), beam_size=3, best_of=3)  # 178 blocks
    assert transcript.text
    assert_all_blocks_free(llm)


def test_fault2_admission_keeps_the_watermark(tiny_bart_dir):
    """A request that fits the cache but not the cache less its watermark is refused up front
    (it used to finish with no tokens); one that fits both runs to max_tokens."""
    llm = LLM(model=str(tiny_bart_dir), block_size=2, num_gpu_blocks=100)  # 1 watermark block
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def prompt(num_encoder_tokens: int) -> dict:  # decoder: <DEC> + 1 token = 1 self block
        return {"encoder_prompt": encoder_prompt(num_encoder_tokens),
                "decoder_prompt": TokensPrompt(prompt_token_ids=[2])}

    with pytest.raises(ValueError, match="watermark"):
        llm.generate(prompt(198), params, use_tqdm=False)  # 99 cross + 1 self > 100 - 1
    (out,) = llm.generate(prompt(196), params, use_tqdm=False)  # 98 + 1
    assert len(out.outputs[0].token_ids) == 1
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("params", [
    SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=3, ignore_eos=True),
    SamplingParams(beam_width=2, n=2, max_tokens=3),
], ids=["n2", "beam2"])
def test_fault3_multi_sequence_request_that_fills_the_cache(tiny_bart_dir, params):
    """10 cross blocks + 2 sequences x 1 self block = the whole cache: the shared last block
    needs one copy, not one per sharer, so the request runs alone without preemption."""
    llm = LLM(model=str(tiny_bart_dir), block_size=8, num_gpu_blocks=12)
    (out,) = llm.generate(encoder_prompt(80), params, use_tqdm=False)
    assert len(out.outputs) == 2
    assert llm.llm_engine.stats.num_preemptions == 0
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("params, field", [
    (SamplingParams(n=3, temperature=1.0), "n=3"),
    (SamplingParams(beam_width=3), "beam_width=3"),
])
def test_fault4_more_sequences_than_max_num_seqs_is_refused(tiny_bart_dir, params, field):
    """It used to be queued, never scheduled, and stall every request behind it."""
    llm = LLM(model=str(tiny_bart_dir), max_num_seqs=2, num_gpu_blocks=128)
    engine = llm.llm_engine
    with pytest.raises(ValueError, match=rf"{field}.*max_num_seqs=2"):
        engine.add_request("wide", TEXT, params)
    assert not engine.has_unfinished_requests()
    (out,) = llm.generate(TEXT, SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=4),
                          use_tqdm=False)
    assert len(out.outputs) == 2
    assert_all_blocks_free(llm)


def test_fault7_out_of_swap_space_loses_no_request(tiny_bart_dir):
    """Preempting an n=2 request with no swap space recomputes it (it used to drop out of every
    queue, later to fail the batch): both requests end as in a cache with room for both."""
    params = SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=30, ignore_eos=True)
    outputs = {}
    for num_gpu_blocks in (14, 40):  # each needs at most 2 + 2 x 4 blocks; both need 20
        llm = LLM(model=str(tiny_bart_dir), block_size=8, num_gpu_blocks=num_gpu_blocks, swap_space=0)
        engine = llm.llm_engine
        for request_id in ("a", "b"):
            engine.add_request(request_id, encoder_prompt(16), params)
        finished = {}
        while engine.has_unfinished_requests():
            finished.update((o.request_id, [c.token_ids for c in o.outputs]) for o in engine.step() if o.finished)
        outputs[num_gpu_blocks] = finished
        assert (engine.stats.num_recomputes > 0) == (num_gpu_blocks == 14)
        assert_all_blocks_free(llm)
    assert outputs[14] == outputs[40] and len(outputs[14]) == 2


@pytest.mark.parametrize("params, field", [
    (SamplingParams(max_tokens=4, stop_token_ids=[1000]), "stop_token_ids"),
    (SamplingParams(max_tokens=4, forced_bos_token_id=5000), "forced_bos_token_id"),
    (SamplingParams(max_tokens=4, forced_eos_token_id=1000), "forced_eos_token_id"),
    (SamplingParams(max_tokens=4, temperature=0.0, logprobs=1001), "logprobs"),
])
def test_fault5_token_ids_beyond_the_vocabulary_are_refused_up_front(tiny_bart_dir, params, field):
    """They used to raise IndexError inside a step and fail the whole batch."""
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=128)
    engine = llm.llm_engine
    engine.add_request("good", TEXT, SamplingParams(max_tokens=4, temperature=0.0))
    with pytest.raises(ValueError, match=rf"{field}.*vocab_size=1000"):
        engine.add_request("bad", TEXT, params)
    finished = [o for _ in range(10) for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["good"]
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("sampling_params, message", [
    ("greedy", "sampling_params must be a SamplingParams or a list of them, got str"),
    ({"temperature": 0}, "got dict"),
    ([SamplingParams(max_tokens=2), None], r"sampling_params\[1\] must be a SamplingParams, got NoneType"),
])
def test_fault6_sampling_params_of_the_wrong_type_are_named(tiny_bart_dir, sampling_params, message):
    """They used to raise AttributeError deep inside and leave the earlier prompts queued."""
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=128)
    with pytest.raises(ValueError, match=message):
        llm.generate(["a", "b"], sampling_params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="must be a SamplingParams, got str"):
        llm.llm_engine.add_request("x", "a", "greedy")
    assert_all_blocks_free(llm)

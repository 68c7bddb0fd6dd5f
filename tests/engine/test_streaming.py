"""`LLMEngine.step()` streams: an output per advancing request, as its `output_kind` asks."""
from __future__ import annotations

import dataclasses
import time

import pytest

from encdec import LLM, RequestOutputKind, SamplingParams
from tests.conftest import assert_all_blocks_free

TEXT = "The rain in spain falls mainly on the plain."


@pytest.fixture(scope="module")
def llm(tiny_bart_dir):
    return LLM(model=str(tiny_bart_dir), num_gpu_blocks=200, block_size=8)


def run(llm, params_by_id: dict) -> dict[str, list]:
    """Each request's outputs, step by step."""
    engine = llm.llm_engine
    for request_id, params in params_by_id.items():
        engine.add_request(request_id, TEXT, params)
    outputs = {request_id: [] for request_id in params_by_id}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].append(out)
    assert_all_blocks_free(llm)
    return outputs


def test_kinds_agree_with_the_offline_result(llm):
    base = dict(temperature=1.0, seed=11, max_tokens=12, n=2, ignore_eos=True)
    (offline,) = llm.generate(TEXT, SamplingParams(**base), use_tqdm=False)
    outputs = run(llm, {kind.name: SamplingParams(**base, output_kind=kind) for kind in RequestOutputKind})

    final = outputs["FINAL_ONLY"]
    assert len(final) == 1 and final[0].finished
    cumulative = outputs["CUMULATIVE"]
    assert len(cumulative) == 12 and [o.finished for o in cumulative] == [False] * 11 + [True]
    for step, out in enumerate(cumulative, start=1):
        assert [len(c.token_ids) for c in out.outputs] == [step, step]
    delta = outputs["DELTA"]
    assert len(delta) == 12
    for index in range(2):
        expected = offline.outputs[index]
        for out in (final[0], cumulative[-1]):
            assert out.outputs[index].token_ids == expected.token_ids
            assert out.outputs[index].text == expected.text
        pieces = [c for out in delta for c in out.outputs if c.index == index]
        assert sum((c.token_ids for c in pieces), []) == expected.token_ids
        assert "".join(c.text for c in pieces) == expected.text
        assert pieces[-1].finish_reason == "length" and pieces[-1].cumulative_logprob == pytest.approx(
            expected.cumulative_logprob)


def test_delta_logprobs_are_the_new_ones(llm):
    outputs = run(llm, {"r": SamplingParams(temperature=0.0, max_tokens=6, logprobs=2, ignore_eos=True,
                                            output_kind=RequestOutputKind.DELTA)})["r"]
    assert [len(o.outputs[0].logprobs) for o in outputs] == [1] * 6


def test_beam_search_gives_one_output_at_the_end(llm):
    params = SamplingParams(use_beam_search=True, beam_width=3, max_tokens=8, temperature=0.0,
                            output_kind=RequestOutputKind.DELTA)
    (offline,) = llm.generate(TEXT, params, use_tqdm=False)
    (out,) = run(llm, {"b": params})["b"]
    assert out.finished and [c.token_ids for c in out.outputs] == [c.token_ids for c in offline.outputs]


def test_outputs_carry_the_requests_times(llm):
    """`RequestOutput.metrics` (vLLM's fields): set on every output of every kind, the first
    token's time fixed from the step that sampled it (the server's time to first token), the
    latest token's moving on, the finish time on the last output only."""
    before = time.monotonic()
    outputs = run(llm, {kind.name: SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                                  output_kind=kind) for kind in RequestOutputKind})
    after = time.monotonic()
    for outs in outputs.values():
        times = {(o.metrics.arrival_time, o.metrics.first_scheduled_time, o.metrics.time_in_queue,
                  o.metrics.first_token_time) for o in outs}
        assert len(times) == 1
        ((arrival, scheduled, queued, first),) = times
        assert before <= arrival <= scheduled <= first <= after and queued == scheduled - arrival
        latest = [o.metrics.last_token_time for o in outs]
        assert latest == sorted(latest) and latest[0] >= first
        assert [o.metrics.finished_time is not None for o in outs] == [o.finished for o in outs]
        assert latest[-1] <= outs[-1].metrics.finished_time <= after
    assert len(outputs["CUMULATIVE"]) == 4  # a moving last token time was seen


def test_detokenize_false_gives_the_same_ids_and_no_text(llm):
    """vLLM's `detokenize=False`, for every output kind and for beam search: the token ids,
    finish reasons and log-probabilities of the detokenized run, every text empty."""
    base = dict(temperature=1.0, seed=3, max_tokens=10, n=2, logprobs=1)
    requests = {kind.name: SamplingParams(**base, output_kind=kind) for kind in RequestOutputKind}
    requests["beam"] = SamplingParams(use_beam_search=True, beam_width=3, temperature=0.0, max_tokens=10)
    plain = run(llm, requests)
    bare = run(llm, {name: dataclasses.replace(p, detokenize=False) for name, p in requests.items()})
    assert plain.keys() == bare.keys()
    for name in requests:
        assert len(bare[name]) == len(plain[name])
        for with_text, without in zip(plain[name], bare[name]):
            fields = [[(c.index, c.token_ids, c.finish_reason, [
                {t: (e.logprob, e.rank) for t, e in step.items()} for step in c.logprobs or []])
                for c in out.outputs] for out in (with_text, without)]
            assert fields[0] == fields[1]
            assert all(c.text == "" for c in without.outputs)
            assert all(e.decoded_token is None for c in without.outputs for step in c.logprobs or []
                       for e in step.values())
    assert any(c.text for out in plain["CUMULATIVE"] for c in out.outputs)
    with pytest.raises(ValueError, match="stop needs detokenize=True"):
        SamplingParams(stop=".", detokenize=False)

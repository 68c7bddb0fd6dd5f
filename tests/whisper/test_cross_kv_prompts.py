"""Cross keys and values given back as a `CrossKVPrompt`: the same decode without the encoder,
and temperature fallbacks that reuse their window's keys and values (one encoder run a window)."""
from __future__ import annotations

import pytest
import torch

from encdec import LLM, SamplingParams
from encdec.whisper.options import TranscribeOptions
from encdec.whisper.transcribe import run_job
from tests.conftest import assert_all_blocks_free
from tests.whisper.recording_job import RecordingJob

GREEDY = SamplingParams(temperature=0.0, max_tokens=30)
SAMPLED = SamplingParams(temperature=0.8, n=3, seed=11, max_tokens=30)


def audio_prompt(clip, sot: int) -> dict:
    return {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": clip.pair}},
            "decoder_prompt": [sot]}


def kv_prompt(cross_kv, sot: int) -> dict:
    return {"encoder_prompt": {"cross_kv": cross_kv}, "decoder_prompt": [sot]}


def run(engine, requests) -> dict:
    """Add `(request_id, prompt, params, return_cross_kv)` requests, step until all finish."""
    for request_id, prompt, params, returned in requests:
        engine.add_request(request_id, prompt, params, return_cross_kv=returned)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((out.request_id, out) for out in engine.step() if out.finished)
    return finished


def samples(output) -> list[tuple[list[int], float]]:
    return [(c.token_ids, c.cumulative_logprob) for c in output.outputs]


@pytest.fixture(scope="module")
def sot(tiny_en) -> int:
    return tiny_en.llm_engine.model_config.special_tokens.sot


def test_a_failing_return_cross_kv_callable_fails_its_request_alone(tiny_en, corpus, sot):
    engine = tiny_en.llm_engine

    def broken(output):
        raise ZeroDivisionError("the caller's bug")

    done = run(engine, [("good", audio_prompt(corpus[0], sot), GREEDY, lambda out: True),
                        ("bad", audio_prompt(corpus[1], sot), GREEDY, broken)])
    assert set(done) == {"good"} and len(done["good"].cross_kv) == 4
    failures = engine.take_failures()
    assert list(failures) == ["bad"] and isinstance(failures["bad"], ZeroDivisionError)
    assert_all_blocks_free(tiny_en)


def test_a_cross_kv_prompt_decodes_as_its_audio_did_without_the_encoder(tiny_en, corpus, sot):
    engine = tiny_en.llm_engine
    first = run(engine, [("first", audio_prompt(corpus[0], sot), GREEDY, True)])["first"]
    assert len(first.cross_kv) == 4 and first.cross_kv[0][0].shape == (6, 1500, 64)
    runs = engine.stats.num_encoder_runs
    again = run(engine, [("audio", audio_prompt(corpus[0], sot), SAMPLED, False)])["audio"]
    assert engine.stats.num_encoder_runs - runs == 1
    given = run(engine, [("given", kv_prompt(first.cross_kv, sot), SAMPLED, False)])["given"]
    greedy = run(engine, [("greedy", kv_prompt(first.cross_kv, sot), GREEDY, False)])["greedy"]
    assert engine.stats.num_encoder_runs - runs == 1  # no encoder run for either
    assert samples(given) == samples(again)  # the same bits: each run alone, one window encoded alone
    assert samples(greedy) == samples(first)
    assert greedy.outputs[0].text == first.outputs[0].text
    assert_all_blocks_free(tiny_en)


def test_given_and_encoded_prefills_share_a_step(tiny_en, corpus, sot):
    """The runner puts given prefills after encoded ones; each request decodes as it did alone."""
    engine = tiny_en.llm_engine
    alone = run(engine, [("a", audio_prompt(corpus[1], sot), GREEDY, True)])["a"]
    other = run(engine, [("b", audio_prompt(corpus[2], sot), GREEDY, False)])["b"]
    runs = engine.stats.num_encoder_runs
    mixed = run(engine, [("given", kv_prompt(alone.cross_kv, sot), GREEDY, False),
                         ("encoded", audio_prompt(corpus[2], sot), GREEDY, False)])
    assert engine.stats.num_encoder_runs - runs == 1
    assert mixed["given"].outputs[0].token_ids == alone.outputs[0].token_ids
    assert mixed["encoded"].outputs[0].token_ids == other.outputs[0].token_ids
    assert_all_blocks_free(tiny_en)


def test_return_cross_kv_may_decide_on_the_final_output(tiny_en, corpus, sot):
    engine = tiny_en.llm_engine
    seen = []
    outs = run(engine, [("no", audio_prompt(corpus[0], sot), GREEDY, lambda out: seen.append(out) or False),
                        ("yes", audio_prompt(corpus[1], sot), GREEDY, lambda out: out.outputs[0].token_ids != [])])
    assert outs["no"].cross_kv is None and [out.request_id for out in seen] == ["no"]
    assert seen[0].finished and seen[0].outputs[0].token_ids == outs["no"].outputs[0].token_ids
    assert outs["yes"].cross_kv is not None and outs["yes"].cross_kv[3][1].shape == (6, 1500, 64)
    assert_all_blocks_free(tiny_en)


def test_bad_cross_kv_prompts_are_refused_by_name(tiny_en, corpus, sot, tiny_bart_dir):
    engine = tiny_en.llm_engine
    kv = run(engine, [("kv", audio_prompt(corpus[0], sot), GREEDY, True)])["kv"].cross_kv
    bad = {
        "for each of the model's 4 decoder layers": kv[:3],
        r"torch.float32 tensor \[num_heads=6, encoder_len, head_size=64\]": [(k.double(), v.double()) for k, v in kv],
        "of one encoder_len": [(k, v[:, :100]) for k, v in kv],
        "covers 1600 encoder positions; the model takes 1 to 1500":
            [(torch.cat([k, k[:, :100]], 1), torch.cat([v, v[:, :100]], 1)) for k, v in kv],
        "must hold": "not a list",
    }
    for message, cross_kv in bad.items():
        with pytest.raises(ValueError, match=message):
            engine.add_request("bad", kv_prompt(cross_kv, sot), GREEDY)
    with pytest.raises(ValueError, match="takes no other keys"):
        engine.add_request("bad", {"encoder_prompt": {"cross_kv": kv, "prompt": ""}, "decoder_prompt": [sot]}, GREEDY)
    assert not engine.has_unfinished_requests()
    assert_all_blocks_free(tiny_en)
    bart = LLM(str(tiny_bart_dir), num_gpu_blocks=64, swap_space=0.01)
    with pytest.raises(ValueError, match="for audio models"):
        bart.llm_engine.add_request("bad", {"encoder_prompt": {"cross_kv": kv}, "decoder_prompt": None}, GREEDY)
    assert_all_blocks_free(bart)


class WithoutCrossKV:
    """An engine that ignores `return_cross_kv`: every fallback encodes its audio again."""

    def __init__(self, engine):
        self.engine = engine

    def add_request(self, request_id, prompt, params, arrival_time=None, return_cross_kv=False):
        self.engine.add_request(request_id, prompt, params)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_fallbacks_reuse_their_windows_cross_kv(tiny_en, corpus):
    """Every decode made unsure (logprob_threshold 0): each window is decoded at three
    temperatures from one encoder run, into the transcript of re-encoding every time."""
    engine = tiny_en.llm_engine
    options = TranscribeOptions(language="en", temperature=(0.0, 0.4, 0.8), best_of=2, logprob_threshold=0.0)
    for clip in corpus[:2]:  # one window a job: the same encoder batches with and without reuse
        results = []
        for driver, encoder_runs in ((engine, 1), (WithoutCrossKV(engine), 3)):
            job = RecordingJob(engine.model_config.special_tokens, engine.tokenizer,
                               engine.model_config.max_decoder_len, [clip.audio], options)
            runs = engine.stats.num_encoder_runs
            run_job(driver, job)
            assert [r.params.temperature for r in job.requests_made] == [0.0, 0.4, 0.8]
            assert engine.stats.num_encoder_runs - runs == encoder_runs
            assert all(w.cross_kv is None for w in job.windows)  # dropped once the window is done
            results.append(job.results([None])[0])
        reused, encoded = results
        assert reused.text == encoded.text
        assert [s.tokens for s in reused.segments] == [s.tokens for s in encoded.segments]
        assert [s.temperature for s in reused.segments] == [s.temperature for s in encoded.segments]
    assert_all_blocks_free(tiny_en)


def test_word_timestamps_after_a_fallback_read_the_first_decodes_cross_kv(tiny_en, corpus):
    runs = tiny_en.llm_engine.stats.num_encoder_runs
    result = tiny_en.transcribe([corpus[3].pair], language="en", temperature=(0.0, 0.6), best_of=2,
                                logprob_threshold=0.0, word_timestamps=True)[0]
    assert tiny_en.llm_engine.stats.num_encoder_runs - runs == 1  # two decodes, one encoder run
    words = [w for s in result.segments for w in s.words]
    assert "".join(w.word for w in words).strip() == result.text
    assert all(a.start <= b.start for a, b in zip(words, words[1:]))
    assert_all_blocks_free(tiny_en)

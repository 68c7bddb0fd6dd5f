"""`max_running_requests`: requests past the limit wait their turn and decode the same."""
from __future__ import annotations

import pytest

from encdec import LLM, SamplingParams
from tests.conftest import assert_all_blocks_free

PROMPTS = ["The rain in spain falls mainly on the plain.", "A stitch in time saves nine.",
           "All that glitters is not gold.", "Fortune favours the bold.", "Time and tide wait for no man."]


def test_requests_past_the_limit_wait_in_arrival_order_and_decode_the_same(tiny_bart_dir, monkeypatch):
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (3, 9, 5, 12, 4)]
    params[1] = SamplingParams(max_tokens=9, n=3, temperature=1.0, seed=7)  # three sequences, one request
    unlimited = LLM(model=str(tiny_bart_dir), num_gpu_blocks=128).generate(PROMPTS, params, use_tqdm=False)
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=128, max_running_requests=2)
    scheduler = llm.llm_engine.scheduler
    running, schedule = [], scheduler.schedule

    def counting_schedule():
        result = schedule()
        running.append([group.request_id for group in scheduler.running])
        return result

    monkeypatch.setattr(scheduler, "schedule", counting_schedule)
    limited = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in limited] == [[c.token_ids for c in o.outputs] for o in unlimited]
    assert max(map(len, running)) == 2
    admitted = list(dict.fromkeys(request for step in running for request in step))
    assert admitted == sorted(admitted, key=int)  # arrival order
    assert llm.llm_engine.stats.num_steps > 12 + 1  # the longest request alone would take 12
    assert_all_blocks_free(llm)


def test_auto_limits_whisper_on_the_cpu_only():
    assert LLM(model="tiny.en", max_running_requests="auto").llm_engine.scheduler_config.max_running_requests == 16


def test_auto_leaves_text_models_unlimited(tiny_bart_dir):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=16, max_running_requests="auto")
    assert llm.llm_engine.scheduler_config.max_running_requests is None


@pytest.mark.parametrize("value, message", [
    (0, "max_running_requests must be an integer >= 1, None or 'auto', got 0"),
    ("many", "max_running_requests must be an integer >= 1, None or 'auto', got 'many'"),
    (2.5, "max_running_requests must be an integer >= 1, None or 'auto', got 2.5"),
])
def test_bad_max_running_requests_name_the_option(tiny_bart_dir, value, message, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the option was checked")

    monkeypatch.setattr("encdec.engine.llm_engine.load_model", no_load)
    with pytest.raises(ValueError, match=message):
        LLM(model=str(tiny_bart_dir), num_gpu_blocks=16, max_running_requests=value)

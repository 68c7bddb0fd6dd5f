"""AsyncLLMEngine: concurrent streaming callers on one event loop, cancellation, overload, faults.

Every request's result through the async engine must equal the offline `LLM.generate` result
for the same prompt and params (seeded sampling draws from the request's own generator, so the
batch it shares does not matter), and every block must be free once the callers are done.
"""
from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref

import pytest

from encdec import (LLM, AsyncLLMEngine, EngineDeadError, EngineOverloaded, RequestOutputKind,
                    SamplingParams)
from encdec.engine import async_engine
from encdec.engine.async_engine import Admission
from encdec.engine.detokenizer import decode
from tests.bart_checkpoints import make_bart_checkpoint
from tests.family_checkpoints import make_family_checkpoint
from tests.multibyte_tokenizers import MULTILINGUAL, byte_level_bpe, sentencepiece_bpe
from tests.whisper.conftest import corpus, speech_dir, tiny_en_assets  # noqa: F401 (fixtures)

DELTA = RequestOutputKind.DELTA


@pytest.fixture(scope="module", params=["byte-level-bpe", "sentencepiece", "t5-sentencepiece"])
def multibyte_model(request, tmp_path_factory):
    """A tiny random BART whose tokenizer knows accents, CJK and emoji, or a T5 with T5's
    SentencePiece tokenizer (unigram with byte fallback) trained on such text."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "t5-sentencepiece":
        return str(make_family_checkpoint("t5", folder, seed=3))
    tokenizer = (byte_level_bpe(folder / "_bpe") if request.param == "byte-level-bpe"
                 else sentencepiece_bpe())
    return str(make_bart_checkpoint(folder, seed=3, tokenizer=tokenizer))


def engine_blocks_free(engine) -> None:
    bm = engine.block_manager
    bm.check_invariants()
    assert not engine.has_unfinished_requests()
    assert bm.get_num_free_gpu_blocks() == bm.num_total_gpu_blocks
    assert bm.get_num_free_cpu_blocks() == bm.num_total_cpu_blocks


async def until_idle(engine, timeout: float = 30.0) -> None:
    """Wait for the engine thread to take in every abort and finish what is left."""
    deadline = time.monotonic() + timeout
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)


def test_32_streams_of_deltas_equal_the_offline_results(multibyte_model):
    offline = LLM(model=multibyte_model, num_gpu_blocks=400, block_size=8)
    prompts = [MULTILINGUAL[i % len(MULTILINGUAL)] for i in range(32)]
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=8 + i % 17, ignore_eos=True)
              for i in range(32)]
    expected = offline.generate(prompts, params, use_tqdm=False)
    engine = AsyncLLMEngine.from_model(multibyte_model, num_gpu_blocks=400, block_size=8)

    async def consume(i):
        ids, text = [], ""
        async for out in engine.generate(prompts[i], SamplingParams(
                temperature=1.0, seed=100 + i, max_tokens=8 + i % 17, ignore_eos=True, output_kind=DELTA)):
            (completion,) = out.outputs
            ids += completion.token_ids
            text += completion.text
        return ids, text

    async def main():
        results = await asyncio.gather(*(consume(i) for i in range(32)))
        await engine.shutdown()
        return results

    results = asyncio.run(main())
    tokenizer = offline.get_tokenizer()
    multibyte = 0
    for (ids, text), want in zip(results, expected):
        assert ids == want.outputs[0].token_ids
        assert text == want.outputs[0].text == decode(tokenizer, ids, skip_special_tokens=True)
        multibyte += any(ord(c) > 127 for c in text)
    assert multibyte >= 16  # the outputs do hold accented letters, CJK or emoji
    engine_blocks_free(engine.engine)


def test_a_bad_request_fails_alone_and_overload_is_refused(tiny_bart_dir):
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), max_waiting_requests=2, max_num_seqs=2,
                                       num_gpu_blocks=200)

    async def collect(prompt, params):
        return [out async for out in engine.generate(prompt, params)]

    async def collect_in(prompt, params, admission):
        return [out async for out in engine.generate(prompt, params, admission=admission)]

    async def main():
        # vLLM's calls for the tokenizer
        assert await engine.get_tokenizer() is engine.engine.get_tokenizer() is engine.engine.tokenizer is not None
        good = asyncio.ensure_future(collect("The rain in spain", SamplingParams(temperature=0, max_tokens=4)))
        with pytest.raises(ValueError, match="stop_token_ids"):
            await collect("Hello", SamplingParams(max_tokens=4, stop_token_ids=[10**6]))
        with pytest.raises(ValueError, match="SamplingParams"):
            await collect("Hello", "greedy")
        # a bad field beside the prompt: refused by name, its id not kept, the others untouched
        with pytest.raises(ValueError, match="arrival_time must be a number or None, got 'now'"):
            await anext(engine.generate("Hello", SamplingParams(max_tokens=4), request_id="x", arrival_time="now"))
        with pytest.raises(ValueError, match="return_cross_kv must be a bool or a callable, got 'yes'"):
            await anext(engine.generate("Hello", SamplingParams(max_tokens=4), request_id="x", return_cross_kv="yes"))
        changed = SamplingParams(max_tokens=4)
        changed.max_tokens = "5"
        with pytest.raises(ValueError, match="max_tokens"):
            await anext(engine.generate("Hello", changed, request_id="x"))
        with pytest.raises(ValueError, match="request_id must be a string or an iterable of them, got 5"):
            await engine.abort(5)
        outputs = [out async for out in engine.generate("Hello", SamplingParams(max_tokens=2), request_id="x")]
        assert outputs[-1].finished  # the id was not kept
        outputs = await good
        assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 4
        # a burst on an idle engine: max_num_seqs (2) run, max_waiting_requests (2) wait for
        # a place, the rest are refused at once
        burst = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
        results = await asyncio.gather(*(collect("A burst", burst) for _ in range(7)), return_exceptions=True)
        assert [isinstance(r, EngineOverloaded) for r in results] == [False] * 4 + [True] * 3
        # places are sequences: two samples of one request fill the batch, so of a burst behind
        # them two wait and the rest are refused
        pair = engine.generate("A pair", SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=100, ignore_eos=True,
                                                        output_kind=RequestOutputKind.DELTA))
        await anext(pair)  # running: counted before its first output is handed over
        # and a request that could never run is refused as such, not as an overload
        too_wide = SamplingParams(n=3, temperature=1.0, max_tokens=4)
        results = await asyncio.gather(*(collect("A burst", burst) for _ in range(4)),
                                       collect("Too wide", too_wide), return_exceptions=True)
        assert [isinstance(r, EngineOverloaded) for r in results] == [False] * 2 + [True] * 2 + [False]
        assert isinstance(results[-1], ValueError) and str(results[-1]) == (
            "n=3 is more than the engine runs at once (max_num_seqs=2)")
        await pair.aclose()  # aborts it
        # a job of several requests is checked once, then added whole past the bound
        admission = Admission()
        params = SamplingParams(temperature=0, max_tokens=2)
        job = await asyncio.gather(*(collect_in("A job", params, admission) for _ in range(6)))
        assert all(outputs[-1].finished for outputs in job)
        await engine.shutdown()

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_requests_held_back_by_max_running_requests_wait_for_a_place(tiny_bart_dir):
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), max_waiting_requests=1, max_running_requests=2,
                                       num_gpu_blocks=200)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)

    async def collect():
        return [out async for out in engine.generate("A burst", params)]

    async def main():
        # two run, though the batch has room for 256 sequences; one waits; the rest are refused
        results = await asyncio.gather(*(collect() for _ in range(5)), return_exceptions=True)
        assert [isinstance(r, EngineOverloaded) for r in results] == [False] * 3 + [True] * 2
        assert all(len(r[-1].outputs[0].token_ids) == 20 for r in results[:3])
        await engine.shutdown()

    asyncio.run(main())
    engine_blocks_free(engine.engine)


class TwoRunning:
    """An engine of two places whose first step after which two requests run is held (until
    `release`): arrivals meanwhile meet the batch as that step left it."""

    def __init__(self, model_dir, monkeypatch):
        self.engine = AsyncLLMEngine.from_model(str(model_dir), max_waiting_requests=1, max_num_seqs=2,
                                                num_gpu_blocks=200)
        self.stepping, self.release = threading.Event(), threading.Event()
        step = self.engine.engine.step

        def held_step():
            outputs = step()
            if len(self.engine.engine.scheduler.running) == 2 and not self.release.is_set():
                self.stepping.set()
                self.release.wait(30)
            return outputs

        monkeypatch.setattr(self.engine.engine, "step", held_step)

    async def collect(self):
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        return [out async for out in self.engine.generate("A burst", params)]

    async def start_two(self) -> list:
        """Two running requests' tasks, once their step is held."""
        running = [asyncio.ensure_future(self.collect()) for _ in range(2)]
        assert await asyncio.get_running_loop().run_in_executor(None, self.stepping.wait, 30)
        return running


def test_a_burst_during_a_step_is_counted_against_the_batch_before_it(tiny_bart_dir, monkeypatch):
    """Requests that arrive while a step moves waiting requests into the batch must not see
    those requests' places as free."""
    two = TwoRunning(tiny_bart_dir, monkeypatch)
    engine, collect, release = two.engine, two.collect, two.release

    async def main():
        running = await two.start_two()
        burst = [asyncio.ensure_future(collect()) for _ in range(3)]
        await asyncio.sleep(0.2)  # the step is held: no place frees meanwhile
        refused = [task for task in burst if task.done()]
        assert len(refused) == 2 and all(isinstance(task.exception(), EngineOverloaded) for task in refused)
        release.set()
        taken = [task for task in burst if task not in refused]
        for outputs in await asyncio.gather(*running, *taken):
            assert len(outputs[-1].outputs[0].token_ids) == 8
        await engine.shutdown()

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_places_are_sequences_and_a_job_is_weighed_whole(tiny_bart_dir):
    """Requests of several sequences take as many places (two samples, four beams), and a job
    that would leave more than max_waiting_requests waiting is refused while some wait."""
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), max_waiting_requests=3, max_num_seqs=4,
                                       num_gpu_blocks=400)

    async def collect(params, admission=None):
        return [out async for out in engine.generate("A burst", params, admission=admission)]

    async def burst(params, count=10):
        results = await asyncio.gather(*(collect(params) for _ in range(count)), return_exceptions=True)
        return [isinstance(r, EngineOverloaded) for r in results]

    async def main():
        pairs = SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=20, ignore_eos=True)
        assert await burst(pairs) == [False] * 5 + [True] * 5  # two run, three wait
        beams = SamplingParams(beam_width=4, max_tokens=20, ignore_eos=True)
        assert await burst(beams) == [False] * 4 + [True] * 6  # one runs, three wait
        single = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
        running = [asyncio.ensure_future(collect(single)) for _ in range(5)]  # four run, one waits
        while engine.num_queued() == 0:
            await asyncio.sleep(0.01)
        job = Admission(size=3)  # would leave four waiting
        results = await asyncio.gather(*(collect(single, job) for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, EngineOverloaded) for r in results)
        job = Admission(size=2)  # three: taken
        assert all(len(r[-1].outputs[0].token_ids) == 30
                   for r in await asyncio.gather(*(collect(single, job) for _ in range(2)), *running))
        job = Admission(size=6)  # on an engine with none waiting any job starts
        assert len(await asyncio.gather(*(collect(single, job) for _ in range(6)))) == 6
        await engine.shutdown()

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_a_waiting_request_whose_caller_leaves_frees_its_place_at_once(tiny_bart_dir, monkeypatch):
    """Not at the end of the step under way: its abort, on its way to the engine, already counts."""
    two = TwoRunning(tiny_bart_dir, monkeypatch)
    engine, collect, release = two.engine, two.collect, two.release

    async def main():
        running = await two.start_two()
        waiting = asyncio.ensure_future(collect())
        await asyncio.sleep(0.05)
        with pytest.raises(EngineOverloaded):
            await collect()
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        later = asyncio.ensure_future(collect())  # the step is still held
        await asyncio.sleep(0.05)
        assert not later.done()
        release.set()
        for outputs in await asyncio.gather(*running, later):
            assert len(outputs[-1].outputs[0].token_ids) == 8
        await engine.shutdown()

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_abort_by_id_ends_its_callers_stream_and_touches_no_other_request(tiny_bart_dir):
    """`abort(id)` from another task ends that request's stream with a last output (finish
    reason "abort", as vLLM's), for each output kind; a caller that leaves (a cancelled
    duplicate, a generator closed after its id was reused) aborts only its own request."""
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)
    long = dict(temperature=0, max_tokens=200, ignore_eos=True)

    async def collect(generator):
        return [out async for out in generator]

    async def started(generator):
        """The generator's first output, then the generator (its request is running)."""
        return await generator.__anext__(), generator

    async def main():
        for kind in RequestOutputKind:
            caller = asyncio.ensure_future(collect(engine.generate("Rain", SamplingParams(**long, output_kind=kind),
                                                                   request_id=f"other-{kind.name}")))
            while engine.engine.get_num_unfinished_requests() == 0:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            await engine.abort([f"other-{kind.name}"] if kind is DELTA else f"other-{kind.name}")
            outputs = await asyncio.wait_for(caller, 10)
            assert outputs[-1].finished and [c.finish_reason for c in outputs[-1].outputs] == ["abort"]
            tokens = [t for out in outputs for c in out.outputs for t in c.token_ids] if kind is DELTA else \
                outputs[-1].outputs[0].token_ids
            assert 0 < len(tokens) < 200
            await until_idle(engine.engine)
            engine_blocks_free(engine.engine)

        first, running = await started(engine.generate("Rain", SamplingParams(**long), request_id="same"))
        duplicate = asyncio.ensure_future(collect(engine.generate("Rain", SamplingParams(**long), request_id="same")))
        await asyncio.sleep(0)  # its add is in the inbox; cancelled before the engine refuses it
        duplicate.cancel()
        rest = await asyncio.wait_for(collect(running), 30)
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "length"

        short = SamplingParams(temperature=0, max_tokens=3)
        old = engine.generate("Rain", short, request_id="user-42")
        async for _ in old:
            break  # the request is left to finish (the generator is still held)
        await until_idle(engine.engine)
        _, new = await started(engine.generate("Rain", SamplingParams(**long), request_id="user-42"))
        await old.aclose()  # its own request is over: the new one goes on
        rest = await asyncio.wait_for(collect(new), 30)
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "length"
        await engine.shutdown()

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_a_caller_that_leaves_aborts_its_request_at_once(tiny_bart_dir):
    """A caller that stops reading (its task cancelled, or its generator closed) aborts its
    request before the engine's next step: the engine does not decode the rest for nobody."""
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def read(generator, first: asyncio.Event):
        async for _ in generator:
            first.set()

    async def main():
        for leave in ("cancel", "aclose"):
            generator = engine.generate("Rain", long)
            if leave == "cancel":
                first = asyncio.Event()
                reader = asyncio.ensure_future(read(generator, first))
                await first.wait()
                stats = engine.engine.stats
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            else:
                await anext(generator)
                stats = engine.engine.stats
                await generator.aclose()
            await until_idle(engine.engine)
            after = engine.engine.stats
            assert after.num_aborts == stats.num_aborts + 1, leave
            assert after.num_steps - stats.num_steps <= 2, leave  # the step under way, at most one more
            engine_blocks_free(engine.engine)
        await engine.shutdown()

    asyncio.run(main())


def test_the_engine_trims_the_heap_once_after_a_second_idle(tiny_bart_dir, monkeypatch):
    """Requests back to back trim nothing (their next steps want the pages); once the engine
    has been idle for IDLE_TRIM_SECONDS it trims exactly once, and not again while idle."""
    trims = []
    monkeypatch.setattr(async_engine, "trim_heap", lambda: trims.append(time.monotonic()))
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)
    params = SamplingParams(temperature=0, max_tokens=4)

    async def main():
        for _ in range(5):
            assert [out async for out in engine.generate("The rain in spain", params)][-1].finished
        last = time.monotonic()
        assert not trims
        await asyncio.sleep(async_engine.IDLE_TRIM_SECONDS + 1.5)
        await engine.shutdown()
        return last

    last = asyncio.run(main())
    assert len(trims) == 1
    assert async_engine.IDLE_TRIM_SECONDS - 0.05 <= trims[0] - last <= async_engine.IDLE_TRIM_SECONDS + 1
    engine_blocks_free(engine.engine)


def test_an_engine_whose_trim_fails_serves_on(tiny_bart_dir, monkeypatch):
    """Giving idle memory back is best effort: when it fails, the engine thread lives on."""
    def broken():
        raise OSError("libc is gone")

    monkeypatch.setattr(async_engine, "trim_heap", broken)
    monkeypatch.setattr(async_engine, "IDLE_TRIM_SECONDS", 0.05)
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)

    async def main():
        for _ in range(2):
            outputs = await asyncio.wait_for(collect(engine.generate("Rain", SamplingParams(max_tokens=3))), 30)
            assert outputs[-1].finished
            await asyncio.sleep(0.3)  # idle: the trim fails
        assert engine.is_healthy() and engine._thread.is_alive()
        await engine.shutdown()

    async def collect(generator):
        return [out async for out in generator]

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_a_failing_logits_processor_fails_its_request_alone(tiny_bart_dir):
    """The caller's own code raising (or returning no row) ends that request with the error;
    the requests beside it in the batch finish as offline and the engine stays healthy."""
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)
    steps = 0

    def breaks_at_step_three(output_ids, row):
        nonlocal steps
        steps += 1
        if steps == 3:
            raise KeyError("user bug")
        return row

    good = [SamplingParams(temperature=0, max_tokens=12), SamplingParams(beam_width=2, max_tokens=12)]
    bad = [SamplingParams(temperature=0, max_tokens=12, logits_processors=[breaks_at_step_three]),
           SamplingParams(temperature=0, max_tokens=12, logits_processors=[lambda ids, row: None])]
    expected = [o.outputs[0].token_ids for o in LLM(model=str(tiny_bart_dir), num_gpu_blocks=200).generate(
        ["The rain in spain", "Paged attention"], good, use_tqdm=False)]

    async def final(prompt, params):
        return [out async for out in engine.generate(prompt, params)][-1].outputs[0].token_ids

    async def main():
        results = await asyncio.gather(final("The rain in spain", good[0]), final("Hello", bad[0]),
                                       final("Paged attention", good[1]), final("Hello", bad[1]),
                                       return_exceptions=True)
        assert results[0::2] == expected
        assert isinstance(results[1], KeyError) and "user bug" in str(results[1])
        assert isinstance(results[3], TypeError) and "it must return the logits row" in str(results[3])
        assert engine.is_healthy()
        assert await final("The rain in spain", good[0]) == expected[0]
        await engine.shutdown()

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_a_request_with_no_token_left_fails_alone(tiny_bart_dir):
    """All tokens banned (ValueError) or NaN logits (RuntimeError) end that request alone."""
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)
    good = [SamplingParams(temperature=0, max_tokens=12), SamplingParams(beam_width=2, max_tokens=12)]
    expected = [o.outputs[0].token_ids for o in LLM(model=str(tiny_bart_dir), num_gpu_blocks=200).generate(
        ["The rain in spain", "Paged attention"], good, use_tqdm=False)]
    banned = SamplingParams(beam_width=2, max_tokens=12, min_tokens=2,
                            suppress_tokens=[t for t in range(1000) if t != 2])  # EOS is 2
    nan = SamplingParams(temperature=0, max_tokens=12,
                         logits_processors=[lambda ids, row: row if len(ids) < 4 else row * float("nan")])

    async def final(prompt, params):
        return [out async for out in engine.generate(prompt, params)][-1].outputs[0].token_ids

    async def main():
        results = await asyncio.gather(final("The rain in spain", good[0]), final("Hello", banned),
                                       final("Paged attention", good[1]), final("Hello", nan),
                                       return_exceptions=True)
        assert results[0::2] == expected
        assert isinstance(results[1], ValueError) and "every token is banned at output token 0" in str(results[1])
        assert isinstance(results[3], RuntimeError) and "output token 4 hold NaN" in str(results[3])
        assert engine.is_healthy()
        await engine.shutdown()

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_a_failing_forward_pass_fails_every_request_and_kills_the_engine(tiny_bart_dir):
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)
    runner = engine.engine.model_runner
    real = runner.execute_model
    calls = 0

    def flaky(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 4:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(*args, **kwargs)

    runner.execute_model = flaky

    async def consume(i):
        return [out async for out in engine.generate(f"Request {i}", SamplingParams(temperature=0, max_tokens=20))]

    async def main():
        results = await asyncio.gather(*(consume(i) for i in range(8)), return_exceptions=True)
        assert all(isinstance(r, EngineDeadError) for r in results), results
        assert all("illegal memory access" in str(r) for r in results)
        assert not engine.is_healthy()
        with pytest.raises(EngineDeadError, match="illegal memory access"):
            await consume(99)

    asyncio.run(main())
    engine_blocks_free(engine.engine)


@pytest.mark.parametrize("leave", ["aclose", "abort by id"])
def test_a_failure_between_steps_fails_every_request_and_kills_the_engine(tiny_bart_dir, leave):
    """The engine thread fails taking in an abort (not in a step): every caller still gets the
    error (also the one whose request it was aborting by id) and the engine says it is dead,
    rather than its callers waiting forever."""
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)

    def broken(*args, **kwargs):
        raise RuntimeError("abort failed")

    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True, output_kind=DELTA)

    async def consume(i):
        return [out async for out in engine.generate(f"Request {i}", params)]

    async def consume_rest(generator):
        return [out async for out in generator]

    async def main():
        running = [asyncio.ensure_future(consume(i)) for i in range(4)]
        leaving = engine.generate("Leaving", params, request_id="leaving")
        await anext(leaving)
        engine.engine.abort_request = broken
        if leave == "aclose":
            await leaving.aclose()  # its abort fails on the engine thread
        else:
            running.append(asyncio.ensure_future(consume_rest(leaving)))
            await engine.abort("leaving")
        results = await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), 30)
        assert len(results) == 4 + (leave != "aclose")
        assert all(isinstance(r, EngineDeadError) and "abort failed" in str(r) for r in results), results
        assert not engine.is_healthy()
        with pytest.raises(EngineDeadError, match="abort failed"):
            await consume(99)

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_abort_before_the_first_step_gives_n_completions(tiny_bart_dir):
    """A request of n completions (samples or beams) aborted while it waits ends with n of
    them, finish_reason "abort", as one aborted while it runs does."""
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200, max_num_seqs=3)
    long = dict(max_tokens=200, ignore_eos=True)

    async def until(condition):
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    async def aborted(request_id, params, unfinished):
        """The last completions of a request aborted once `unfinished` requests are in."""
        caller = asyncio.ensure_future(collect(engine.generate("Rain", params, request_id=request_id)))
        await until(lambda: engine.engine.get_num_unfinished_requests() == unfinished)
        await engine.abort(request_id)
        return [(c.index, c.finish_reason) for c in (await asyncio.wait_for(caller, 30))[-1].outputs]

    async def collect(generator):
        return [out async for out in generator]

    def slowly(ids, row):  # the running request lasts until it is aborted, on any machine
        time.sleep(0.05)
        return row

    async def main():
        running = asyncio.ensure_future(collect(engine.generate(  # fills the batch's 3 places
            "Rain", SamplingParams(n=3, temperature=1.0, logits_processors=[slowly], **long), request_id="running")))
        await until(lambda: engine.engine.scheduler.running)
        for request_id, params in (("sampled", SamplingParams(n=3, temperature=1.0, **long)),
                                   ("beams", SamplingParams(n=2, beam_width=3, **long))):
            assert await aborted(request_id, params, 2) == [(i, "abort") for i in range(params.n)]
            assert [g.request_id for g in engine.engine.scheduler.running] == ["running"]  # they waited
        await engine.abort("running")
        outputs = await asyncio.wait_for(running, 30)
        assert [(c.index, c.finish_reason) for c in outputs[-1].outputs] == [(0, "abort"), (1, "abort"), (2, "abort")]
        await engine.shutdown()

    asyncio.run(main())
    engine_blocks_free(engine.engine)


def test_an_engine_dropped_without_shutdown_is_freed(tiny_bart_dir):
    """A notebook cell run again drops its engine: the engine thread holds it only while it has
    work, so the engine (weights, cache) is collected and its thread ends. After `shutdown()`
    the engine says it is not healthy and refuses requests as shut down."""
    def cell():
        engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)

        async def use():
            return [out async for out in engine.generate("Rain", SamplingParams(max_tokens=3))][-1]

        assert asyncio.run(use()).finished
        return weakref.ref(engine), engine._thread

    refs, threads = zip(*[cell() for _ in range(3)])
    deadline = time.monotonic() + 10
    while any(ref() is not None for ref in refs) and time.monotonic() < deadline:
        gc.collect()  # a thread may hold its engine a moment longer, between two steps
        time.sleep(0.05)
    assert [ref() for ref in refs] == [None] * 3
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads)

    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=200)

    async def shut():
        assert engine.is_healthy()
        await engine.shutdown()
        assert not engine.is_healthy() and engine.dead_error is None
        with pytest.raises(EngineDeadError, match="the engine is shut down"):
            await anext(engine.generate("Rain", SamplingParams(max_tokens=3)))

    asyncio.run(shut())


@pytest.fixture(scope="module")
def tiny_en_offline(tiny_en_assets):
    from tests.whisper.conftest import make_llm

    return make_llm("tiny.en", 20 * 110)


def mixed_params(i: int) -> SamplingParams:
    """Greedy, seeded sampling with n=2, and beam search, in turn; outputs streamed as deltas."""
    kind = i % 3
    if kind == 0:
        return SamplingParams(temperature=0.0, max_tokens=10 + i % 23, output_kind=DELTA)
    if kind == 1:
        return SamplingParams(temperature=0.8, seed=i, n=2, max_tokens=10 + i % 19, output_kind=DELTA)
    return SamplingParams(use_beam_search=True, beam_width=3, temperature=0.0, max_tokens=12,
                          output_kind=DELTA)


def test_64_consumers_with_cancellations_keep_results_blocks_and_the_event_loop(
        tiny_bart_dir, tiny_en_offline, corpus):
    prompts = [f"Request {i}: the rain in spain falls mainly on the plain {i} times." for i in range(56)]
    offline = LLM(model=str(tiny_bart_dir), num_gpu_blocks=1000, block_size=8)
    expected = offline.generate(prompts, [mixed_params(i) for i in range(56)], use_tqdm=False)
    clips = corpus[:8]
    expected_text = [t.text for t in tiny_en_offline.transcribe([c.pair for c in clips])]

    bart = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=70, block_size=8,
                                     swap_space=0.05, preemption_mode="swap", max_num_seqs=24)
    whisper = AsyncLLMEngine.from_model("tiny.en", num_gpu_blocks=8 * 110, swap_space=0.05)
    states: dict[int, str] = {}  # consumer -> where its request was when it was cancelled

    async def consume(i):
        ids: dict[int, list[int]] = {}
        async for out in bart.generate(prompts[i], mixed_params(i), request_id=f"r{i}"):
            for c in out.outputs:
                ids.setdefault(c.index, []).extend(c.token_ids)
        return [ids[k] for k in sorted(ids)]

    def where(i: int) -> str:
        scheduler = bart.engine.scheduler
        for name in ("waiting", "running", "swapped"):
            if any(g.request_id == f"r{i}" for g in list(getattr(scheduler, name))):
                return name
        return "elsewhere"

    async def canceller(tasks):
        """Cancel 3 consumers while waiting (the last ones queued), 3 while running (the first
        ones admitted) and the first 4 seen swapped out: 10 in all."""
        wanted = {**{i: "waiting" for i in (53, 54, 55)}, **{i: "running" for i in (0, 1, 2)}}
        while len(states) < 10 and not all(t.done() for t in tasks):
            for i, task in enumerate(tasks):
                state = where(i)
                if i in states or task.done() or state == "elsewhere":
                    continue
                if wanted.get(i) == state or (state == "swapped" and sum(
                        s == "swapped" for s in states.values()) < 4 and i not in wanted):
                    states[i] = state
                    task.cancel()
            await asyncio.sleep(0.002)

    lateness = []

    async def ticker(stop):
        while not stop.is_set():
            start = time.monotonic()
            await asyncio.sleep(0.01)
            lateness.append(time.monotonic() - start - 0.01)

    async def main():
        stop = asyncio.Event()
        tick = asyncio.ensure_future(ticker(stop))
        tasks = [asyncio.ensure_future(consume(i)) for i in range(56)]
        transcripts = [asyncio.ensure_future(whisper.transcribe([clip.pair])) for clip in clips]
        await canceller(tasks)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        texts = [t[0].text for t in await asyncio.gather(*transcripts)]
        await until_idle(bart.engine)
        stop.set()
        await tick
        await bart.shutdown()
        await whisper.shutdown()
        return results, texts

    results, texts = asyncio.run(main())
    assert texts == expected_text
    for i, (result, want) in enumerate(zip(results, expected)):
        if i in states and isinstance(result, asyncio.CancelledError):
            continue
        assert result == [c.token_ids for c in want.outputs], i
    cancelled = sum(isinstance(results[i], asyncio.CancelledError) for i in states)
    print(f"cancelled while {sorted(states.values())} ({cancelled} before they finished); swaps "
          f"{bart.engine.stats.num_swap_outs}; ticker late by {1000 * max(lateness):.1f} ms at most "
          f"over {len(lateness)} ticks")
    assert sorted(states.values()) == ["running"] * 3 + ["swapped"] * 4 + ["waiting"] * 3
    assert cancelled >= 8
    assert bart.engine.stats.num_swap_outs > 0
    # An engine that blocks the loop makes the tick of every step late; one late tick on a shared
    # VM can be the machine's (one CI run saw a single 0.57 s tick among 453, not reproduced
    # since). So: 99% of ticks within 50 ms.
    late = sum(x > 0.05 for x in lateness)
    assert late <= len(lateness) // 100, f"{late} of {len(lateness)} ticks late by over 50 ms"
    engine_blocks_free(bart.engine)
    engine_blocks_free(whisper.engine)

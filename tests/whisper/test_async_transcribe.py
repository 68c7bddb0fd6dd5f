"""The async driver gives `LLM.transcribe`'s transcripts: corpus clips and the long clips whose
cuts fall in short gaps and between words (follow-up windows, conditioning on previous text;
with word timestamps, the next window after a window's words) through
`AsyncLLMEngine.transcribe`."""
from __future__ import annotations

import asyncio
import gc
import threading

import numpy as np

import pytest

from encdec import AsyncLLMEngine, EngineOverloaded
from encdec.audio import SAMPLE_RATE
from encdec.whisper.pipeline import TranscriptionJob


def test_async_transcripts_equal_the_offline_ones(tiny_en, corpus, long_clips):
    inputs = [clip.pair for clip in corpus[:8]] + [(long_clips[2].audio, SAMPLE_RATE)]  # 86 s: 3 windows or more
    offline = tiny_en.transcribe(inputs)
    joined = [(np.concatenate([clip.audio for clip in corpus[:12]]), SAMPLE_RATE)]  # 37 s: two windows or more
    offline_words = tiny_en.transcribe(joined, word_timestamps=True)
    engine = AsyncLLMEngine.from_model("tiny.en", num_gpu_blocks=20 * 110, swap_space=0.05)
    reported = []  # (thread, segments): the callbacks run on the event loop, also after word alignment

    async def main():
        together = await engine.transcribe(inputs)
        one_by_one = await asyncio.gather(*(engine.transcribe([item]) for item in inputs[:4]))
        words = await engine.transcribe(joined, word_timestamps=True, on_segments=lambda i, segments: reported.append(
            (threading.current_thread(), segments)))
        await engine.shutdown()
        return together, [t for (t,) in one_by_one], words

    together, one_by_one, words = asyncio.run(main())
    key = [(t.text, [(s.start, s.end, s.tokens) for s in t.segments]) for t in offline]
    assert [(t.text, [(s.start, s.end, s.tokens) for s in t.segments]) for t in together] == key
    assert [t.text for t in one_by_one] == [t.text for t in offline[:4]]
    assert [[(s.start, s.end, s.words) for s in t.segments] for t in words] == \
        [[(s.start, s.end, s.words) for s in t.segments] for t in offline_words]
    assert [s for _, segments in reported for s in segments] == words[0].segments
    assert {thread for thread, _ in reported} == {threading.main_thread()}
    bm = engine.engine.block_manager
    assert bm.get_num_free_gpu_blocks() == bm.num_total_gpu_blocks


def test_async_fallbacks_reuse_cross_kv_and_match_the_offline_ones(tiny_en, corpus, monkeypatch):
    """Every decode made unsure: the engine thread decides to return a window's cross keys and
    values, and its fallback decodes from them, as offline (one clip at a time: same batches)."""
    options = dict(language="en", temperature=(0.0, 0.4), best_of=2, logprob_threshold=0.0)
    clips = [clip.pair for clip in corpus[4:6]]
    offline = [tiny_en.transcribe([clip], **options)[0] for clip in clips]
    engine = AsyncLLMEngine.from_model("tiny.en", num_gpu_blocks=2 * 110, swap_space=0.05)
    decided = []  # (thread, the window's decode failed) per first decode
    fails = TranscriptionJob._fails
    monkeypatch.setattr(TranscriptionJob, "_fails", lambda job, request, output: decided.append(
        (threading.current_thread(), fails(job, request, output))) or decided[-1][1])

    async def main():
        results = [(await engine.transcribe([clip], **options))[0] for clip in clips]
        await engine.shutdown()
        return results

    served = asyncio.run(main())
    assert [failed for _, failed in decided] == [True, True]
    assert all(thread is not threading.main_thread() for thread, _ in decided)
    assert engine.engine.stats.num_encoder_runs == len(clips)  # two decodes a window, one encoder run
    assert [[(s.tokens, s.temperature) for s in t.segments] for t in served] == \
        [[(s.tokens, s.temperature) for s in t.segments] for t in offline]
    bm = engine.engine.block_manager
    assert bm.get_num_free_gpu_blocks() == bm.num_total_gpu_blocks


def test_a_finished_job_is_freed_without_the_garbage_collector(tiny_en, corpus):
    """No reference cycle keeps a job (and its audio features) alive once its transcription
    returned, with temperature fallback possible (the default) or word timestamps, offline or
    through the async driver; a server's memory would otherwise wait for the collector."""
    def jobs_alive() -> int:
        return sum(type(o) is TranscriptionJob for o in gc.get_objects())

    engine = AsyncLLMEngine.from_model("tiny.en", num_gpu_blocks=2 * 120, swap_space=0.05)

    async def main():
        await engine.transcribe([corpus[0].pair])
        await engine.transcribe([corpus[1].pair], word_timestamps=True)
        await engine.shutdown()

    gc.collect()
    gc.disable()
    try:
        tiny_en.transcribe([corpus[0].pair])
        tiny_en.transcribe([corpus[1].pair], word_timestamps=True)
        asyncio.run(main())
        assert jobs_alive() == 0
    finally:
        gc.enable()


def test_a_refused_job_reads_every_windows_refusal(long_clips):
    """The windows of a job of windows at once start together and, past `max_waiting_requests`, are
    refused together: the job raises EngineOverloaded once, and no window's refusal is left
    unread (asyncio's "Task exception was never retrieved" in a server's log)."""
    engine = AsyncLLMEngine.from_model("tiny.en", max_waiting_requests=1, max_num_seqs=1,
                                       num_gpu_blocks=4 * 110, swap_space=0.05)
    long = [(long_clips[1].audio, SAMPLE_RATE)]
    assert len(long[0][0]) > 2 * 30 * SAMPLE_RATE  # three windows or more
    unread = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda _, context: unread.append(context["message"]))
        first = asyncio.ensure_future(engine.transcribe(long, windows_at_once=True))
        while engine.num_queued() == 0:  # its windows are in: one running, the others waiting
            await asyncio.sleep(0.01)
        with pytest.raises(EngineOverloaded):
            await engine.transcribe(long, windows_at_once=True)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await engine.shutdown()
        gc.collect()

    asyncio.run(main())
    assert unread == []

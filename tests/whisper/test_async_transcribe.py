"""The async driver gives `LLM.transcribe`'s transcripts: the corpus clips and the long clips
(follow-up windows, conditioning on previous text) through `AsyncLLMEngine.transcribe`."""
from __future__ import annotations

import asyncio

from encdec import AsyncLLMEngine
from encdec.audio import SAMPLE_RATE


def test_async_transcripts_equal_the_offline_ones(tiny_en, corpus, long_clips):
    inputs = [clip.pair for clip in corpus] + [(clip.audio, SAMPLE_RATE) for clip in long_clips]
    offline = tiny_en.transcribe(inputs)
    engine = AsyncLLMEngine.from_model("tiny.en", num_gpu_blocks=20 * 110, swap_space=0.05)

    async def main():
        together = await engine.transcribe(inputs)
        one_by_one = await asyncio.gather(*(engine.transcribe([item]) for item in inputs[:4]))
        await engine.shutdown()
        return together, [t for (t,) in one_by_one]

    together, one_by_one = asyncio.run(main())
    key = [(t.text, [(s.start, s.end, s.tokens) for s in t.segments]) for t in offline]
    assert [(t.text, [(s.start, s.end, s.tokens) for s in t.segments]) for t in together] == key
    assert [t.text for t in one_by_one] == [t.text for t in offline[:4]]
    bm = engine.engine.block_manager
    assert bm.get_num_free_gpu_blocks() == bm.num_total_gpu_blocks

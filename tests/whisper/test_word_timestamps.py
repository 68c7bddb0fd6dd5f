"""Word timestamps: the alignment heads' attention, DTW, and openai-whisper's rules, against
faster-whisper's `word_timestamps=True` on the same weights and the espeak-ng corpus."""
from __future__ import annotations

import numpy as np
import pytest

from encdec import AsyncLLMEngine
from encdec.whisper.timing import dtw, median_filter, merge_punctuation, split_words
from encdec.whisper.transcript import Word
from tests.conftest import assert_all_blocks_free

faster_whisper = pytest.importorskip("faster_whisper")


def test_dtw_follows_the_cheapest_monotonic_path():
    cost = np.array([[0, 5, 5, 5], [5, 0, 0, 5], [5, 5, 5, 0]], dtype=float)
    rows, cols = dtw(cost)
    assert rows.tolist() == [0, 1, 1, 2] and cols.tolist() == [0, 1, 2, 3]


def test_median_filter_reflects_at_the_edges():
    x = np.array([[1.0, 9.0, 2.0, 3.0, 8.0]])
    assert median_filter(x, 3).tolist() == [[9.0, 2.0, 3.0, 3.0, 3.0]]


def test_punctuation_joins_its_word_and_keeps_the_word_times():
    words = [Word(" (", 0.0, 0.1, 1.0, [1]), Word("Hello", 0.1, 0.5, 1.0, [2]),
             Word(",", 0.5, 0.6, 1.0, [3]), Word(" world", 0.6, 1.0, 1.0, [4])]
    merge_punctuation(words)
    assert [(w.word, w.start, w.end, w.tokens) for w in words] == [
        ("", 0.0, 0.1, []), (" (Hello,", 0.1, 0.5, [1, 2, 3]), ("", 0.5, 0.6, []), (" world", 0.6, 1.0, [4])]


def test_words_split_at_spaces_and_punctuation(tiny_en):
    tokenizer = tiny_en.get_tokenizer()
    ids = tokenizer(" Hello, wonderful world.", add_special_tokens=False)["input_ids"]
    assert [w for w, _ in split_words(tokenizer, ids, "en")] == [" Hello", ",", " wonderful", " world", "."]


@pytest.fixture(scope="module")
def reference_words(tiny_en_assets, corpus):
    model = faster_whisper.WhisperModel(str(tiny_en_assets.bin_parts[0].parent), device="cpu",
                                        compute_type="float32")
    return [[w for s in model.transcribe(clip.audio, beam_size=1, word_timestamps=True)[0] for w in s.words]
            for clip in corpus]


def test_word_times_match_faster_whisper(tiny_en, corpus, reference_words):
    results = tiny_en.transcribe([clip.pair for clip in corpus], word_timestamps=True)
    gaps, compared = [], 0
    for result, theirs in zip(results, reference_words):
        ours = [w for s in result.segments for w in s.words]
        assert ours and all(s.words for s in result.segments)
        for segment in result.segments:  # words fit their segment
            assert segment.start <= segment.words[0].start + 1e-6 and segment.words[-1].end <= segment.end + 1e-6
        if [w.word for w in ours] != [w.word for w in theirs]:
            continue
        compared += 1
        gaps += [abs(a.start - b.start) for a, b in zip(ours, theirs)]
        gaps += [abs(a.end - b.end) for a, b in zip(ours, theirs)]
    print(f"{compared}/{len(corpus)} clips with the same words; median |difference| "
          f"{1000 * np.median(gaps):.0f} ms, 90th percentile {1000 * np.percentile(gaps, 90):.0f} ms")
    assert compared >= len(corpus) // 2
    assert np.median(gaps) <= 0.05
    assert_all_blocks_free(tiny_en)


def test_async_word_timestamps_equal_the_offline_ones(tiny_en, corpus):
    offline = tiny_en.transcribe([clip.pair for clip in corpus[:4]], word_timestamps=True)
    engine = AsyncLLMEngine.from_model("tiny.en", num_gpu_blocks=8 * 110, swap_space=0.05)

    async def main():
        results = await engine.transcribe([clip.pair for clip in corpus[:4]], word_timestamps=True)
        await engine.shutdown()
        return results

    import asyncio
    together = asyncio.run(main())
    key = lambda ts: [[(w.word, w.start, w.end) for s in t.segments for w in s.words] for t in ts]  # noqa: E731
    assert key(together) == key(offline)


def test_a_hallucination_between_silences_is_found():
    from encdec.whisper.timing import hallucination_index, is_anomaly
    from encdec.whisper.transcript import Segment

    def segment(start, end, probability, word_length):
        words = [Word(f" w{i}", start + i * word_length, start + (i + 1) * word_length, probability)
                 for i in range(int((end - start) / word_length))]
        return Segment(start, end, "".join(w.word for w in words), words=words)

    speech = segment(0.5, 3.0, 0.9, 0.25)
    ghost = segment(12.0, 12.5, 0.05, 0.1)  # improbable, very short words after 9 s of silence
    assert not is_anomaly(speech) and is_anomaly(ghost)
    assert hallucination_index([speech, ghost], 2.0, 0.0, 0.0, 30.0) == 1
    assert hallucination_index([speech, ghost], 10.0, 0.0, 0.0, 30.0) is None
    # silence after it: up to the audio's end (13 s: 0.5 s, too short), or 30 s after the window's
    # start (as openai-whisper's `window_end_time`, also for a shorter window)
    assert hallucination_index([speech, ghost], 2.0, 0.0, 0.0, 13.0) is None
    late = segment(28.6, 29.0, 0.05, 0.1)
    assert hallucination_index([speech, late], 2.0, 0.0, 0.0, 29.5) == 1
    # openai-whisper's: silence before a segment that starts within `threshold` of the input's start
    assert hallucination_index([segment(2.5, 3.0, 0.05, 0.1)], 3.0, 0.0, 0.0, 30.0) == 0
    # only the first 8 words count: 8 good ones, then 2 that alone would score 5.7
    mixed = segment(0.0, 2.0, 0.9, 0.25)
    mixed.words += [Word(" x", 2.0, 2.01, 0.01), Word(" y", 2.01, 2.02, 0.01)]
    assert not is_anomaly(mixed)
    # words left out are openai-whisper's punctuation (what word timestamps merge), not Python's
    signs = [Word(" 50", 0.0, 0.5, 0.9), Word("%", 0.5, 0.51, 0.05), Word(";", 0.51, 0.52, 0.05)]
    assert is_anomaly(Segment(0.0, 0.52, " 50%;", words=signs))
    quoted = [Word(" w", 0.0, 0.5, 0.9), Word("“", 0.5, 0.51, 0.05), Word("。", 0.51, 0.52, 0.05)]
    assert not is_anomaly(Segment(0.0, 0.52, " w“。", words=quoted))

"""VAD: Silero VAD's speech regions become what is transcribed, and times map back."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path

import numpy as np
import pytest

from encdec.audio import SAMPLE_RATE, load_audio
from encdec.whisper.transcript import Segment, Word
from encdec.whisper.vad import (FRAME, MIN_SPLIT_S, SpeechMap, VadOptions, speech_probabilities,
                                speech_regions)
from tests.conftest import assert_all_blocks_free
from tests.speech_corpus import sentence_coverage

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "hello.wav"

pytest.importorskip("silero_vad")


def frames(pattern: str) -> np.ndarray:
    """'0' = 0.1, '1' = 0.9, one character per 512-sample frame."""
    return np.array([0.9 if c == "1" else 0.1 for c in pattern], dtype=np.float32)


def test_regions_follow_thresholds_gaps_and_padding():
    probs = frames("0000111100000000001110000")
    n = len(probs) * FRAME
    options = VadOptions(min_silence_duration_ms=0, speech_pad_ms=0)
    assert speech_regions(probs, n, options) == [(4 * FRAME, 8 * FRAME), (18 * FRAME, 21 * FRAME)]
    # a gap shorter than min_silence joins the regions, and so does the silence at the end,
    # shorter than it too (the speech runs to the end); padding stays inside the audio
    joined = VadOptions(min_silence_duration_ms=1000, speech_pad_ms=100)
    assert speech_regions(probs, n, joined) == [(4 * FRAME - 1600, n)]
    assert speech_regions(probs, n, VadOptions(min_speech_duration_ms=100, speech_pad_ms=0,
                                               min_silence_duration_ms=0)) == [(4 * FRAME, 8 * FRAME)]
    long = VadOptions(max_speech_duration_s=2 * FRAME / SAMPLE_RATE, speech_pad_ms=0, min_silence_duration_ms=0)
    assert all(e - s <= 2 * FRAME for s, e in speech_regions(frames("0111111110"), 10 * FRAME, long))


def test_the_thresholds_ends_are_allowed():
    """OpenAI's `server_vad` threshold runs from 0.0 to 1.0: at 0 every frame is speech, at 1
    none of these is."""
    probs = frames("0000111100")
    n = len(probs) * FRAME
    assert speech_regions(probs, n, VadOptions(threshold=0.0, min_silence_duration_ms=0, speech_pad_ms=0)) == [(0, n)]
    assert speech_regions(probs, n, VadOptions(threshold=1.0, neg_threshold=1.0)) == []


@pytest.mark.parametrize("fields, message", [
    (dict(max_speech_duration_s=0.001), r"vad max_speech_duration_s must be a number >= 0.064, got 0.001"),
    (dict(max_speech_duration_s=float("nan")), "vad max_speech_duration_s"),
    (dict(threshold="0.5"), r"vad threshold must be in \[0, 1\], got '0.5'"),
    (dict(threshold=float("nan")), "vad threshold"),
    (dict(neg_threshold=2.0), r"vad neg_threshold must be in \[0, 1\] or None, got 2.0"),
    (dict(neg_threshold=-1.0), "vad neg_threshold"),
    (dict(speech_pad_ms=-0.5), "vad speech_pad_ms must be a number >= 0, got -0.5"),
    (dict(min_silence_duration_ms=-1), "vad min_silence_duration_ms"),
])
def test_bad_vad_options_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        VadOptions(**fields)


def test_options_changed_after_they_were_made_are_checked_again():
    options = VadOptions()
    options.threshold = 5
    with pytest.raises(ValueError, match=r"vad threshold must be in \[0, 1\], got 5"):
        VadOptions.of(options)


def test_probabilities_score_a_frame_past_the_audio_as_faster_whisper_pads_it():
    """faster-whisper pads to a whole frame more: a full frame of zeros when the audio ends on one."""
    audio = load_audio(str(SAMPLE))
    for length in (2 * FRAME, 2 * FRAME + 1, 3 * FRAME - 1):
        assert len(speech_probabilities(audio[:length])) == length // FRAME + 1


def test_uploads_scored_at_once_get_their_own_probabilities():
    """The server scores several uploads on threads at once: each gets what it gets alone (a
    shared model mixed their frame-to-frame state, and crashed)."""
    audio = load_audio(str(SAMPLE))
    clips = [audio[i * 4000:] for i in range(4)]
    alone = [speech_probabilities(clip) for clip in clips]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(2):
            together = list(pool.map(speech_probabilities, clips))
            assert all(np.array_equal(a, b) for a, b in zip(alone, together))


def test_the_shortest_max_speech_duration_splits_any_run():
    options = VadOptions(max_speech_duration_s=MIN_SPLIT_S, speech_pad_ms=0, min_silence_duration_ms=0)
    for pattern in ("011", "0111", "01111111111111111111111110"):
        probs = frames(pattern)
        regions = speech_regions(probs, len(probs) * FRAME, options)
        assert all(e - s <= 2 * FRAME for s, e in regions) and regions[0][0] == FRAME


def test_speech_map_times_go_back_to_the_input():
    speech = SpeechMap.__new__(SpeechMap)
    speech.regions = [(16000, 32000), (80000, 96000)]  # 1-2 s and 5-6 s
    speech.joined_starts = np.array([0, 16000])
    assert speech.to_original(0.5) == 1.5 and type(speech.to_original(0.5)) is float  # not NumPy's
    assert speech.to_original(1.0) == 5.0 and speech.to_original(1.0, is_end=True) == 2.0
    assert speech.to_original(1.75, is_end=True) == 5.75
    # a word across the seam goes back whole by the region its middle is in, as in faster-whisper;
    # a segment with words spans them
    words = [Word(" so", 0.2, 0.6, 0.9), Word(" on", 0.9, 1.3, 0.9), Word(" and", 1.4, 1.5, 0.9)]
    back = speech.segment_to_original(Segment(0.1, 1.6, " so on and", words=words))
    assert [(w.start, w.end) for w in back.words] == [(1.2, 1.6), (4.9, 5.3), (5.4, 5.5)]
    assert (back.start, back.end) == (1.2, 5.5)
    plain = speech.segment_to_original(Segment(0.1, 1.0, " so"))
    assert (plain.start, plain.end) == (1.1, 2.0)


def test_a_segment_that_ends_on_a_seam_ends_in_the_region_it_closes():
    """8.06 s is 128960.00000000001 samples: read as the sample faster-whisper reads, 128960,
    the seam, not past it (which put the end after the 4.44 s of silence left out)."""
    speech = SpeechMap.__new__(SpeechMap)
    speech.regions = [(0, 128960), (200000, 260000)]
    speech.joined_starts = np.array([0, 128960])
    assert speech.segment_to_original(Segment(7.0, 8.06, " x")).end == 8.06


@pytest.mark.parametrize("options", [
    {}, dict(min_silence_duration_ms=300, speech_pad_ms=0), dict(min_speech_duration_ms=250),
    dict(threshold=0.6, neg_threshold=0.2, speech_pad_ms=100), dict(max_speech_duration_s=3.0),
    dict(max_speech_duration_s=1.5, min_silence_duration_ms=100, speech_pad_ms=30),
    dict(min_speech_duration_ms=62.5, min_silence_duration_ms=150.5, speech_pad_ms=33.3),
], ids=str)
def test_regions_are_faster_whispers_for_the_same_probabilities(monkeypatch, options):
    """Silero VAD's rules as faster-whisper applies them: seeded probabilities that hover about
    both thresholds (pauses, uncertain stretches, speech to the very end), the same regions."""
    fw_vad = pytest.importorskip("faster_whisper.vad")
    rng = np.random.default_rng(0)
    for case in range(30):
        levels = rng.choice([0.05, 0.3, 0.42, 0.55, 0.95], size=rng.integers(4, 30))
        probs = np.repeat(levels, rng.integers(1, 90, size=len(levels))).astype(np.float32)
        num_samples = len(probs) * FRAME - int(rng.integers(0, FRAME))
        monkeypatch.setattr(fw_vad, "get_vad_model", lambda: lambda audio: probs)
        expected = fw_vad.get_speech_timestamps(np.zeros(num_samples, np.float32), fw_vad.VadOptions(**options))
        assert speech_regions(probs, num_samples, VadOptions(**options)) == [
            (r["start"], r["end"]) for r in expected], case


def test_vad_drops_the_gap_and_keeps_the_second_sentence_in_place(tiny_en, corpus):
    # tiny.en stops after the first sentence of some pairs, as openai-whisper and faster-whisper
    # do (corpus[0] and corpus[3]: the second is lost with or without VAD, in all three)
    first, second = corpus[2], corpus[5]
    rng = np.random.default_rng(0)
    gap = np.concatenate([np.zeros(8 * SAMPLE_RATE), rng.normal(0, 0.03, 4 * SAMPLE_RATE),
                          np.zeros(8 * SAMPLE_RATE)]).astype(np.float32)  # 20 s of silence and noise
    audio = np.concatenate([first.audio, gap, second.audio])
    gap_start, second_start = len(first.audio) / SAMPLE_RATE, (len(first.audio) + len(gap)) / SAMPLE_RATE
    (plain,) = tiny_en.transcribe((audio, SAMPLE_RATE))
    (filtered,) = tiny_en.transcribe((audio, SAMPLE_RATE), vad_filter=True)
    in_gap = [s.text for s in plain.segments if s.start > gap_start + 0.5 and s.end < second_start - 0.5]
    print(f"without VAD, in the gap: {in_gap or 'nothing'}; with VAD: "
          f"{[(round(s.start, 2), round(s.end, 2), s.text) for s in filtered.segments]}")
    assert not [s for s in filtered.segments if s.start > gap_start + 0.5 and s.end < second_start - 0.5]
    assert min(sentence_coverage([first.text, second.text], filtered.text)) >= 0.5
    later = [s for s in filtered.segments if s.start > gap_start]
    assert later and abs(later[0].start - second_start) <= 0.3
    assert filtered.duration == pytest.approx(len(audio) / SAMPLE_RATE)
    assert_all_blocks_free(tiny_en)

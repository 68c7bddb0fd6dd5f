"""Long audio loses no speech: the repair loop, against faster-whisper on long espeak-ng clips.

The clips (`tests.speech_corpus.long_clips`, about 7 minutes) join 50-60 sentences with pauses
of 0.1-0.9 s, or in run-on utterances that cross the 30 s boundaries. Every window's decode that
stops short gets a follow-up window (`encdec.whisper.coverage`); the gates: every sentence is
transcribed, and the WER is within one point of faster-whisper's `WhisperModel` (greedy,
`beam_size=1`, float32, its other defaults) on the same weights.
"""
from __future__ import annotations

import numpy as np
import pytest

from encdec.audio import SAMPLE_RATE
from encdec.whisper.options import TranscribeOptions
from encdec.whisper.transcribe import run_job
from encdec.whisper.windows import split_windows
from tests.conftest import assert_all_blocks_free
from tests.speech_corpus import CORPUS, sentence_coverage, speak, wer
from tests.whisper.recording_job import RecordingJob

faster_whisper = pytest.importorskip("faster_whisper")


def transcribe_job(llm, clips, **options) -> RecordingJob:
    """The job `LLM.transcribe` runs, kept so its requests can be read."""
    engine = llm.llm_engine
    job = RecordingJob(engine.model_config.special_tokens, engine.tokenizer, engine.model_config.max_decoder_len,
                       [clip.audio for clip in clips], TranscribeOptions(language="en", **options))
    runs = engine.stats.num_encoder_runs
    run_job(engine, job)
    windows = {id(request.window) for request in job.requests_made}
    assert engine.stats.num_encoder_runs - runs == len(windows)  # one a window: fallbacks reuse it
    assert_all_blocks_free(llm)
    return job


def faster_whisper_texts(assets_dir: str, clips) -> list[str]:
    model = faster_whisper.WhisperModel(assets_dir, device="cpu", compute_type="float32")
    return [" ".join(s.text.strip() for s in model.transcribe(clip.audio, language="en", beam_size=1)[0])
            for clip in clips]


def check_against_faster_whisper(llm, assets_dir: str, clips, name: str) -> None:
    job = transcribe_job(llm, clips)
    ours = [t.text for t in job.results([None] * len(clips))]
    theirs = faster_whisper_texts(assets_dir, clips)
    plain = [t.text for t in llm.transcribe([(c.audio, 16000) for c in clips], language="en", timestamps=False)]
    refs = [clip.text for clip in clips]
    ours_wer, theirs_wer, plain_wer = wer(refs, ours), wer(refs, theirs), wer(refs, plain)
    print(f"{name} on {sum(c.seconds for c in clips):.0f} s of long clips: WER encdec {ours_wer:.2%}, "
          f"--no-timestamps {plain_wer:.2%}, faster-whisper {theirs_wer:.2%}; "
          f"{len(job.requests_made)} requests for {len(job.windows)} windows")
    assert ours_wer <= theirs_wer + 0.01
    assert abs(ours_wer - plain_wer) <= 0.01
    for clip, text in zip(clips, ours):
        coverage = sentence_coverage(clip.sentences, text)
        assert min(coverage) >= 0.5, [s for s, c in zip(clip.sentences, coverage) if c < 0.5]


@pytest.mark.extended
def test_tiny_en_long_clips_match_faster_whisper(tiny_en, tiny_en_assets, long_clips):
    check_against_faster_whisper(tiny_en, str(tiny_en_assets.bin_parts[0].parent), long_clips, "tiny.en")


@pytest.mark.slow
def test_base_long_clips_match_faster_whisper(base, base_assets, ct2_dir, long_clips):
    check_against_faster_whisper(base, ct2_dir(base_assets), long_clips, "base")


def test_windows_that_end_early_get_follow_ups_and_no_sentence_is_lost(tiny_en, long_clips):
    """Windows decoded at once, as `windows_at_once=True` runs them: the 3-minute
    clip's windows stop short, their follow-ups start where the kept text ends, and every
    sentence is in the transcript."""
    pauses = long_clips[0]
    assert pauses.seconds > 170
    job = transcribe_job(tiny_en, [pauses], windows_at_once=True)
    windows = split_windows(pauses.audio)
    firsts = [r for r in job.requests_made if not r.window.follow_ups]
    assert [(r.window.start, r.window.end) for r in firsts] == windows
    follow_ups = [r.window for r in job.requests_made if r.window.follow_ups]
    assert follow_ups
    for follow_up in follow_ups:  # it ends where its window ends and starts after the kept text
        parent = next(w for w in job.windows if w.end == follow_up.end and w.start < follow_up.start
                      and w.follow_ups == follow_up.follow_ups - 1)
        assert parent.segments and parent.segments[-1].end <= follow_up.offset + 1e-6
    (result,) = job.results([None])
    coverage = sentence_coverage(pauses.sentences, result.text)
    assert min(coverage) >= 0.5, [s for s, c in zip(pauses.sentences, coverage) if c < 0.5]
    for before, after in zip(result.segments, result.segments[1:]):
        assert before.end <= after.start + 1e-6
    assert result.text == "".join(s.text for s in result.segments).strip()


def test_conditioned_windows_are_prompted_with_the_previous_windows_text(tiny_en, long_clips):
    pauses = long_clips[0]
    job = transcribe_job(tiny_en, [pauses], condition_on_previous_text=True, temperature=0.0)
    requests = job.requests_made
    starts = [r.window.start for r in requests]
    assert starts == sorted(starts)  # one window after the other, follow-ups in between
    sot_prev = tiny_en.llm_engine.model_config.special_tokens.sot_prev
    sot = tiny_en.llm_engine.model_config.special_tokens.sot
    for before, after in zip(requests, requests[1:]):
        if not before.window.segments:
            continue
        last = before.window.segments[-1].tokens
        prompt = after.prompt["decoder_prompt"]
        # <|startofprev|> ... the previous window's last segment (timestamps included), sot
        assert prompt[0] == sot_prev and prompt[-1] == sot
        assert prompt[-1 - len(last):-1] == last


@pytest.mark.parametrize("resume", [27.5, 31.0])  # speech resumes inside the first cut's zone; past its limit
def test_a_window_starts_close_to_the_speech_after_a_long_silence(tiny_en, speech_dir, resume):
    """Cut at quiet points (`windows_at_once=True`), the window after a long digital
    silence starts at most a second before the speech, where tiny.en would invent text for
    seconds of silence (" 1. 1. 1."), and nothing is transcribed inside the silence."""
    parts = [speak(speech_dir, f"gap{i}", voice, speed, text) for i, (voice, speed, text) in enumerate(CORPUS[:8])]
    before = parts[0]
    after = np.concatenate([p for part in parts[1:] for p in (part, np.zeros(SAMPLE_RATE // 2, np.float32))])
    audio = np.concatenate([before, np.zeros(int(resume * SAMPLE_RATE) - len(before), np.float32), after])
    speech_end, speech_start = len(before) / SAMPLE_RATE, int(resume * SAMPLE_RATE) / SAMPLE_RATE
    assert len(after) > 25 * SAMPLE_RATE  # the speech after the silence needs windows of its own
    starts = [start / SAMPLE_RATE for start, _ in split_windows(audio)]
    resumed = next(start for start in starts if start > speech_end)
    assert speech_start - 1.0 <= resumed <= speech_start
    [result] = tiny_en.transcribe([audio], language="en", windows_at_once=True, temperature=0.0)
    assert all(s.start < speech_end or s.start >= speech_start - 1.0 for s in result.segments), result.segments
    sentences = [text for _, _, text in CORPUS[:8]]
    assert min(sentence_coverage(sentences, result.text)) >= 0.5, result.text

"""The transcription job's repair loop, temperature fallback and seams, with a scripted engine.

A toy vocabulary: text 0-9 (token i reads " w{i}"), <|endoftext|> 10, <|startoftranscript|> 11,
<|notimestamps|> 17, timestamps 18.. (<|0.00|> .. <|30.00|>). `ScriptedEngine` answers each
request with the tokens a script gives for its window, so every request the job makes can be
asserted on.
"""
from __future__ import annotations

import numpy as np
import pytest
from faster_whisper.vad import VadOptions as FasterVadOptions

from encdec.audio import SAMPLE_RATE
from encdec.outputs import CompletionOutput, RequestOutput
from encdec.whisper.coverage import MIN_REMAINDER, plan_seek, plan_window, repeated_words
from encdec.whisper.options import TranscribeOptions
from encdec.whisper.pipeline import decode_seed
from encdec.whisper.segments import split_spans
from encdec.whisper.tokens import WhisperTokens
from encdec.whisper.transcribe import run_job
from encdec.whisper.vad import VadOptions
from tests.whisper.recording_job import RecordingJob

EOT, SOT, SOT_PREV, NO_TS = 10, 11, 12, 17
TOKENS = WhisperTokens(eot=EOT, sot=SOT, no_timestamps=NO_TS, multilingual=False, sot_prev=SOT_PREV)


def ts(seconds: float) -> int:
    return NO_TS + 1 + round(seconds / 0.02)


class Tokenizer:
    def decode(self, ids):
        return "".join(f" w{i}" for i in ids)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(word[1:]) for word in text.split()]}


class ScriptedEngine:
    """`script(start_seconds, duration, temperature) -> (sampled ids, mean logprob[, no-speech
    probability])` per request; one request finishes per step, first come first served.
    `run(job)` drives a job."""

    def __init__(self, script):
        self.script = script
        self.job = None
        self.queue: list[tuple[str, dict, object]] = []
        self.requests: list[tuple[float, float, float]] = []  # (start, duration, temperature)
        self.prompts: list[list[int]] = []  # decoder prompts, in the order decoded
        self.params: list = []  # sampling parameters, in the order decoded

    def add_request(self, request_id, prompt, params, arrival_time=None, return_cross_kv=False):
        self.queue.append((request_id, prompt, params))

    def abort_request(self, request_id):
        self.queue = [q for q in self.queue if q[0] != request_id]

    def run(self, job):
        self.job = job
        run_job(self, job)

    def step(self):
        request_id, prompt, params = self.queue.pop(0)
        window = next(r.window for r in self.job.requests_made if r.request_id == request_id)
        start, duration = round(window.offset, 2), window.duration
        # the window's frames of its input's log-mel
        features = prompt["encoder_prompt"]["multi_modal_data"]["audio_features"]
        assert features.shape == (80, min(3000, round(duration * 100)))
        assert features.data_ptr() == self.job.features[window.input_index][:, round(start * 100):].data_ptr()
        self.requests.append((start, round(duration, 2), params.temperature))
        self.prompts.append(prompt["decoder_prompt"])
        self.params.append(params)
        ids, mean_logprob, *no_speech = self.script(start, duration, params.temperature)
        if no_speech:  # what the control processor finds at the first step
            window.state.no_speech_prob = no_speech[0]
        completions = [CompletionOutput(i, "", list(ids), mean_logprob * (len(ids) + 1), None, "stop")
                       for i in range(params.n)]
        return [RequestOutput(request_id, None, [SOT], None, [], completions, True)]

    def take_failures(self):
        return {}


def clock_audio(seconds: float) -> np.ndarray:
    """Audio whose every sample is its own time in seconds plus one: loud everywhere. Its
    quietest stretch before 30 s is the whole search range, so the first window ends in its
    middle, at 27.5 s."""
    return (np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE + 1.0).astype(np.float32)


def run(script, seconds=40.0, **options):
    """Transcribe `seconds` of clock audio; windows at once unless the options say otherwise."""
    audio = clock_audio(seconds)
    engine = ScriptedEngine(script)
    options.setdefault("windows_at_once", True)
    job = RecordingJob(TOKENS, Tokenizer(), 448, [audio], TranscribeOptions(**options))
    engine.run(job)
    return engine.requests, job.results([None])[0]


def test_a_window_that_ends_early_gets_a_follow_up():
    def script(start, duration, temperature):
        if start == 0.0:  # two segments, then end-of-text at 10 s of a 27.5 s window
            return [ts(0.0), 1, 2, ts(5.0), ts(5.0), 3, ts(10.0), ts(10.0), EOT], -0.2
        if start == 10.0:
            return [ts(0.0), 4, 5, ts(duration - 0.5), EOT], -0.2
        return [ts(0.0), 6, ts(duration), EOT], -0.2

    requests, result = run(script)
    first_end = requests[1][0]  # the second window starts where the first was cut
    assert first_end == 27.5
    assert requests == [(0.0, first_end, 0.0), (first_end, requests[1][1], 0.0),
                        (10.0, round(first_end - 10.0, 2), 0.0)]
    assert result.text == "w1 w2 w3 w4 w5 w6"
    assert [(round(s.start, 2), s.text) for s in result.segments] == [
        (0.0, " w1 w2"), (5.0, " w3"), (10.0, " w4 w5"), (first_end, " w6")]


def test_windows_that_reach_their_end_get_none():
    requests, result = run(lambda start, duration, t: ([ts(0.0), 1, ts(duration - MIN_REMAINDER), EOT], -0.2))
    assert len(requests) == 2 and result.text == "w1 w1"


def test_an_open_last_segment_is_decoded_again_from_its_start():
    def script(start, duration, temperature):
        if start == 0.0:  # the last segment has no closing timestamp (token limit)
            return [ts(0.0), 1, ts(4.0), ts(6.0), 2, 2], -0.2
        return [ts(0.0), 3, ts(duration), EOT], -0.2

    requests, result = run(script)
    assert [r[0] for r in requests][:3] == [0.0, requests[1][0], 6.0]
    assert result.text.split() == ["w1", "w3", "w3"]


@pytest.mark.parametrize("at_once", [True, False])
def test_a_looping_last_segment_is_dropped_and_decoded_again(at_once):
    loop = [7, 8, 9] * 20

    def script(start, duration, temperature):
        if start == 0.0:
            return [ts(0.0), 1, 2, 3, 4, 5, 6, 1, 2, 3, ts(8.0), ts(8.0), *loop, ts(20.0), EOT], -0.2
        return [ts(0.0), 4, ts(duration), EOT], -0.2

    # no fallback: the loop stays
    requests, result = run(script, temperature=0.0, windows_at_once=at_once)
    assert 8.0 in [start for start, *_ in requests]
    assert "w7 w8 w9 w7" not in result.text and result.text.startswith("w1 w2 w3 w4")
    # without a compression ratio threshold nothing loops
    requests, result = run(script, temperature=0.0, windows_at_once=at_once,
                           compression_ratio_threshold=None)
    assert 8.0 not in [start for start, *_ in requests] and "w7 w8 w9 w7" in result.text


def test_words_repeated_at_a_seam_are_dropped():
    def script(start, duration, temperature):
        if start == 0.0:
            return [ts(0.0), 1, 2, 3, ts(9.0), EOT], -0.2
        if start == 9.0:  # the timestamp was early: the follow-up hears " w2 w3" again
            return [ts(0.0), 2, 3, 4, 5, ts(duration), EOT], -0.2
        return [ts(0.0), 6, ts(duration), EOT], -0.2

    _, result = run(script)
    assert result.text == "w1 w2 w3 w4 w5 w6"


def test_words_repeated_where_a_conditioned_window_seeks_back_are_kept():
    """openai-whisper's seek loop keeps what the next window decodes: speech said twice stays."""
    def script(start, duration, temperature):
        if start == 0.0:  # " w4" left open: the next window starts at 5.0
            return [ts(0.0), 1, 2, 3, ts(5.0), ts(5.0), 4], -0.2
        if start == 5.0:
            return [ts(0.0), 2, 3, 6, ts(4.0), EOT], -0.2
        return [ts(0.0), 7, ts(duration), EOT], -0.2

    _, result = run(script, temperature=0.0, windows_at_once=False)
    assert (result.segments[1].start, result.segments[1].end, result.segments[1].text) == (5.0, 9.0, " w2 w3 w6")


def test_unsure_decodes_fall_back_to_higher_temperatures_with_seeded_samples():
    def script(start, duration, temperature):
        mean = -2.0 if (start == 0.0 and temperature < 0.4) else -0.2
        return [ts(0.0), 1 if temperature < 0.4 else 2, ts(duration), EOT], mean

    requests, result = run(script)
    assert [(r[0], r[2]) for r in requests] == [(0.0, 0.0), (requests[1][0], 0.0), (0.0, 0.2), (0.0, 0.4)]
    assert result.segments[0].text == " w2" and result.segments[0].temperature == 0.4


def test_beams_at_temperature_0_and_best_of_samples_above_it():
    """openai-whisper's: `beam_size` beams at temperature 0, `best_of` seeded samples at each
    fallback temperature."""
    def script(start, duration, temperature):
        return [ts(0.0), 1, ts(duration), EOT], -2.0 if temperature < 0.4 else -0.2

    engine = ScriptedEngine(script)
    options = TranscribeOptions(beam_size=2, best_of=3, temperature=(0.0, 0.2, 0.4), seed=7)
    engine.run(RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(20.0)], options))
    assert [(p.temperature, bool(p.use_beam_search), p.n, p.seed) for p in engine.params] == [
        (0.0, True, 2, None), (0.2, False, 3, decode_seed(7, 0, 1)), (0.4, False, 3, decode_seed(7, 0, 2))]


@pytest.mark.parametrize("threshold, text", [(0.6, "w1"), (0.4, ""), (None, "w1")])
def test_a_window_is_silence_over_the_no_speech_threshold(threshold, text):
    """openai-whisper's rule with the given threshold: an unsure decode (mean log-probability
    under -1) of a window whose no-speech probability passes it is dropped as silence, and is
    not tried again at a higher temperature."""
    requests, result = run(lambda start, duration, t: ([ts(0.0), 1, ts(duration), EOT], -1.5, 0.5),
                           seconds=20.0, no_speech_threshold=threshold)
    assert result.text == text
    assert [r[2] for r in requests] == ([0.0] if text == "" else [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])


def test_when_every_temperature_fails_the_likeliest_fluent_decode_is_kept():
    def script(start, duration, temperature):
        return [ts(0.0), 1 + int(temperature * 5), ts(duration), EOT], -3.0 + temperature

    requests, result = run(script, seconds=20.0, temperature=(0.0, 0.2, 0.4))
    assert [r[2] for r in requests] == [0.0, 0.2, 0.4]
    assert result.text == "w3"


def test_when_every_temperature_fails_the_kept_decode_has_the_last_temperature():
    """faster-whisper's: the likeliest failed decode (here the greedy one) is kept with the last
    temperature, so its text is not passed on to the next window (prompt_reset_on_temperature),
    as openai-whisper, which keeps the last decode, does not pass it on either."""
    def script(start, duration, temperature):
        return [ts(0.0), 1 + int(temperature * 5), ts(duration), EOT], (-1.5 - temperature if start == 0.0 else -0.2)

    engine = ScriptedEngine(script)
    job = RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(40.0)], TranscribeOptions())
    engine.run(job)
    first = job.results([None])[0].segments[0]
    assert (first.text, first.temperature) == (" w1", 1.0)
    assert engine.prompts[-1] == [SOT]


def test_a_repetitive_decode_falls_back_though_the_window_may_be_silence():
    """openai-whisper's: a window likely silent (no_speech_prob over its threshold) skips the
    fallback only when its decode is unsure too; a sure but repetitive decode is tried again."""
    def script(start, duration, temperature):
        if start == 0.0 and temperature == 0.0:
            return [ts(0.0), *[1] * 60, ts(duration), EOT], -0.5, 0.9  # compression ratio over 2.4
        return [ts(0.0), 2, ts(duration), EOT], -0.2, 0.9

    requests, result = run(script, seconds=20.0)
    assert [r[2] for r in requests] == [0.0, 0.2] and result.text == "w2"


def test_when_every_temperature_fails_a_repetitive_decode_is_kept_last():
    """faster-whisper's choice among failed decodes: the likeliest of those under the
    compression-ratio threshold, though a repetitive one is likelier."""
    def script(start, duration, temperature):
        if temperature == 0.0:
            return [ts(0.0), *[1] * 60, ts(duration), EOT], -0.5  # likelier, but loops
        return [ts(0.0), 2, ts(duration), EOT], -1.5  # unsure

    requests, result = run(script, seconds=20.0, temperature=(0.0, 0.2))
    assert [r[2] for r in requests] == [0.0, 0.2] and result.text == "w2"


@pytest.mark.parametrize("temperature, reset", [(0.5, False), (0.6, True)])
def test_the_context_resets_only_above_prompt_reset_on_temperature(temperature, reset):
    """openai-whisper resets the prompt after a decode sampled at more than 0.5, not at 0.5."""
    engine = ScriptedEngine(lambda start, duration, t: ([ts(0.0), 1, ts(duration), EOT], -0.2))
    engine.run(RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(40.0)],
                            TranscribeOptions(temperature=temperature)))
    assert engine.prompts[1] == ([SOT] if reset else [SOT_PREV, ts(0.0), 1, ts(30.0), SOT])


def test_without_timestamps_the_text_still_conditions_the_next_window():
    """openai-whisper conditions on the text before a window whether or not it keeps timestamps."""
    engine = ScriptedEngine(lambda start, duration, t: ([ts(0.0), 1, 2, ts(duration), EOT], -0.2))
    engine.run(RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(40.0)],
                            TranscribeOptions(timestamps=False, temperature=0.0)))
    assert engine.prompts[1][0] == SOT_PREV and engine.prompts[1][-4:] == [1, 2, ts(30.0), SOT]


def test_without_timestamps_the_window_is_one_segment_of_its_kept_text():
    def script(start, duration, temperature):
        if start == 0.0:
            return [ts(0.0), 1, ts(3.0), ts(3.0), 2, ts(9.0), EOT], -0.2
        return [ts(0.0), 3, ts(duration), EOT], -0.2

    requests, result = run(script, timestamps=False)
    assert requests[2][0] == 9.0
    assert [(round(s.start, 2), round(s.end, 2), s.text) for s in result.segments][:2] == [
        (0.0, 9.0, " w1 w2"), (9.0, round(requests[1][0], 2), " w3")]


@pytest.mark.parametrize("at_once", [False, True])
def test_without_timestamps_a_segment_ends_by_its_windows_end(at_once):
    """The last window's decode closes at a timestamp past the audio's end (a loop, say): its
    one segment still ends with the audio (it ended 4 s past it)."""
    def script(start, duration, temperature):
        if start == 0.0:
            return [ts(0.0), 1, ts(24.0), ts(24.0), EOT], -0.2
        return [ts(0.0), 2, ts(10.0), ts(10.0), 3, ts(20.0), ts(20.0), EOT], -0.2

    requests, result = run(script, timestamps=False, windows_at_once=at_once)
    assert requests[-1][0] + 20.0 > 40.0  # the last window's decode closes past the end
    assert all(s.end <= 40.0 for s in result.segments)
    assert (round(result.segments[-1].end, 2), result.segments[-1].text) == (40.0, " w2 w3")


def test_plan_window_rules():
    spans = split_spans([ts(0.0), 1, ts(2.0), ts(2.0), 2, ts(5.0), EOT], TOKENS)
    texts = [" w1", " w2"]
    assert plan_window(spans, texts, 20.0, True, 5.0).resume == 5.0
    assert plan_window(spans, texts, 5.5, True, 5.0).resume is None
    assert plan_window(spans, texts, 20.0, False, None).resume is None


def test_plan_seek_rules():
    """openai-whisper's seek."""
    def plan(tokens):
        spans = split_spans(tokens, TOKENS)
        text = tokens[:tokens.index(EOT)] if EOT in tokens else tokens
        single = len(text) >= 2 and text[-1] > NO_TS and text[-2] < EOT
        result = plan_seek(spans, [Tokenizer().decode(ids) for *_, ids in spans], True, single)
        return result.resume, [ids for *_, ids in result.kept]

    # closed: the next window at this one's end, however much is left
    assert plan([ts(0.0), 1, ts(2.0), ts(2.0), 2, ts(29.5), EOT]) == (None, [[1], [2]])
    assert plan([ts(0.0), 1, ts(2.0), ts(2.0), 2, ts(5.0), EOT]) == (None, [[1], [2]])
    # a final pair of timestamps: the next window at the first, however little is left
    assert plan([ts(0.0), 1, ts(29.5), ts(29.8), EOT]) == (29.5, [[1]])
    # an open last segment (the token limit) is decoded again from the end of the one before it
    assert plan([ts(0.0), 1, ts(2.0), ts(2.2), 2, 2]) == (2.0, [[1]])
    assert plan([ts(0.0), 1, 1]) == (None, [[1, 1]])  # nothing before it: kept, on to the end
    # so is a last segment that repeats itself (compression ratio above the threshold)
    looping = [ts(0.0), 1, ts(2.0), ts(2.0)] + [2] * 40 + [ts(5.0), ts(5.0), EOT]
    assert plan(looping) == (2.0, [[1]])
    spans = split_spans(looping, TOKENS)
    kept = plan_seek(spans, [Tokenizer().decode(ids) for *_, ids in spans], True, False, None)
    assert (kept.resume, len(kept.kept)) == (5.0, 2)  # no threshold: kept, as any closed segment
    assert plan_seek([], [], True, False).resume is None
    # one segment (no pair of timestamps): kept whole, timed from the window's start
    assert plan_seek(split_spans([ts(1.0), 1, ts(2.0), EOT], TOKENS), [" w1"], True, True).from_start
    assert plan_seek(split_spans([ts(1.0), 1, 1], TOKENS), [" w1 w1"], True, False).from_start
    assert not plan_seek(split_spans([ts(0.0), 1, ts(2.0), ts(2.0), EOT], TOKENS), [" w1"], True, False).from_start
    assert plan_seek(split_spans([1, 2, EOT], TOKENS), [" w1 w2"], False, False).resume is None


def test_seek_windows_pass_over_silence():
    """Conditioned, a silent stretch is passed over a window at a time (as openai-whisper's
    no-speech rule skips it, without decoding it); progress still adds up to the whole input."""
    audio = clock_audio(100.0)
    audio[25 * SAMPLE_RATE:65 * SAMPLE_RATE] = 0.0
    progress = []
    engine = ScriptedEngine(lambda start, duration, t: ([ts(0.0), 1, ts(duration), EOT], -0.2))
    job = RecordingJob(TOKENS, Tokenizer(), 448, [audio, np.zeros(35 * SAMPLE_RATE, np.float32)],
                       TranscribeOptions(clip_timestamps=[0, 40, 50]), on_progress=progress.append)
    engine.run(job)
    # input 0: clip [0, 40): [0, 30) decoded, [30, 40) silent; clip [50, 100): sound from 65 s;
    # input 1 (35 s, one clip): [0, 30) and [30, 35) silent
    assert engine.requests == [(0.0, 30.0, 0.0), (50.0, 30.0, 0.0), (80.0, 20.0, 0.0)]
    assert progress[-1] == pytest.approx(40 + 50 + 35)
    assert [[round(s.start) for s in r.segments] for r in job.results([None] * 2)] == [[0, 50, 80], []]


@pytest.mark.parametrize("previous, text, expected", [
    (" The cat sat on the mat.", " On the mat. A dog barked.", 3),
    (" The cat sat on the mat.", " A dog barked.", 0),
    (" It was very", " very good.", 0),  # one word: taken for speech
])
def test_repeated_words(previous, text, expected):
    assert repeated_words(previous, text) == expected


def test_segments_are_reported_in_time_order_as_soon_as_what_precedes_them_is_decoded():
    def script(start, duration, temperature):
        if start == 0.0:
            return [ts(0.0), 1, ts(5.0), EOT], -0.2
        return [ts(0.0), 2, ts(duration), EOT], -0.2

    reported = []
    job = RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(60.0)],
                       TranscribeOptions(windows_at_once=True),
                       on_segments=lambda index, segments: reported.append(
                           [(s.id, round(s.start, 2), s.text) for s in segments]))
    engine = ScriptedEngine(script)
    engine.run(job)
    # decoded in the order 0, 27.5, 52.5, then the follow-up at 5.0: its segment comes before
    # the later windows', so they wait for it
    assert [r[0] for r in engine.requests] == [0.0, 27.5, 52.5, 5.0]
    # numbered in time order across the windows, as the transcript's segments are
    assert reported == [[(0, 0.0, " w1")], [(1, 5.0, " w2")], [(2, 27.5, " w2")], [(3, 52.5, " w2")]]
    assert [s.id for s in job.results([None])[0].segments] == [0, 1, 2, 3]


def test_conditioned_windows_follow_the_decodes_prompted_with_the_text_before_them():
    """Conditioned, an input's windows run one after another, each starting where the last
    decode left off (openai-whisper's seek): a segment left open is dropped and decoded again
    from the end of the one before it, and a decode that closes its last segment moves on to
    its window's end; each window is prompted with the text kept before it."""
    def script(start, duration, temperature):
        if start == 0.0:  # a segment to 4.0, then one that the window cuts off
            return [ts(0.0), 1, 2, ts(4.0), ts(4.0), 3, EOT], -0.2
        return [ts(0.0), 3, ts(duration), EOT], -0.2

    audio = clock_audio(60.0)
    engine = ScriptedEngine(script)
    job = RecordingJob(TOKENS, Tokenizer(), 448, [audio, audio[:10 * SAMPLE_RATE]],
                       TranscribeOptions())
    engine.run(job)
    # both inputs' first windows at once, then each input's next one when its last is decoded
    assert engine.requests == [(0.0, 30.0, 0.0), (0.0, 10.0, 0.0), (4.0, 30.0, 0.0), (4.0, 6.0, 0.0),
                               (34.0, 26.0, 0.0)]
    assert engine.prompts[:2] == [[SOT], [SOT]]
    assert engine.prompts[2] == [SOT_PREV, ts(0.0), 1, 2, ts(4.0), SOT]
    assert engine.prompts[4] == [SOT_PREV, ts(0.0), 1, 2, ts(4.0), ts(0.0), 3, ts(30.0), SOT]
    first, second = job.results([None, None])
    assert [(round(s.start, 2), round(s.end, 2), s.text) for s in first.segments] == [
        (0.0, 4.0, " w1 w2"), (4.0, 34.0, " w3"), (34.0, 60.0, " w3")]
    assert second.text == "w1 w2 w3"


@pytest.mark.parametrize("carry", [False, True])
@pytest.mark.parametrize("options", [dict(condition_on_previous_text=False), dict(windows_at_once=True)], ids=str)
def test_unconditioned_windows_after_the_first_get_no_initial_prompt(carry, options):
    """As openai-whisper and faster-whisper reset the prompt after each window when not
    conditioning: the initial prompt reaches an input's first window only (every window
    with `carry_initial_prompt`), follow-ups included. Not conditioned, windows still follow
    the decodes, as openai-whisper's do; at once, they are cut at quiet points."""
    def script(start, duration, temperature):
        if start == 0.0:  # a pair of timestamps: the next window starts at 5.0
            return [ts(0.0), 1, ts(5.0), ts(5.0), EOT], -0.2
        return [ts(0.0), 2, ts(duration), EOT], -0.2

    engine = ScriptedEngine(script)
    job = RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(60.0)], TranscribeOptions(
        initial_prompt="w7 w8", carry_initial_prompt=carry, **options))
    engine.run(job)
    starts = [r[0] for r in engine.requests]
    assert starts == ([0.0, 27.5, 52.5, 5.0] if "windows_at_once" in options else [0.0, 5.0, 35.0])
    prompted = [SOT_PREV, 7, 8, SOT]
    assert engine.prompts == [prompted] + [prompted if carry else [SOT]] * (len(starts) - 1)


def test_a_hot_decode_is_not_passed_on():
    def script(start, duration, temperature):
        return [ts(0.0), 1, ts(duration), EOT], (-2.0 if start == 0.0 and temperature < 0.6 else -0.2)

    engine = ScriptedEngine(script)
    job = RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(40.0)], TranscribeOptions())
    engine.run(job)
    assert [r[2] for r in engine.requests] == [0.0, 0.2, 0.4, 0.6, 0.0]
    assert engine.prompts[-1] == [SOT]


@pytest.mark.parametrize("options, message", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": ()}, "temperature"),
    ({"best_of": 0}, "best_of"), ({"logprob_threshold": "low"}, "logprob_threshold"),
    ({"beam_size": 0}, "beam_size"), ({"patience": 2.0}, "patience"),
    ({"beam_size": 3, "patience": 0.1}, r"^patience=0.1 with beam_size=3 waits for no finished beam"),
    ({"suppress_tokens": "a,b"}, "suppress_tokens"), ({"clip_timestamps": "5,2"}, "clip_timestamps"),
    ({"clip_timestamps": "1,2", "vad_filter": True}, "exclude each other"),
    ({"vad_parameters": {"threshold": 1.5}}, "threshold"),
    ({"hallucination_silence_threshold": 2.0}, "needs word_timestamps"),
    ({"temperature": None}, "temperature must be a number or a non-empty sequence"),
    ({"temperature": "0.5"}, "temperature must be"), ({"temperature": True}, "temperature"),
    ({"seed": "a"}, r"seed must be an integer in \[0, 4294967295\], or -1 or None \(unseeded\), got 'a'"), ({"seed": -2}, "seed"),
    ({"repetition_penalty": 0}, r"repetition_penalty must be in \[1e-30, 1e\+30\]"),
    ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be an integer >= 0"),
    ({"presence_penalty": 3}, r"presence_penalty must be in \[-2, 2\]"), ({"top_p": 0}, r"top_p must be in \(0, 1\]"),
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"), ({"top_k": -3}, r"^top_k must be an integer >= 1, or 0, -1 or None \(no top-k\), got -3$"),
    ({"prompt_reset_on_temperature": "x"}, r"prompt_reset_on_temperature must be in \[0, 2\]"),
    ({"prepend_punctuations": None}, "prepend_punctuations must be a string"),
    ({"append_punctuations": 3}, "append_punctuations must be a string"),
    ({"clip_timestamps": None}, "clip_timestamps must be seconds"),
    ({"suppress_tokens": [1.5]}, "suppress_tokens must be token ids"),
    ({"word_timestamps": "yes"}, "word_timestamps must be True or False, got 'yes'"),
    ({"condition_on_previous_text": 1}, "condition_on_previous_text must be True or False"),
    ({"word_timestamps": True, "hallucination_silence_threshold": -1.0},
     "hallucination_silence_threshold must be a number >= 0"),
    ({"word_timestamps": True, "hallucination_silence_threshold": float("nan")}, "hallucination_silence_threshold"),
    ({"initial_prompt": 5}, "initial_prompt must be a string, a list of token ids or None, got 5"),
    ({"initial_prompt": ["a"]}, "initial_prompt must be a string"), ({"hotwords": 5}, "hotwords must be a string"),
    ({"best_of": True}, "best_of"),
    ({"vad_parameters": "x"}, "vad_parameters must be a VadOptions, a dict of its fields or None, got str"),
    ({"vad_parameters": {"thresold": 0.5}}, r"vad_parameters: unknown fields \['thresold'\]"),
    ({"vad_parameters": {"max_speech_duration_s": float("nan")}}, "max_speech_duration_s"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        TranscribeOptions(**options)


def test_vad_parameters_of_faster_whisper():
    """faster-whisper's own `VadOptions` (a dataclass of the same fields) is taken as it is."""
    options = TranscribeOptions(vad_filter=True, vad_parameters=FasterVadOptions(threshold=0.3, speech_pad_ms=100))
    assert options.vad_parameters == VadOptions(threshold=0.3, speech_pad_ms=100)


def test_callbacks_are_checked_first():
    with pytest.raises(ValueError, match="on_progress must be a function or None, got 5"):
        RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(5.0)], TranscribeOptions(), on_progress=5)


def test_optional_forms_of_options():
    """openai-whisper's other spellings: one clip start, no suppress list; seed None samples
    from the engine's generator."""
    options = TranscribeOptions(clip_timestamps=1.5, suppress_tokens=None, temperature=0.5, seed=None)
    assert (options.clip_timestamps, options.suppress_tokens, options.temperature) == ([1.5], [], (0.5,))
    job = RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(5.0)], options)
    assert job._decoding(job.windows[0])["seed"] is None


def test_windows_and_fallbacks_sample_from_streams_of_their_own():
    """Each decode's samples draw from seed + i (i < best_of): no two windows, fallbacks or
    user seeds share one, where seed + start + attempt made a fallback reuse the streams of
    the one before it at another temperature."""
    seeds = sorted(decode_seed(seed, start, attempt) for seed in (0, 1) for start in (0, 1, 160, 480_000)
                   for attempt in range(6))
    assert min(b - a for a, b in zip(seeds, seeds[1:])) > 1000


def test_text_with_no_opening_timestamp_joins_the_context_from_the_window_start():
    """A decode whose text comes before any timestamp (a row the rules left nothing to sample
    gives one) is kept, conditioned on, from the window's start."""
    engine = ScriptedEngine(lambda start, duration, t: (
        [1, 2, EOT] if start == 0.0 else [ts(0.0), 3, ts(1.0), EOT], -0.2))
    job = RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(40.0)], TranscribeOptions(temperature=0.0))
    engine.run(job)
    assert engine.prompts[1] == [SOT_PREV, ts(0.0), 1, 2, SOT]
    assert job.results([None])[0].text.startswith("w1 w2")


def test_hotwords_open_every_prompt_and_a_carried_initial_prompt_stays():
    def script(start, duration, temperature):
        return [ts(0.0), *([5] * 150), ts(duration), EOT], -0.2

    engine = ScriptedEngine(script)
    job = RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(90.0)],
                       TranscribeOptions(initial_prompt="w7 w8", hotwords="w9", carry_initial_prompt=True,
                                             compression_ratio_threshold=None))
    engine.run(job)
    first, second, third = engine.prompts
    assert first == [SOT_PREV, 9, 7, 8, SOT]
    assert second == [SOT_PREV, 9, 7, 8, ts(0.0), *[5] * 150, ts(30.0), SOT]
    # two windows of context outgrow the 223 prompt tokens: the initial prompt stays
    assert third[:4] == [SOT_PREV, 9, 7, 8] and len(third) == 1 + 223 + 1 and third[-2:] == [ts(30.0), SOT]
    # it may sample up to the decoder's 448 positions (English-only: no control tokens) and
    # one more, which is never fed back: openai-whisper's 224
    assert [r.params.max_tokens for r in job.requests_made] == [224, 224, 448 + 1 - len(third)] == [224] * 3
    plain = ScriptedEngine(script)
    plain.run(RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(90.0)],
                                    TranscribeOptions(initial_prompt="w7 w8", compression_ratio_threshold=None)))
    assert plain.prompts[0] == [SOT_PREV, 7, 8, SOT] and plain.prompts[2][1:3] != [7, 8]


def test_clip_timestamps_limit_the_audio_decoded():
    engine = ScriptedEngine(lambda start, duration, t: ([ts(0.0), 1, ts(duration), EOT], -0.2))
    job = RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(60.0)],
                       TranscribeOptions(clip_timestamps="2,5,40", windows_at_once=True))
    engine.run(job)
    assert [(r[0], r[1]) for r in engine.requests] == [(2.0, 3.0), (40.0, 20.0)]
    (result,) = job.results([None])
    assert [(round(s.start, 2), round(s.end, 2)) for s in result.segments] == [(2.0, 5.0), (40.0, 60.0)]
    # times between frames start and end on a frame, as openai-whisper's seek points
    engine = ScriptedEngine(lambda start, duration, t: ([ts(0.0), 1, ts(duration), EOT], -0.2))
    job = RecordingJob(TOKENS, Tokenizer(), 448, [clock_audio(10.0)],
                       TranscribeOptions(clip_timestamps="1.237,5.004", windows_at_once=True))
    engine.run(job)
    (result,) = job.results([None])
    assert [(s.start, s.end, s.seek) for s in result.segments] == [(1.24, 5.0, 124)]

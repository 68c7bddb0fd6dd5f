"""Whisper decoding rules, control steps, segments, windows and the silence checks, without a model.

A toy vocabulary: text 0-9, <|endoftext|> 10, control tokens 11-17 (<|notimestamps|> last),
timestamps 18-118 (<|0.00|> .. <|2.00|>).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from encdec.audio import SAMPLE_RATE
from encdec.whisper.control import DETECT, ControlProcessor, WindowState, control_prefix
from encdec.sampling.logits_processors import apply_logits_processors
from encdec.sampling.params import SamplingParams
from encdec.sequence import SequenceData
from encdec.whisper.decoding import DecodingRules, apply_rules, suppressed_token_ids
from encdec.whisper.segments import split_spans, window_segments
from encdec.whisper.silence import compression_ratio, is_no_speech, is_silent
from encdec.whisper.tokens import WhisperTokens
from encdec.whisper.windows import split_windows

EOT, SOT, EN, FR, TRANSCRIBE, SOT_PREV, NO_SPEECH, NO_TS = 10, 11, 12, 13, 14, 15, 16, 17
TOKENS = WhisperTokens(eot=EOT, sot=SOT, no_timestamps=NO_TS, multilingual=True,
                       lang_to_id={"en": EN, "fr": FR}, task_to_id={"transcribe": TRANSCRIBE},
                       suppress_tokens=(3,), begin_suppress_tokens=(0, EOT), no_speech=NO_SPEECH,
                       sot_prev=SOT_PREV)
TS = NO_TS + 1  # <|0.00|>
VOCAB = TS + 101


def ts(seconds: float) -> int:
    return TS + round(seconds / 0.02)


def allowed(rules: DecodingRules, sampled: list[int], logits: torch.Tensor = None) -> set[int]:
    """Tokens left possible; by default text is far likelier than the timestamps together."""
    if logits is None:
        logits = torch.zeros(VOCAB)
        logits[:TS] = 10.0
    row = logits.clone()
    apply_rules(row[None], [0], [sampled], [rules])
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def test_suppress_list_adds_control_tokens():
    assert suppressed_token_ids(TOKENS) == [3, SOT, TRANSCRIBE, SOT_PREV, NO_SPEECH]
    assert suppressed_token_ids(TOKENS, [5, -1]) == [3, 5, SOT, TRANSCRIBE, SOT_PREV, NO_SPEECH]
    assert suppressed_token_ids(TOKENS, [5]) == [5, SOT, TRANSCRIBE, SOT_PREV, NO_SPEECH]
    assert suppressed_token_ids(TOKENS, []) == [SOT, TRANSCRIBE, SOT_PREV, NO_SPEECH]


@pytest.mark.parametrize("suppress, blank, message", [
    ([EOT], True, "may not name <.endoftext.> \\(10\\) or a timestamp \\(>= 18\\): .*got 10"),
    ([TS + 2], True, "got 20"),
    (list(range(EOT)), False, "suppresses every text token"),
    ([t for t in range(EOT) if t != 0], True, "every text token"),  # token 0 is the blank
])
def test_a_suppress_list_that_leaves_nothing_to_sample_is_refused(suppress, blank, message):
    with pytest.raises(ValueError, match=message):
        DecodingRules(TOKENS, timestamps=True, suppress_tokens=suppress, suppress_blank=blank)
    rules = DecodingRules(TOKENS, timestamps=False, suppress_tokens=[t for t in range(EOT) if t != 0],
                          suppress_blank=False)
    assert 0 in allowed(rules, [])  # the blank alone is enough without suppress_blank


def test_suppress_blank_off_lets_the_first_step_end():
    rules = DecodingRules(TOKENS, timestamps=False, suppress_blank=False)
    assert {0, EOT} <= allowed(rules, [])


def test_first_step_is_an_early_timestamp():
    rules = DecodingRules(TOKENS, timestamps=True)
    assert allowed(rules, []) == set(range(ts(0.0), ts(1.0) + 1))


def test_without_timestamps_only_suppression():
    rules = DecodingRules(TOKENS, timestamps=False)
    first = allowed(rules, [])
    assert 0 not in first and EOT not in first and 3 not in first and NO_TS in first
    assert {0, EOT} <= allowed(rules, [5])


def test_timestamps_come_in_pairs_and_never_decrease():
    rules = DecodingRules(TOKENS, timestamps=True)
    text = {0, 1, 2, 4, 5, 6, 7, 8, 9, EN, FR}  # language tokens are not suppressed (as in openai)
    # After the opening timestamp: text or the end, no timestamp.
    assert allowed(rules, [ts(0.4)]) == text | {EOT}
    # After text: a timestamp after the opening one (no segment of zero length), or text.
    assert allowed(rules, [ts(0.4), 5]) == text | {EOT} | set(range(ts(0.42), VOCAB))
    # After a closing timestamp: the next opening one (not earlier) or the end.
    assert allowed(rules, [ts(0.4), 5, ts(1.0)]) == {EOT, EN, FR} | set(range(ts(1.0), VOCAB))
    # After a closing + opening pair: text.
    assert allowed(rules, [ts(0.4), 5, ts(1.0), ts(1.0)]) == text | {EOT}


def test_timestamp_mass_beats_best_text_token():
    rules = DecodingRules(TOKENS, timestamps=True)
    logits = torch.full((VOCAB,), -10.0)
    logits[5] = 0.0
    logits[TS:] = 0.0  # 101 timestamps at e^0 each outweigh the best text token
    assert allowed(rules, [ts(0.0), 5], logits) == set(range(ts(0.02), VOCAB))
    logits[TS:] = -10.0
    assert 5 in allowed(rules, [ts(0.0), 5], logits)


def test_a_batch_gets_the_edits_of_its_rows_one_at_a_time():
    """The sampler runs the windows' processors of a batch together: each row ends as if
    processed alone, whatever its neighbours' rules, and a plain processor keeps its place."""
    rules = [DecodingRules(TOKENS, True), DecodingRules(TOKENS, False),
             DecodingRules(TOKENS, True, max_initial_timestamp=None, suppress_tokens=[5]),
             DecodingRules(TOKENS, True, suppress_blank=False)]
    histories = [[], [ts(0.4)], [ts(0.4), 5], [ts(0.4), 5, ts(1.0)], [ts(0.4), 5, ts(1.0), ts(1.0)],
                 [ts(0.2), 1, 2], [4, 5]]
    rows = [(FR, TRANSCRIBE, *history) for history in histories] + [(), (FR,)]  # + control steps

    def marked(output_ids, row):  # a plain processor after the control processor
        row[7] += 1.0
        return row

    generator = torch.Generator().manual_seed(0)
    cases = [(rules[i % len(rules)], list(out)) for i, out in enumerate(rows * 2)]
    scores = torch.randn(len(cases), VOCAB, generator=generator) * 3
    scores[:, :TS] += torch.arange(len(cases))[:, None] % 4 * 4.0  # timestamps win in some rows only
    alone = scores.clone()
    for i, (r, out) in enumerate(cases):
        marked(out, ControlProcessor(TOKENS, [FR, TRANSCRIBE], r, WindowState())(out, alone[i]))
    params = [SamplingParams(temperature=0.0, max_tokens=50, min_tokens=0, no_repeat_ngram_size=0,
                             repetition_penalty=1.0,
                             logits_processors=[ControlProcessor(TOKENS, [FR, TRANSCRIBE], r, WindowState()),
                                                marked]) for r, _ in cases]
    together = scores.clone()
    apply_logits_processors(together, [(SequenceData([SOT], out), p) for (_, out), p in zip(cases, params)], EOT)
    assert torch.equal(together, alone)
    assert 0 < int(torch.isinf(together[:, :TS]).all(dim=-1).sum()) < len(cases)  # both outcomes seen


def test_control_prefix_layouts():
    assert control_prefix(TOKENS, "en", "transcribe", True) == [EN, TRANSCRIBE]
    assert control_prefix(TOKENS, "fr", "transcribe", False) == [FR, TRANSCRIBE, NO_TS]
    english = WhisperTokens(eot=EOT, sot=SOT, no_timestamps=NO_TS, multilingual=False)
    assert control_prefix(english, None, "transcribe", True) == []
    assert control_prefix(english, "en", "transcribe", False) == [NO_TS]


def test_control_steps_force_detect_and_measure_no_speech():
    state = WindowState()
    processor = ControlProcessor(TOKENS, [DETECT, TRANSCRIBE], DecodingRules(TOKENS, True), state)
    raw = torch.randn(VOCAB)
    raw[FR], raw[EN], raw[7] = 5.0, 4.0, 9.0  # French beats English; text is ignored
    first = processor([], raw.clone())
    assert state.language == "fr"
    assert state.no_speech_prob == pytest.approx(torch.softmax(raw, -1)[NO_SPEECH].item())
    assert torch.log_softmax(first, -1)[FR].item() == 0.0 and first.argmax().item() == FR
    second = processor([FR], torch.randn(VOCAB))
    assert second.argmax().item() == TRANSCRIBE and torch.isinf(second).sum() == VOCAB - 1
    third = processor([FR, TRANSCRIBE], torch.zeros(VOCAB))  # rules start: a timestamp first
    assert set(torch.isfinite(third).nonzero().flatten().tolist()) == set(range(ts(0.0), ts(1.0) + 1))
    assert state.no_speech_prob == pytest.approx(torch.softmax(raw, -1)[NO_SPEECH].item())


def test_spans_pairs_unterminated_and_plain_text():
    tokens = [ts(0.0), 1, 2, ts(1.0), ts(1.2), 3, ts(1.8), ts(1.8), 4, 5, EOT]
    assert split_spans(tokens, TOKENS) == [
        (0.0, 1.0, [1, 2]), (pytest.approx(1.2), pytest.approx(1.8), [3]), (pytest.approx(1.8), None, [4, 5])]
    assert split_spans([1, 2, EOT], TOKENS) == [(None, None, [1, 2])]
    assert split_spans([ts(0.0), EOT], TOKENS) == []


def test_window_segments_are_offset_and_keep_their_sampled_times():
    """A timestamp past the window's end stays when nothing follows the window in its clip
    (openai-whisper and faster-whisper keep it: 0.7 + <|2.34|> = 3.04 s for a clip that ends at
    3 s); an open segment ends at the window's end."""
    class Tokenizer:
        def decode(self, ids):
            return "".join(f" w{i}" for i in ids)

    spans = split_spans([ts(0.2), 1, ts(1.5), ts(1.5), 2], TOKENS)
    segments = window_segments(spans, TOKENS, Tokenizer(), 30.0, 1.0, avg_logprob=-0.5, no_speech_prob=0.1)
    assert [(s.start, s.end, s.text, s.tokens) for s in segments] == [
        (pytest.approx(30.2), 31.5, " w1", [ts(0.2), 1, ts(1.5)]), (31.5, 31.5, " w2", [ts(1.5), 2])]
    (opened,) = window_segments(split_spans([ts(0.4), 3], TOKENS), TOKENS, Tokenizer(), 2.0, 1.0,
                                avg_logprob=-0.5, no_speech_prob=0.1)
    assert (opened.start, opened.end) == (pytest.approx(2.4), 3.0)
    # a window cut before its clip's end: times stop at the next window's start
    limited = window_segments(spans, TOKENS, Tokenizer(), 30.0, 1.0, 1.0, avg_logprob=-0.5, no_speech_prob=0.1)
    assert [(s.start, s.end) for s in limited] == [(pytest.approx(30.2), 31.0), (31.0, 31.0)]
    assert segments[0].avg_logprob == -0.5 and segments[0].no_speech_prob == 0.1


def test_windows_cut_at_the_quietest_point_near_30_seconds():
    rng = np.random.default_rng(0)
    audio = rng.normal(0, 0.1, 75 * SAMPLE_RATE).astype(np.float32)
    audio[int(27.0 * SAMPLE_RATE):int(27.6 * SAMPLE_RATE)] = 0.0  # the longest pause in the zone
    audio[int(29.3 * SAMPLE_RATE):int(29.6 * SAMPLE_RATE)] = 0.0  # a shorter, later one
    audio[int(10.0 * SAMPLE_RATE):int(12.0 * SAMPLE_RATE)] = 0.0  # outside it: ignored
    windows = split_windows(audio)
    assert windows[0][0] == 0 and windows[-1][1] == len(audio)
    assert all(end == start for (_, end), (start, _) in zip(windows, windows[1:]))
    assert all(end - start <= 30 * SAMPLE_RATE for start, end in windows)
    assert windows[0][1] == pytest.approx(27.3 * SAMPLE_RATE, abs=0.05 * SAMPLE_RATE)
    assert len(windows) == 3
    assert split_windows(audio[:30 * SAMPLE_RATE]) == [(0, 30 * SAMPLE_RATE)]
    # the cut before the last window leaves it 5 s at least (a second of speech alone reads badly)
    short_tail = split_windows(audio[:int(57.5 * SAMPLE_RATE)])
    assert len(short_tail) == 3 and short_tail[-1][1] - short_tail[-1][0] >= 5 * SAMPLE_RATE


def test_a_cut_in_a_long_pause_falls_just_before_the_speech_after_it():
    rng = np.random.default_rng(1)
    audio = rng.normal(0, 0.1, 50 * SAMPLE_RATE).astype(np.float32)
    audio[int(24.0 * SAMPLE_RATE):int(28.0 * SAMPLE_RATE)] = 0.0  # speech resumes at 28 s
    assert split_windows(audio)[0][1] == pytest.approx(27.5 * SAMPLE_RATE, abs=0.15 * SAMPLE_RATE)
    audio[int(28.0 * SAMPLE_RATE):int(33.0 * SAMPLE_RATE)] = 0.0  # the pause goes on past 30 s
    assert split_windows(audio)[0][1] == 30 * SAMPLE_RATE


def test_silence_checks():
    rng = np.random.default_rng(0)
    assert is_silent(np.zeros(SAMPLE_RATE, np.float32))
    assert is_silent(rng.normal(0, 2 ** -15, SAMPLE_RATE).astype(np.float32))  # 16-bit dither
    assert not is_silent(rng.normal(0, 1e-3, SAMPLE_RATE).astype(np.float32))  # -60 dBFS: quiet, not silent
    assert is_no_speech(0.9, -1.5) and not is_no_speech(0.5, -1.5)
    assert not is_no_speech(0.9, -0.3)  # the model is sure of its text, even " ." or a chorus


def test_compression_ratio_is_openai_whispers():
    from whisper.utils import compression_ratio as openai_compression_ratio

    chorus = " Sing it again, sing it again, sing it again, sing it again, sing it again."
    for text in (" ." * 30, chorus, " Hello there.", "naïve café, 日本語"):
        assert compression_ratio(text) == openai_compression_ratio(text)
    assert compression_ratio(chorus) > 2.4 > compression_ratio(" Hello there.")


def test_no_speech_rule_takes_the_thresholds():
    assert is_no_speech(0.3, -0.5, no_speech_threshold=0.2, logprob_threshold=0.0)
    assert not is_no_speech(0.9, -1.5, no_speech_threshold=None)
    # as openai-whisper: without a logprob threshold nothing vouches for the decode, and only an
    # average above the threshold does
    assert is_no_speech(0.9, -0.3, logprob_threshold=None)
    assert is_no_speech(0.9, -1.0) and not is_no_speech(0.9, -0.999)

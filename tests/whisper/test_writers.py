"""Transcript writers: srt / vtt parsed back, tsv and json round trips, timestamp formatting."""
from __future__ import annotations

import dataclasses
import io
import json
import random
import re

import pytest

from encdec.whisper.transcript import Segment, Transcription, Word
from encdec.whisper.writers import (ALL_FORMATS, FORMATS, WRITERS, WriterOptions, format_timestamp,
                                    subtitle_cues, write_result)

SEGMENTS = [
    Segment(0.0, 2.5, " Hello there.", tokens=[1, 2], avg_logprob=-0.25, no_speech_prob=0.01, id=0),
    Segment(2.5, 61.004, " A long\tcue --> with an arrow.", id=1),
    Segment(3723.4567, 3725.0, " Past the hour, ünïcode.", id=2),
]
RESULT = Transcription(text="".join(s.text for s in SEGMENTS), language="en", segments=SEGMENTS,
                       duration=3725.0, source="/some/dir/talk.take1.wav")
CUE_TEXTS = ["Hello there.", "A long cue -> with an arrow.", "Past the hour, ünïcode."]
TIME = r"(?:(\d\d):)?(\d\d):(\d\d)([.,])(\d\d\d)"  # hours are left out in vtt under an hour
TIME_LINE = re.compile(rf"^{TIME} --> {TIME.replace('([.,])', '[.,]')}$")


def parse_cues(text: str, marker: str, numbered: bool) -> list[tuple[int, int, str]]:
    """(start ms, end ms, text) of each blank-line separated cue: [index line,] time line, text lines."""
    cues = []
    for block in text.strip("\n").split("\n\n"):
        lines = block.split("\n")
        if numbered:
            assert lines.pop(0) == str(len(cues) + 1)
        match = TIME_LINE.match(lines[0])
        assert match and match.group(4) == marker, lines[0]
        h1, m1, s1, _, ms1, h2, m2, s2, ms2 = match.groups()
        assert (h1 is None) == (h2 is None) == (marker == "." and int(m2) < 60 and h2 is None)
        start = ((int(h1 or 0) * 60 + int(m1)) * 60 + int(s1)) * 1000 + int(ms1)
        end = ((int(h2 or 0) * 60 + int(m2)) * 60 + int(s2)) * 1000 + int(ms2)
        cues.append((start, end, "\n".join(lines[1:])))
    return cues


def expected_cues() -> list[tuple[int, int, str]]:
    return [(round(s.start * 1000), round(s.end * 1000), t) for s, t in zip(SEGMENTS, CUE_TEXTS)]


def test_srt_parses_back(tmp_path):
    [path] = write_result(RESULT, tmp_path, "srt")
    assert path == tmp_path / "talk.take1.srt"
    cues = parse_cues(path.read_text(encoding="utf-8"), ",", numbered=True)
    assert cues == expected_cues()


def test_vtt_parses_back(tmp_path):
    [path] = write_result(RESULT, tmp_path, "vtt")
    text = path.read_text(encoding="utf-8")
    header, body = text.split("\n\n", 1)
    assert header == "WEBVTT"
    cues = parse_cues(body, ".", numbered=False)
    assert cues == expected_cues()


def test_tsv_round_trip(tmp_path):
    [path] = write_result(RESULT, tmp_path, "tsv")
    header, *rows = path.read_text(encoding="utf-8").splitlines()
    assert header == "start\tend\ttext"
    parsed = [row.split("\t") for row in rows]
    assert all(len(row) == 3 for row in parsed)
    assert [(int(a), int(b)) for a, b, _ in parsed] == [(0, 2500), (2500, 61004), (3723457, 3725000)]
    assert [t for _, _, t in parsed] == CUE_TEXTS[:1] + ["A long cue --> with an arrow."] + CUE_TEXTS[2:]


def test_json_round_trip(tmp_path):
    [path] = write_result(RESULT, tmp_path, "json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert (data["text"], data["language"], data["duration"]) == (RESULT.text, "en", 3725.0)
    assert [Segment(**s) for s in data["segments"]] == SEGMENTS


@pytest.mark.parametrize("fmt", ["json", "verbose_json"])
def test_json_keeps_each_segments_id(fmt):
    """A part of a transcript (the segments `on_segments` streams after the first) keeps the ids
    the segments have in the whole."""
    part = Transcription("".join(s.text for s in SEGMENTS[1:]), "en", SEGMENTS[1:], 3725.0)
    assert [s["id"] for s in json.loads(write_text(part, fmt))["segments"]] == [1, 2]


def test_txt_and_all(tmp_path):
    paths = write_result(RESULT, tmp_path, "all")
    assert sorted(p.name for p in paths) == sorted(f"talk.take1.{f}" for f in ALL_FORMATS)
    assert set(FORMATS) - set(ALL_FORMATS) == {"verbose_json"}  # on request only
    assert (tmp_path / "talk.take1.txt").read_text(encoding="utf-8").splitlines() == [
        s.text.strip() for s in SEGMENTS]


def test_empty_transcription(tmp_path):
    empty = Transcription(text="", language="en", segments=[], duration=1.0)
    write_result(empty, tmp_path, "all", basename="silence")
    assert (tmp_path / "silence.txt").read_text() == ""
    assert (tmp_path / "silence.srt").read_text() == ""
    assert (tmp_path / "silence.vtt").read_text() == "WEBVTT\n\n"
    assert (tmp_path / "silence.tsv").read_text() == "start\tend\ttext\n"
    assert json.loads((tmp_path / "silence.json").read_text())["segments"] == []


def test_write_result_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown output format 'doc'"):
        write_result(RESULT, tmp_path, "doc")
    with pytest.raises(ValueError, match="no source file"):
        write_result(Transcription("", None, [], 0.0), tmp_path, "txt")


@pytest.mark.parametrize("seconds, hours, marker, expected", [
    (0.0, True, ",", "00:00:00,000"),
    (1.2344, True, ".", "00:00:01.234"),
    (1.2346, True, ".", "00:00:01.235"),
    (59.9996, False, ".", "01:00.000"),          # rounding carries into the minutes
    (3599.9996, False, ",", "01:00:00,000"),     # ... and into the hours
    (3723.4567, False, ".", "01:02:03.457"),     # hours shown once there are any
    (12.5, False, ".", "00:12.500"),
    (36000 + 0.001, True, ",", "10:00:00,001"),
    (100 * 3600.0, True, ".", "100:00:00.000"),
])
def test_format_timestamp(seconds, hours, marker, expected):
    assert format_timestamp(seconds, always_include_hours=hours, decimal_marker=marker) == expected


def test_format_timestamp_rejects_negative():
    with pytest.raises(ValueError, match="non-negative"):
        format_timestamp(-0.5)


# ----------------------------------------------------------------------------- words


def timed(text: str, start: float, step: float = 0.5) -> list[Word]:
    """Words of `text` (leading spaces as Whisper gives them) each `step` seconds long."""
    return [Word(f" {w}", start + i * step, start + (i + 1) * step - 0.1, 0.9, tokens=[i])
            for i, w in enumerate(text.split())]


WORDED = [Segment(0.0, 3.0, " One two three four five six.", words=timed("One two three four five six.", 0.0)),
          Segment(3.0, 5.0, " Seven eight nine.", words=timed("Seven eight nine.", 3.0), id=1),
          Segment(10.0, 12.0, " Ten eleven.", words=timed("Ten eleven.", 10.0), id=2)]  # after a 5 s pause
WORDED_RESULT = Transcription(text="".join(s.text for s in WORDED), language="en", segments=WORDED,
                              duration=12.0, source="words.wav")
ALL_WORDS = [w for s in WORDED for w in s.words]


def write_text(result: Transcription, fmt: str, options: WriterOptions = WriterOptions()) -> str:
    out = io.StringIO()
    WRITERS[fmt](result, out, options)
    return out.getvalue()


def cue_words(text: str) -> list[str]:
    return text.replace("<u>", "").replace("</u>", "").split()


def test_highlight_words_underlines_each_word_in_its_time():
    options = WriterOptions(word_timestamps=True, highlight_words=True)
    cues = subtitle_cues(WORDED_RESULT, options)
    underlined = [c for c in cues if "<u>" in c.text]
    assert len(underlined) == len(ALL_WORDS)
    for cue, word in zip(underlined, ALL_WORDS):
        assert re.findall(r"<u>(.*?)</u>", cue.text) == [word.word.strip()]
        assert (cue.start, cue.end) == (word.start, word.end)
    # the 0.1 s gaps between words show the segment's text without underline
    gaps = [c for c in cues if "<u>" not in c.text]
    assert len(gaps) == len(ALL_WORDS) - len(WORDED)
    for cue in cues:
        segment = next(s for s in WORDED if s.start <= cue.start < s.end)
        assert cue_words(cue.text) == segment.text.split()
    assert write_text(WORDED_RESULT, "srt", options).count("<u>") == len(ALL_WORDS)


def test_max_line_width_wraps_each_segment():
    cues = subtitle_cues(WORDED_RESULT, WriterOptions(word_timestamps=True, max_line_width=10))
    assert len(cues) == len(WORDED)  # segments kept
    for cue, segment in zip(cues, WORDED):
        lines = cue.text.split("\n")
        assert all(len(line) <= 10 for line in lines)
        assert cue_words(cue.text) == segment.text.split()
        assert (cue.start, cue.end) == (segment.words[0].start, segment.words[-1].end)
    assert cues[0].text.split("\n") == ["One two", "three four", "five six."]


def test_max_line_count_flows_words_across_segments():
    options = WriterOptions(word_timestamps=True, max_line_width=12, max_line_count=2)
    cues = subtitle_cues(WORDED_RESULT, options)
    assert [c.text.split("\n") for c in cues] == [
        ["One two", "three four"], ["five six.", "Seven eight"], ["nine."], ["Ten eleven."]]
    # a cue ends at the pause of over 3 s, not at a segment's end
    assert (cues[1].start, cues[1].end) == (ALL_WORDS[4].start, ALL_WORDS[7].end)
    assert "five six.\nSeven eight\n\n" in write_text(WORDED_RESULT, "vtt", options)


def test_max_words_per_line_cuts_cues():
    cues = subtitle_cues(WORDED_RESULT, WriterOptions(word_timestamps=True, max_words_per_line=4))
    assert [c.text for c in cues] == ["One two three four", "five six.", "Seven eight nine.",
                                      "Ten eleven."]
    assert (cues[1].start, cues[1].end) == (ALL_WORDS[4].start, ALL_WORDS[5].end)


@pytest.mark.parametrize("options, message", [
    (dict(highlight_words=True), "highlight_words needs word_timestamps=True"),
    (dict(max_line_width=20), "max_line_width needs word_timestamps=True"),
    (dict(max_words_per_line=3), "max_words_per_line needs word_timestamps=True"),
    (dict(word_timestamps=True, max_line_count=2), "max_line_count needs max_line_width"),
    (dict(word_timestamps=True, max_line_width=0), r"max_line_width must be an integer >= 1, got 0"),
])
def test_writer_option_errors(options, message):
    with pytest.raises(ValueError, match=message):
        WriterOptions(**options)


def test_json_lists_words():
    segments = json.loads(write_text(WORDED_RESULT, "json"))["segments"]
    for segment, expected in zip(segments, WORDED):
        assert segment["words"] == [dict(word=w.word, start=w.start, end=w.end, probability=w.probability)
                                    for w in expected.words]


@pytest.mark.parametrize("task, language", [("transcribe", "english"), ("translate", "english")])
def test_verbose_json(tmp_path, task, language):
    result = Transcription(WORDED_RESULT.text, "fr" if task == "translate" else "en", WORDED, 12.0,
                           source="words.wav")
    [path] = write_result(result, tmp_path, "verbose_json",
                          options=WriterOptions(task=task, word_timestamps=True))
    assert path.name == "words.verbose.json"
    data = json.loads(path.read_text())
    assert (data["task"], data["language"], data["duration"], data["text"]) == (task, language, 12.0, result.text)
    fields = ["id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob",
              "compression_ratio", "no_speech_prob"]
    assert [list(s) for s in data["segments"]] == [fields] * len(WORDED)
    assert [(s["id"], s["start"], s["end"], s["text"]) for s in data["segments"]] == [
        (i, s.start, s.end, s.text) for i, s in enumerate(WORDED)]
    assert data["words"] == [dict(word=w.word.strip(), start=w.start, end=w.end) for w in ALL_WORDS]
    [plain] = write_result(result, tmp_path, "verbose_json", basename="plain")
    assert "words" not in json.loads(plain.read_text())


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_files_are_openai_whispers(tmp_path, fmt):
    """Byte for byte what openai-whisper's writers make of the same segments (its json has no
    `duration`), an emptied one among them (no length: its text cleared, as openai-whisper
    clears it). Whitespace inside a text (here a tab) differs: cues keep it on one line."""
    from whisper.utils import get_writer

    emptied = Segment(2.5, 2.5, "", tokens=[])
    plain = [dataclasses.replace(s, text=s.text.replace("\t", " "), id=i)
             for i, s in enumerate([SEGMENTS[0], emptied, *SEGMENTS[1:]])]
    result = dataclasses.replace(RESULT, text="".join(s.text for s in plain), segments=plain)
    segments = [dict(id=i, seek=s.seek, start=s.start, end=s.end, text=s.text, tokens=s.tokens,
                     temperature=s.temperature, avg_logprob=s.avg_logprob,
                     compression_ratio=s.compression_ratio, no_speech_prob=s.no_speech_prob)
                for i, s in enumerate(plain)]
    reference = dict(text=result.text, segments=segments, language="en")
    (tmp_path / "openai").mkdir()
    get_writer(fmt, str(tmp_path / "openai"))(reference, RESULT.source, highlight_words=False,
                                                max_line_width=None, max_line_count=None,
                                                max_words_per_line=None)
    [path] = write_result(result, tmp_path, fmt)
    expected = (tmp_path / "openai" / path.name).read_text(encoding="utf-8")
    got = path.read_text(encoding="utf-8")
    if fmt == "json":
        assert got.startswith(expected[:-1] + ", ") and json.loads(got)["duration"] == 3725.0
    else:
        assert got == expected


def random_worded(seed: int) -> Transcription:
    """Segments of timed words: varied widths, gaps around and past `PAUSE`, segment ends before
    and after their last word's."""
    rng = random.Random(seed)
    vocabulary = ["so", "we", "extraordinarily", "it's", "well,", "(aside)", "ünïcode", "done.", "yes?"]
    time, segments = 0.0, []
    for _ in range(rng.randint(1, 5)):
        words = []
        for _ in range(rng.randint(1, 12)):
            time += rng.choice([0.0, 0.1, 0.5, 2.5, 3.2])
            length = rng.choice([0.1, 0.4, 1.5])
            words.append(Word(" " + rng.choice(vocabulary), round(time, 2), round(time + length, 2), 0.9))
            time += length
        end = round(words[-1].end + rng.choice([-0.1, 0.0, 0.2]), 2)
        segments.append(Segment(words[0].start, end, "".join(w.word for w in words), words=words))
        time += rng.choice([0.2, 1.0, 3.5])
    return Transcription("".join(s.text for s in segments), "en", segments, time)


@pytest.mark.parametrize("options", [
    dict(), dict(highlight_words=True), dict(max_line_width=12), dict(max_line_width=1),
    dict(max_line_width=20, max_line_count=2), dict(max_line_width=30, max_line_count=1),
    dict(max_words_per_line=3), dict(max_words_per_line=2, highlight_words=True),
    dict(max_line_width=15, max_words_per_line=3), dict(max_line_width=15, max_line_count=2, max_words_per_line=3),
    dict(max_line_width=15, max_line_count=2, highlight_words=True),
], ids=str)
def test_word_subtitles_are_openai_whispers(options):
    """With word timestamps, srt and vtt byte for byte as openai-whisper's writers make them
    (cues from words: the last word's end, not the segment's; pauses from word starts)."""
    from whisper.utils import WriteSRT, WriteVTT

    exactly_three = [Word(" so", 1.0, 1.5, 0.9), Word(" we", 4.0, 4.5, 0.9)]  # starts 3.0 s apart: no pause
    paused = Transcription(" so we", "en", [Segment(1.0, 4.5, " so we", words=exactly_three)], 5.0)
    for result in [paused] + [random_worded(seed) for seed in range(40)]:
        reference = dict(text=result.text, language="en", segments=[
            dict(start=s.start, end=s.end, text=s.text,
                 words=[dataclasses.asdict(w) for w in s.words]) for s in result.segments])
        for fmt, openai_writer in (("srt", WriteSRT), ("vtt", WriteVTT)):
            expected = io.StringIO()
            openai_writer(".").write_result(reference, expected, **options)
            assert write_text(result, fmt, WriterOptions(word_timestamps=True, **options)) == \
                expected.getvalue(), (result.text, fmt)

"""Transcript writers: srt / vtt parsed back, tsv and json round trips, timestamp formatting."""
from __future__ import annotations

import json
import re

import pytest

from encdec.whisper.transcript import Segment, Transcription
from encdec.whisper.writers import FORMATS, format_timestamp, write_result

SEGMENTS = [
    Segment(0.0, 2.5, " Hello there.", tokens=[1, 2], avg_logprob=-0.25, no_speech_prob=0.01),
    Segment(2.5, 61.004, " A long\tcue --> with an arrow."),
    Segment(3723.4567, 3725.0, " Past the hour, ünïcode."),
]
RESULT = Transcription(text="".join(s.text for s in SEGMENTS), language="en", segments=SEGMENTS,
                       duration=3725.0, source="/some/dir/talk.take1.wav")
CUE_TEXTS = ["Hello there.", "A long cue -> with an arrow.", "Past the hour, ünïcode."]
TIME_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)([.,])(\d\d\d) --> (\d\d):(\d\d):(\d\d)\4(\d\d\d)$")


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
        start = ((int(h1) * 60 + int(m1)) * 60 + int(s1)) * 1000 + int(ms1)
        end = ((int(h2) * 60 + int(m2)) * 60 + int(s2)) * 1000 + int(ms2)
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
    segments = [Segment(**{k: v for k, v in s.items() if k != "id"}) for s in data["segments"]]
    assert segments == SEGMENTS
    assert [s["id"] for s in data["segments"]] == [0, 1, 2]


def test_txt_and_all(tmp_path):
    paths = write_result(RESULT, tmp_path, "all")
    assert sorted(p.name for p in paths) == sorted(f"talk.take1.{f}" for f in FORMATS)
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

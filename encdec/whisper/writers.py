"""Write a `Transcription` to disk as txt, srt, vtt, tsv or json (as the openai-whisper CLI does).

`write_result(transcription, output_dir, fmt)` writes `<basename>.<ext>`, where the basename is
the source file's name without its extension; "all" writes every format.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional, TextIO, Union

from encdec.whisper.transcript import Segment, Transcription

FORMATS = ("txt", "srt", "vtt", "tsv", "json")


def format_timestamp(seconds: float, always_include_hours: bool = True,
                     decimal_marker: str = ".") -> str:
    """`HH:MM:SS.mmm` (or `MM:SS.mmm` under an hour when hours are optional), to the nearest ms."""
    if seconds < 0:
        raise ValueError(f"timestamp must be non-negative, got {seconds}")
    milliseconds = round(seconds * 1000.0)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1000)
    prefix = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{prefix}{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def _cue_text(segment: Segment) -> str:
    # "-->" inside a cue would read as a time line
    return " ".join(segment.text.split()).replace("-->", "->")


def write_txt(result: Transcription, file: TextIO) -> None:
    lines = [s.text.strip() for s in result.segments] if result.segments else [result.text.strip()]
    for line in lines:
        if line:
            file.write(f"{line}\n")


def write_srt(result: Transcription, file: TextIO) -> None:
    for index, segment in enumerate(result.segments, start=1):
        start = format_timestamp(segment.start, decimal_marker=",")
        end = format_timestamp(segment.end, decimal_marker=",")
        file.write(f"{index}\n{start} --> {end}\n{_cue_text(segment)}\n\n")


def write_vtt(result: Transcription, file: TextIO) -> None:
    file.write("WEBVTT\n\n")
    for segment in result.segments:
        start, end = format_timestamp(segment.start), format_timestamp(segment.end)
        file.write(f"{start} --> {end}\n{_cue_text(segment)}\n\n")


def write_tsv(result: Transcription, file: TextIO) -> None:
    """Header `start end text`, times in integer milliseconds, tabs in the text become spaces."""
    file.write("start\tend\ttext\n")
    for segment in result.segments:
        text = " ".join(segment.text.split())
        file.write(f"{round(1000 * segment.start)}\t{round(1000 * segment.end)}\t{text}\n")


def write_json(result: Transcription, file: TextIO) -> None:
    segments = [dict(id=i, **asdict(s)) for i, s in enumerate(result.segments)]
    data = dict(text=result.text, language=result.language, segments=segments,
                duration=result.duration)
    json.dump(data, file, ensure_ascii=False, indent=2)
    file.write("\n")


WRITERS: dict[str, Callable[[Transcription, TextIO], None]] = {
    "txt": write_txt, "srt": write_srt, "vtt": write_vtt, "tsv": write_tsv, "json": write_json,
}


def output_basename(transcription: Transcription) -> str:
    """The source file's name without directory and extension."""
    if not transcription.source:
        raise ValueError("transcription has no source file; pass basename= to write_result")
    return os.path.splitext(os.path.basename(transcription.source))[0]


def write_result(transcription: Transcription, output_dir: Union[str, os.PathLike], fmt: str,
                 basename: Optional[str] = None) -> list[Path]:
    """Write `<output_dir>/<basename>.<fmt>` (every format for "all"); return the paths written."""
    if fmt != "all" and fmt not in WRITERS:
        raise ValueError(f"unknown output format {fmt!r}; expected one of {[*FORMATS, 'all']}")
    basename = basename or output_basename(transcription)
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in FORMATS if fmt == "all" else (fmt,):
        path = directory / f"{basename}.{name}"
        with open(path, "w", encoding="utf-8") as file:
            WRITERS[name](transcription, file)
        written.append(path)
    return written

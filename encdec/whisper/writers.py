"""Write a `Transcription` as txt, srt, vtt, tsv, json (as the openai-whisper CLI does) or
verbose_json (OpenAI's audio API shape).

`write_result(transcription, output_dir, fmt, options=WriterOptions(...))` writes
`<basename>.<ext>`, where the basename is the source file's name without its extension ("all":
openai-whisper's five formats; verbose_json goes to `<basename>.verbose.json`). Subtitles are a
cue per segment, from its start to its end; with word timestamps, from its first word's start to
its last word's end (segments without words are left out), and `WriterOptions` wraps a
segment's cue into lines of at most `max_line_width` characters (with `max_line_count`, words
flow across segments into cues of that many lines, a new cue where a word starts over 3 s after
the one before it starts) and cuts it every `max_words_per_line` words (without
`max_line_count`), and `highlight_words` repeats each cue once per word with that word
underlined (`<u>`), timed to the word: all as openai-whisper's writers do.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TextIO, Union

from encdec.whisper.languages import LANGUAGES
from encdec.whisper.transcript import Segment, Transcription, Word

FORMATS = ("txt", "srt", "vtt", "tsv", "json", "verbose_json")
ALL_FORMATS = FORMATS[:5]  # what "all" writes: openai-whisper's formats
EXTENSIONS = {"verbose_json": "verbose.json"}
PAUSE = 3.0  # seconds between word starts that start a new cue when cues flow across segments


@dataclass(frozen=True)
class WriterOptions:
    """How the writers lay a transcript out. `word_timestamps`: the transcript has words (json
    and verbose_json list them; the subtitle options below need them). `task` names the task
    in verbose_json."""

    task: str = "transcribe"
    word_timestamps: bool = False
    highlight_words: bool = False
    max_line_width: Optional[int] = None
    max_line_count: Optional[int] = None
    max_words_per_line: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("max_line_width", "max_line_count", "max_words_per_line"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.word_timestamps:
            for name in ("highlight_words", "max_line_width", "max_line_count", "max_words_per_line"):
                if getattr(self, name):
                    raise ValueError(f"{name} needs word_timestamps=True")
        if self.max_line_count and not self.max_line_width:
            raise ValueError("max_line_count needs max_line_width")


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


def segment_line(segment: Segment) -> str:
    """A segment as openai-whisper prints it while it transcribes: `[MM:SS.mmm --> MM:SS.mmm] text`."""
    start, end = format_timestamp(segment.start, False), format_timestamp(segment.end, False)
    return f"[{start} --> {end}] {segment.text}"


# ----------------------------------------------------------------------------- subtitle cues

Line = list[Word]


@dataclass
class Cue:
    start: float
    end: float
    text: str


def _one_line(text: str) -> str:
    # "-->" inside a cue would read as a time line
    return " ".join(text.split()).replace("-->", "->")


def _line_text(line: Line, underlined: Optional[Word] = None) -> str:
    """The line's words as spoken, `underlined` (if in it) wrapped in `<u>...</u>`."""
    pieces = []
    for word in line:
        text = _one_line(word.word)
        if word is underlined:
            text = f"<u>{text}</u>"
        pieces.append(" " + text if word.word[:1].isspace() else text)
    return "".join(pieces).strip()


def _pack(words: list[Word], width: float = math.inf, lines: float = math.inf,
          words_per_cue: float = math.inf, pause: float = math.inf) -> list[list[Line]]:
    """Words into cues of lines: a word joins the last line while it fits `width`, else starts
    a new line while the cue has fewer than `lines`, else (or when it starts over `pause`
    seconds after the word before it started, or once the cue has `words_per_cue` words) starts
    a new cue."""
    cues: list[list[Line]] = []
    for i, word in enumerate(words):
        cue = cues[-1] if cues else None
        if cue and word.start - words[i - 1].start <= pause and sum(map(len, cue)) < words_per_cue:
            if len(_line_text(cue[-1] + [word])) <= width:
                cue[-1].append(word)
                continue
            if len(cue) < lines:
                cue.append([word])
                continue
        cues.append([[word]])
    return cues


def _word_cues(segments: list[Segment], options: WriterOptions) -> list[list[Line]]:
    width = options.max_line_width or math.inf
    if options.max_line_count:
        return _pack([w for s in segments for w in s.words], width, options.max_line_count,
                     pause=PAUSE)
    per_cue = options.max_words_per_line or math.inf
    return [cue for s in segments for cue in _pack(s.words, width, words_per_cue=per_cue)]


def _highlighted(lines: list[Line]) -> list[Cue]:
    """A cue per word with that word underlined; gaps between words show the plain text."""
    plain = "\n".join(_line_text(line) for line in lines)
    cues, time = [], lines[0][0].start
    for word in (w for line in lines for w in line):
        if round(word.start, 3) > round(time, 3):
            cues.append(Cue(time, word.start, plain))
        cues.append(Cue(word.start, word.end, "\n".join(_line_text(line, word) for line in lines)))
        time = word.end
    return cues


def subtitle_cues(result: Transcription, options: WriterOptions = WriterOptions()) -> list[Cue]:
    """The srt / vtt cues of a transcript (see the module docstring)."""
    if not options.word_timestamps:
        return [Cue(s.start, s.end, _one_line(s.text)) for s in result.segments]
    cues = []
    for lines in _word_cues(result.segments, options):
        if options.highlight_words:
            cues.extend(_highlighted(lines))
        else:
            cues.append(Cue(lines[0][0].start, lines[-1][-1].end,
                            "\n".join(_line_text(line) for line in lines)))
    return cues


# ----------------------------------------------------------------------------- writers


def write_txt(result: Transcription, file: TextIO, options: WriterOptions = WriterOptions()) -> None:
    """openai-whisper's: a line per segment, blank for one whose text was cleared."""
    lines = [s.text.strip() for s in result.segments] if result.segments else [result.text.strip()]
    file.writelines(f"{line}\n" for line in lines if line or result.segments)


def write_srt(result: Transcription, file: TextIO, options: WriterOptions = WriterOptions()) -> None:
    for index, cue in enumerate(subtitle_cues(result, options), start=1):
        start = format_timestamp(cue.start, decimal_marker=",")
        end = format_timestamp(cue.end, decimal_marker=",")
        file.write(f"{index}\n{start} --> {end}\n{cue.text}\n\n")


def write_vtt(result: Transcription, file: TextIO, options: WriterOptions = WriterOptions(),
              always_include_hours: bool = False) -> None:
    """WebVTT; times have hours from the first hour on, as openai-whisper writes them (OpenAI's
    API always writes them: `always_include_hours`)."""
    file.write("WEBVTT\n\n")
    for cue in subtitle_cues(result, options):
        start = format_timestamp(cue.start, always_include_hours)
        end = format_timestamp(cue.end, always_include_hours)
        file.write(f"{start} --> {end}\n{cue.text}\n\n")


def write_tsv(result: Transcription, file: TextIO, options: WriterOptions = WriterOptions()) -> None:
    """Header `start end text`, times in integer milliseconds, tabs in the text become spaces."""
    file.write("start\tend\ttext\n")
    for segment in result.segments:
        text = " ".join(segment.text.split())
        file.write(f"{round(1000 * segment.start)}\t{round(1000 * segment.end)}\t{text}\n")


def _word_dict(word: Word) -> dict:
    return dict(word=word.word, start=word.start, end=word.end, probability=word.probability)


def _segment_dict(s: Segment) -> dict:
    """A segment's ten fields as openai-whisper and OpenAI's API write them (without words)."""
    return dict(id=s.id, seek=s.seek, start=s.start, end=s.end, text=s.text, tokens=s.tokens,
                temperature=s.temperature, avg_logprob=s.avg_logprob,
                compression_ratio=s.compression_ratio, no_speech_prob=s.no_speech_prob)


def write_json(result: Transcription, file: TextIO, options: WriterOptions = WriterOptions()) -> None:
    """openai-whisper's json, laid out as it writes it (one line), with `duration` added: the
    text as decoded (its leading space kept), every segment field, and with word timestamps
    each segment's words with their times and probabilities."""
    worded = options.word_timestamps or any(s.words for s in result.segments)
    segments = [_segment_dict(s) | ({"words": [_word_dict(w) for w in s.words]} if worded else {})
                for s in result.segments]
    text = "".join(s.text for s in result.segments) if result.segments else result.text
    json.dump(dict(text=text, segments=segments, language=result.language, duration=result.duration), file)


def language_name(result: Transcription, task: str) -> str:
    """OpenAI's language field: the full name in lower case ("english" for a translation)."""
    code = "en" if task == "translate" else result.language or ""
    return LANGUAGES.get(code, code)


def verbose_json(result: Transcription, task: str = "transcribe", segments: bool = True,
                 words: bool = False) -> dict:
    """OpenAI's verbose_json body: task, language, duration, text, and `segments` with every
    OpenAI segment field and/or top-level `words` (`word` without spaces, `start`, `end`)."""
    data = dict(task=task, language=language_name(result, task), duration=result.duration,
                text=result.text)
    if segments:
        data["segments"] = [_segment_dict(s) for s in result.segments]
    if words:
        data["words"] = [dict(word=w.word.strip(), start=w.start, end=w.end)
                         for s in result.segments for w in s.words]
    return data


def write_verbose_json(result: Transcription, file: TextIO,
                       options: WriterOptions = WriterOptions()) -> None:
    json.dump(verbose_json(result, options.task, words=options.word_timestamps), file,
              ensure_ascii=False, indent=2)
    file.write("\n")


WRITERS: dict[str, Callable[[Transcription, TextIO, WriterOptions], None]] = {
    "txt": write_txt, "srt": write_srt, "vtt": write_vtt, "tsv": write_tsv, "json": write_json,
    "verbose_json": write_verbose_json,
}


def source_basename(source: str) -> str:
    """The name of a transcript's files: its source file's, without directory and extension."""
    return os.path.splitext(os.path.basename(source))[0]


def output_basename(transcription: Transcription) -> str:
    if not transcription.source:
        raise ValueError("transcription has no source file; pass basename= to write_result")
    return source_basename(transcription.source)


def write_result(transcription: Transcription, output_dir: Union[str, os.PathLike], fmt: str,
                 basename: Optional[str] = None,
                 options: WriterOptions = WriterOptions()) -> list[Path]:
    """Write `<output_dir>/<basename>.<ext>` (openai-whisper's five formats for "all");
    return the paths written."""
    if fmt != "all" and fmt not in WRITERS:
        raise ValueError(f"unknown output format {fmt!r}; expected one of {[*FORMATS, 'all']}")
    basename = basename or output_basename(transcription)
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ALL_FORMATS if fmt == "all" else (fmt,):
        path = directory / f"{basename}.{EXTENSIONS.get(name, name)}"
        with open(path, "w", encoding="utf-8") as file:
            WRITERS[name](transcription, file, options)
        written.append(path)
    return written

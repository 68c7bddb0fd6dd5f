"""openai-whisper's `verbose` and `fp16` arguments for `LLM.transcribe`: what it prints.

`verbose=True` prints each segment as `[MM:SS.mmm --> MM:SS.mmm] text` once it is final (with
several inputs, a `==> name <==` line first whenever the next line is another input's);
`verbose=False` shows a progress bar over the audio's spectrogram frames (100 a second), as
openai-whisper's does; None prints nothing. A detected language is announced as openai-whisper
announces it (`verbose=True`: two lines, `verbose=False`: the second). The precision is the
LLM's `dtype`, fixed when it is made, so `fp16` only warns when it asks for another one (as
openai-whisper warns that a CPU runs float32 whatever `fp16` says).
"""
from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from collections.abc import Iterator
from typing import Callable, ContextManager, Optional

import torch

from encdec.audio import HOP_LENGTH, SAMPLE_RATE
from encdec.whisper.languages import LANGUAGES
from encdec.whisper.transcript import Segment
from encdec.whisper.writers import segment_line

Progress = Optional[Callable[[float], None]]
Segments = Optional[Callable[[int, list[Segment]], None]]
Languages = Optional[Callable[[int, str], None]]
Reporter = Callable[[list[str], float, Progress], ContextManager[tuple[Progress, Segments, Languages]]]
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # log-mel frames


def check_fp16(fp16: Optional[bool], dtype: torch.dtype) -> None:
    """ValueError unless `fp16` is None or a bool; a warning if the LLM runs another precision."""
    if fp16 is None:
        return
    if not isinstance(fp16, bool):
        raise ValueError(f"fp16 must be True, False or None, got {fp16!r}")
    wanted = torch.float16 if fp16 else torch.float32
    if dtype != wanted:
        warnings.warn(f"fp16={fp16}: this LLM runs in {str(dtype).removeprefix('torch.')}, set when "
                      f"it is made (LLM(..., dtype=...)); transcribing in that", stacklevel=3)


def reporter(verbose: Optional[bool]) -> Optional[Reporter]:
    """`encdec.whisper.transcribe`'s `report` for `verbose` (None: silent); ValueError for
    anything but True, False or None."""
    if not (verbose is None or isinstance(verbose, bool)):
        raise ValueError(f"verbose must be True, False or None, got {verbose!r}")
    return None if verbose is None else functools.partial(reporting, verbose)


@contextlib.contextmanager
def reporting(verbose: bool, names: list[str], total_seconds: float,
              on_progress: Progress) -> Iterator[tuple[Progress, Segments, Languages]]:
    """The job's `on_progress`, `on_segments` and `on_language` for `verbose`, around the
    caller's `on_progress`."""
    if verbose:
        printer = Printer(names, verbose, functools.partial(print, flush=True))
        yield on_progress, printer.segments, printer.language
        return
    from tqdm.auto import tqdm

    with tqdm(total=round(total_seconds * FRAMES_PER_SECOND), unit="frames", file=sys.stderr) as bar:
        def progress(seconds: float) -> None:
            bar.update(round(seconds * FRAMES_PER_SECOND) - bar.n)
            if on_progress is not None:
                on_progress(seconds)

        printer = Printer(names, verbose, functools.partial(tqdm.write, file=sys.stdout))  # above the bar
        yield progress, None, printer.language


def language_lines(code: str, verbose: bool) -> list[str]:
    """openai-whisper's lines on a detected language: both with verbose, the second without."""
    detecting = ["Detecting language using up to the first 30 seconds. Use `--language` to specify "
                 "the language"] if verbose else []
    return [*detecting, f"Detected language: {LANGUAGES.get(code, code).title()}"]


class Printer:
    """What `verbose` prints on stdout: each final segment's line (verbose=True; those with
    text, as `encdec transcribe` prints them) and a detected language, each under its input's
    name when there are several inputs; `write(line)` prints a line."""

    def __init__(self, names: list[str], verbose: bool, write: Callable[[str], None]):
        self.names = names
        self.verbose = verbose
        self.write = write
        self.last: Optional[int] = None

    def segments(self, index: int, segments: list[Segment]) -> None:
        self._lines(index, [segment_line(s) for s in segments if s.text.strip()])

    def language(self, index: int, code: str) -> None:
        self._lines(index, language_lines(code, self.verbose))

    def _lines(self, index: int, lines: list[str]) -> None:
        for line in lines:
            if len(self.names) > 1 and index != self.last:
                self.write(f"==> {self.names[index]} <==")
            self.last = index
            self.write(line)

"""The options of `encdec transcribe` beyond model and input, spelt as openai-whisper's CLI
spells them (`--beam_size`, `-f`/`--output_format`, booleans as `True`/`False`), grouped in
--help as decoding, fallback, prompt, timestamps, VAD and output, with openai-whisper's
defaults (beam 5, best_of 5, temperature fallback on). The earlier dashed spellings
(`--output-format`, `--initial-prompt`, ...) still work.

`checked_options(args)` turns the parsed options into `LLM.transcribe` options and the
writers' `WriterOptions`; a ValueError names the flag at fault.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any, Callable

from encdec.entrypoints.whisper_options import NAMES, transcribe_options
from encdec.whisper.pipeline import TranscribeOptions
from encdec.whisper.vad import VadOptions
from encdec.whisper.writers import FORMATS, WriterOptions

DEFAULTS = {f.name: f.default for f in dataclasses.fields(TranscribeOptions)}
WRITER_NAMES = tuple(f.name for f in dataclasses.fields(WriterOptions) if f.name != "task")
PASSED_ELSEWHERE = ("language", "task")  # given to LLM.transcribe by the command itself
FAST_GREEDY = "--beam_size 1 --no_fallback"
VAD_HELP = {
    "threshold": "speech probability that starts speech",
    "neg_threshold": "probability below which speech ends (default: None, threshold - 0.15)",
    "min_speech_duration_ms": "drop speech regions shorter than this",
    "max_speech_duration_s": "cut speech regions longer than this at their quietest frame",
    "min_silence_duration_ms": "silence that ends a speech region",
    "speech_pad_ms": "padding added on both sides of each speech region",
}


def str2bool(value: str) -> bool:
    """openai-whisper's booleans: True or False (any case)."""
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")
    return lowered == "true"


BOOL = dict(type=str2bool, metavar="{True,False}")  # openai-whisper's boolean flags


def number(kind: Callable[[str], Any], minimum: float = float("-inf"),
           none: bool = False) -> Callable[[str], Any]:
    """An argparse type: a `kind` number >= `minimum`; with `none`, also `None` (openai-whisper's
    `optional_int` / `optional_float`)."""
    def parse(value: str) -> Any:
        if none and value == "None":
            return None
        try:
            parsed = kind(value)
        except ValueError:
            parsed = None
        if parsed is None or not parsed >= minimum:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}"
                f"{f' >= {minimum:g}' if minimum > float('-inf') else ''}"
                f"{' or None' if none else ''}, got {value!r}")
        return parsed
    return parse


def add_decoding(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--beam_size", type=number(int, 1, none=True), default=5,
                   help=f"beams at temperature 0; 1 decodes greedily (default: 5; fastest: "
                        f"{FAST_GREEDY})")
    g.add_argument("--best_of", type=number(int, 1), default=5,
                   help="samples per decode at temperatures above 0, the likeliest kept (default: 5)")
    g.add_argument("--patience", type=number(float, 0, none=True), default=None,
                   help="beam search patience: wait for beam_size * patience finished beams "
                        "(default: 1.0)")
    g.add_argument("--temperature", type=number(float, 0), default=0.0,
                   help="first temperature of each window's decode; 0 decodes greedily or with "
                        "beams (default: 0)")
    g.add_argument("--suppress_tokens", default=DEFAULTS["suppress_tokens"],
                   help="comma-separated token ids never sampled; -1: the model's list of "
                        "symbols (default: -1)")
    g.add_argument("--suppress_blank", **BOOL, default=DEFAULTS["suppress_blank"],
                   help="never start a window's text with a blank (default: True)")
    g.add_argument("--condition_on_previous_text", **BOOL,
                   default=DEFAULTS["condition_on_previous_text"],
                   help="prompt each window with the text before it; False decodes all windows "
                        "of a file at once, faster but less consistent (default: True)")


def add_fallback(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "temperature fallback and thresholds",
        "A window is decoded again, hotter, while its text is too repetitive or unsure, "
        "unless it is silence.")
    g.add_argument("--temperature_increment_on_fallback", type=number(float, 0, none=True),
                   default=0.2, help="step from --temperature up to 1.0; None or 0: no fallback "
                                     "(default: 0.2)")
    g.add_argument("--no_fallback", "--no-fallback", action="store_true",
                   help=f"decode once at --temperature (fast greedy: {FAST_GREEDY})")
    for name, rule in (("compression_ratio_threshold", "fall back when the text's gzip "
                                                       "compression ratio is above this"),
                       ("logprob_threshold", "fall back when the average log-probability is "
                                             "below this"),
                       ("no_speech_threshold", "a window is silence (no text) when its no-speech "
                                               "probability is above this and its average "
                                               "log-probability below --logprob_threshold")):
        g.add_argument(f"--{name}", type=number(float, none=True), default=DEFAULTS[name],
                       help=f"{rule}; None: never (default: {DEFAULTS[name]})")


def add_prompt(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prompt")
    g.add_argument("--initial_prompt", "--initial-prompt", default=None,
                   help="text that conditions the first window (spelling, names, style)")
    g.add_argument("--carry_initial_prompt", **BOOL, default=False,
                   help="keep the initial prompt in every window's prompt (default: False)")
    g.add_argument("--hotwords", default=None,
                   help="words or phrases put first in every window's prompt (faster-whisper)")


def add_timestamps(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("timestamps and words")
    g.add_argument("--timestamps", action=argparse.BooleanOptionalAction, default=True,
                   help="predict segment timestamps (default: on)")
    g.add_argument("--word_timestamps", **BOOL, default=False,
                   help="time every word (cross-attention alignment); json and verbose_json "
                        "list the words (default: False)")
    g.add_argument("--clip_timestamps", default=DEFAULTS["clip_timestamps"],
                   help="start,end,start,end,... seconds to transcribe; an open last clip runs "
                        "to the end (default: 0, everything)")
    g.add_argument("--hallucination_silence_threshold", type=number(float, 0, none=True),
                   default=None, help="with --word_timestamps True: drop text that looks made "
                                      "up between silences longer than this many seconds")


def add_vad(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("voice activity detection",
                             "Silero VAD; the --vad_* options are faster-whisper's vad_parameters.")
    g.add_argument("--vad_filter", **BOOL, default=False,
                   help="transcribe only the speech regions, mapping times back (default: False)")
    for field in dataclasses.fields(VadOptions):
        kind = int if field.type == "int" else float
        g.add_argument(f"--vad_{field.name}", type=number(kind, 0, none=field.default is None),
                       default=argparse.SUPPRESS,
                       help=VAD_HELP[field.name] + ("" if field.default is None
                                                    else f" (default: {field.default})"))


def add_output(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--output_format", "-f", "--output-format", choices=[*FORMATS, "all"],
                   default=None, metavar="FORMAT",
                   help=f"also write FILE's transcript as BASENAME.EXT into the output directory: "
                        f"{', '.join(FORMATS)} (as BASENAME.verbose.json) or all (openai-whisper's "
                        f"five; the default when only --output_dir is given); default: no files")
    g.add_argument("--output_dir", "-o", "--output-dir", default=None,
                   help="directory for the output files (default: current directory)")
    g.add_argument("--verbose", **BOOL, default=True,
                   help="print each transcript on stdout (default: True)")
    g.add_argument("--highlight_words", **BOOL, default=False,
                   help="srt/vtt: underline each word as it is spoken (needs --word_timestamps "
                        "True; default: False)")
    g.add_argument("--max_line_width", type=number(int, 1, none=True), default=None,
                   help="srt/vtt: wrap lines at this many characters (needs --word_timestamps True)")
    g.add_argument("--max_line_count", type=number(int, 1, none=True), default=None,
                   help="srt/vtt: lines per cue, words flowing across segments (needs "
                        "--max_line_width)")
    g.add_argument("--max_words_per_line", type=number(int, 1, none=True), default=None,
                   help="srt/vtt: words per cue (needs --word_timestamps True; not with "
                        "--max_line_width)")


def add_transcribe_arguments(p: argparse.ArgumentParser) -> None:
    """Every group but model and input."""
    for add in (add_decoding, add_fallback, add_prompt, add_timestamps, add_vad, add_output):
        add(p)


def flag_wording(message: str) -> str:
    """An option error with each option name spelt as its flag (`beam_size` -> `--beam_size`)."""
    names = sorted((*NAMES, *WRITER_NAMES), key=len, reverse=True)
    return re.sub(r"(?<![\w-])(" + "|".join(names) + r")\b", r"--\1", message)


def checked_options(args: argparse.Namespace) -> tuple[dict[str, Any], WriterOptions]:
    """`LLM.transcribe` options (all but language and task) and `WriterOptions` from `args`."""
    values = {name: getattr(args, name) for name in NAMES
              if hasattr(args, name) and name not in PASSED_ELSEWHERE}
    if args.no_fallback:
        values["temperature_increment_on_fallback"] = None
    try:
        writer = WriterOptions(task=args.task, **{name: getattr(args, name) for name in WRITER_NAMES})
        return transcribe_options(values), writer
    except ValueError as err:
        raise ValueError(flag_wording(str(err))) from None

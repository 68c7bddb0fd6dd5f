"""The options of `encdec transcribe` beyond model and input, spelt as openai-whisper's CLI
spells them (`--beam_size`, `-f`/`--output_format`, booleans as `True`/`False`), grouped in
--help as decoding, fallback, prompt, timestamps, VAD and output, with openai-whisper's
defaults (beam 5, best_of 5, temperature fallback on). The earlier dashed spellings
(`--output-format`, `--initial-prompt`, ...) still work.

`checked_options(args)` turns the parsed options into `LLM.transcribe` options and the
writers' `WriterOptions`; a ValueError names the flag at fault. `number(...)` and the types
made with it (`positive_int`, ...) check every number flag of the `encdec` commands.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
from typing import Any, Callable

from encdec.config import SchedulerConfig
from encdec.entrypoints.whisper_options import NAMES, VAD_NAMES, transcribe_options
from encdec.whisper.options import TranscribeOptions
from encdec.whisper.vad import VadOptions
from encdec.whisper.writers import FORMATS, WriterOptions

DEFAULTS = {f.name: f.default for f in dataclasses.fields(TranscribeOptions)}
WRITER_NAMES = tuple(f.name for f in dataclasses.fields(WriterOptions) if f.name != "task")
PASSED_ELSEWHERE = ("language", "task")  # given to LLM.transcribe by the command itself
FAST_GREEDY = "--beam_size 1 --no_fallback"
MAX_SEQS = SchedulerConfig.max_num_seqs  # sequences the engine decodes at once: beams, samples
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


def number(kind: Callable[[str], Any], minimum: float = -math.inf, maximum: float = math.inf,
           none: bool = False, above: bool = False, infinite: bool = False) -> Callable[[str], Any]:
    """An argparse type: a `kind` number in [minimum, maximum] (over `minimum` with `above`),
    finite unless `infinite`; with `none`, also `None` (openai-whisper's `optional_int` /
    `optional_float`)."""
    def shown(bound: float) -> str:
        return str(bound) if kind is int else f"{bound:g}"

    if minimum > -math.inf and maximum < math.inf:
        bounds = f" in {'(' if above else '['}{shown(minimum)}, {shown(maximum)}]"
    elif minimum > -math.inf:
        bounds = f" {'>' if above else '>='} {shown(minimum)}"
    else:
        bounds = f" <= {shown(maximum)}" if maximum < math.inf else ""
    finite = "finite " if maximum == math.inf and not infinite else ""
    what = "an integer" if kind is int else f"a {finite}number"
    expected = f"{what}{bounds}{' or None' if none else ''}"

    def parse(value: str) -> Any:
        if none and value == "None":
            return None
        try:
            parsed = kind(value)
        except ValueError:
            parsed = math.nan
        if not ((minimum < parsed if above else minimum <= parsed) and parsed <= maximum
                and (infinite or kind is int or math.isfinite(parsed))):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
        return parsed
    return parse


# argparse types of the other commands' flags
positive_int = number(int, 1)
non_negative_int = number(int, 0)
non_negative_float = number(float, 0)
positive_float = number(float, 0, above=True)


def number_list(item: Callable[[str], Any], expected: str) -> Callable[[str], list]:
    """An argparse type: comma-separated values of the argparse type `item` (empty: none)."""
    def parse(value: str) -> list:
        try:
            return [item(v) for v in value.split(",")] if value.strip() else []
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}") from None
    return parse


def add_decoding(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--beam_size", type=number(int, 1, MAX_SEQS, none=True), default=5,
                   help=f"beams at temperature 0; 1 decodes greedily, or with --patience as one beam (default: 5; fastest: "
                        f"{FAST_GREEDY}); at most {MAX_SEQS}")
    g.add_argument("--best_of", type=number(int, 1, MAX_SEQS, none=True), default=5,
                   help=f"samples per decode at temperatures above 0, the likeliest kept; at most "
                        f"{MAX_SEQS} (default: 5)")
    g.add_argument("--patience", type=number(float, 0, none=True, above=True), default=None,
                   help="beam search patience: wait for beam_size * patience finished beams "
                        "(default: 1.0)")
    g.add_argument("--length_penalty", type=number(float, 0, 1, none=True), default=None,
                   help="rank beams and samples by log-probability over ((5 + length) / 6) ** "
                        "length_penalty (Google NMT's alpha), in [0, 1] as openai-whisper takes "
                        "it; default: over the length")
    g.add_argument("--temperature", type=number(float, 0, 2), default=0.0,
                   help="first temperature of each window's decode, in [0, 2]; 0 decodes greedily "
                        "or with beams (default: 0)")
    g.add_argument("--suppress_tokens", default=DEFAULTS["suppress_tokens"],
                   type=number_list(number(int, -1), "comma-separated token ids (integers >= 0, "
                                                     "or -1)"),
                   help="comma-separated token ids never sampled; -1: the model's list of "
                        "symbols (default: -1)")
    g.add_argument("--suppress_blank", **BOOL, default=DEFAULTS["suppress_blank"],
                   help="never start a window's text with a blank (default: True)")
    g.add_argument("--condition_on_previous_text", **BOOL,
                   default=DEFAULTS["condition_on_previous_text"],
                   help="prompt each window with the text before it (default: True)")
    g.add_argument("--repetition_penalty", type=number(float, 0, above=True), default=DEFAULTS["repetition_penalty"],
                   help="penalize the tokens a decode has already made: their scores divided by "
                        "this, or multiplied when negative (faster-whisper's; default: 1, none)")
    g.add_argument("--no_repeat_ngram_size", type=number(int, 0), default=DEFAULTS["no_repeat_ngram_size"],
                   help="never repeat an n-gram of this size within a decode (faster-whisper's; "
                        "default: 0, none)")
    g.add_argument("--max_new_tokens", type=number(int, 1, none=True), default=DEFAULTS["max_new_tokens"],
                   help="tokens each window's decode makes at most, its timestamps and end "
                        "counted (openai-whisper's sample_len; default: 224)")
    g.add_argument("--windows_at_once", **BOOL, default=DEFAULTS["windows_at_once"],
                   help="cut a file at quiet points and decode all its windows at once, not "
                        "conditioned: faster on one long file, less consistent (default: False)")


def add_fallback(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "temperature fallback and thresholds",
        "A window is decoded again, hotter, while its text is too repetitive or unsure, "
        "unless it is silence.")
    g.add_argument("--temperature_increment_on_fallback", type=number(float, 0, none=True),
                   default=0.2, help="step from --temperature up to 1.0; None or 0: no fallback "
                                     "(default: 0.2)")
    g.add_argument("--no_fallback", action="store_true",
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
    g.add_argument("--initial_prompt", default=None,
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
                   type=number_list(number(float, 0), "comma-separated seconds (numbers >= 0)"),
                   help="start,end,start,end,... seconds to transcribe; an open last clip runs "
                        "to the end (default: 0, everything)")
    g.add_argument("--hallucination_silence_threshold", type=number(float, 0, none=True),
                   default=None, help="with --word_timestamps True: drop text that looks made "
                                      "up between silences longer than this many seconds")
    for side, joins in (("prepend", "next"), ("append", "previous")):
        default = DEFAULTS[f"{side}_punctuations"]
        g.add_argument(f"--{side}_punctuations", default=default,
                       help=f"with --word_timestamps True: these marks join the {joins} word; "
                            f"default: {default}")


def add_vad(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("voice activity detection",
                             "Silero VAD; the --vad_* options are faster-whisper's vad_parameters.")
    g.add_argument("--vad_filter", **BOOL, default=False,
                   help="transcribe only the speech regions, mapping times back (default: False)")
    for field in dataclasses.fields(VadOptions):
        kind = int if field.type == "int" else float
        g.add_argument(f"--vad_{field.name}", type=number(kind, 0, none=field.default is None,
                                                          infinite=field.default == math.inf),
                       default=argparse.SUPPRESS,
                       help=VAD_HELP[field.name] + ("" if field.default is None
                                                    else f" (default: {field.default})"))


def add_output(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--output_format", "-f", choices=[*FORMATS, "all"],
                   default=None, metavar="FORMAT",
                   help=f"also write FILE's transcript as BASENAME.EXT into the output directory: "
                        f"{', '.join(FORMATS)} (as BASENAME.verbose.json) or all (openai-whisper's "
                        f"five; the default when only --output_dir is given); default: no files")
    g.add_argument("--output_dir", "-o", default=None,
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
                        "--max_line_count)")


def add_transcribe_arguments(p: argparse.ArgumentParser) -> None:
    """Every group but model and input."""
    for add in (add_decoding, add_fallback, add_prompt, add_timestamps, add_vad, add_output):
        add(p)


def flag_wording(message: str) -> str:
    """An option error with each option name spelt as its flag (`beam_size` -> `--beam_size`)."""
    names = sorted((*NAMES, *WRITER_NAMES), key=len, reverse=True)
    return re.sub(r"(?<![\w-])(" + "|".join(names) + r")\b", r"--\1", message)


def ignored_vad_flags(args: argparse.Namespace) -> list[str]:
    """The --vad_* flags given without --vad_filter True, which then do nothing."""
    return [] if args.vad_filter else [f"--{name}" for name in VAD_NAMES if name in args]


def drop_ineffective_flags(args: argparse.Namespace) -> list[str]:
    """Unset the flags that openai-whisper's command line takes but ignores here, as it ignores
    them; returns a warning for each. (Without --word_timestamps True, a word-level writer flag
    is an error first, as there.)"""
    ineffective = []
    if args.max_line_count and not args.max_line_width and args.word_timestamps:
        ineffective.append(("max_line_count", "has no effect without --max_line_width"))
    if args.max_words_per_line and args.max_line_count and args.max_line_width:
        ineffective.append(("max_words_per_line", "has no effect with --max_line_count"))
    if args.hallucination_silence_threshold is not None and not args.word_timestamps:
        ineffective.append(("hallucination_silence_threshold", "has no effect without --word_timestamps True"))
    for name, _ in ineffective:
        setattr(args, name, None)
    return [f"--{name} {why}" for name, why in ineffective]


def checked_options(args: argparse.Namespace) -> tuple[dict[str, Any], WriterOptions]:
    """`LLM.transcribe` options (all but language and task) and `WriterOptions` from `args`."""
    values = {name: getattr(args, name) for name in NAMES
              if hasattr(args, name) and name not in PASSED_ELSEWHERE}
    if args.no_fallback:
        values["temperature_increment_on_fallback"] = None
    if values.get("best_of", 1) is None:  # openai-whisper's optional_int: one sample
        values["best_of"] = 1
    try:
        writer = WriterOptions(task=args.task, **{name: getattr(args, name) for name in WRITER_NAMES})
        return transcribe_options(values), writer
    except ValueError as err:
        raise ValueError(flag_wording(str(err))) from None

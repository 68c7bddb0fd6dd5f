"""`encdec transcribe`: audio files with Whisper, as openai-whisper's command line takes and
writes them (`encdec.entrypoints.transcribe_args` reads its options)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from tqdm import tqdm

from encdec.audio import SAMPLE_RATE, load_audio
from encdec.entrypoints import cli_args
from encdec.entrypoints.cli_args import MAX_THREADS, add_model_options, directory, make_output_dir
from encdec.entrypoints.cli_messages import UsageError, error, file_error, input_error, os_reason, warn
from encdec.entrypoints.transcribe_args import (BOOL, add_transcribe_arguments, checked_options,
                                                drop_ineffective_flags, flag_wording, ignored_vad_flags,
                                                number)
from encdec.entrypoints.whisper_console import language_lines
from encdec.llm import LLM
from encdec.weights.loader import check_model
from encdec.whisper.languages import english_only_warning, requested_language
from encdec.whisper.tokens import WhisperTokens
from encdec.whisper.transcript import Transcription
from encdec.whisper.writers import segment_line, source_basename, write_result


TRANSCRIBE_EPILOG = """\
output: each file's transcript goes to stdout, with one "[MM:SS.mmm --> MM:SS.mmm] text" line per
segment (plain text with --no-timestamps; nothing with --verbose False); with several files
each transcript follows a "==> FILE <==" line (with --verbose False, only above a detected
language's line). Files are written only when --output_format or --output_dir is given:
--output_format alone writes into the current directory, --output_dir alone writes
openai-whisper's five formats (all).
Progress (seconds of audio done) goes to stderr. A file that cannot be read or transcribed gets
one "encdec: error: FILE: reason" line on stderr; the other files still finish, and the exit
status is 1 if any file failed, 0 otherwise.
"""


@dataclass
class AudioInput:
    """A file to transcribe, checked readable: its length, and its waveform where it is kept (a
    pipe's, which cannot be read again; the first batch's); another file's is read again when its
    batch comes, so that many long files are never in memory at once."""

    name: str
    seconds: float
    audio: Optional[np.ndarray] = None

    def take_waveform(self) -> np.ndarray:
        """The waveform, kept or read again; no longer kept here."""
        audio, self.audio = self.audio, None
        return audio if audio is not None else load_audio(self.name, allow_empty=True)


def load_inputs(files: Sequence[str], keep: int) -> tuple[list[AudioInput], int]:
    """Every readable file, the first `keep` with their waveforms, and how many failed (each
    reported)."""
    loaded, failed = [], 0
    for name in files:
        try:
            audio = load_audio(name, allow_empty=True)
        except (ValueError, OSError) as err:
            file_error(name, err)
            failed += 1
            continue
        kept = len(loaded) < keep or not Path(name).is_file()
        loaded.append(AudioInput(name, len(audio) / SAMPLE_RATE, audio if kept else None))
    return loaded, failed


def drop_name_clashes(inputs: list[AudioInput]) -> tuple[list[AudioInput], int]:
    """Inputs whose output files would overwrite an earlier input's are reported and dropped."""
    kept, owners = [], {}
    for audio_input in inputs:
        name, base = audio_input.name, source_basename(audio_input.name)
        if base in owners:
            error(f"{name}: its output files would overwrite those of {owners[base]} "
                  f"(same name {base!r}); skipped")
            continue
        owners[base] = name
        kept.append(audio_input)
    return kept, len(inputs) - len(kept)


def transcribe_batch(llm: LLM, batch: list[tuple[str, np.ndarray]], args: argparse.Namespace,
                     on_progress: Callable[[float], None]) -> list[Optional[Transcription]]:
    """One `LLM.transcribe` call over the batch; if it refuses, each file alone (None: failed)."""
    try:
        results = llm.transcribe([(audio, SAMPLE_RATE) for _, audio in batch],
                                 language=None if args.language == "auto" else args.language,
                                 task=args.task, on_progress=on_progress, **args.transcribe_options)
    except ValueError as err:
        if len(batch) > 1:
            return [r for item in batch for r in transcribe_batch(llm, [item], args, on_progress)]
        file_error(batch[0][0], err)
        return [None]
    for (name, _), result in zip(batch, results, strict=True):
        result.source = name
    return results


def transcript_lines(result: Transcription, timestamps: bool) -> list[str]:
    """What stdout shows for one file: a line per segment, or the plain text."""
    if not timestamps:
        text = result.text.strip()
        return [text] if text else []
    return [segment_line(s) for s in result.segments if s.text.strip()]


def detected_language(result: Transcription, args: argparse.Namespace) -> list[str]:
    """openai-whisper's notes on a detected language (the second one also with --verbose False)."""
    if not args.detects_language or not result.language:
        return []
    return language_lines(result.language, args.verbose)


def report(result: Transcription, args: argparse.Namespace, with_header: bool) -> bool:
    """Print one transcript and write its files; False if writing failed."""
    lines = detected_language(result, args)
    lines += transcript_lines(result, args.timestamps) if args.verbose else []
    if with_header and (lines or args.verbose):  # with --verbose False: only above lines shown
        lines.insert(0, f"==> {result.source} <==")
    for line in lines:
        tqdm.write(line, file=sys.stdout)
    if args.output_format is None:
        return True
    try:
        write_result(result, args.output_dir, args.output_format, options=args.writer_options)
    except OSError as err:  # an output file: named, as the input was read
        reason = os_reason(err)
        input_error(result.source, f"cannot write {err.filename}: {reason}" if err.filename else reason)
        return False
    return True


def resolve_outputs(args: argparse.Namespace) -> None:
    """Fill in the output defaults described in the epilog (format None: write no files) and
    make the output directory (UsageError if it cannot be written)."""
    if args.output_format is None and args.output_dir is None:
        return
    args.output_format = args.output_format or "all"
    args.output_dir = args.output_dir or "."
    make_output_dir(args.output_dir, "--output_dir")


def check_transcribe_options(args: argparse.Namespace) -> None:
    """The transcribe options that the parser alone cannot check, before anything loads."""
    for warning in drop_ineffective_flags(args):
        warn(warning)
    try:
        args.transcribe_options, args.writer_options = checked_options(args)
    except ValueError as err:
        raise UsageError(str(err)) from None
    ignored = ignored_vad_flags(args)
    if ignored:
        warn(f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} nothing without "
             f"--vad_filter True")
    if args.task == "translate" and args.word_timestamps:  # as openai-whisper warns
        warn("word-level timestamps on translations may not be reliable")
    resolve_outputs(args)


def check_english_only(args: argparse.Namespace, multilingual: bool) -> None:
    """--task and --language against a Whisper model that is English-only unless `multilingual`:
    translate is a UsageError; another language is a warning, then English."""
    if args.task == "translate" and not multilingual:
        raise UsageError(f"--task translate needs a multilingual model; {args.model} is "
                         f"English-only (it writes all speech as English: leave --task out)")
    warning = english_only_warning(multilingual, args.model, args.language)
    if warning:
        warn(warning)
        args.language = "en"


def check_whisper_model(llm: LLM, args: argparse.Namespace) -> None:
    """--model, --task and --suppress_tokens against the loaded model (UsageError); warns of a
    --language that an English-only model writes as English."""
    config = llm.llm_engine.model_config
    tokens = config.special_tokens
    if not isinstance(tokens, WhisperTokens):
        raise UsageError(f"--model {args.model}: not a Whisper model (transcribe needs one)")
    check_english_only(args, tokens.multilingual)
    unknown = [token for token in args.suppress_tokens if token >= config.vocab_size]
    if unknown:
        raise UsageError(f"--suppress_tokens: {unknown[0]} is not a token id of {args.model} "
                         f"(its ids end at {config.vocab_size - 1})")
    args.detects_language = tokens.multilingual and args.language in (None, "auto")
    from encdec.whisper.transcribe import checked_options as checked_against

    try:  # the options against the model (prompts in its vocabulary) and the engine
        checked_against(llm.llm_engine, None if args.language == "auto" else args.language,
                        args.task, **args.transcribe_options)
    except ValueError as err:
        raise UsageError(flag_wording(str(err))) from None


def run_transcribe(args: argparse.Namespace) -> int:
    if args.model_dir and (Path(args.model_dir) / args.model).is_dir():
        args.model = str(Path(args.model_dir) / args.model)
    try:
        args.language = requested_language(args.language, "--language")
        check_model(args.model, "--model")
    except ValueError as err:
        error(str(err))
        return 2
    check_transcribe_options(args)
    inputs, failed = load_inputs(args.files, keep=args.batch_size)
    if args.output_format is not None:
        inputs, clashes = drop_name_clashes(inputs)
        failed += clashes
    if not inputs:
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        llm = cli_args.load_llm(args)
    except (ValueError, OSError) as err:
        error(f"cannot load model {args.model!r}: {err}")
        return 1
    check_whisper_model(llm, args)
    return 1 if failed + transcribe_all(llm, inputs, args) else 0


def transcribe_all(llm: LLM, inputs: list[AudioInput], args: argparse.Namespace) -> int:
    """Transcribe `--batch-size` files per call, each batch's audio read when it comes, reporting
    as batches finish; returns failures."""
    failed, seconds_before = 0, 0.0
    total = sum(audio_input.seconds for audio_input in inputs)
    bar = tqdm(total=total, desc="Transcribing", unit="s", file=sys.stderr, dynamic_ncols=True,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s "
                          "[{elapsed}<{remaining}]")

    def advance_to(seconds: float) -> None:
        bar.update(max(0.0, min(seconds, total) - bar.n))

    try:
        for first in range(0, len(inputs), args.batch_size):
            chunk, batch = inputs[first:first + args.batch_size], []
            for audio_input in chunk:
                try:
                    batch.append((audio_input.name, audio_input.take_waveform()))
                except (ValueError, OSError) as err:  # changed since it was checked
                    file_error(audio_input.name, err)
                    failed += 1
            # on_progress gives the seconds done within this call
            results = transcribe_batch(llm, batch, args, lambda s: advance_to(seconds_before + s)) if batch else []
            for result in results:
                failed += result is None or not report(result, args, len(args.files) > 1)
            seconds_before += sum(audio_input.seconds for audio_input in chunk)
            advance_to(seconds_before)
    finally:
        bar.close()
    return failed


def add_transcribe(subparsers) -> None:
    p = subparsers.add_parser("transcribe", help="transcribe audio files with Whisper",
                              description="Transcribe audio files with Whisper. Options take "
                                          "openai-whisper's spellings (--beam_size, "
                                          "--output_format, booleans as True/False) and "
                                          "defaults (beam 5, temperature fallback).",
                              epilog=TRANSCRIBE_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("model and input")
    g.add_argument("files", nargs="+", metavar="FILE", help="audio or video files (any format FFmpeg reads)")
    g.add_argument("--model", default="tiny.en",
                   help="tiny.en or base (bundled), or a local Whisper checkpoint directory "
                        "(default: tiny.en)")
    g.add_argument("--model_dir", type=directory, default=None,
                   help="a directory holding checkpoint directories: --model names one of them "
                        "if there is one of that name (before the bundled models)")
    g.add_argument("--language", default=None,
                   help="language code or name such as en or English, or auto to detect it "
                        "(default: auto; English-only models use en)")
    g.add_argument("--task", default="transcribe", choices=["transcribe", "translate"],
                   help="translate turns speech into English text (multilingual models only)")
    g.add_argument("--batch_size", type=number(int, 1), default=8,
                   help="files per batch; all windows of a batch decode together (default: 8)")
    g.add_argument("--threads", type=number(int, 0, MAX_THREADS), default=0,
                   help=f"CPU threads for torch, at most {MAX_THREADS}; 0: torch's default "
                        f"(default: 0)")
    add_model_options(g)
    g.add_argument("--fp16", **BOOL, default=None,
                   help="openai-whisper's switch: True runs float16 on CUDA unless --dtype or "
                        "--compute_type is given; the CPU runs float32 regardless (default: what "
                        "--dtype says)")
    add_transcribe_arguments(p)
    p.set_defaults(handler=run_transcribe)

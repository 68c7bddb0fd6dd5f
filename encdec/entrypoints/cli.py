"""The `encdec` command line: `transcribe` audio with Whisper, `summarize` text with BART-family
checkpoints (`encdec.entrypoints.summarize_cli`), `translate` (`encdec.entrypoints.translate_cli`), `serve` models over HTTP
(`encdec.entrypoints.openai`), `batch` jobs on Ray (`encdec.entrypoints.ray`).

`bench NAME` runs a benchmark script of the source checkout; `warmup` compiles the CPU kernels
once after an install.
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
from tqdm import tqdm

from encdec import __version__
from encdec.audio import SAMPLE_RATE, load_audio
from encdec.config import resolve_dtype
from encdec.entrypoints.ray.batch_cli import add_batch
from encdec.entrypoints.ray.serve import add_ray_options, ray_options_without_ray
from encdec.entrypoints.cli_messages import (INSTALL_RAY, PROG, UsageError, error, file_error, input_error,
                                             option_wording, os_reason, warn)
from encdec.entrypoints.summarize_cli import add_summarize
from encdec.entrypoints.translate_cli import add_translate
from encdec.entrypoints.whisper_console import language_lines
from encdec.entrypoints.transcribe_args import (BOOL, add_transcribe_arguments, checked_options,
                                                drop_ineffective_flags, flag_wording, ignored_vad_flags,
                                                non_negative_float, number, positive_float, positive_int)
from encdec.kernels import cpu_attention
from encdec.kernels.cpu_decode import compile_decode_kernels
from encdec.llm import LLM
from encdec.models.quantization import COMPUTE_TYPES, QUANTIZATION_METHODS, resolve_compute_type
from encdec.weights.loader import check_model
from encdec.whisper.languages import english_only_warning, requested_language
from encdec.whisper.timing import dtw
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

# ----------------------------------------------------------------------------- transcribe


def load_llm(args: argparse.Namespace) -> LLM:
    """The model named by --model / --dtype / --device (tests swap this for a cached one)."""
    return LLM(model=args.model, dtype=args.dtype, device=args.device,
               quantization=args.quantization)


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


def make_output_dir(name: str, option: str) -> None:
    """Make the folder `name` of `option` if it is not there (UsageError if it cannot be made or
    written to)."""
    folder = Path(name)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{option} {name}: not a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{option} {name}: {os_reason(err)}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {name}: permission denied")


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
        llm = load_llm(args)
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


# ----------------------------------------------------------------------------- serve


def memory_gib(device: torch.device) -> float:
    """How much memory `device` has (this machine's for the CPU), in GiB."""
    from encdec.worker.cache_engine import memory_bytes

    return memory_bytes(device) / 2**30


def check_serve(args: argparse.Namespace) -> None:
    """The serve options that span several flags, before any model loads (UsageError): a name
    and cache budgets for each --model, budgets within the memory of the machine serving."""
    from encdec.entrypoints.openai.serving_models import (CACHE_OPTIONS, ModelLoadError,
                                                          per_model_options, served_names)

    try:
        served_names(args.models, args.served_model_names)
        per_model_options({name: getattr(args, name) for name in CACHE_OPTIONS}, len(args.models))
    except ModelLoadError as err:
        raise UsageError(str(err)) from None
    if unused := ray_options_without_ray(args):
        raise UsageError(f"{', '.join(unused)}: Ray Serve options; add --ray to serve through Ray")
    if args.ray:
        return
    for flag, values, device in (("--kv-cache-space", args.kv_cache_space, local_device(args.device)),
                                 ("--swap-space", args.swap_space, torch.device("cpu"))):
        limit = memory_gib(device)
        for value in values or []:
            if value > limit:
                where = "this machine" if device.type == "cpu" else device
                raise UsageError(f"{flag} {value:g}: more than {where}'s {limit:.1f} GiB of memory")


def run_serve(args: argparse.Namespace) -> int:
    from encdec.entrypoints.openai.api_server import ListenError, run_server
    from encdec.entrypoints.openai.serving_models import ENGINE_OPTIONS, ModelLoadError

    check_serve(args)
    try:
        for model in args.models:  # as each engine checks it, but before Ray starts (no weights read)
            check_model(model, "--model")
    except ValueError as err:
        error(str(err))
        return 2
    if args.ray:
        from encdec.entrypoints.ray.serve import run_ray_server
        try:
            return run_ray_server(args)
        except ImportError as err:
            error(f"serve --ray needs Ray ({err}): {INSTALL_RAY}")
            return 1
        except ListenError as err:
            error(str(err))
            return 1
    try:
        return run_server(args)
    except (ListenError, ModelLoadError) as err:
        error(option_wording(err, {name: "--" + name.replace("_", "-") for name in ENGINE_OPTIONS}))
        return 1


# ----------------------------------------------------------------------------- bench


BENCHMARKS = ("bart", "whisper", "overhead", "serve")


def run_bench(args: argparse.Namespace) -> int:
    """Run benchmarks/bench_NAME.py of the source checkout (they compare against the anchors
    installed by the `bench` extra); further arguments go to the script, which runs in the
    current directory (its relative paths are the user's) with the checkout on PYTHONPATH and,
    from Python 3.11, without that directory on sys.path (PYTHONSAFEPATH: a `tests` or
    `benchmarks` folder of the user's hides none of the checkout's)."""
    import subprocess

    import encdec

    root = Path(encdec.__file__).resolve().parents[1]
    if not (root / "benchmarks" / f"bench_{args.name}.py").exists():
        error("bench: the benchmarks live in the source checkout; install encdec from a clone "
              "with pip install -e '.[bench]'")
        return 2
    script = [sys.executable, "-m", f"benchmarks.bench_{args.name}", *args.script_args]
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return subprocess.call(script, env={**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"})


# ----------------------------------------------------------------------------- warmup


def run_warmup(args: argparse.Namespace) -> int:
    """Compile the CPU kernels (decode and prefill attention, word-timestamp alignment) once,
    where every later process loads them from."""
    start, dtype = time.perf_counter(), resolve_dtype(args.dtype)
    for made in compile_decode_kernels(dtype):
        print(f"{PROG}: decode attention: {made}")
    prefill = (f"compiled at {cpu_attention.library_path()}" if cpu_attention.available()
               else "torch's SDPA (the C kernel needs AVX-512 with AVX512_BF16 and a C compiler)")
    print(f"{PROG}: prefill attention: {prefill}")
    dtw(np.zeros((1, 1)))
    print(f"{PROG}: CPU kernels ({str(dtype).removeprefix('torch.')}) ready in {time.perf_counter() - start:.1f} s")
    return 0


# ----------------------------------------------------------------------------- parser


# torch crashes far above this (more threads than cores are allowed, if seldom of use)
MAX_THREADS = max(1024, os.cpu_count() or 1)


def device_name(value: str) -> str:
    """An argparse type: cpu, cuda, cuda:N or auto."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?|auto", value):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {value!r}")
    return value


def directory(value: str) -> str:
    """An argparse type: an existing directory."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: no such directory")
    return str(path)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="auto",
                        choices=["auto", "float32", "float16", "bfloat16"],
                        help="weight and activation dtype (default: auto, float32)")
    parser.add_argument("--quantization", default=None, choices=list(QUANTIZATION_METHODS),
                        help="int8: int8 weights for the layers' linears, float32 activations "
                             "(faster-whisper's compute_type int8; CPU, dtype float32)")
    parser.add_argument("--compute_type", default=None,
                        choices=[*COMPUTE_TYPES, "default", "auto"],
                        help="faster-whisper's name for --dtype and --quantization: float32, "
                             "bfloat16 or int8 (int8 weights, float32 activations); default: "
                             "what those two say")
    parser.add_argument("--device", type=device_name, default=None,
                        help="cpu or cuda[:N] (default: cuda if available, else cpu)")


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


def positive_int_or_auto(value: str) -> Union[int, str]:
    """An argparse type: "auto" or an integer >= 1."""
    if value == "auto":
        return value
    try:
        return positive_int(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 1, got {value!r}") from None


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """`LLM`'s engine options, for `encdec serve` (each model gets its own engine and cache)."""
    add_model_options(p)
    p.add_argument("--block-size", type=positive_int, default=16, help="KV cache block size (default: 16)")
    per_model = "; once for every model, or once per --model in their order"
    p.add_argument("--num-gpu-blocks", type=positive_int, action="append",
                   help=f"KV cache blocks{per_model} (default: from --kv-cache-space)")
    p.add_argument("--kv-cache-space", type=positive_float, action="append",
                   help=f"KV cache memory in GiB{per_model} (default: 2)")
    p.add_argument("--swap-space", type=non_negative_float, action="append",
                   help=f"swap space in GiB for preempted requests{per_model} (default: 1)")
    p.add_argument("--max-num-seqs", type=positive_int, default=256,
                   help="sequences decoded at once per model (default: 256)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=16384,
                   help="tokens in one forward pass (default: 16384)")
    p.add_argument("--max-running-requests", type=positive_int_or_auto, default="auto",
                   help="requests decoded at once per model; the rest wait in arrival order. "
                        "auto: 16 for Whisper on the CPU, where more adds little throughput "
                        "and much latency; no limit otherwise (default: auto)")
    p.add_argument("--preemption-mode", choices=["swap", "recompute"], default=None,
                   help="how to make room when the cache is full (default: the engine's choice)")
    p.add_argument("--seed", type=number(int, 0, 2**63 - 1), default=0,
                   help="seed of the engines' shared generator (default: 0)")
    p.add_argument("--attention-backend", choices=["torch", "xformers"], default=None,
                   help="attention implementation (default: ENCDEC_ATTENTION_BACKEND, else automatic)")
    p.add_argument("--tune-malloc", action=argparse.BooleanOptionalAction, default=True,
                   help="on the CPU, keep freed activation memory for the next steps while "
                        "requests run (about 90%% fewer page faults, a few %% less CPU, 250-300 MB "
                        "more while busy), given back after a second idle (default: on)")


class StoreOnce(argparse.Action):
    """An option's value, refused when given again: `encdec serve`'s options hold for every
    --model, so `--model a --dtype bfloat16 --model b --dtype float32` must not quietly serve
    both in float32."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = vars(namespace).setdefault("given_once", set())
        if self.dest in given:
            parser.error(f"{option_string} is given twice: each option takes one value for the whole "
                         f"server (one per --model: only --num-gpu-blocks, --kv-cache-space, --swap-space)")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def add_serve(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve models over HTTP (OpenAI-compatible API and /v1/summarize)",
        description="Serve models over HTTP: /v1/completions, /v1/summarize, "
                    "/v1/audio/transcriptions, /v1/audio/translations, /v1/models, /health, "
                    "/version, /metrics. Every request to a model joins its engine's batch.")
    p.register("action", None, StoreOnce)  # a value given twice is refused, not the last one taken
    p.add_argument("--model", dest="models", action="append", required=True, metavar="MODEL",
                   help="a Whisper alias (tiny.en, base) or a local checkpoint directory; repeat "
                        "for several models, each with its own engine")
    p.add_argument("--served-model-name", dest="served_model_names", action="append", default=[],
                   metavar="NAME", help="the name clients use for the --model at the same "
                                        "position (default: the --model value)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=number(int, 0, 65535), default=8000,
                   help="port to listen on; 0: any free one (default: 8000)")
    p.add_argument("--api-key", default=os.environ.get("ENCDEC_API_KEY"),
                   help="require Authorization: Bearer KEY on every path but /health "
                        "(default: $ENCDEC_API_KEY; none: no key)")
    p.add_argument("--allowed-origins", nargs="*", default=["*"], metavar="ORIGIN",
                   help="origins whose web pages may call the server (CORS), e.g. "
                        "https://app.example.com; none after the flag: no other origin "
                        "(default: *, any origin, as vLLM's server)")
    p.add_argument("--max-upload-mb", type=positive_float, default=25,
                   help="largest audio upload (and JSON body) in MiB; larger ones get 413 "
                        "(default: 25)")
    p.add_argument("--max-audio-seconds", type=positive_float, default=3600,
                   help="longest audio in seconds; longer ones get 400 (default: 3600)")
    p.add_argument("--request-body-timeout", type=positive_float, default=60, metavar="SECONDS",
                   help="seconds a request body may go without sending any part of it before "
                        "the request gets 408 (default: 60)")
    p.add_argument("--max-waiting-requests", type=positive_int, default=None,
                   help="requests queued per model before new ones get 429 (default: no limit)")
    p.add_argument("--shutdown-timeout", type=number(float, 1), default=30,
                   help="on SIGTERM, seconds to let requests in flight finish before aborting "
                        "them, at least 1 (the process then ends by the signal, as uvicorn ends: "
                        "exit status 143) (default: 30)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level (default: info)")
    add_engine_options(p)
    add_ray_options(p)
    p.set_defaults(handler=run_serve)


def add_bench(subparsers) -> None:
    p = subparsers.add_parser("bench", help="same-run benchmarks against Hugging Face transformers "
                                            "and CTranslate2/faster-whisper",
                              description="Run a benchmark script; other options go to it "
                                          "(e.g. encdec bench bart --num-docs 16 --rounds 1).")
    p.add_argument("name", choices=BENCHMARKS)
    # argparse counts a REMAINDER positional as required; an empty one is fine
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...",
                   help="options for the script").required = False
    p.set_defaults(handler=run_bench)


def add_warmup(subparsers) -> None:
    p = subparsers.add_parser(
        "warmup", help="compile the CPU kernels once after an install (20-60 s)",
        description="Compile the CPU decode-attention, prefill-attention (C, for processors with "
                    "AVX-512 and AVX512_BF16) and word-alignment kernels and cache them "
                    "next to the package (or in $NUMBA_CACHE_DIR), so that the first "
                    "transcription does not wait for the compiler, and so that one-sequence "
                    "decoding runs an ahead-of-time build that does not load Numba at all (needs "
                    "a C compiler; without one it stays Numba's). Run it once after installing or "
                    "upgrading encdec (or Numba, or NumPy); without it the first run compiles what "
                    "it needs.")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the KV cache dtype to compile for (default: auto, float32 on the CPU)")
    p.add_argument("--compute_type", default=None,
                   choices=[name for name, (dtype, _) in COMPUTE_TYPES.items() if dtype != "float16"],
                   help="faster-whisper's name for it (int8 runs a float32 cache)")
    p.set_defaults(handler=run_warmup, quantization=None, device="cpu")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that takes `--a_b` for `--a-b` and `--a-b` for `--a_b` (each command has
    one spelling of its own, openai-whisper's underscores for `transcribe`, vLLM's dashes
    elsewhere; both work everywhere, as vLLM's parser takes both), and leaves the parser of the
    (innermost) command in `args.parser`, for the usage errors found after parsing."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        namespace, extra = super().parse_known_args(self.respelled(args), namespace)
        if "parser" not in namespace:  # a subcommand's parser has set it first
            namespace.parser = self
        return namespace, extra

    def respelled(self, args: list[str]) -> list[str]:
        """`args` with each long option that this parser knows only in its other spelling
        (dashes for underscores, or underscores for dashes) written that way."""
        known = self._option_string_actions
        out = []
        for i, arg in enumerate(args):
            if arg == "--":
                return out + args[i:]
            name, equals, value = arg.partition("=")
            if arg.startswith("--") and name not in known:
                name = next((other for other in (name.replace("_", "-"), "--" + name[2:].replace("-", "_"))
                             if other in known), name)
            out.append(name + equals + value)
        return out


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG, description="Inference runtime for encoder/decoder transformers "
                               "(BART, T5, Marian, Whisper, ...) with continuous batching.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=16))
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", title="commands", required=True)
    add_transcribe(subparsers)
    add_summarize(subparsers)
    add_translate(subparsers)
    add_serve(subparsers)
    add_bench(subparsers)
    add_batch(subparsers)
    add_warmup(subparsers)
    return parser


PACKAGE_DIR = Path(__file__).resolve().parents[1]
MODEL_OPTIONS = {"compute_type": "--compute_type", "dtype": "--dtype", "quantization": "--quantization"}


def runs_here(args: argparse.Namespace) -> bool:
    """Whether the command's engines run on this machine: in this process, or in the actors of
    the local Ray instance that `batch` and `serve --ray` start without --ray-address."""
    return getattr(args, "ray_address", None) is None


def local_device(name: Optional[str]) -> torch.device:
    """The device that --device names, on this machine (UsageError if it has no such device)."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device, count = torch.device(name), torch.cuda.device_count()
    if device.type == "cuda" and (device.index or 0) >= count:
        raise UsageError(f"--device {name}: " + (f"this machine has {count} CUDA device(s)" if count
                                                  else "CUDA is not available on this machine"))
    return device


def resolve_model_options(args: argparse.Namespace) -> None:
    """--compute_type as --dtype and --quantization, the three checked against each other, and
    a local --device against the machine; transcribe's --fp16 True as float16 on CUDA when no
    dtype is given (UsageError)."""
    try:
        dtype, quantization = resolve_compute_type(args.compute_type, args.dtype, args.quantization)
    except ValueError as err:
        raise UsageError(option_wording(err, MODEL_OPTIONS)) from None
    if quantization and dtype not in ("auto", "float32"):
        raise UsageError(f"--quantization {quantization} runs with float32 activations, not "
                         f"--dtype {dtype}")
    if runs_here(args):
        device = local_device(args.device)
        if getattr(args, "fp16", None) and dtype == "auto" and device.type == "cuda":
            dtype = "float16"
    args.dtype, args.quantization = dtype, quantization


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (usage errors: 2, with the command's usage).
    A UserWarning of encdec's own (the Python API's notes, such as float16 on the CPU) shows as
    one `encdec: warning: ...` line in the options' spelling; other libraries' keep their form."""
    with warnings.catch_warnings():
        python_format = warnings.showwarning

        def show(message, category, filename, *where) -> None:
            if issubclass(category, UserWarning) and Path(filename).is_relative_to(PACKAGE_DIR):
                warn(option_wording(message, MODEL_OPTIONS))
            else:
                python_format(message, category, filename, *where)

        warnings.showwarning = show
        return _main(argv)


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        try:
            if extra:
                raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
            if "compute_type" in args:  # one spelling from here on: dtype and quantization
                resolve_model_options(args)
            # The imports (torch's above all) leave hundreds of thousands of objects that the
            # garbage collector's full passes would walk again and again while a model loads
            # (0.2-0.3 s of a short transcription's start-up); none of them is garbage, so they
            # move out of its sight.
            gc.freeze()
            return args.handler(args)
        except UsageError as err:
            args.parser.error(str(err))
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


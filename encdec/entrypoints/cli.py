"""The `encdec` command line: its parser and `main`, and the two small commands. Each other
command has a module of its own in `encdec.entrypoints`: `transcribe` audio with Whisper
(`transcribe_cli`), `summarize` text (`summarize_cli`), `translate` (`translate_cli`), `serve`
models over HTTP (`serve_cli`), `batch` jobs on Ray (`ray.batch_cli`); what several share is in
`cli_args` and `cli_messages`.

`bench NAME` runs a benchmark script of the source checkout; `warmup` compiles the CPU kernels
once after an install.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from encdec import __version__
from encdec.config import resolve_dtype
from encdec.entrypoints.cli_args import MODEL_OPTIONS, resolve_model_options
from encdec.entrypoints.cli_messages import PROG, UsageError, error, option_wording, warn
from encdec.entrypoints.ray.batch_cli import add_batch
from encdec.entrypoints.serve_cli import add_serve
from encdec.entrypoints.summarize_cli import add_summarize
from encdec.entrypoints.transcribe_cli import add_transcribe
from encdec.entrypoints.translate_cli import add_translate
from encdec.kernels import cpu_attention
from encdec.kernels.cpu_decode import compile_decode_kernels
from encdec.models.quantization import COMPUTE_TYPES
from encdec.whisper.timing import dtw


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

"""What several commands share: the model and device options, loading the model, the output
folder. (`encdec.entrypoints.transcribe_args` holds the argparse types.)"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Optional

import torch

from encdec.entrypoints.cli_messages import UsageError, option_wording, os_reason
from encdec.llm import LLM
from encdec.models.quantization import COMPUTE_TYPES, QUANTIZATION_METHODS, resolve_compute_type


def load_llm(args: argparse.Namespace) -> LLM:
    """The model named by --model / --dtype / --device (tests swap this for a cached one)."""
    return LLM(model=args.model, dtype=args.dtype, device=args.device,
               quantization=args.quantization)


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
                        choices=["auto", "float32", "float16", "bfloat16", "float", "half"],
                        help="weight and activation dtype; float and half are vLLM's names for "
                             "float32 and float16 (default: auto, float32)")
    parser.add_argument("--quantization", default=None, choices=list(QUANTIZATION_METHODS),
                        help="int8: int8 weights for the layers' linears, float32 activations "
                             "(faster-whisper's compute_type int8; CPU, dtype float32)")
    parser.add_argument("--compute_type", default=None, metavar="TYPE",
                        choices=[*COMPUTE_TYPES, "default", "auto"],
                        help="faster-whisper's name for --dtype and --quantization: float32, "
                             "bfloat16, float16, int8 or int8_float32 (both: int8 weights, float32 "
                             "activations); default or auto: what those two say (the default)")
    parser.add_argument("--device", type=device_name, default=None,
                        help="cpu or cuda[:N] (default: cuda if available, else cpu)")


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

"""`encdec serve`: its options (the engine options `LLM` takes, once per server or per model),
their checks before any model loads, and the start of the HTTP server (`encdec.entrypoints.openai`)
or of Ray Serve (`encdec.entrypoints.ray.serve`)."""
from __future__ import annotations

import argparse
import os
import ssl
from typing import Optional, Union

import torch

from encdec.entrypoints.cli_args import add_model_options, local_device
from encdec.entrypoints.cli_messages import INSTALL_RAY, UsageError, error, option_wording, os_reason
from encdec.entrypoints.ray.serve import add_ray_options, ray_options_without_ray
from encdec.entrypoints.transcribe_args import non_negative_float, number, positive_float, positive_int
from encdec.weights.loader import check_model


def memory_gib(device: torch.device) -> float:
    """How much memory `device` has (this machine's for the CPU), in GiB."""
    from encdec.worker.cache_engine import memory_bytes

    return memory_bytes(device) / 2**30


def check_serve(args: argparse.Namespace) -> None:
    """The serve options that span several flags, before any model loads (UsageError): a model,
    a name and cache budgets for each --model, budgets within the memory of the machine serving."""
    from encdec.entrypoints.openai.metrics import log_stats_interval
    from encdec.entrypoints.openai.serving_models import (PER_MODEL_OPTIONS, ModelLoadError,
                                                          per_model_options, served_names)

    if not args.models:
        raise UsageError("no model to serve: give one (encdec serve MODEL) or --model, once per model")
    try:
        served_names(args.models, args.served_model_names)
        per_model_options({name: getattr(args, name) for name in PER_MODEL_OPTIONS}, len(args.models))
    except ModelLoadError as err:
        raise UsageError(str(err)) from None
    check_tls(args.ssl_keyfile, args.ssl_certfile)
    try:
        log_stats_interval(args.disable_log_stats)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if unused := ray_options_without_ray(args):
        raise UsageError(f"{', '.join(unused)}: Ray Serve options; add --ray to serve through Ray")
    if args.ray:
        if args.request_header_timeout is not None:
            raise UsageError("--request-header-timeout: not with --ray, whose proxy reads the requests")
        return
    for flag, values, device in (("--kv-cache-space", args.kv_cache_space, local_device(args.device)),
                                 ("--swap-space", args.swap_space, torch.device("cpu"))):
        limit = memory_gib(device)
        for value in values or []:
            if value > limit:
                where = "this machine" if device.type == "cpu" else device
                raise UsageError(f"{flag} {value:g}: more than {where}'s {limit:.1f} GiB of memory")


class EncryptedKey(Exception):
    """An HTTPS key that asks for a password."""


def no_password() -> str:
    """OpenSSL's password callback, called only for an encrypted key (without one it prompts)."""
    raise EncryptedKey()


def check_tls(keyfile: Optional[str], certfile: Optional[str]) -> None:
    """HTTPS's key and certificate: both or neither, and a pair that loads (UsageError)."""
    if (keyfile is None) != (certfile is None):
        raise UsageError("--ssl-keyfile and --ssl-certfile go together: give both to serve HTTPS, "
                         "or neither")
    if keyfile is None:
        return
    for flag, path in (("--ssl-keyfile", keyfile), ("--ssl-certfile", certfile)):
        try:
            with open(path, "rb"):
                pass
        except OSError as err:
            raise UsageError(f"{flag} {path}: {os_reason(err)}") from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile, no_password)
    except EncryptedKey:
        raise UsageError(f"--ssl-keyfile {keyfile}: the key is encrypted; give it unencrypted (its "
                         f"file readable by the server's user alone)") from None
    except ssl.SSLError as err:
        if err.reason == "KEY_VALUES_MISMATCH":
            raise UsageError(f"--ssl-keyfile {keyfile}: not the key of the certificate in "
                             f"--ssl-certfile {certfile}") from None
        raise UsageError(f"--ssl-certfile {certfile}, --ssl-keyfile {keyfile}: not a PEM certificate "
                         f"and its private key ({err.strerror or err})") from None


def run_serve(args: argparse.Namespace) -> int:
    from encdec.entrypoints.openai.api_server import ListenError, run_server
    from encdec.entrypoints.openai.serving_models import ENGINE_OPTIONS, ModelLoadError

    args.models = [args.model_tag, *args.models] if args.model_tag is not None else args.models
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


def positive_int_or_auto(value: str) -> Union[int, str]:
    """An argparse type: "auto" or an integer >= 1."""
    if value == "auto":
        return value
    try:
        return positive_int(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 1, got {value!r}") from None


def api_key(value: str) -> str:
    """An argparse type: a key with something in it (an empty one would let anyone in), without
    the spaces or line end around it (a key read from a file), as a client's is read."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the key is empty (--api-key or $ENCDEC_API_KEY): give a "
                                         "key, or neither for a server without one")
    if not (value.strip().isascii() and value.strip().isprintable()):
        raise argparse.ArgumentTypeError("the key (--api-key or $ENCDEC_API_KEY) must be printable "
                                         "ASCII: clients send it in an HTTP header")
    return value.strip()


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
    p.add_argument("--max-model-len", type=positive_int, action="append",
                   help="decoder positions a request may take, its decoder prompt and new tokens, at "
                        f"most the model's (vLLM's option; Whisper: only its own){per_model} "
                        "(default: the model's)")
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
                         f"server (one per --model: only --num-gpu-blocks, --kv-cache-space, --swap-space, "
                         f"--max-model-len)")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def add_serve(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve models over HTTP (OpenAI-compatible API and /v1/summarize)",
        description="Serve models over HTTP: /v1/completions, /v1/summarize, "
                    "/v1/audio/transcriptions, /v1/audio/translations, /v1/models, /health, "
                    "/version, /metrics. Every request to a model joins its engine's batch.")
    p.register("action", None, StoreOnce)  # a value given twice is refused, not the last one taken
    p.add_argument("model_tag", nargs="?", metavar="MODEL",
                   help="a model to serve first, as `vllm serve MODEL` names it (or --model)")
    p.add_argument("--model", dest="models", action="append", default=[], metavar="MODEL",
                   help="a Whisper alias (tiny.en, base) or a local checkpoint directory; repeat "
                        "for several models, each with its own engine")
    p.add_argument("--served-model-name", dest="served_model_names", action="append", nargs="+",
                   default=[], metavar="NAME",
                   help="the names clients use for the --model at the same position: the first "
                        "is the metrics' label, the others aliases, as in vLLM (default: the "
                        "--model value)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=number(int, 0, 65535), default=8000,
                   help="port to listen on; 0: any free one (default: 8000)")
    p.add_argument("--ssl-keyfile", metavar="PATH",
                   help="serve HTTPS with this private key (PEM), with --ssl-certfile (default: HTTP)")
    p.add_argument("--ssl-certfile", metavar="PATH",
                   help="the certificate (PEM, its chain after it) of --ssl-keyfile's key")
    p.add_argument("--api-key", type=api_key, default=os.environ.get("ENCDEC_API_KEY"),
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
    p.add_argument("--max-audio-seconds-in-flight", type=positive_float, default=14400,
                   metavar="SECONDS",
                   help="seconds of audio the uploads being transcribed may hold together (an "
                        "hour takes about 340 MB); an upload that would pass it while others are "
                        "in flight gets 429 with Retry-After (default: %(default)g)")
    p.add_argument("--request-body-timeout", type=positive_float, default=60, metavar="SECONDS",
                   help="seconds a request body may go without sending any part of it before "
                        "the request gets 408, as does a body that has sent fewer than 500 bytes "
                        "for each second after the first SECONDS (default: 60)")
    p.add_argument("--request-header-timeout", type=positive_float, default=None, metavar="SECONDS",
                   help="seconds a connection may take to send a whole request head, from its "
                        "opening or its last response's end, before it is closed; not with --ray, "
                        "whose proxy reads the requests (default: 60)")
    p.add_argument("--max-waiting-requests", type=positive_int, default=None,
                   help="requests queued per model before new ones get 429 (default: no limit)")
    p.add_argument("--shutdown-timeout", type=number(float, 1), default=30,
                   help="on SIGTERM, seconds to let requests in flight finish before aborting "
                        "them, at least 1 (the process then ends by the signal, as uvicorn ends: "
                        "exit status 143) (default: 30)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level (default: info)")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="do not log each model's stats line (throughput, requests, KV cache "
                        "usage) every $ENCDEC_LOG_STATS_INTERVAL seconds it has work (default: 10)")
    p.add_argument("--disable-log-requests", action="store_true",
                   help="log only the requests that fail (4xx, 5xx), not each one answered, as "
                        "vLLM's --disable-log-requests (the lines go to --log-level debug)")
    add_engine_options(p)
    add_ray_options(p)
    p.set_defaults(handler=run_serve)

"""The FastAPI app (`build_app`) and `encdec serve` (`run_server`).

Models load before the server listens: one that fails stops start-up with its name in the
message. On SIGTERM (or Ctrl-C) the server answers new requests with 503, lets those in
flight finish for up to `--shutdown-timeout` seconds, then cancels the rest (their engine
requests are aborted, every block freed) and stops the engines. A second signal stops at once.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from types import FrameType
from typing import Optional, Sequence

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from encdec import __version__
from encdec.entrypoints.cli_messages import os_reason
from encdec.entrypoints.openai.errors import OpenAIError, add_error_handlers, bad_request
from encdec.entrypoints.openai.http_protocol import HEADER_TIMEOUT_SECONDS, head_timeout_protocol
from encdec.entrypoints.openai.metrics import STATS_INTERVAL_SECONDS, LoggingStatLogger, ServerMetrics, log_stats_interval
from encdec.entrypoints.openai.middleware import BODY_TIMEOUT_SECONDS, ServerState, ServingMiddleware
from encdec.entrypoints.openai.protocol import (CompletionRequest, CompletionResponse, ModelCard,
                                                ModelList, SummarizeRequest, SummarizeResponse)
from encdec.entrypoints.openai.serving_completions import OpenAIServingCompletion
from encdec.entrypoints.openai.serving_models import ServedModels, engine_options, load_models
from encdec.entrypoints.openai.serving_summarize import OpenAIServingSummarize
from encdec.entrypoints.openai.serving_transcription import OpenAIServingTranscription
from encdec.worker.cpu_memory import use_one_arena

logger = logging.getLogger("encdec.server")
CANCEL_AFTER_DRAIN_SECONDS = 1.0  # uvicorn's wait before it cancels what is left
TRANSCRIPTIONS, TRANSLATIONS = "/v1/audio/transcriptions", "/v1/audio/translations"  # the upload routes


async def require_json(request: Request) -> None:
    """A JSON body: `application/json` or another `application/...+json` type, as FastAPI reads
    them (a body without a Content-Type is not read as JSON, as FastAPI's default)."""
    content_type = request.headers.get("content-type", "")
    kind = content_type.split(";")[0].strip().lower()
    if not (kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))):
        raise bad_request(f"Content-Type must be application/json, got {content_type or 'none'!r}")


def build_app(models: ServedModels, state: ServerState, api_key: Optional[str] = None,
              max_upload_mb: float = 25, max_audio_seconds: float = 3600,
              max_audio_seconds_in_flight: float = 14400,
              metrics: Optional[ServerMetrics] = None, allowed_origins: Sequence[str] = ("*",),
              request_body_timeout: float = BODY_TIMEOUT_SECONDS,
              stats_interval: Optional[float] = STATS_INTERVAL_SECONDS, echo_request_id: bool = True,
              log_requests: bool = True) -> FastAPI:
    """The server's app over `models`; `metrics` are its own unless given (Ray Serve's replicas
    render every replica's). Browsers at `allowed_origins` may call it (CORS, as vLLM's server:
    preflights are answered before the API key is asked for); none: same-origin only. An
    `api_key` of only spaces is refused: it would let anyone in. Every `stats_interval` seconds
    with work, each model's stats line is logged (None: never); each answered request's line,
    unless `log_requests` is false (then only those that failed). The request id goes back in the
    `x-request-id` header unless `echo_request_id` is false (behind Ray Serve, whose proxy sends it)."""
    if api_key is not None and not api_key.strip():
        raise ValueError("api_key is empty: give a key, or None for a server without one")
    metrics = metrics or ServerMetrics(models, state)
    completions = OpenAIServingCompletion(models, metrics)
    summarize = OpenAIServingSummarize(models, metrics)
    max_body_bytes = int(max_upload_mb * 1024 * 1024)
    audio = OpenAIServingTranscription(models, metrics, max_body_bytes, max_audio_seconds,
                                       max_audio_seconds_in_flight)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        stats = None if stats_interval is None else asyncio.ensure_future(
            LoggingStatLogger(metrics, models, stats_interval).run())
        yield
        if stats is not None:
            stats.cancel()
        await asyncio.gather(*(m.engine.shutdown() for m in models))

    app = FastAPI(title="encdec", version=__version__, lifespan=lifespan)
    add_error_handlers(app)
    app.add_middleware(ServingMiddleware, state=state, metrics=metrics, api_key=api_key,
                       max_body_bytes=max_body_bytes, routes=app.routes,  # filled in below
                       body_timeout=request_body_timeout, form_paths=(TRANSCRIPTIONS, TRANSLATIONS),
                       echo_request_id=echo_request_id, log_requests=log_requests)
    if allowed_origins:  # added last: the outermost layer
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"],
                           allow_headers=["*"])
    json_body = [Depends(require_json)]

    def get(path: str, **options):
        """A GET route that answers HEAD too (its headers, no body), as Starlette's own do; the
        HEAD route stays out of the OpenAPI schema (one operation id per route)."""
        def register(endpoint):
            route = app.get(path, **options)(endpoint)
            app.head(path, include_in_schema=False, **options)(endpoint)
            return route
        return register

    @get("/health")
    async def health() -> Response:
        dead = [m.name for m in models if m.engine.dead_error is not None]
        if dead:
            return OpenAIError(503, f"engine stopped after an error: {dead}", code="engine_dead").response()
        return JSONResponse({"status": "ok"})

    @get("/version")
    async def show_version() -> dict:
        return {"version": __version__}

    @get("/metrics")
    async def show_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @get("/v1/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return models.list()

    @get("/v1/models/{model_id:path}", response_model=ModelCard)
    async def show_model(model_id: str) -> ModelCard:
        return models.card(model_id)

    @app.post("/v1/completions", dependencies=json_body, response_model=CompletionResponse)
    async def create_completion(body: CompletionRequest, request: Request) -> Response:
        return await completions.create(body, request)

    @app.post("/v1/summarize", dependencies=json_body, response_model=SummarizeResponse)
    async def create_summary(body: SummarizeRequest, request: Request) -> Response:
        return await summarize.create(body, request)

    @app.post(TRANSCRIPTIONS)
    async def create_transcription(request: Request) -> Response:
        return await audio.create(request, "transcribe")

    @app.post(TRANSLATIONS)
    async def create_translation(request: Request) -> Response:
        return await audio.create(request, "translate")

    return app


class DrainingServer(uvicorn.Server):
    """uvicorn, with a graceful shutdown that keeps answering (503) while requests drain."""

    def __init__(self, config: uvicorn.Config, state: ServerState, shutdown_timeout: float):
        super().__init__(config)
        self.state, self.shutdown_timeout = state, shutdown_timeout
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.drain: Optional[asyncio.Task] = None

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: Optional[FrameType]) -> None:
        if self.state.draining:  # a second signal: stop at once, not after an engine step ends
            logger.warning("%s again: stopping at once", signal.Signals(sig).name)  # written at once
            os._exit(128 + sig)
        if self.loop is None:
            super().handle_exit(sig, frame)
            return
        self.state.draining = True
        self.loop.call_soon_threadsafe(self._start_drain, sig)

    def _start_drain(self, sig: int) -> None:
        self.drain = asyncio.ensure_future(self._drain(sig))

    async def _drain(self, sig: int) -> None:
        logger.info("%s: refusing new requests; waiting up to %g s for %d in flight",
                    signal.Signals(sig).name, self.shutdown_timeout, self.state.inflight)
        # uvicorn's own wait before it cancels what is left is the timeout's last second
        deadline = time.monotonic() + max(0.0, self.shutdown_timeout - CANCEL_AFTER_DRAIN_SECONDS)
        while self.state.inflight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.state.inflight:
            logger.warning("%d requests still in flight: aborting those not done in %g s",
                           self.state.inflight, CANCEL_AFTER_DRAIN_SECONDS)
        super().handle_exit(sig, None)


class ListenError(Exception):
    """The server's address cannot be listened on (in use, not this machine's, ...)."""


def configure_logging(level: str) -> None:
    """The servers' log lines: time, level, logger, message, at `--log-level` (encdec's also in
    a process whose logging was set up before, as a Ray Serve replica's)."""
    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("encdec").setLevel(getattr(logging, level.upper()))
    logging.getLogger("uvicorn.error").addFilter(expected_cancel_as_warning)


def expected_cancel_as_warning(record: logging.LogRecord) -> bool:
    """uvicorn's "Cancel N running task(s)" at the shutdown timeout is what the timeout is for
    (encdec has said "N requests still in flight: aborting ..." already): a warning, not an error."""
    if str(record.msg).startswith("Cancel %s running task(s)"):
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port`, made before any model loads (as vLLM binds its own
    early), so that a port in use is an error at once, not after the models load."""
    sock = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        if sock is not None:
            sock.close()
        raise ListenError(f"--host {host} --port {port}: cannot listen there: {os_reason(err)}") from None
    return sock


def server_url(host: str, port: int, tls: bool = False) -> str:
    """Where clients reach a server listening on `host`:`port` (IPv6 addresses in brackets),
    with HTTPS if `tls`."""
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def announce(line: str) -> None:
    """Log where the server listens, at INFO, or on stderr where --log-level hides INFO: the
    address (the port --port 0 took) reaches the user whatever the level."""
    if logger.isEnabledFor(logging.INFO):
        logger.info(line)
    else:
        print(line, file=sys.stderr, flush=True)


def run_server(args: argparse.Namespace) -> int:
    """`encdec serve`: bind the address (ListenError), load the models (ModelLoadError if one
    fails), then serve until a signal."""
    configure_logging(args.log_level)
    sock = listening_socket(args.host, args.port)
    use_one_arena()  # before the engines' and uploads' threads start
    served = ServedModels(load_models(args.models, args.served_model_names,
                                      args.max_waiting_requests, engine_options(args)))
    state = ServerState()
    app = build_app(served, state, args.api_key, args.max_upload_mb, args.max_audio_seconds,
                    args.max_audio_seconds_in_flight, allowed_origins=args.allowed_origins,
                    request_body_timeout=args.request_body_timeout,
                    stats_interval=log_stats_interval(args.disable_log_stats),
                    log_requests=not args.disable_log_requests)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None,
                            log_level=args.log_level, access_log=False,
                            timeout_graceful_shutdown=CANCEL_AFTER_DRAIN_SECONDS,
                            http=head_timeout_protocol(HEADER_TIMEOUT_SECONDS if args.request_header_timeout is None
                                                       else args.request_header_timeout),
                            ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile)
    announce(f"serving {', '.join(model.name for model in served)} on "  # the port bound, also for --port 0
             f"{server_url(args.host, sock.getsockname()[1], args.ssl_certfile is not None)}")
    DrainingServer(config, state, args.shutdown_timeout).run(sockets=[sock])
    return 0

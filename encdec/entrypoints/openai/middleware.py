"""Per HTTP request: an id, the API key, the body's size and pace, refusal while shutting down (and a 503
or a last error event for what is cut off when the shutdown timeout ends), metrics and a log
line.

A plain ASGI middleware (it sees streamed responses to their end). The request id is the
client's `x-request-id` when it sends a usable one, else a new one; it goes back in the
`x-request-id` header (unless a proxy in front sets that header itself: Ray Serve's) and into
every log line about the request. A body other than a multipart
upload to a route that reads one (`uploads.read_form` counts it as it streams) is read here
whole, up to the limit, so that a chunked body without a Content-Length gets the same 413 as
one that declares its size.
A client that sends no part of its body for `body_timeout` seconds gets a 408, as nginx's
`client_body_timeout`, so a stalled upload does not hold a connection and its buffers forever;
so does one that trickles it, having sent fewer than MIN_BODY_RATE bytes for each second past
`body_timeout` (as Apache's mod_reqtimeout with `MinRate=500`).
Once no request has been in flight for `IDLE_TRIM_SECONDS`, the C heap's free pages go back to
the system (`trim_heap`): an engine trims after its own steps, but uploads are decoded and texts
tokenized outside them (an hour of silence, which the engine never decodes, left 0.8 GB held).
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Optional, Sequence

from starlette.datastructures import Headers, MutableHeaders
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from encdec.engine.async_engine import IDLE_TRIM_SECONDS
from encdec.entrypoints.openai.errors import CLIENT_CLOSED_REQUEST, OpenAIError
from encdec.entrypoints.openai.metrics import ServerMetrics
from encdec.entrypoints.openai.streaming import DONE, sse
from encdec.entrypoints.openai.uploads import discard_body
from encdec.worker.cpu_memory import trim_heap

logger = logging.getLogger("encdec.server")
OPEN_PATHS = ("/health",)  # answered without an API key
UNCOUNTED_PATHS = ("/health", "/metrics")  # not requests in flight for a graceful shutdown
QUIET_PATHS = ("/health", "/metrics")  # probes and scrapes: logged at DEBUG when they succeed
CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
BODY_TIMEOUT_SECONDS = 60.0  # --request-body-timeout's default, nginx's client_body_timeout
MIN_BODY_RATE = 500  # bytes a body sends for each second past its first timeout (Apache's MinRate)


class ConnectionGone(Exception):
    """The client's connection closed before its body was read or while its response was sent."""


@dataclass
class ServerState:
    draining: bool = False  # shutting down: new requests get 503
    inflight: int = 0
    idle_trim: Optional[asyncio.TimerHandle] = None  # the heap trim due if no request comes first


class ServingMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState, metrics: ServerMetrics,
                 api_key: Optional[str], max_body_bytes: int, routes: Sequence[BaseRoute] = (),
                 body_timeout: float = BODY_TIMEOUT_SECONDS, form_paths: Sequence[str] = (),
                 echo_request_id: bool = True, log_requests: bool = True):
        self.app, self.state, self.metrics, self.routes = app, state, metrics, routes
        self.echo_request_id, self.log_requests = echo_request_id, log_requests
        self.form_paths = form_paths  # where a multipart body is the route's to count (read_form)
        self.max_body_bytes, self.body_timeout = max_body_bytes, body_timeout
        self.api_key = None if api_key is None else api_key.strip().encode()  # compared with the sent key, stripped

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        given = headers.get("x-request-id", "")
        request_id = given if CLIENT_REQUEST_ID.match(given) else uuid.uuid4().hex
        start = time.monotonic()
        scope.setdefault("state", {}).update(request_id=request_id, start_time=start)
        status = 500
        started = finished = streaming = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started, finished, streaming
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                headers = MutableHeaders(scope=message)
                if self.echo_request_id:
                    headers["x-request-id"] = request_id
                streaming = headers.get("content-type", "").startswith("text/event-stream")
            try:
                await send(message)
            except (OSError, RuntimeError) as err:  # uvicorn's transport is closed
                raise ConnectionGone() from err
            finished = message["type"] == "http.response.body" and not message.get("more_body", False)

        path = scope["path"]
        receive = self._paced(receive)
        counted = path not in UNCOUNTED_PATHS
        self.state.inflight += counted
        if counted and self.state.idle_trim is not None:
            self.state.idle_trim.cancel()
        try:
            upload = path in self.form_paths and headers.get("content-type", "").lower().startswith("multipart/")
            refusal = self._refusal(path, headers, upload)
            if refusal is None and not upload:
                receive, refusal = await self._buffered(receive)
            if refusal is not None:
                await refusal.response()(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except ConnectionGone:
            status = CLIENT_CLOSED_REQUEST
        except OpenAIError as err:  # the body stalled while it was read here
            await err.response()(scope, receive, send_with_id)
        except asyncio.CancelledError:  # uvicorn's, once --shutdown-timeout is over
            if not self.state.draining:
                raise
            cut_off = OpenAIError(503, "the server shut down before this request finished "
                                       "(--shutdown-timeout)", code="shutting_down")
            with contextlib.suppress(ConnectionGone):
                if not started:
                    await cut_off.response()(scope, receive, send_with_id)
                elif streaming:
                    scope["state"]["stream_status"] = cut_off.status
                    await send_with_id({"type": "http.response.body", "more_body": False,
                                        "body": (sse(cut_off.body()) + DONE).encode()})
        except Exception as err:  # a real fault: the client still gets OpenAI's shape
            logger.exception("request %s: %s %s failed", request_id, scope["method"], path, exc_info=err)
            if not started:
                await OpenAIError(500, f"internal error: {type(err).__name__}: {err}").response()(
                    scope, receive, send_with_id)
        finally:
            if started and not finished:  # a response the client left in the middle of
                status = CLIENT_CLOSED_REQUEST
            self.state.inflight -= counted
            if counted and not self.state.inflight:
                self._trim_when_idle()
            endpoint = self._endpoint(scope)
            seconds = time.monotonic() - start
            # a stream ended by an error event is counted and logged with the error's status
            in_stream = scope["state"].get("stream_status") if status == 200 else None
            status = in_stream or status
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.latency.labels(endpoint).observe(seconds)
            quiet = path in QUIET_PATHS or not self.log_requests
            level = logging.DEBUG if quiet and status < 400 else logging.INFO
            logger.log(level, "request %s: %s %s -> %d%s in %.3f s", request_id, scope["method"], path,
                       status, " (an error event ending its stream)" if in_stream else "", seconds)

    def _trim_when_idle(self) -> None:
        """In IDLE_TRIM_SECONDS, unless a request comes in meanwhile: `trim_heap` off the loop."""
        loop = asyncio.get_running_loop()

        def trim() -> None:
            if not self.state.draining:  # a shutdown may be closing the executor
                loop.run_in_executor(None, trim_heap).add_done_callback(trimmed)

        def trimmed(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception() is not None:  # best effort: serve on
                logger.error("could not give the idle server's free memory back", exc_info=done.exception())

        self.state.idle_trim = loop.call_later(IDLE_TRIM_SECONDS, trim)

    def _endpoint(self, scope: Scope) -> str:
        """The route's path, for a request refused here too; "unmatched" for an unknown path."""
        route = scope.get("route") or next(
            (r for r in self.routes if r.matches(scope)[0] == Match.FULL), None)
        return getattr(route, "path", "unmatched")

    def _refusal(self, path: str, headers: Headers, upload: bool) -> Optional[OpenAIError]:
        if self.api_key is not None and path not in OPEN_PATHS:
            given = headers.getlist("authorization")  # one, the key: not a right one among wrong ones
            scheme, _, key = given[0].partition(" ") if len(given) == 1 else ("", "", "")
            if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.api_key):
                return OpenAIError(401, "missing or wrong API key: send Authorization: Bearer KEY",
                                   code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        if self.state.draining and path != "/metrics":  # a scrape may watch the drain
            return OpenAIError(503, "the server is shutting down", code="shutting_down")
        declared = headers.get("content-length", "")
        if not upload and declared.isdigit() and int(declared) > self.max_body_bytes:
            return self._too_large()
        return None

    def _paced(self, receive: Receive) -> Receive:
        """`receive` raising a 408 OpenAIError once the body is `body_timeout` seconds without
        a new part, or slower than MIN_BODY_RATE: its deadline, `body_timeout` seconds after the
        first read, moves a second later for each MIN_BODY_RATE bytes received. What follows a
        whole body (the wait for a disconnect) has no limit."""
        whole, received, start = False, 0, None

        async def receive_paced() -> Message:
            nonlocal whole, received, start
            if whole:
                return await receive()
            now = time.monotonic()
            start = now if start is None else start
            left = start + self.body_timeout + received / MIN_BODY_RATE - now
            try:
                message = await asyncio.wait_for(receive(), min(left, self.body_timeout))
            except asyncio.TimeoutError:
                if left < self.body_timeout:
                    raise OpenAIError(408, f"the request body came too slowly: {received} bytes in "
                                           f"{time.monotonic() - start:.0f} s, less than {MIN_BODY_RATE} "
                                           f"bytes a second after the first {self.body_timeout:g} s "
                                           f"(--request-body-timeout)", code="request_timeout") from None
                raise OpenAIError(408, f"the request body stalled: no part of it arrived for "
                                       f"{self.body_timeout:g} s (--request-body-timeout)",
                                  code="request_timeout") from None
            received += len(message.get("body", b""))
            whole = message["type"] != "http.request" or not message.get("more_body", False)
            return message
        return receive_paced

    async def _buffered(self, receive: Receive) -> tuple[Receive, Optional[OpenAIError]]:
        """Read the body whole; returns a `receive` that hands it over in one message and then
        listens for the disconnect, or a 413 once the body passes the limit (ConnectionGone if
        the client leaves first)."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body was whole
                raise ConnectionGone()
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_body_bytes:
                await discard_body(receive, self.max_body_bytes, message)
                return receive, self._too_large()
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(parts), "more_body": False}
                break
        pending = [first]

        async def replay() -> Message:
            return pending.pop() if pending else await receive()
        return replay, None

    def _too_large(self) -> OpenAIError:
        return OpenAIError(413, f"the request body is larger than the server's limit of "
                                f"{self.max_body_bytes} bytes (--max-upload-mb)", code="body_too_large")

"""The request-head deadline on both of uvicorn's HTTP protocols (httptools', which a dev install
gets, and h11's, which a plain install may run): connections that never finish a head are
closed; requests that do, pipelined or answered slowly, are not cut."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from encdec.entrypoints.openai.http_protocol import head_timeout_protocol

TIMEOUT = 1.0


def protocols():
    yield pytest.param(H11Protocol, id="h11")
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed: uvicorn runs h11
        return
    yield pytest.param(HttpToolsProtocol, id="httptools")


async def app(scope, receive, send):
    """`/slow` answers after twice the timeout; any other path at once."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(2 * TIMEOUT)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=list(protocols()))
def port(request):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off",
                                           http=head_timeout_protocol(TIMEOUT, request.param)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)
    sock.close()


def closed_after(sock: socket.socket, line: bytes = b"") -> float:
    """Send `line` every 0.2 s until the server closes the connection; the seconds it took."""
    start = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - start < TIMEOUT + 10:
        try:
            sock.sendall(line)
            if sock.recv(1024) == b"":
                return time.monotonic() - start
        except socket.timeout:
            pass
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start
    return float("inf")


def answers(sock: socket.socket, count: int) -> bytes:
    """Read until `count` responses (of body "ok") have come."""
    sock.settimeout(10)
    data = b""
    while data.count(b"\r\n\r\nok") < count:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def test_a_connection_that_sends_nothing_is_closed(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert TIMEOUT - 0.2 < closed_after(sock) < TIMEOUT + 5


def test_a_head_trickled_a_line_at_a_time_is_closed(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        assert TIMEOUT - 0.2 < closed_after(sock, b"X-Padding: a\r\n") < TIMEOUT + 5


def test_slow_and_pipelined_requests_are_answered_then_the_next_head_is_timed(port):
    """A response that takes twice the timeout, then two pipelined requests, are all answered
    on one connection; a head begun after them and never ended is closed."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answers(sock, 1).startswith(b"HTTP/1.1 200 OK")
        sock.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answers(sock, 2).count(b"HTTP/1.1 200 OK") == 2
        sock.sendall(b"GET / HTTP/1.1\r\n")
        assert TIMEOUT - 0.2 < closed_after(sock, b"X-Padding: a\r\n") < TIMEOUT + 5

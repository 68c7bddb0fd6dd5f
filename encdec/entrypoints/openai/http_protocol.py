"""uvicorn's HTTP protocol with a deadline on each request's head, as nginx's
`client_header_timeout`: a connection that has not sent a whole request head `timeout` seconds
after it opened, or after its last response ended, is closed (also one still sending the body
of a request answered before it was read, as a refusal is). uvicorn alone waits for a
connection's first head without limit, and for a later one once any of it has come (its
keep-alive timeout, set when a response ends, closes only a connection that sends nothing
more), so a client sending a header line now and then could hold a connection forever.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

from uvicorn.protocols.http.auto import AutoHTTPProtocol

logger = logging.getLogger("encdec.server")
HEADER_TIMEOUT_SECONDS = 60.0  # --request-header-timeout's default, nginx's client_header_timeout


def head_timeout_protocol(timeout: float, base: type[asyncio.Protocol] = AutoHTTPProtocol) -> type[asyncio.Protocol]:
    """uvicorn's protocol class `base` (httptools' or h11's; by default the one uvicorn picks),
    closing connections whose request head does not come within `timeout` seconds."""

    class HeadTimeoutProtocol(base):  # type: ignore[misc, valid-type]
        head_deadline: Optional[asyncio.TimerHandle] = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.await_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.await_head()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self.head_deadline is not None:
                self.head_deadline.cancel()
            super().connection_lost(exc)

        def await_head(self) -> None:
            """Close the connection in `timeout` seconds unless a request's head comes first."""
            if self.head_deadline is not None:
                self.head_deadline.cancel()
            if not self.transport.is_closing():
                self.head_deadline = self.loop.call_later(timeout, self.head_timed_out, self.cycle)

        def head_timed_out(self, cycle) -> None:
            """Close the connection if no request has begun since `cycle`, its last when the
            deadline was set (None: none yet), and that one has been answered."""
            self.head_deadline = None
            if self.cycle is cycle and (cycle is None or cycle.response_complete):
                logger.debug("closing a connection from %s: no request head in %g s (--request-header-timeout)",
                             self.client, timeout)
                self.transport.close()

    return HeadTimeoutProtocol

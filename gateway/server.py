"""The gateway's HTTP server: uvicorn, hardened against slow and greedy clients.

uvicorn bounds idle kept-alive connections and (with ``limit_concurrency``) requests in
progress, but it never times out a connection that has not finished its request headers: a
client that opens connections and trickles header bytes (slowloris), or sends nothing at all,
holds them for ever. On top of uvicorn's own limits, the HTTP protocol here adds:

- a header timeout: a connection must deliver a request line and headers within
  ``header_timeout_s`` of opening, or of the end of its previous response on a kept-alive
  connection, else it is closed (after a 408 when part of a request had arrived). The timer
  runs only while headers are awaited: never while a body is read (bounded elsewhere, by
  ``gateway.limits``) nor while a response, such as a minutes-long SSE stream, is sent;
- a per-address limit: a connection beyond ``max_connections_per_client`` open ones from the
  same peer address gets a 429 and is closed at once.

Both HTTP implementations of uvicorn are covered; ``auto`` picks the one ``uvicorn.run``
would (httptools when installed, else h11). WebSockets are off: the API has none, and an
upgraded connection would leave the protocol that counts it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

import structlog
import uvicorn
from starlette.types import ASGIApp

from gateway.settings import GatewaySettings
from schemas.errors import error_body

log = structlog.get_logger()

HttpImplementation = Literal["auto", "h11", "httptools"]


@dataclass
class ConnectionLimits:
    """The limits one server's connections share, and the open connections per address."""

    header_timeout_s: float
    per_client: int
    """Open connections allowed per peer address; 0: no limit."""
    open_by_client: dict[str, int] = field(default_factory=dict)


def _raw_response(status: int, reason: str, message: str, type_: str, code: str) -> bytes:
    """A whole HTTP/1.1 response with an OpenAI error body, that closes the connection."""
    body = json.dumps(error_body(message, type_, code=code)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


TOO_MANY_CONNECTIONS = _raw_response(
    429,
    "Too Many Requests",
    "Too many open connections from your address; close some or reuse them.",
    "rate_limit_error",
    "too_many_connections",
)
HEADER_TIMEOUT = _raw_response(
    408,
    "Request Timeout",
    "The request's headers did not arrive in time.",
    "invalid_request_error",
    "request_timeout",
)


class ConnectionGuard:
    """One connection's header timer and its slot in the per-address count.

    Kept apart from the protocol classes, so both uvicorn implementations share it and only
    tell it when headers are awaited and when they are complete.
    """

    def __init__(
        self,
        limits: ConnectionLimits,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        client: tuple[str, int] | None,
    ) -> None:
        self._limits = limits
        self._loop = loop
        self._transport = transport
        self._host = client[0] if client else None
        self._counted = False
        self._timer: asyncio.TimerHandle | None = None
        self._partial = False

    def admit(self) -> bool:
        """Take a slot for this connection's address; beyond the limit, answer 429 and close."""
        limit, host = self._limits.per_client, self._host
        if limit > 0 and host is not None:
            open_now = self._limits.open_by_client.get(host, 0)
            if open_now >= limit:
                log.warning("connection_refused", client=host, open_connections=open_now)
                self._transport.write(TOO_MANY_CONNECTIONS)
                self._transport.close()
                return False
            self._limits.open_by_client[host] = open_now + 1
            self._counted = True
        self.await_headers()
        return True

    def await_headers(self) -> None:
        """(Re)start the header timer: a request's headers are due from now."""
        self.headers_complete()
        if not self._transport.is_closing():
            self._partial = False
            self._timer = self._loop.call_later(self._limits.header_timeout_s, self._expired)

    def bytes_received(self) -> None:
        """Some bytes arrived; while headers are awaited, they begin a request."""
        if self._timer is not None:
            self._partial = True

    def headers_complete(self) -> None:
        """A request's headers are in: no timer until its response has been sent."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def release(self) -> None:
        """The connection is gone: stop its timer and free its slot."""
        self.headers_complete()
        if self._counted and self._host is not None:
            self._counted = False
            left = self._limits.open_by_client.get(self._host, 1) - 1
            if left > 0:
                self._limits.open_by_client[self._host] = left
            else:
                self._limits.open_by_client.pop(self._host, None)

    def _expired(self) -> None:
        self._timer = None
        if self._transport.is_closing():
            return
        log.info("header_timeout_closed", client=self._host, partial_request=self._partial)
        if self._partial:
            self._transport.write(HEADER_TIMEOUT)
        self._transport.close()


class _Guarded(asyncio.Protocol):
    """What both guarded protocols add to uvicorn's; mixed in before uvicorn's class, whose
    ``loop`` and ``client`` it reads. ``limits`` is bound per server by `protocol_class`."""

    limits: ClassVar[ConnectionLimits]
    guard: ConnectionGuard
    loop: asyncio.AbstractEventLoop
    client: tuple[str, int] | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.guard = ConnectionGuard(
            self.limits, self.loop, cast(asyncio.Transport, transport), self.client
        )
        self.guard.admit()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.guard.bytes_received()
        super().data_received(data)


def _httptools_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(_Guarded, HttpToolsProtocol):
        def on_headers_complete(self) -> None:
            self.guard.headers_complete()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            # A pipelined request's headers are complete already; it starts in super().
            if not self.pipeline:
                self.guard.await_headers()
            super().on_response_complete()

    GuardedHttpToolsProtocol.limits = limits
    return GuardedHttpToolsProtocol


def _h11_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(_Guarded, H11Protocol):
        def handle_events(self) -> None:
            # h11 has no headers-complete callback: a new request cycle means headers are in.
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:
                self.guard.headers_complete()

        def on_response_complete(self) -> None:
            # Armed first: super() parses a pipelined request, whose headers then disarm it.
            self.guard.await_headers()
            super().on_response_complete()

    GuardedH11Protocol.limits = limits
    return GuardedH11Protocol


def protocol_class(limits: ConnectionLimits, http: HttpImplementation = "auto") -> type[Any]:
    """The guarded HTTP protocol class of one server (uvicorn constructs it per connection
    with fixed arguments, so the limits are bound in a class made here)."""
    if http == "auto":
        http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return _httptools_protocol(limits) if http == "httptools" else _h11_protocol(limits)


def server_config(
    app: ASGIApp, settings: GatewaySettings, *, http: HttpImplementation = "auto", **overrides: Any
) -> uvicorn.Config:
    """uvicorn's configuration of the gateway; `overrides` replace any other uvicorn option
    (tests pass a free port)."""
    limits = ConnectionLimits(settings.header_timeout_s, settings.max_connections_per_client)
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": "warning",
        "timeout_graceful_shutdown": 10,
        # Annotated int by uvicorn, but only handed to loop.call_later: fractions work.
        "timeout_keep_alive": cast(int, settings.keep_alive_timeout_s),
        "limit_concurrency": settings.max_connections,
        "http": protocol_class(limits, http),
        "ws": "none",
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


def serve(app: ASGIApp, settings: GatewaySettings) -> None:
    """Serve `app` until interrupted (what `uvicorn.run` does for one process)."""
    server = uvicorn.Server(server_config(app, settings))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises a captured Ctrl-C once it has shut down
        pass
    if not server.started:
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE

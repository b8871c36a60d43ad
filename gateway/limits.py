"""Request bodies are bounded before any work: size first, then time.

`BodyLimitMiddleware` is plain ASGI (no body is parsed here), in front of every route:

- a body larger than the limit gets 413 in OpenAI's error format. A `Content-Length` over the
  limit is refused before a byte of the body is read; a chunked body (or one longer than it
  said) is refused as soon as the bytes read pass the limit, so it is never held whole;
- a JSON body must arrive whole within `body_timeout_s` of its headers (408 otherwise), so a
  client trickling a body cannot hold a request open;
- routes with a limit of their own (file uploads stream to S3 up to their own size) are only
  bounded in time: an upload stalls out when no byte arrives for `body_timeout_s`.

A body that passed is handed to the application unchanged, as one message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.errors import error_body

log = structlog.get_logger()

DEFAULT_OVERHEAD_BYTES = 1024**2
"""Room for everything in a body that is not prompt text (tools, schemas, options)."""
BYTES_PER_TOKEN_BOUND = 32
"""JSON bytes per prompt token that no real request exceeds on average: English text is
about 4, other scripts and escaped characters up to about 12."""

LINGER_S = 1.0
"""How long a refused body is still read (and dropped) so its client can read the answer."""
LINGER_BYTES_FACTOR = 4
"""...and at most this many times the limit of it."""


def default_max_request_bytes(max_model_lens: Iterable[int]) -> int:
    """The default body limit: overhead plus the bound for the largest context served."""
    largest = max(max_model_lens, default=0)
    return DEFAULT_OVERHEAD_BYTES + BYTES_PER_TOKEN_BOUND * largest


class _Refused(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class BodyLimitMiddleware:
    """Refuses oversized (413) and slow (408) request bodies before the app sees them."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        body_timeout_s: float,
        own_limit_paths: tuple[str, ...] = ("/v1/files",),
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout_s = body_timeout_s
        self.own_limit_paths = own_limit_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        if scope["path"] in self.own_limit_paths:
            await self.app(scope, self._idle_bounded(receive), send)
            return
        try:
            declared = _content_length(scope)
            if declared is not None and declared > self.max_bytes:
                raise self._too_large(declared)
            async with asyncio.timeout(self.body_timeout_s):
                body, rest = await self._read(receive)
        except _Refused as refused:
            await self._refuse(scope, receive, send, refused)
            return
        except TimeoutError:
            timed_out = _Refused(
                408,
                f"The request body did not arrive within {self.body_timeout_s:g}s.",
                "request_timeout",
            )
            await self._refuse(scope, receive, send, timed_out)
            return
        if rest is not None:  # the client left mid-body: the app sees the disconnect
            await self.app(scope, _replay([rest]), send)
            return
        await self.app(scope, _replay([_body_message(body)], then=receive), send)

    async def _read(self, receive: Receive) -> tuple[bytes, Message | None]:
        """The whole body, refused once it passes the limit; or the disconnect that cut it."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"", message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large(None)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None

    def _idle_bounded(self, receive: Receive) -> Receive:
        timeout_s = self.body_timeout_s

        async def bounded() -> Message:
            try:
                async with asyncio.timeout(timeout_s):
                    return await receive()
            except TimeoutError:
                log.info("request_body_stalled", timeout_s=timeout_s)
                return {"type": "http.disconnect"}  # the route ends as for a client gone

        return bounded

    def _too_large(self, declared: int | None) -> _Refused:
        size = f"{declared} bytes" if declared is not None else "more than that"
        return _Refused(
            413,
            f"The request body is too large: at most {self.max_bytes} bytes are accepted, "
            f"this one has {size}.",
            "request_too_large",
        )

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, refused: _Refused) -> None:
        """Answer in OpenAI's format, then close. Before the response ends, whatever the client
        is still sending is read and dropped for a moment (a lingering close, bounded in time
        and bytes): closing on unread data resets the connection, and a client still writing
        its body would lose the answer with it."""
        client = scope.get("client")
        log.info(
            "request_body_refused",
            path=scope["path"],
            status=refused.status,
            client=client[0] if client else None,
        )
        payload = json.dumps(
            error_body(refused.message, "invalid_request_error", code=refused.code)
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": refused.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    # The unread rest of the body makes the connection unusable: close it.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload, "more_body": True})
        await self._discard(receive)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _discard(self, receive: Receive) -> None:
        budget = LINGER_BYTES_FACTOR * self.max_bytes
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_S):
                while budget > 0:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body"):
                        return
                    budget -= len(message.get("body", b""))


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                message = "The Content-Length header is invalid."
                raise _Refused(400, message, "invalid_request") from None
    return None


def _body_message(body: bytes) -> Message:
    return {"type": "http.request", "body": body, "more_body": False}


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A `receive` that returns `messages` first, then defers to `then` (disconnects)."""
    pending = list(messages)

    async def receive() -> Any:
        if pending:
            return pending.pop(0)
        if then is None:
            return {"type": "http.disconnect"}
        return await then()

    return receive

"""Request bodies are bounded before any work, on a real uvicorn server over real sockets:
413 for a body over the limit (declared or chunked, never read whole), 408 for a body that
trickles, and the upload route bounded only by idleness."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import pytest
import uvicorn
from fastapi import FastAPI, Request

from gateway.limits import BodyLimitMiddleware
from llmq import services

pytestmark = pytest.mark.integration

LIMIT = 64 * 1024
BODY_TIMEOUT_S = 0.5


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.post("/v1/files")
    async def upload(request: Request) -> dict[str, object]:
        size = 0
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return {"bytes": size, "ended": "stalled"}
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return {"bytes": size, "ended": "complete"}

    app.add_middleware(BodyLimitMiddleware, max_bytes=LIMIT, body_timeout_s=BODY_TIMEOUT_S)
    return app


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, int]]:
    port = services.free_port()
    config = uvicorn.Config(_app(), host=services.LOCALHOST, port=port, log_level="warning")
    srv = uvicorn.Server(config)
    task = asyncio.create_task(srv.serve())
    while not srv.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield services.LOCALHOST, port
    finally:
        srv.should_exit = True
        await task


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, object]]:
    """Status and JSON body of one HTTP/1.1 response (Content-Length framed)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    length = next(int(v) for k, _, v in (x.partition(": ") for x in lines) if k == "content-length")
    return status, json.loads(await reader.readexactly(length))


def _head(path: str, **headers: str) -> bytes:
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    start = f"POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
    return f"{start}{extra}\r\n".encode()


async def test_a_declared_length_over_the_limit_is_refused_before_any_body(
    server: tuple[str, int],
) -> None:
    reader, writer = await asyncio.open_connection(*server)
    writer.write(_head("/v1/echo", content_length=str(10 * 1024**2)))  # and no body at all
    await writer.drain()
    status, body = await _response(reader)
    assert status == 413
    assert body["error"]["code"] == "request_too_large"  # type: ignore[index]
    assert str(LIMIT) in body["error"]["message"]  # type: ignore[index]
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # and the connection closes
    writer.close()


async def test_a_chunked_body_over_the_limit_is_refused_without_reading_it_whole(
    server: tuple[str, int],
) -> None:
    reader, writer = await asyncio.open_connection(*server)
    writer.write(_head("/v1/echo", transfer_encoding="chunked"))
    planned = 64 * 1024**2
    chunk = b"x" * (16 * 1024)
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    answer = asyncio.create_task(_response(reader))
    sent = 0
    with contextlib.suppress(ConnectionError):
        while sent < planned and not answer.done():
            writer.write(frame)
            await writer.drain()
            sent += len(chunk)
    status, body = await answer
    assert status == 413 and body["error"]["code"] == "request_too_large"  # type: ignore[index]
    assert sent < planned / 4  # refused while most of the body was still unsent
    writer.close()


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_at_the_limit_is_accepted(server: tuple[str, int], chunked: bool) -> None:
    payload = b"y" * LIMIT
    reader, writer = await asyncio.open_connection(*server)
    if chunked:
        half = LIMIT // 2
        writer.write(_head("/v1/echo", transfer_encoding="chunked"))
        for part in (payload[:half], payload[half:]):
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        writer.write(b"0\r\n\r\n")
    else:
        writer.write(_head("/v1/echo", content_length=str(LIMIT)) + payload)
    await writer.drain()
    assert await _response(reader) == (200, {"bytes": LIMIT})
    writer.close()


async def test_a_trickled_body_times_out_with_408(server: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*server)
    started = time.monotonic()
    writer.write(_head("/v1/echo", content_length="100") + b"0123456789")
    await writer.drain()

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(80):
                await asyncio.sleep(0.05)  # the slow client's pace, not synchronisation
                writer.write(b"z")
                await writer.drain()

    dripping = asyncio.create_task(trickle())
    status, body = await _response(reader)
    elapsed = time.monotonic() - started
    dripping.cancel()
    assert status == 408 and body["error"]["code"] == "request_timeout"  # type: ignore[index]
    assert BODY_TIMEOUT_S <= elapsed < BODY_TIMEOUT_S + 2.0
    writer.close()


async def test_an_upload_is_bounded_by_idleness_not_size(server: tuple[str, int]) -> None:
    big = b"u" * (4 * LIMIT)  # over the JSON limit: the upload route has its own
    reader, writer = await asyncio.open_connection(*server)
    writer.write(_head("/v1/files", content_length=str(len(big))) + big)
    await writer.drain()
    assert await _response(reader) == (200, {"bytes": len(big), "ended": "complete"})

    started = time.monotonic()
    writer.write(_head("/v1/files", content_length=str(len(big))) + big[:LIMIT])  # then silence
    await writer.drain()
    status, body = await _response(reader)
    assert (status, body) == (200, {"bytes": LIMIT, "ended": "stalled"})
    assert time.monotonic() - started >= BODY_TIMEOUT_S
    writer.close()

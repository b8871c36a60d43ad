"""Slow and greedy clients against the gateway's real HTTP server (`gateway.server`).

A tiny app (a JSON route and an SSE-like stream) runs in-process on uvicorn with the guarded
protocol, on each HTTP implementation installed; clients are raw sockets, so nothing in an
HTTP client library hides what the server does to a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
from collections.abc import AsyncIterator

import h11
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from structlog.testing import capture_logs

from gateway.server import HttpImplementation, server_config
from gateway.settings import GatewaySettings
from llmq import services

pytestmark = pytest.mark.integration

HEADER_TIMEOUT_S = 0.5
CLOSE_BOUND_S = 3.0
"""A connection the server closes must be gone well within this (generous on a busy CI)."""
CHUNKS, CHUNK_INTERVAL_S = 40, 0.05
"""The stream lasts about 2 s: four header timeouts."""


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/json")
    async def plain() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for n in range(CHUNKS):
                yield f"data: {n}\n\n".encode()
                await asyncio.sleep(CHUNK_INTERVAL_S)

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(
    params=[
        "h11",
        pytest.param(
            "httptools",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("httptools") is None, reason="httptools not installed"
            ),
        ),
    ]
)
def http(request: pytest.FixtureRequest) -> HttpImplementation:
    impl: HttpImplementation = request.param
    return impl


@contextlib.asynccontextmanager
async def _serve(
    http: HttpImplementation, max_connections_per_client: int = 0
) -> AsyncIterator[int]:
    """The app on the guarded server on a free loopback port; yields the port."""
    settings = GatewaySettings(
        host=services.LOCALHOST,
        port=services.free_port(),
        header_timeout_s=HEADER_TIMEOUT_S,
        keep_alive_timeout_s=5.0,
        max_connections_per_client=max_connections_per_client,
    )
    server = uvicorn.Server(server_config(_app(), settings, http=http))
    task = asyncio.create_task(server.serve())
    while not server.started:  # uvicorn has no start event to await
        if task.done():
            task.result()
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.01)
    try:
        yield settings.port
    finally:
        server.should_exit = True
        await task


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts)."""
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await reader.read(65536):
            received += chunk
    return received


class RawClient:
    """One HTTP/1.1 connection, driven by h11: requests on it reuse it (keep-alive)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int) -> RawClient:
        return cls(*await asyncio.open_connection(services.LOCALHOST, port))

    async def _next_event(self) -> object:
        while (event := self.conn.next_event()) is h11.NEED_DATA:
            self.conn.receive_data(await self.reader.read(65536))
        return event

    async def get(self, path: str, close: bool = False) -> tuple[int, list[bytes]]:
        """GET `path`; its status and body, in the chunks they arrived in."""
        headers = [("host", "test")] + ([("connection", "close")] if close else [])
        self.writer.write(self.conn.send(h11.Request(method="GET", target=path, headers=headers)))
        self.writer.write(self.conn.send(h11.EndOfMessage()))
        await self.writer.drain()
        response = await self._next_event()
        assert isinstance(response, h11.Response)
        chunks: list[bytes] = []
        while isinstance(event := await self._next_event(), h11.Data):
            chunks.append(bytes(event.data))
        assert isinstance(event, h11.EndOfMessage)
        if not close:
            self.conn.start_next_cycle()
        return response.status_code, chunks

    def close(self) -> None:
        self.writer.close()


async def _idle_client(port: int) -> float:
    """Connect, send nothing; seconds until the server closed the connection."""
    loop = asyncio.get_running_loop()
    start = loop.time()  # before connecting: the server's timer cannot start earlier
    reader, writer = await asyncio.open_connection(services.LOCALHOST, port)
    received = await asyncio.wait_for(_read_until_closed(reader), CLOSE_BOUND_S)
    elapsed = loop.time() - start
    writer.close()
    assert received == b""  # nothing of a request arrived: closed without a response
    return elapsed


async def _slowloris_client(port: int) -> float:
    """Send a request's headers one byte every 0.2 s; seconds until the server cut it off."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    reader, writer = await asyncio.open_connection(services.LOCALHOST, port)
    request = b"GET /json HTTP/1.1\r\nhost: test\r\nx-padding: " + b"a" * 64 + b"\r\n\r\n"

    async def drip() -> None:
        with contextlib.suppress(ConnectionError):
            for byte in request:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.2)  # the attacker's pace, not a synchronisation

    dripping = asyncio.create_task(drip())
    try:
        received = await asyncio.wait_for(_read_until_closed(reader), CLOSE_BOUND_S)
        elapsed = loop.time() - start
    finally:
        dripping.cancel()
        writer.close()
    assert not dripping.done() or dripping.cancelled()  # cut off long before it finished
    # Part of a request had arrived: the server said why before it closed.
    assert received.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in received.lower()
    return elapsed


async def test_a_silent_connection_is_closed_after_the_header_timeout(
    http: HttpImplementation,
) -> None:
    async with _serve(http) as port:
        elapsed = await _idle_client(port)
    assert HEADER_TIMEOUT_S <= elapsed < CLOSE_BOUND_S


async def test_a_slowloris_client_is_cut_off(http: HttpImplementation) -> None:
    async with _serve(http) as port:
        with capture_logs() as logs:
            elapsed = await _slowloris_client(port)
    assert HEADER_TIMEOUT_S <= elapsed < CLOSE_BOUND_S
    closed = [entry for entry in logs if entry["event"] == "header_timeout_closed"]
    assert closed and closed[0]["client"] == services.LOCALHOST
    assert closed[0]["partial_request"] is True


async def test_a_long_stream_outlives_the_header_timeout_while_slow_clients_are_cut(
    http: HttpImplementation,
) -> None:
    async def stream_on_a_kept_alive_connection() -> tuple[float, list[bytes]]:
        client = await RawClient.open(port)
        try:
            # A first response re-arms the header timer; the stream's headers disarm it again.
            assert await client.get("/json") == (200, [b'{"ok":true}'])
            loop = asyncio.get_running_loop()
            start = loop.time()
            status, chunks = await client.get("/stream")
            assert status == 200
            return loop.time() - start, chunks
        finally:
            client.close()

    async with _serve(http) as port:
        (stream_s, chunks), idle_s, slowloris_s = await asyncio.gather(
            stream_on_a_kept_alive_connection(), _idle_client(port), _slowloris_client(port)
        )
    assert b"".join(chunks) == b"".join(f"data: {n}\n\n".encode() for n in range(CHUNKS))
    assert stream_s > 3 * HEADER_TIMEOUT_S
    assert HEADER_TIMEOUT_S <= idle_s < CLOSE_BOUND_S
    assert HEADER_TIMEOUT_S <= slowloris_s < CLOSE_BOUND_S


async def test_a_body_is_not_cut_by_the_header_timer(http: HttpImplementation) -> None:
    """Once headers are in, the header timer is off: a body trickling in for longer than the
    header timeout is read (bodies are bounded in time elsewhere, by `gateway.limits`)."""
    body = b"12345678"
    async with _serve(http) as port:
        reader, writer = await asyncio.open_connection(services.LOCALHOST, port)
        try:
            writer.write(b"POST /echo HTTP/1.1\r\nhost: test\r\ncontent-length: 8\r\n\r\n")
            for byte in body:  # 8 x 0.15 s: well past the header timeout
                await asyncio.sleep(0.15)  # the client's pace, not a synchronisation
                writer.write(bytes([byte]))
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_BOUND_S)
        finally:
            writer.close()
    assert head.startswith(b"HTTP/1.1 200 ")


async def test_a_kept_alive_connection_serves_its_next_request_then_times_out_idle(
    http: HttpImplementation,
) -> None:
    async with _serve(http) as port:
        client = await RawClient.open(port)
        try:
            assert await client.get("/json") == (200, [b'{"ok":true}'])
            await asyncio.sleep(HEADER_TIMEOUT_S / 2)  # idle, but within the timeout
            assert await client.get("/json") == (200, [b'{"ok":true}'])
            loop = asyncio.get_running_loop()
            start = loop.time()
            received = await asyncio.wait_for(_read_until_closed(client.reader), CLOSE_BOUND_S)
            elapsed = loop.time() - start
        finally:
            client.close()
    assert received == b""
    # The timer started when the server finished the response, a moment before the client
    # read its end; keep_alive_timeout_s (5 s) is far longer, so this is the header timer.
    assert HEADER_TIMEOUT_S * 0.8 <= elapsed < CLOSE_BOUND_S


async def test_connections_beyond_the_per_client_limit_are_refused_at_once(
    http: HttpImplementation,
) -> None:
    async with _serve(http, max_connections_per_client=3) as port:
        clients = [await RawClient.open(port) for _ in range(3)]
        try:
            for client in clients:  # answered, so the server counts them
                assert (await client.get("/json"))[0] == 200

            loop = asyncio.get_running_loop()
            with capture_logs() as logs:
                start = loop.time()
                reader, writer = await asyncio.open_connection(services.LOCALHOST, port)
                refused = await asyncio.wait_for(_read_until_closed(reader), CLOSE_BOUND_S)
                elapsed = loop.time() - start
            writer.close()
            assert elapsed < HEADER_TIMEOUT_S  # at once, not by the header timer
            head, _, body = refused.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 429 ")
            assert json.loads(body)["error"] == {
                "message": "Too many open connections from your address; close some or reuse them.",
                "type": "rate_limit_error",
                "param": None,
                "code": "too_many_connections",
            }
            assert [(e["event"], e["client"]) for e in logs] == [
                ("connection_refused", services.LOCALHOST)
            ]

            for client in clients:  # the first three still work
                assert (await client.get("/json"))[0] == 200

            # A connection that ends frees its slot. The server closes this one after its
            # response; asyncio runs connection_lost before it closes the socket, so the
            # slot is free by the time the client reads the end.
            assert (await clients[0].get("/json", close=True))[0] == 200
            assert await _read_until_closed(clients[0].reader) == b""
            another = await RawClient.open(port)
            clients.append(another)
            assert (await another.get("/json"))[0] == 200
        finally:
            for client in clients:
                client.close()

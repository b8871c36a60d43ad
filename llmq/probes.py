"""`/healthz`, `/readyz` and `/metrics` over plain HTTP for processes that serve no API
(workers, the batch service), so Kubernetes probes and Prometheus (or `curl`) can ask them
directly.

- `/healthz`: 200 while the process can do its work at all (a worker: its engine passes its
  health checks); 503 once it cannot, and a supervisor should restart it.
- `/readyz`: 200 while it should get work (a worker: engine loaded, not draining, healthy).

- `/metrics`: the process's Prometheus metrics in the text exposition format (when it has any).

Probe bodies are small JSON objects. Only GET of these paths is answered (404 otherwise); the
server reads one request line and its headers, answers, and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger()

Check = Callable[[], Awaitable[bool]]
Exposition = Callable[[], bytes]
"""The current metrics in Prometheus's text format (`prometheus_client.generate_latest`)."""

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


class ProbeServer:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        healthy: Check,
        ready: Check,
        metrics: Exposition | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._checks = {"/healthz": healthy, "/readyz": ready}
        self._metrics = metrics
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._answer, self._host, self._port)
        log.info("probes_listening", host=self._host, port=self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 and parts[0] == "GET" else None
            status, content_type, payload = await self._response(path)
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _response(self, path: str | None) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of `path` (None: not a GET)."""
        if path == "/metrics" and self._metrics is not None:
            return 200, METRICS_CONTENT_TYPE, self._metrics()
        check = self._checks.get(path) if path is not None else None
        if check is None:
            return 404, "application/json", json.dumps({"error": "not found"}).encode()
        try:
            ok = await check()
        except Exception:
            ok = False
        body = {"status": "ok"} if ok else {"status": "unavailable"}
        return (200 if ok else 503), "application/json", json.dumps(body).encode()

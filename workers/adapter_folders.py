"""LoRA adapters on a worker's node: each job names its adapter's location and digest
(`AdapterRef`); the first job of an adapter fetches it from object storage into the node's
cache, verified like model weights (`WeightsCache`, under `<weights cache>/adapters`), and
later jobs find it there. Only verified folders ever reach the engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from schemas.messages import AdapterRef
from workers.weights import WeightsCache, WeightsSource

log = structlog.get_logger()


class AdapterFolders:
    """The local, verified folder of each adapter a job names."""

    def __init__(self, root: Path, source: WeightsSource) -> None:
        self._cache = WeightsCache(root, source)
        self._fetching: dict[str, asyncio.Task[Path]] = {}

    async def folder(self, adapter: AdapterRef) -> Path:
        """The adapter's folder, fetched and verified on first use (one fetch however many
        jobs ask at once). Raises `WeightsError` when it cannot be fetched or verified."""
        task = self._fetching.get(adapter.sha256)
        if task is None or (task.done() and task.exception() is not None):
            task = asyncio.ensure_future(self._cache.ensure(adapter.weights_uri, adapter.sha256))
            self._fetching[adapter.sha256] = task
        return await asyncio.shield(task)


class S3AdapterSource:
    """A `WeightsSource` on S3 that opens a client per call: adapters are fetched rarely, so
    a worker holds no S3 connection between fetches."""

    def __init__(self, endpoint_url: str | None) -> None:
        self._endpoint_url = endpoint_url

    async def list(self, uri: str) -> list[tuple[str, int]]:
        from workers.s3_weights import S3WeightsSource

        async with S3WeightsSource(endpoint_url=self._endpoint_url) as source:
            return await source.list(uri)

    async def download(self, uri: str, relative_path: str, dest: Path) -> None:
        from workers.s3_weights import S3WeightsSource

        async with S3WeightsSource(endpoint_url=self._endpoint_url) as source:
            await source.download(uri, relative_path, dest)

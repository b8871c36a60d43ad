"""S3 adapter of `WeightsSource` (aioboto3): a weights folder is every object under a prefix,
`s3://bucket/prefix/<relative path>`.

Credentials and region come from the environment (AWS_ACCESS_KEY_ID, AWS_REGION, an instance
or pod role...), as for the batch file store; `endpoint_url` points at another S3 API (the
local stack's moto). Only this module talks to S3 for weights.
"""

from __future__ import annotations

import builtins
import contextlib
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aioboto3
import structlog

from workers.weights import WeightsError, regular_files

log = structlog.get_logger()


def parse_uri(uri: str) -> tuple[str, str]:
    """(bucket, key prefix) of `s3://bucket/prefix`; the prefix ends in "/" unless empty, so
    `s3://b/m` never takes in the objects of `s3://b/m2`."""
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise WeightsError(f"not an s3://bucket/prefix uri: {uri!r}")
    prefix = parts.path.strip("/")
    return parts.netloc, f"{prefix}/" if prefix else ""


class S3WeightsSource:
    """`WeightsSource` on S3; use as `async with S3WeightsSource(...) as source:` (one client
    for every call inside)."""

    def __init__(
        self, session: aioboto3.Session | None = None, endpoint_url: str | None = None
    ) -> None:
        self._session = session or aioboto3.Session()
        self._endpoint_url = endpoint_url
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    async def __aenter__(self) -> S3WeightsSource:
        self._client = await self._stack.enter_async_context(
            self._session.client("s3", endpoint_url=self._endpoint_url)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._stack.aclose()
        self._client = None

    def _s3(self) -> Any:
        if self._client is None:
            raise RuntimeError("S3WeightsSource is used outside `async with`")
        return self._client

    async def download(self, uri: str, relative_path: str, dest: Path) -> None:
        """Write the object `relative_path` under `uri` to `dest` (ranged GETs in parallel)."""
        bucket, prefix = parse_uri(uri)
        await self._s3().download_file(bucket, prefix + relative_path, str(dest))

    async def push(self, folder: Path, uri: str) -> int:
        """Upload every regular file below `folder` under `uri` (which must hold nothing yet:
        a weights version is immutable); returns the bytes uploaded."""
        bucket, prefix = parse_uri(uri)
        if await self.list(uri):
            raise WeightsError(f"{uri} already holds objects: push to a new prefix")
        files = sorted(regular_files(folder))
        total = 0
        for relative in files:
            path = folder / relative
            await self._s3().upload_file(str(path), bucket, prefix + relative)
            total += path.stat().st_size
        log.info("weights_pushed", uri=uri, files=len(files), bytes=total)
        return total

    async def list(self, uri: str) -> builtins.list[tuple[str, int]]:
        """Every object under `uri` but folder placeholders (keys ending in "/"), as (path
        relative to `uri`, size), read page by page."""
        bucket, prefix = parse_uri(uri)
        paginator = self._s3().get_paginator("list_objects_v2")
        found: builtins.list[tuple[str, int]] = []
        async for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = str(item["Key"])
                if not key.endswith("/"):
                    found.append((key[len(prefix) :], int(item["Size"])))
        return found

"""S3 adapter of `FileStore` (aioboto3): content streamed in by multipart upload.

Layout in the bucket:

- `files/<id>/content`: the bytes, as uploaded;
- `files/<id>/meta.json`: the `StoredFile` as JSON (written after the content, so a file
  exists once its metadata does);
- `teams/<team>/files/<created_at:010d>-<id>`: an empty index object per file, so S3's
  key-ordered listing gives a team's files in creation order.

Only this module talks to S3.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Sequence
from typing import Any, Literal
from urllib.parse import quote

import aioboto3
import structlog

from batch.ports import FileTooLarge, StoredFile

log = structlog.get_logger()

PART_SIZE = 8 * 1024 * 1024
"""Bytes per uploaded part (S3 wants at least 5 MiB for every part but the last)."""
_READ_CHUNK = 1024 * 1024
_META_FETCHES = 16
"""Metadata objects read at once while listing."""
_START_TIMEOUT_S = 10.0
_ID = re.compile(r"file-[0-9a-f]{24}")
_MISSING_BUCKET = {"404", "NoSuchBucket", "NotFound"}


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def _content_key(file_id: str) -> str:
    return f"files/{file_id}/content"


def _meta_key(file_id: str) -> str:
    return f"files/{file_id}/meta.json"


def _team_prefix(team: str) -> str:
    return f"teams/{quote(team, safe='')}/files/"


def _index_key(stored: StoredFile) -> str:
    return f"{_team_prefix(stored.team)}{stored.created_at:010d}-{stored.id}"


def _id_of(index_key: str, prefix: str) -> str:
    return index_key[len(prefix) + 11 :]  # past "<created_at:010d>-"


def _decode(raw: bytes) -> StoredFile:
    data = json.loads(raw)
    return StoredFile(
        id=str(data["id"]),
        team=str(data["team"]),
        filename=str(data["filename"]),
        purpose=str(data["purpose"]),
        bytes=int(data["bytes"]),
        created_at=int(data["created_at"]),
    )


class S3FileStore:
    """`FileStore` on one S3 bucket (created at start if missing)."""

    def __init__(self, session: aioboto3.Session, bucket: str, endpoint_url: str | None) -> None:
        self._session = session
        self._bucket = bucket
        self._endpoint_url = endpoint_url
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._bucket_ready = False
        self._bucket_lock = asyncio.Lock()

    async def start(self) -> None:
        """Create the client, and the bucket if missing. An unreachable S3 does not stop the
        process from starting (chat does not need it): the bucket is checked again on use."""
        self._client = await self._stack.enter_async_context(
            self._session.client("s3", endpoint_url=self._endpoint_url)
        )
        try:
            async with asyncio.timeout(_START_TIMEOUT_S):
                await self._ready()
        except Exception as exc:
            log.warning(
                "file_store_unavailable",
                bucket=self._bucket,
                endpoint=self._endpoint_url,
                error=repr(exc),
            )

    async def stop(self) -> None:
        await self._stack.aclose()
        self._client = None

    async def create(
        self,
        *,
        team: str,
        filename: str,
        purpose: str,
        chunks: AsyncIterable[bytes],
        max_bytes: int,
    ) -> StoredFile:
        s3 = await self._ready()
        file_id = new_file_id()
        created_at = int(time.time())
        size = await self._upload(s3, _content_key(file_id), chunks, max_bytes)
        stored = StoredFile(file_id, team, filename, purpose, size, created_at)
        try:
            await s3.put_object(
                Bucket=self._bucket,
                Key=_meta_key(file_id),
                Body=json.dumps(dataclasses.asdict(stored)).encode(),
                ContentType="application/json",
            )
            await s3.put_object(Bucket=self._bucket, Key=_index_key(stored), Body=b"")
        except BaseException:
            with contextlib.suppress(Exception):
                await self._remove(s3, stored)
            raise
        return stored

    async def _upload(self, s3: Any, key: str, chunks: AsyncIterable[bytes], max_bytes: int) -> int:
        """Stream `chunks` to `key`: one PUT when the whole fits in a part, else a multipart
        upload of PART_SIZE parts (at most one part in memory). Returns the size."""
        size = 0
        pending = bytearray()
        upload_id: str | None = None
        parts: list[dict[str, Any]] = []

        async def upload_part(body: bytes) -> None:
            nonlocal upload_id
            if upload_id is None:
                created = await s3.create_multipart_upload(
                    Bucket=self._bucket, Key=key, ContentType="application/octet-stream"
                )
                upload_id = str(created["UploadId"])
            number = len(parts) + 1
            sent = await s3.upload_part(
                Bucket=self._bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
            )
            parts.append({"ETag": sent["ETag"], "PartNumber": number})

        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise FileTooLarge(max_bytes)
                pending += chunk
                while len(pending) >= PART_SIZE:
                    body = bytes(pending[:PART_SIZE])
                    del pending[:PART_SIZE]
                    await upload_part(body)
            if upload_id is None:
                await s3.put_object(
                    Bucket=self._bucket,
                    Key=key,
                    Body=bytes(pending),
                    ContentType="application/octet-stream",
                )
                return size
            if pending:
                await upload_part(bytes(pending))
            await s3.complete_multipart_upload(
                Bucket=self._bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
            return size
        except BaseException:
            if upload_id is not None:
                with contextlib.suppress(Exception):
                    await s3.abort_multipart_upload(
                        Bucket=self._bucket, Key=key, UploadId=upload_id
                    )
            raise

    async def get(self, file_id: str) -> StoredFile | None:
        if not _ID.fullmatch(file_id):
            return None
        s3 = await self._ready()
        try:
            got = await s3.get_object(Bucket=self._bucket, Key=_meta_key(file_id))
        except s3.exceptions.NoSuchKey:
            return None
        body = got["Body"]
        async with body:
            raw: bytes = await body.read()
        return _decode(raw)

    async def list(
        self,
        team: str,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
    ) -> tuple[list[StoredFile], bool]:
        s3 = await self._ready()
        prefix = _team_prefix(team)
        cursor: str | None = None
        if after is not None:
            last = await self.get(after)
            if last is None or last.team != team:
                return [], False
            cursor = _index_key(last)
        if order == "asc":
            keys: AsyncGenerator[str, None] = self._index_keys(s3, prefix, start_after=cursor)
        else:  # S3 lists in ascending key order only
            every = [key async for key in self._index_keys(s3, prefix, start_after=None)]
            every.reverse()
            keys = _iterate([key for key in every if cursor is None or key < cursor])
        found: list[StoredFile] = []
        batch: list[str] = []
        async with contextlib.aclosing(keys):
            async for key in keys:
                batch.append(_id_of(key, prefix))
                if len(batch) == _META_FETCHES:
                    found += await self._matching(batch, team, purpose)
                    batch = []
                    if len(found) > limit:  # one more than the page: has_more is known
                        break
        found += await self._matching(batch, team, purpose)
        return found[:limit], len(found) > limit

    async def _index_keys(
        self, s3: Any, prefix: str, start_after: str | None
    ) -> AsyncGenerator[str, None]:
        params: dict[str, Any] = {"Bucket": self._bucket, "Prefix": prefix}
        if start_after is not None:
            params["StartAfter"] = start_after
        async for page in s3.get_paginator("list_objects_v2").paginate(**params):
            for item in page.get("Contents", []):
                yield str(item["Key"])

    async def _matching(
        self, ids: Sequence[str], team: str, purpose: str | None
    ) -> Sequence[StoredFile]:
        """Metadata of `ids` (in order), dropping files gone meanwhile or of another purpose."""
        metas = await asyncio.gather(*(self.get(file_id) for file_id in ids))
        return [
            m
            for m in metas
            if m is not None and m.team == team and (purpose is None or m.purpose == purpose)
        ]

    async def read(self, file_id: str) -> AsyncIterator[bytes]:
        if not _ID.fullmatch(file_id):
            raise FileNotFoundError(file_id)
        s3 = await self._ready()
        try:
            got = await s3.get_object(Bucket=self._bucket, Key=_content_key(file_id))
        except s3.exceptions.NoSuchKey:
            raise FileNotFoundError(file_id) from None
        body = got["Body"]
        async with body:
            async for chunk in body.iter_chunks(_READ_CHUNK):
                yield chunk

    async def delete(self, file_id: str) -> bool:
        stored = await self.get(file_id)
        if stored is None:
            return False
        await self._remove(await self._ready(), stored)
        return True

    async def _remove(self, s3: Any, stored: StoredFile) -> None:
        """Unlist first, then the metadata (the file is gone from here on), then the bytes."""
        for key in (_index_key(stored), _meta_key(stored.id), _content_key(stored.id)):
            await s3.delete_object(Bucket=self._bucket, Key=key)

    async def _ready(self) -> Any:
        """The client, once the bucket is known to exist (created when missing)."""
        s3 = self._client
        if s3 is None:
            raise RuntimeError("S3FileStore.start() was not awaited")
        if self._bucket_ready:
            return s3
        async with self._bucket_lock:
            if not self._bucket_ready:
                await self._ensure_bucket(s3)
                self._bucket_ready = True
        return s3

    async def _ensure_bucket(self, s3: Any) -> None:
        try:
            await s3.head_bucket(Bucket=self._bucket)
            return
        except s3.exceptions.ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) not in _MISSING_BUCKET:
                raise
        params: dict[str, Any] = {"Bucket": self._bucket}
        region = s3.meta.region_name
        if region not in (None, "us-east-1", "aws-global"):
            params["CreateBucketConfiguration"] = {"LocationConstraint": region}
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            await s3.create_bucket(**params)
        log.info("file_bucket_created", bucket=self._bucket)


async def _iterate(items: Sequence[str]) -> AsyncGenerator[str, None]:
    for item in items:
        yield item

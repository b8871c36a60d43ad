"""Files API: upload, list, retrieve, download and delete a team's files.

A team sees only its own files: another team's file answers exactly as a missing one does.
Content is streamed both ways and never logged.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Literal, cast

import structlog

from batch.ports import FileStore, FileTooLarge, StoredFile
from gateway.auth import Team
from gateway.errors import ApiError
from schemas.files import FILE_PURPOSES, FileDeleted, FileList, FileObject, FilePurpose

log = structlog.get_logger()

MAX_LIST_LIMIT = 10000


def file_not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No such File object: {file_id}", param="id", code="file_not_found")


def file_object(stored: StoredFile) -> FileObject:
    return FileObject(
        id=stored.id,
        bytes=stored.bytes,
        created_at=stored.created_at,
        filename=stored.filename,
        purpose=cast(FilePurpose, stored.purpose),
    )


def _check_purpose(purpose: str) -> None:
    if purpose not in FILE_PURPOSES:
        allowed = ", ".join(f"'{p}'" for p in sorted(FILE_PURPOSES))
        raise ApiError(
            400,
            f"Invalid value for 'purpose': '{purpose}'. Supported values are: {allowed}.",
            param="purpose",
            code="invalid_value",
        )


async def _chain(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


class FilesService:
    """The Files API over a `FileStore`; uploads are limited to `max_bytes`."""

    def __init__(self, store: FileStore, max_bytes: int) -> None:
        self._store = store
        self.max_bytes = max_bytes

    async def upload(
        self, team: Team, *, filename: str, purpose: str, chunks: AsyncIterable[bytes]
    ) -> FileObject:
        """Store the streamed content: 400 for a bad purpose or an empty file, 413 past
        `max_bytes` (nothing is kept of a refused upload)."""
        _check_purpose(purpose)
        stream = aiter(chunks)
        first = b""
        async for chunk in stream:
            if chunk:
                first = chunk
                break
        if not first:
            raise ApiError(400, "The file is empty.", param="file", code="empty_file")
        try:
            stored = await self._store.create(
                team=team.name,
                filename=filename,
                purpose=purpose,
                chunks=_chain(first, stream),
                max_bytes=self.max_bytes,
            )
        except FileTooLarge as exc:
            log.info("file_too_large", team=team.name, purpose=purpose, limit=exc.limit)
            raise ApiError(
                413,
                f"File is too large: the maximum size is {exc.limit} bytes.",
                param="file",
                code="file_too_large",
            ) from None
        log.info(
            "file_uploaded", team=team.name, file_id=stored.id, purpose=purpose, bytes=stored.bytes
        )
        return file_object(stored)

    async def list(
        self,
        team: Team,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = MAX_LIST_LIMIT,
        order: str = "desc",
    ) -> FileList:
        if purpose is not None:
            _check_purpose(purpose)
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ApiError(
                400,
                f"Invalid value for 'limit': {limit}. It must be between 1 and {MAX_LIST_LIMIT}.",
                param="limit",
                code="invalid_value",
            )
        if order not in ("asc", "desc"):
            raise ApiError(
                400,
                f"Invalid value for 'order': '{order}'. Supported values are: 'asc', 'desc'.",
                param="order",
                code="invalid_value",
            )
        page, has_more = await self._store.list(
            team.name,
            purpose=purpose,
            after=after,
            limit=limit,
            order=cast(Literal["asc", "desc"], order),
        )
        data = [file_object(stored) for stored in page]
        return FileList(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=has_more,
        )

    async def retrieve(self, team: Team, file_id: str) -> FileObject:
        return file_object(await self._owned(team, file_id))

    async def content(self, team: Team, file_id: str) -> tuple[FileObject, AsyncIterator[bytes]]:
        """The file and its content as a stream; its first chunk is already read, so a file
        that vanished is a 404 here, before any response starts."""
        stored = await self._owned(team, file_id)
        chunks = aiter(self._store.read(file_id))
        try:
            first = await anext(chunks, b"")
        except FileNotFoundError:
            raise file_not_found(file_id) from None
        return file_object(stored), _chain(first, chunks)

    async def delete(self, team: Team, file_id: str) -> FileDeleted:
        await self._owned(team, file_id)
        if not await self._store.delete(file_id):
            raise file_not_found(file_id)
        log.info("file_deleted", team=team.name, file_id=file_id)
        return FileDeleted(id=file_id, deleted=True)

    async def _owned(self, team: Team, file_id: str) -> StoredFile:
        stored = await self._store.get(file_id)
        if stored is None or stored.team != team.name:
            raise file_not_found(file_id)
        return stored

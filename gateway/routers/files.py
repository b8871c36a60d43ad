"""`/v1/files`: HTTP only; the logic lives in `FilesService`.

An upload is parsed as it arrives (python-multipart's streaming parser on `request.stream()`)
and its file part is handed on as a stream, so no upload is ever held in memory. OpenAI's
Python SDK sends `purpose` before `file`; a file part that comes first (as from some other
clients) waits in a temporary file on disk until `purpose` is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import Enum
from typing import IO, Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from gateway.auth import Team, current_team
from gateway.errors import ApiError
from gateway.services.files import MAX_LIST_LIMIT, FilesService
from schemas.files import FileDeleted, FileList, FileObject

router = APIRouter()

_FIELD_LIMIT = 1024
"""Bytes of a form field other than the file (`purpose`)."""
_DRAIN_SLACK = 1024 * 1024
"""A refused upload's rest is read and dropped up to the size limit plus this, so the client
can read the error instead of losing the connection while it still sends."""
_SPOOL_CHUNK = 1024 * 1024


async def _service(request: Request) -> FilesService:
    service: FilesService = request.app.state.files_service
    return service


def _bad_form(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


class _Mark(Enum):
    PART_END = "part_end"
    BODY_END = "body_end"


@dataclass(frozen=True)
class _Part:
    name: str
    filename: str | None


class _MultipartReader:
    """Pull-style reading of a multipart/form-data body, parsed chunk by chunk as it arrives.

    The parser's callbacks queue events (a part's start, its data, its end); readers pull
    them, and the body is read only when the queue is empty, so at most one received chunk
    is held at a time.
    """

    def __init__(self, body: AsyncIterator[bytes], boundary: bytes) -> None:
        self._body = body
        self._events: deque[_Part | bytes | _Mark] = deque()
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._ended = False
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._on_part_begin,
                "on_header_field": self._on_header_field,
                "on_header_value": self._on_header_value,
                "on_header_end": self._on_header_end,
                "on_headers_finished": self._on_headers_finished,
                "on_part_data": self._on_part_data,
                "on_part_end": self._on_part_end,
            },
        )

    def _on_part_begin(self) -> None:
        self._disposition = b""

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        filename = options.get(b"filename")
        self._events.append(
            _Part(
                name=options.get(b"name", b"").decode("utf-8", "replace"),
                filename=filename.decode("utf-8", "replace") if filename is not None else None,
            )
        )

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if end > start:
            self._events.append(data[start:end])

    def _on_part_end(self) -> None:
        self._events.append(_Mark.PART_END)

    async def _next_event(self) -> _Part | bytes | _Mark:
        while not self._events:
            if self._ended:
                return _Mark.BODY_END
            chunk = await anext(self._body, None)
            try:
                if chunk is None:
                    self._ended = True
                    self._parser.finalize()
                    if self._parser.state != MultipartState.END:
                        raise _bad_form("The multipart/form-data body ended early.")
                elif chunk:
                    self._parser.write(chunk)
            except FormParserError:
                self._ended = True
                raise _bad_form("Could not parse the multipart/form-data body.") from None
        return self._events.popleft()

    async def next_part(self) -> _Part | None:
        """The next part's name and filename (the rest of the current part is skipped), or
        None at the end of the body."""
        while True:
            event = await self._next_event()
            if event is _Mark.BODY_END:
                return None
            if isinstance(event, _Part):
                return event

    async def data(self) -> AsyncIterator[bytes]:
        """The current part's content, chunk by chunk; a body cut short is an error, so a
        truncated upload is never stored."""
        while True:
            event = await self._next_event()
            if isinstance(event, bytes):
                yield event
            elif event is _Mark.PART_END:
                return
            else:  # only after a refused body (`_next_event` raised already): refuse again
                raise _bad_form("The multipart/form-data body ended early.")

    async def value(self, name: str) -> str:
        """The current part as a short text field."""
        value = bytearray()
        async for chunk in self.data():
            value += chunk
            if len(value) > _FIELD_LIMIT:
                raise _bad_form(f"The '{name}' field is too long.", param=name)
        return value.decode("utf-8", "replace").strip()

    async def drain(self, limit: int) -> None:
        """Read and drop what is left of the body, up to `limit` bytes; errors are ignored."""
        with contextlib.suppress(Exception):
            left = limit
            while left > 0 and (event := await self._next_event()) is not _Mark.BODY_END:
                if isinstance(event, bytes):
                    left -= len(event)


class _Spool:
    """A file part kept on disk (not in memory) until the form's `purpose` is known."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file

    @classmethod
    async def fill(cls, chunks: AsyncIterator[bytes], limit: int) -> _Spool:
        """Spool chunks; stop past `limit` bytes, which is enough for the upload to be refused
        as too large (the rest of the part is skipped by the reader)."""
        spool = cls(await asyncio.to_thread(tempfile.TemporaryFile))
        size = 0
        try:
            async for chunk in chunks:
                await asyncio.to_thread(spool._file.write, chunk)
                size += len(chunk)
                if size > limit:
                    break
        except BaseException:
            spool.close()
            raise
        return spool

    async def chunks(self) -> AsyncIterator[bytes]:
        await asyncio.to_thread(self._file.seek, 0)
        while chunk := await asyncio.to_thread(self._file.read, _SPOOL_CHUNK):
            yield chunk

    def close(self) -> None:
        self._file.close()


def _boundary(content_type: str | None) -> bytes:
    kind, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise _bad_form("Expected a multipart/form-data body with the fields 'file' and 'purpose'.")
    return boundary


async def _upload(form: _MultipartReader, team: Team, service: FilesService) -> FileObject:
    purpose: str | None = None
    filename: str | None = None
    spool: _Spool | None = None
    try:
        while (part := await form.next_part()) is not None:
            if part.name == "purpose":
                purpose = await form.value("purpose")
            elif part.name == "file" and filename is None:
                filename = part.filename or "file"
                if purpose is not None:
                    return await service.upload(
                        team, filename=filename, purpose=purpose, chunks=form.data()
                    )
                spool = await _Spool.fill(form.data(), service.max_bytes)
            if spool is not None and purpose is not None:
                break
        if filename is None:
            raise _bad_form("Missing required parameter: 'file'.", param="file")
        if purpose is None or spool is None:
            raise _bad_form("Missing required parameter: 'purpose'.", param="purpose")
        return await service.upload(team, filename=filename, purpose=purpose, chunks=spool.chunks())
    finally:
        if spool is not None:
            spool.close()


@router.post("/v1/files")
async def create_file(
    request: Request,
    team: Annotated[Team, Depends(current_team)],
    service: Annotated[FilesService, Depends(_service)],
) -> FileObject:
    form = _MultipartReader(request.stream(), _boundary(request.headers.get("content-type")))
    try:
        created = await _upload(form, team, service)
    except Exception:
        await form.drain(service.max_bytes + _DRAIN_SLACK)
        raise
    await form.drain(_FIELD_LIMIT * 16)  # fields after the file are ignored
    return created


@router.get("/v1/files")
async def list_files(
    team: Annotated[Team, Depends(current_team)],
    service: Annotated[FilesService, Depends(_service)],
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = MAX_LIST_LIMIT,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> FileList:
    return await service.list(team, purpose=purpose, after=after, limit=limit, order=order)


@router.get("/v1/files/{file_id}")
async def retrieve_file(
    file_id: str,
    team: Annotated[Team, Depends(current_team)],
    service: Annotated[FilesService, Depends(_service)],
) -> FileObject:
    return await service.retrieve(team, file_id)


@router.get(
    "/v1/files/{file_id}/content",
    response_model=None,
    responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}},
)
async def file_content(
    file_id: str,
    team: Annotated[Team, Depends(current_team)],
    service: Annotated[FilesService, Depends(_service)],
) -> StreamingResponse:
    file, chunks = await service.content(team, file_id)
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"Content-Length": str(file.bytes)},
    )


@router.delete("/v1/files/{file_id}")
async def delete_file(
    file_id: str,
    team: Annotated[Team, Depends(current_team)],
    service: Annotated[FilesService, Depends(_service)],
) -> FileDeleted:
    return await service.delete(team, file_id)

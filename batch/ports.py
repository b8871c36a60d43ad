"""Ports of the Files and Batch APIs: where uploaded files live, as a protocol.

`batch.s3_files.S3FileStore` implements it; services depend only on this module.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True)
class StoredFile:
    """A stored file's metadata (its content is read with `FileStore.read`)."""

    id: str
    """"file-" + 24 hex chars."""
    team: str
    """The team that owns it; no other team sees it."""
    filename: str
    purpose: str
    bytes: int
    created_at: int
    """Unix seconds."""


class FileTooLarge(Exception):
    """An upload went past its size limit; nothing of it was kept."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"file larger than {limit} bytes")
        self.limit = limit


class FileStore(Protocol):
    """Files by id, each owned by one team, listed per team in `created_at` order."""

    async def create(
        self,
        *,
        team: str,
        filename: str,
        purpose: str,
        chunks: AsyncIterable[bytes],
        max_bytes: int,
    ) -> StoredFile:
        """Stream chunks into a new object (multipart upload, 8 MiB parts, never the whole
        file in memory); abort the upload and raise FileTooLarge past max_bytes."""
        ...

    async def get(self, file_id: str) -> StoredFile | None:
        """The file's metadata, or None when there is no such file."""
        ...

    async def list(
        self,
        team: str,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
    ) -> tuple[list[StoredFile], bool]:
        """One page of the team's files by `created_at` (then id), and whether more follow.

        `after` is the id of the last file of the previous page (a cursor), `purpose` keeps
        only files of that purpose. A cursor that is not one of the team's files gives an
        empty page.
        """
        ...

    def read(self, file_id: str) -> AsyncIterator[bytes]:
        """The content, streamed in chunks (FileNotFoundError when there is no such file)."""
        ...

    async def delete(self, file_id: str) -> bool:
        """Remove the file; False when there was no such file."""
        ...


async def iter_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The lines of a byte stream, split on b"\\n", without line endings (b"\\r\\n" counts as
    one). Empty lines are kept (line numbers stay right); a final line without b"\\n" is
    yielded; a stream ending in b"\\n" has no empty line after it."""
    buf = bytearray()
    async for chunk in chunks:
        scan = len(buf)  # the buffer holds no b"\n" before this point
        buf += chunk
        start = 0
        while (newline := buf.find(b"\n", scan)) >= 0:
            end = newline - 1 if newline > start and buf[newline - 1] == 0x0D else newline
            yield bytes(buf[start:end])
            start = scan = newline + 1
        if start:
            del buf[:start]
    if buf:
        yield bytes(buf)

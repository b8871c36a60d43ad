"""Model weights on a worker's node: fetched from object storage once per node into a local
cache, and never handed to the engine before their digest matches the deployment's `sha256`.

The digest of a weights folder (`folder_digest`) is defined so that it is the same for files
on disk and for the same files in object storage under a prefix:

    SHA-256 over the lines "{relative path}\\t{SHA-256 of the file's bytes}\\n" (both hashes
    in lowercase hex, the path relative to the folder with "/" separators, UTF-8), one line
    per regular file below the folder at any depth (a link to a file counts as that file;
    links to folders are not followed; folders themselves add nothing), sorted by relative
    path (as strings, by code point).

So renaming, adding or removing a file, or changing any byte of one, changes the digest; the
order files are listed or downloaded in does not. `llmq weights digest` prints it.

The cache (`WeightsCache`) keeps verified weights in `<root>/<sha256>/`, marked verified by
`<root>/<sha256>.verified` (written after the folder is in place). A second worker on the
node finds the marker and downloads nothing; workers starting together serialize on an
exclusive `flock` of `<root>/<sha256>.lock`, so one downloads and the others then find it.
Object storage is behind the `WeightsSource` port (`workers.s3_weights.S3WeightsSource`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path, PurePosixPath
from typing import Protocol

import structlog

log = structlog.get_logger()

_READ_CHUNK = 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")


class WeightsError(RuntimeError):
    """Weights that must not be served: missing, unsafe to place, or not what was pinned."""


class WeightsMismatch(WeightsError):
    """The weights' digest is not the deployment's `sha256`."""

    def __init__(self, where: str, expected: str, actual: str) -> None:
        super().__init__(
            f"weights at {where} do not match their sha256: expected {expected}, got {actual}"
        )
        self.where = where
        self.expected = expected
        self.actual = actual


class WeightsSource(Protocol):
    """Object storage holding weights folders (one folder per `uri` prefix)."""

    async def list(self, uri: str) -> list[tuple[str, int]]:
        """Every object under `uri`: (its path relative to `uri`, "/"-separated; its size)."""
        ...

    async def download(self, uri: str, relative_path: str, dest: Path) -> None:
        """Write the object at `relative_path` under `uri` to the file `dest`."""
        ...


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes (lowercase hex), read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def digest_of(entries: Iterable[tuple[str, str]]) -> str:
    """The folder digest of (relative posix path, file sha256) pairs, in any order."""
    digest = hashlib.sha256()
    for relative, sha256 in sorted(entries):
        digest.update(f"{relative}\t{sha256}\n".encode())
    return digest.hexdigest()


def regular_files(folder: Path) -> list[str]:
    """The relative posix paths of every regular file below `folder`."""
    if not folder.is_dir():
        raise WeightsError(f"weights folder {folder} does not exist")
    found: list[str] = []
    for parent, _dirs, names in os.walk(folder):
        for name in names:
            path = Path(parent, name)
            if path.is_file():
                found.append(path.relative_to(folder).as_posix())
    return found


def folder_digest(folder: Path) -> str:
    """The digest of the weights in `folder` (defined in this module's docstring)."""
    return digest_of(
        (relative, file_sha256(folder / relative)) for relative in regular_files(folder)
    )


def verify_folder(folder: Path, sha256: str) -> None:
    """Raise `WeightsMismatch` unless the digest of `folder` is `sha256` (local weights)."""
    started = time.monotonic()
    actual = folder_digest(folder)
    if actual != sha256:
        raise WeightsMismatch(str(folder), sha256, actual)
    log.info(
        "weights_verified",
        path=str(folder),
        sha256=sha256[:12],
        seconds=round(time.monotonic() - started, 3),
    )


def _safe_relative(relative: str) -> PurePosixPath:
    """`relative` as a path that stays below the folder it is placed in."""
    path = PurePosixPath(relative)
    if not relative or path.is_absolute() or any(part in ("", ".", "..") for part in path.parts):
        raise WeightsError(f"refusing to place a weights file at {relative!r}")
    return path


@contextlib.asynccontextmanager
async def _exclusive(lock_path: Path) -> AsyncIterator[None]:
    """Hold an exclusive `flock` of `lock_path`, waited for in a thread (the loop runs on)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    acquiring = asyncio.ensure_future(asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX))
    try:
        await asyncio.shield(acquiring)
    except BaseException:
        # The thread may still get the lock: release it (close the file) once it returns.
        acquiring.add_done_callback(lambda _: os.close(fd))
        raise
    try:
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


class WeightsCache:
    """Verified weights folders on this node, under `root`, fetched from `source`."""

    def __init__(self, root: Path, source: WeightsSource) -> None:
        self._root = root
        self._source = source

    def folder(self, sha256: str) -> Path:
        """Where the weights with digest `sha256` are (once verified)."""
        return self._root / sha256

    def _marker(self, sha256: str) -> Path:
        return self._root / f"{sha256}.verified"

    def _verified(self, sha256: str) -> bool:
        return self._marker(sha256).exists() and self.folder(sha256).is_dir()

    async def ensure(self, uri: str, sha256: str) -> Path:
        """The local folder of the weights at `uri`, downloaded (once per node) and verified
        against `sha256`; raises `WeightsMismatch` (and keeps nothing) when they differ."""
        if not _SHA256.fullmatch(sha256):
            raise WeightsError(f"not a sha256 (64 lowercase hex digits): {sha256!r}")
        if self._verified(sha256):
            log.info("weights_cached", uri=uri, sha256=sha256[:12])
            return self.folder(sha256)
        self._root.mkdir(parents=True, exist_ok=True)
        async with _exclusive(self._root / f"{sha256}.lock"):
            if self._verified(sha256):  # another worker fetched them meanwhile
                log.info("weights_cached", uri=uri, sha256=sha256[:12])
                return self.folder(sha256)
            await asyncio.to_thread(self._clear_leftovers, sha256)
            await self._fetch(uri, sha256)
        return self.folder(sha256)

    def _clear_leftovers(self, sha256: str) -> None:
        """Remove what an interrupted fetch left (only ever called holding the lock)."""
        for leftover in self._root.glob(f"{sha256}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        shutil.rmtree(self.folder(sha256), ignore_errors=True)  # renamed, never marked

    async def _fetch(self, uri: str, sha256: str) -> None:
        started = time.monotonic()
        listed = await self._source.list(uri)
        if not listed:
            raise WeightsError(f"no weights under {uri}")
        temporary = self._root / f"{sha256}.tmp-{secrets.token_hex(4)}"
        try:
            for relative, _size in listed:
                dest = temporary / _safe_relative(relative)
                dest.parent.mkdir(parents=True, exist_ok=True)
                await self._source.download(uri, relative, dest)
            actual = await asyncio.to_thread(folder_digest, temporary)
            if actual != sha256:
                raise WeightsMismatch(uri, sha256, actual)
            temporary.rename(self.folder(sha256))
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        self._marker(sha256).write_text(uri + "\n")
        log.info(
            "weights_downloaded",
            uri=uri,
            sha256=sha256[:12],
            bytes=sum(size for _relative, size in listed),
            seconds=round(time.monotonic() - started, 3),
        )

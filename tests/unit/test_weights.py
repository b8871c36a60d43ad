"""Weights: the folder digest, the node cache (downloads once, refuses a wrong digest) over an
in-memory source, and the check of a local folder."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from schemas.messages import AdapterRef
from workers.adapter_folders import AdapterFolders
from workers.weights import (
    WeightsCache,
    WeightsError,
    WeightsMismatch,
    digest_of,
    folder_digest,
    verify_folder,
)

FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": bytes(range(256)) * 64,
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
}
URI = "mem://weights/m1"
ONE_BYTE_OFF = bytearray(FILES["model.safetensors"])
ONE_BYTE_OFF[1000] ^= 1


def write_folder(root: Path, files: dict[str, bytes]) -> Path:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def expected_digest(files: dict[str, bytes]) -> str:
    lines = "".join(
        f"{relative}\t{hashlib.sha256(files[relative]).hexdigest()}\n" for relative in sorted(files)
    )
    return hashlib.sha256(lines.encode()).hexdigest()


class MemorySource:
    """A `WeightsSource` of objects in a dict ({uri: {relative path: bytes}})."""

    def __init__(self, folders: dict[str, dict[str, bytes]]) -> None:
        self.folders = folders
        self.downloads: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def list(self, uri: str) -> list[tuple[str, int]]:
        return [(relative, len(data)) for relative, data in self.folders.get(uri, {}).items()]

    async def download(self, uri: str, relative_path: str, dest: Path) -> None:
        self.started.set()
        await self.release.wait()
        self.downloads.append(relative_path)
        await asyncio.to_thread(dest.write_bytes, self.folders[uri][relative_path])


def test_digest_is_the_documented_one_and_order_independent(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", FILES)
    assert folder_digest(folder) == expected_digest(FILES)
    pairs = [(r, hashlib.sha256(d).hexdigest()) for r, d in FILES.items()]
    assert digest_of(pairs) == digest_of(reversed(pairs)) == folder_digest(folder)
    reordered = write_folder(tmp_path / "r", dict(reversed(FILES.items())))
    assert folder_digest(reordered) == folder_digest(folder)


@pytest.mark.parametrize(
    "changed",
    [
        {**FILES, "model.safetensors": bytes(ONE_BYTE_OFF)},
        {**FILES, "config.json": FILES["config.json"] + b" "},
        {**{k: v for k, v in FILES.items() if k != "config.json"}, "Config.json": b"x"},
        {**{k: v for k, v in FILES.items() if k != "config.json"}, "sub/config.json": b"x"},
        {**FILES, "extra.bin": b""},
        {k: v for k, v in FILES.items() if k != "config.json"},
    ],
    ids=["one-byte", "appended", "renamed", "moved", "added", "removed"],
)
def test_digest_changes_with_any_byte_or_name(tmp_path: Path, changed: dict[str, bytes]) -> None:
    original = folder_digest(write_folder(tmp_path / "a", FILES))
    assert folder_digest(write_folder(tmp_path / "b", changed)) != original


async def test_ensure_downloads_once_per_node(tmp_path: Path) -> None:
    sha256 = expected_digest(FILES)
    source = MemorySource({URI: FILES})
    cache = WeightsCache(tmp_path / "cache", source)
    folder = await cache.ensure(URI, sha256)
    assert folder == tmp_path / "cache" / sha256
    assert sorted(source.downloads) == sorted(FILES)
    assert folder_digest(folder) == sha256
    assert (folder / "tokenizer/tokenizer.json").read_bytes() == FILES["tokenizer/tokenizer.json"]
    source.downloads.clear()
    assert await cache.ensure(URI, sha256) == folder
    other_worker = WeightsCache(tmp_path / "cache", source)
    assert await other_worker.ensure(URI, sha256) == folder
    assert source.downloads == []
    assert names(tmp_path / "cache") == [sha256, f"{sha256}.lock", f"{sha256}.verified"]


async def test_workers_starting_together_download_once(tmp_path: Path) -> None:
    sha256 = expected_digest(FILES)
    source = MemorySource({URI: FILES})
    source.release.clear()
    first = asyncio.create_task(WeightsCache(tmp_path, source).ensure(URI, sha256))
    second = asyncio.create_task(WeightsCache(tmp_path, source).ensure(URI, sha256))
    # Both reach the lock before either holds it; the holder's download then waits here.
    await source.started.wait()
    source.release.set()
    assert await first == await second == tmp_path / sha256
    assert sorted(source.downloads) == sorted(FILES)


async def test_a_wrong_digest_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    pinned = expected_digest(FILES)
    tampered = {**FILES, "model.safetensors": b"evil"}
    cache = WeightsCache(tmp_path, MemorySource({URI: tampered}))
    with pytest.raises(WeightsMismatch) as refused:
        await cache.ensure(URI, pinned)
    assert refused.value.expected == pinned
    assert refused.value.actual == expected_digest(tampered)
    assert pinned in str(refused.value) and URI in str(refused.value)
    assert names(tmp_path) == [f"{pinned}.lock"]


async def test_unsafe_paths_bad_digests_and_empty_prefixes_are_refused(tmp_path: Path) -> None:
    sha256 = expected_digest(FILES)
    escaping = MemorySource({URI: {"../outside.bin": b"x"}})
    with pytest.raises(WeightsError, match="refusing to place"):
        await WeightsCache(tmp_path / "c", escaping).ensure(URI, sha256)
    assert not (tmp_path / "outside.bin").exists()
    with pytest.raises(WeightsError, match="no weights under"):
        await WeightsCache(tmp_path / "c", MemorySource({})).ensure(URI, sha256)
    with pytest.raises(WeightsError, match="not a sha256"):
        await WeightsCache(tmp_path / "c", MemorySource({})).ensure(URI, "../etc")


async def test_an_interrupted_fetch_is_fetched_again(tmp_path: Path) -> None:
    sha256 = expected_digest(FILES)
    (tmp_path / f"{sha256}.tmp-dead").mkdir()  # a download cut short
    write_folder(tmp_path / sha256, {"config.json": b"half"})  # renamed, never marked
    source = MemorySource({URI: FILES})
    folder = await WeightsCache(tmp_path, source).ensure(URI, sha256)
    assert folder_digest(folder) == sha256
    assert sorted(source.downloads) == sorted(FILES)
    assert not (tmp_path / f"{sha256}.tmp-dead").exists()


def test_verify_folder_refuses_a_tampered_folder(tmp_path: Path) -> None:
    folder = write_folder(tmp_path, FILES)
    sha256 = folder_digest(folder)
    verify_folder(folder, sha256)
    (folder / "tokenizer" / "tokenizer.json").write_bytes(b'{"version": "1.1"}')
    with pytest.raises(WeightsMismatch) as refused:
        verify_folder(folder, sha256)
    assert refused.value.expected == sha256
    assert refused.value.actual == folder_digest(folder) != sha256


def test_a_worker_never_builds_an_engine_on_unverified_weights(tmp_path: Path) -> None:
    from workers.main import WEIGHTS_EXIT_CODE, run_worker
    from workers.settings import WorkerSettings

    folder = write_folder(tmp_path / "m", FILES)
    wrong = expected_digest({**FILES, "config.json": b"{}"})
    for settings in (
        WorkerSettings(engine="vllm", model_path=str(folder), weights_sha256=wrong),
        WorkerSettings(engine="vllm", model_path=str(folder), weights_uri="s3://b/m"),  # no sha
    ):
        with pytest.raises(SystemExit) as exited:
            run_worker(settings)  # would build vLLM next: it must exit first
        assert exited.value.code == WEIGHTS_EXIT_CODE


async def test_the_engine_loads_a_verified_local_folder(tmp_path: Path) -> None:
    from workers.main import weights_folder
    from workers.settings import WorkerSettings

    folder = write_folder(tmp_path / "m", FILES)
    settings = WorkerSettings(model_path=str(folder), weights_sha256=expected_digest(FILES))
    assert await weights_folder(settings) == str(folder)


async def test_an_adapter_is_fetched_once_however_many_jobs_ask_and_again_after_a_failure(
    tmp_path: Path,
) -> None:
    digest = expected_digest(FILES)
    source = MemorySource({URI: FILES})
    source.release.clear()
    folders = AdapterFolders(tmp_path, source)
    adapter = AdapterRef(id="team-a/x", weights_uri=URI, sha256=digest, rank=8)
    asking = [asyncio.ensure_future(folders.folder(adapter)) for _ in range(3)]
    await source.started.wait()
    source.release.set()
    assert {await job for job in asking} == {tmp_path / digest}
    assert sorted(source.downloads) == sorted(FILES)  # one fetch for three jobs
    missing = AdapterRef(id="team-a/y", weights_uri="s3://b/nothing", sha256="c" * 64, rank=8)
    for _ in range(2):  # a failed fetch is not remembered: the next job tries again
        with pytest.raises(WeightsError):
            await folders.folder(missing)
    source.folders["s3://b/nothing"] = FILES
    with pytest.raises(WeightsMismatch):
        await folders.folder(missing)

"""Files: `S3FileStore` on the real moto S3 server, and `/v1/files` through the OpenAI SDK
against a real uvicorn server."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import aioboto3
import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI

from batch.ports import FileTooLarge, StoredFile
from batch.s3_files import PART_SIZE, S3FileStore
from gateway.app import create_app
from gateway.auth import ApiKeyAuthenticator
from gateway.errors import install_error_handlers
from gateway.routers import files
from gateway.services.files import FilesService
from gateway.settings import GatewaySettings
from llmq import services

pytestmark = pytest.mark.integration

KEY_A, KEY_B = "sk-files-a", "sk-files-b"
MAX_BYTES = 64 * 1024


def _session() -> aioboto3.Session:
    return aioboto3.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )


async def _chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def _read(store: S3FileStore, file_id: str) -> bytes:
    return b"".join([chunk async for chunk in store.read(file_id)])


@pytest.fixture
async def bucket() -> str:
    return f"llmq-files-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def store(s3_endpoint: str, bucket: str) -> AsyncIterator[S3FileStore]:
    s = S3FileStore(_session(), bucket, s3_endpoint)
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def s3(s3_endpoint: str) -> AsyncIterator[Any]:
    """A plain S3 client, to look at what the store left in its bucket."""
    async with _session().client("s3", endpoint_url=s3_endpoint) as client:
        yield client


async def _keys(s3: Any, bucket: str) -> list[str]:
    listed = await s3.list_objects_v2(Bucket=bucket)
    return sorted(item["Key"] for item in listed.get("Contents", []))


async def _uploads_in_progress(s3: Any, bucket: str) -> list[Any]:
    listed = await s3.list_multipart_uploads(Bucket=bucket)
    return list(listed.get("Uploads", []))


# --- the store ---------------------------------------------------------------------------------


async def test_create_get_read_delete(store: S3FileStore, s3: Any, bucket: str) -> None:
    data = b'{"custom_id": "1"}\n{"custom_id": "2"}\n'
    stored = await store.create(
        team="alpha", filename="in.jsonl", purpose="batch", chunks=_chunks(data), max_bytes=1000
    )
    assert stored.id.startswith("file-") and len(stored.id) == 5 + 24
    assert (stored.team, stored.filename, stored.purpose, stored.bytes) == (
        "alpha",
        "in.jsonl",
        "batch",
        len(data),
    )
    assert await store.get(stored.id) == stored
    assert await _read(store, stored.id) == data
    assert await _keys(s3, bucket) == [
        f"files/{stored.id}/content",
        f"files/{stored.id}/meta.json",
        f"teams/alpha/files/{stored.created_at:010d}-{stored.id}",
    ]

    assert await store.delete(stored.id) is True
    assert await store.get(stored.id) is None
    assert await store.delete(stored.id) is False
    assert await _keys(s3, bucket) == []
    with pytest.raises(FileNotFoundError):
        await _read(store, stored.id)


async def test_unknown_and_malformed_ids(store: S3FileStore) -> None:
    for file_id in ["file-" + "0" * 24, "file-nope", "../meta.json", ""]:
        assert await store.get(file_id) is None
        assert await store.delete(file_id) is False
        with pytest.raises(FileNotFoundError):
            await _read(store, file_id)


async def test_large_file_goes_up_in_parts(store: S3FileStore) -> None:
    data = os.urandom(2 * PART_SIZE + 12345)
    stored = await store.create(
        team="alpha",
        filename="big.bin",
        purpose="user_data",
        chunks=_chunks(data, 1024 * 1024 - 7),
        max_bytes=len(data),
    )
    assert stored.bytes == len(data)
    got = await _read(store, stored.id)
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize("size", [101, PART_SIZE + 1024 * 1024])
async def test_too_large_is_aborted_and_leaves_nothing(
    store: S3FileStore, s3: Any, bucket: str, size: int
) -> None:
    limit = size - 1 if size < PART_SIZE else PART_SIZE + 100
    with pytest.raises(FileTooLarge) as info:
        await store.create(
            team="alpha",
            filename="x.jsonl",
            purpose="batch",
            chunks=_chunks(b"x" * size, 256 * 1024),
            max_bytes=limit,
        )
    assert info.value.limit == limit
    assert await _keys(s3, bucket) == []
    assert await _uploads_in_progress(s3, bucket) == []
    assert await store.list("alpha") == ([], False)


async def test_a_failing_stream_leaves_nothing(store: S3FileStore, s3: Any, bucket: str) -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield b"x" * PART_SIZE
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await store.create(
            team="alpha", filename="x", purpose="batch", chunks=broken(), max_bytes=10 * PART_SIZE
        )
    assert await _keys(s3, bucket) == []
    assert await _uploads_in_progress(s3, bucket) == []


async def _create_many(store: S3FileStore, team: str, purposes: list[str]) -> list[StoredFile]:
    made = []
    for n, purpose in enumerate(purposes):
        made.append(
            await store.create(
                team=team,
                filename=f"{n}.jsonl",
                purpose=purpose,
                chunks=_chunks(b"%d\n" % n),
                max_bytes=100,
            )
        )
    return sorted(made, key=lambda f: (f.created_at, f.id))


async def test_list_orders_and_pages(store: S3FileStore) -> None:
    made = await _create_many(store, "alpha", ["batch"] * 20 + ["user_data"] * 5)
    asc = [f.id for f in made]

    page, more = await store.list("alpha", order="asc")
    assert [f.id for f in page] == asc and more is False
    page, more = await store.list("alpha")  # newest first by default
    assert [f.id for f in page] == asc[::-1] and more is False
    assert page[0] == made[-1]

    orders: list[tuple[Literal["asc", "desc"], list[str]]] = [("asc", asc), ("desc", asc[::-1])]
    for order, expected in orders:
        seen: list[str] = []
        after: str | None = None
        while True:
            page, more = await store.list("alpha", after=after, limit=7, order=order)
            assert len(page) <= 7
            seen += [f.id for f in page]
            if not more:
                break
            after = page[-1].id
        assert seen == expected

    batch_only = [f.id for f in made if f.purpose == "batch"]
    page, more = await store.list("alpha", purpose="batch", order="asc", limit=19)
    assert [f.id for f in page] == batch_only[:19] and more is True
    page, more = await store.list("alpha", purpose="batch", order="asc", after=page[-1].id)
    assert [f.id for f in page] == batch_only[19:] and more is False
    page, more = await store.list("alpha", purpose="user_data", limit=5)
    assert len(page) == 5 and more is False
    assert await store.list("alpha", purpose="vision") == ([], False)
    assert await store.list("alpha", after="file-" + "f" * 24) == ([], False)


async def test_teams_are_isolated(store: S3FileStore) -> None:
    (a,) = await _create_many(store, "alpha", ["batch"])
    (b,) = await _create_many(store, "beta", ["batch"])
    assert [f.id for f in (await store.list("alpha"))[0]] == [a.id]
    assert [f.id for f in (await store.list("beta"))[0]] == [b.id]
    assert await store.list("gamma") == ([], False)
    assert await store.list("beta", after=a.id) == ([], False)  # another team's cursor
    assert await store.get(a.id) == a


async def test_start_creates_the_bucket_once(s3_endpoint: str, s3: Any, bucket: str) -> None:
    first, second = (
        S3FileStore(_session(), bucket, s3_endpoint),
        S3FileStore(_session(), bucket, s3_endpoint),
    )
    await first.start()
    await second.start()  # the bucket exists already: fine
    try:
        await s3.head_bucket(Bucket=bucket)
        made = await first.create(
            team="t", filename="f", purpose="batch", chunks=_chunks(b"x"), max_bytes=10
        )
        assert await second.get(made.id) == made
    finally:
        await first.stop()
        await second.stop()


# --- the HTTP API through the OpenAI SDK -------------------------------------------------------


@contextlib.asynccontextmanager
async def _serve(app: FastAPI) -> AsyncIterator[str]:
    """Run `app` on uvicorn on a free loopback port; yields its base URL."""
    port = services.free_port()
    config = uvicorn.Config(app, host=services.LOCALHOST, port=port, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.01)
    try:
        yield f"http://{services.LOCALHOST}:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def base_url(store: S3FileStore) -> AsyncIterator[str]:
    app = FastAPI()
    app.state.authenticator = ApiKeyAuthenticator({KEY_A: "alpha", KEY_B: "beta"})
    app.state.files_service = FilesService(store, MAX_BYTES)
    install_error_handlers(app)
    app.include_router(files.router)
    async with _serve(app) as url:
        yield url


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=KEY_A, max_retries=0) as c:
        yield c


@pytest.fixture
async def other_team(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=KEY_B, max_retries=0) as c:
        yield c


BATCH_INPUT = b"".join(
    json.dumps(
        {
            "custom_id": f"r{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": f"hi {n}"}]},
        }
    ).encode()
    + b"\n"
    for n in range(3)
)


async def test_sdk_round_trip(client: openai.AsyncOpenAI) -> None:
    created = await client.files.create(
        file=("x.jsonl", BATCH_INPUT, "application/jsonl"), purpose="batch"
    )
    assert created.object == "file" and created.id.startswith("file-")
    assert (created.filename, created.purpose, created.bytes) == (
        "x.jsonl",
        "batch",
        len(BATCH_INPUT),
    )
    assert created.status == "processed"

    assert await client.files.retrieve(created.id) == created
    listed = await client.files.list()
    assert [f.id for f in listed.data] == [created.id]
    assert listed.has_more is False
    assert [f.id for f in (await client.files.list(purpose="batch")).data] == [created.id]
    assert (await client.files.list(purpose="user_data")).data == []

    content = await client.files.content(created.id)
    assert content.read() == BATCH_INPUT
    assert content.response.headers["content-type"] == "application/octet-stream"

    deleted = await client.files.delete(created.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (created.id, True, "file")
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(created.id)
    assert (await client.files.list()).data == []


async def test_sdk_pages_through_every_file(client: openai.AsyncOpenAI) -> None:
    ids = set()
    for n in range(5):
        made = await client.files.create(file=(f"{n}.jsonl", b"%d\n" % n), purpose="user_data")
        ids.add(made.id)
    page = await client.files.list(limit=2, order="asc")
    assert len(page.data) == 2 and page.has_more is True
    seen = [f.id async for f in client.files.list(limit=2, order="asc")]
    assert len(seen) == 5 and set(seen) == ids
    seen_desc = [f.id async for f in client.files.list(limit=3)]
    assert seen_desc == seen[::-1]


async def test_another_teams_file_is_not_found(
    client: openai.AsyncOpenAI, other_team: openai.AsyncOpenAI
) -> None:
    created = await client.files.create(file=("x.jsonl", BATCH_INPUT), purpose="batch")
    missing = "file-" + "0" * 24
    for file_id in (created.id, missing):
        with pytest.raises(openai.NotFoundError) as info:
            await other_team.files.retrieve(file_id)
        assert info.value.code == "file_not_found"
        assert info.value.body == {
            "message": f"No such File object: {file_id}",
            "type": "invalid_request_error",
            "param": "id",
            "code": "file_not_found",
        }
        with pytest.raises(openai.NotFoundError):
            await other_team.files.content(file_id)
        with pytest.raises(openai.NotFoundError):
            await other_team.files.delete(file_id)
    assert (await other_team.files.list()).data == []
    assert (await client.files.retrieve(created.id)).id == created.id  # still there


async def test_too_large_is_413_and_nothing_is_kept(
    client: openai.AsyncOpenAI, store: S3FileStore
) -> None:
    for size in (MAX_BYTES + 1, 20 * MAX_BYTES):
        with pytest.raises(openai.APIStatusError) as info:
            await client.files.create(file=("big.jsonl", b"x" * size), purpose="batch")
        assert info.value.status_code == 413
        assert info.value.code == "file_too_large"
    assert await store.list("alpha") == ([], False)
    at_limit = await client.files.create(file=("ok.jsonl", b"x" * MAX_BYTES), purpose="batch")
    assert at_limit.bytes == MAX_BYTES


async def test_bad_uploads_are_400(client: openai.AsyncOpenAI, store: S3FileStore) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.files.create(file=("x.jsonl", b"{}\n"), purpose="evals")
    assert info.value.param == "purpose"
    with pytest.raises(openai.BadRequestError) as info:
        await client.files.create(file=("x.jsonl", b""), purpose="batch")
    assert info.value.param == "file"
    for params in ({"limit": 0}, {"limit": 10001}, {"order": "up"}, {"purpose": "nope"}):
        with pytest.raises(openai.BadRequestError) as info:
            await client.files.list(**params)
        assert info.value.param == next(iter(params))
    assert await store.list("alpha") == ([], False)


def _multipart(parts: list[tuple[str, str | None, bytes]], boundary: str) -> bytes:
    out = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


async def _post_form(base_url: str, body: bytes, boundary: str = "b0undary") -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.post(
            f"{base_url}/v1/files",
            content=body,
            headers={
                "Authorization": f"Bearer {KEY_A}",
                "Content-Type": f"multipart/form-data; boundary={boundary}",
            },
        )


async def test_file_before_purpose_and_extra_fields(
    base_url: str, client: openai.AsyncOpenAI
) -> None:
    body = _multipart(
        [
            ("file", "first.jsonl", BATCH_INPUT),
            ("expires_after[anchor]", None, b"created_at"),
            ("purpose", None, b"batch"),
            ("other", None, b"ignored"),
        ],
        "b0undary",
    )
    response = await _post_form(base_url, body)
    assert response.status_code == 200, response.text
    made = response.json()
    assert (made["filename"], made["purpose"], made["bytes"]) == (
        "first.jsonl",
        "batch",
        len(BATCH_INPUT),
    )
    assert (await client.files.content(made["id"])).read() == BATCH_INPUT

    too_big = _multipart(
        [("file", "big", b"x" * (MAX_BYTES + 1)), ("purpose", None, b"batch")], "b"
    )
    response = await _post_form(base_url, too_big, "b")
    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"


@pytest.mark.parametrize(
    ("body", "content_type", "param"),
    [
        (_multipart([("purpose", None, b"batch")], "b"), "multipart/form-data; boundary=b", "file"),
        (_multipart([("file", "f", b"x")], "b"), "multipart/form-data; boundary=b", "purpose"),
        (b'{"purpose": "batch"}', "application/json", None),
        (b"--b\r\nContent-Disposition: form-data; name=", "multipart/form-data; boundary=b", None),
        (
            b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\ncut sh',
            "multipart/form-data; boundary=b",
            None,
        ),
    ],
)
async def test_malformed_forms_are_400(
    base_url: str, store: S3FileStore, body: bytes, content_type: str, param: str | None
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{base_url}/v1/files",
            content=body,
            headers={"Authorization": f"Bearer {KEY_A}", "Content-Type": content_type},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert await store.list("alpha") == ([], False)


async def test_a_bad_key_is_401(base_url: str) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="sk-wrong", max_retries=0
    ) as c:
        with pytest.raises(openai.AuthenticationError):
            await c.files.list()


# --- the gateway's own wiring ------------------------------------------------------------------


@pytest.fixture
def aws_credentials() -> Iterator[None]:
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(dict(zip(names, ("testing", "testing", "us-east-1"), strict=True)))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.mark.usefixtures("aws_credentials")
async def test_gateway_serves_files(
    kafka_bootstrap: str, redis_url: str, s3_endpoint: str, bucket: str, s3: Any
) -> None:
    settings = GatewaySettings(
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        s3_endpoint_url=s3_endpoint,
        s3_bucket=bucket,
        files_max_bytes=1000,
        api_keys={KEY_A: "alpha"},
    )
    async with (
        _serve(create_app(settings)) as url,
        openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY_A, max_retries=0) as c,
    ):
        made = await c.files.create(file=("x.jsonl", BATCH_INPUT), purpose="batch")
        assert (await c.files.content(made.id)).read() == BATCH_INPUT
        with pytest.raises(openai.APIStatusError) as info:
            await c.files.create(file=("x.jsonl", b"x" * 1001), purpose="batch")
        assert info.value.status_code == 413
    assert f"files/{made.id}/content" in await _keys(s3, bucket)

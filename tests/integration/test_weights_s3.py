"""Weights in S3 (the real moto server): pushed by `S3WeightsSource.push` and `llmq weights
push`, fetched into the node cache and verified; tampered objects are refused."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aioboto3
import pytest
from typer.testing import CliRunner

from llmq.weights_cli import weights_app
from workers.s3_weights import S3WeightsSource, parse_uri
from workers.weights import WeightsCache, WeightsError, WeightsMismatch, folder_digest

pytestmark = pytest.mark.integration

FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": bytes(range(256)) * 1024,
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
}
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _session() -> aioboto3.Session:
    return aioboto3.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    for relative, data in FILES.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    return folder


@pytest.fixture
async def bucket(s3_endpoint: str) -> str:
    name = f"llmq-weights-{uuid.uuid4().hex[:8]}"
    async with _session().client("s3", endpoint_url=s3_endpoint) as s3:
        await s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
async def source(s3_endpoint: str) -> AsyncIterator[S3WeightsSource]:
    async with S3WeightsSource(_session(), s3_endpoint) as s:
        yield s


async def _keys(s3: Any, bucket: str) -> list[str]:
    listed = await s3.list_objects_v2(Bucket=bucket)
    return sorted(item["Key"] for item in listed.get("Contents", []))


def test_parse_uri() -> None:
    assert parse_uri("s3://b/models/m1") == ("b", "models/m1/")
    assert parse_uri("s3://b/models/m1/") == ("b", "models/m1/")
    assert parse_uri("s3://b") == ("b", "")
    for bad in ("https://b/m", "s3:///m", "b/m"):
        with pytest.raises(WeightsError, match="not an s3://"):
            parse_uri(bad)


async def test_push_then_ensure_fetches_and_verifies(
    source: S3WeightsSource, bucket: str, model: Path, tmp_path: Path, s3_endpoint: str
) -> None:
    uri = f"s3://{bucket}/models/m1"
    await source.push(model, uri)
    async with _session().client("s3", endpoint_url=s3_endpoint) as s3:
        await s3.put_object(Bucket=bucket, Key="models/m1-other/config.json", Body=b"not ours")
        assert await _keys(s3, bucket) == [
            "models/m1-other/config.json",
            "models/m1/config.json",
            "models/m1/model.safetensors",
            "models/m1/tokenizer/tokenizer.json",
        ]
    assert sorted(await source.list(uri)) == sorted((r, len(d)) for r, d in FILES.items())
    sha256 = folder_digest(model)
    folder = await WeightsCache(tmp_path / "cache", source).ensure(uri, sha256)
    assert folder_digest(folder) == sha256
    for relative, data in FILES.items():
        assert (folder / relative).read_bytes() == data
    with pytest.raises(WeightsError, match="already holds objects"):
        await source.push(model, uri)


async def test_a_tampered_object_is_refused(
    source: S3WeightsSource, bucket: str, model: Path, tmp_path: Path, s3_endpoint: str
) -> None:
    sha256 = folder_digest(model)
    uri = f"s3://{bucket}/models/tampered"
    await source.push(model, uri)
    async with _session().client("s3", endpoint_url=s3_endpoint) as s3:
        await s3.put_object(
            Bucket=bucket, Key="models/tampered/model.safetensors", Body=b"\0" * 1024
        )
    cache_root = tmp_path / "cache"
    with pytest.raises(WeightsMismatch) as refused:
        await WeightsCache(cache_root, source).ensure(uri, sha256)
    assert refused.value.expected == sha256 and refused.value.where == uri
    assert [p.name for p in cache_root.iterdir()] == [f"{sha256}.lock"]


def test_cli_digest_and_push(
    bucket: str, model: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("llmq.logging.configure_logging", lambda *a, **k: None)
    runner = CliRunner()
    digested = runner.invoke(weights_app, ["digest", str(model)])
    assert digested.exit_code == 0, digested.output
    assert digested.output.strip() == folder_digest(model)
    uri = f"s3://{bucket}/cli/m1"
    pushed = runner.invoke(weights_app, ["push", str(model), uri, "--endpoint-url", s3_endpoint])
    assert pushed.exit_code == 0, pushed.output
    printed = json.loads(pushed.stdout.strip().splitlines()[-1])
    assert printed == {"weights_uri": uri, "sha256": folder_digest(model)}
    again = runner.invoke(weights_app, ["push", str(model), uri, "--endpoint-url", s3_endpoint])
    assert again.exit_code == 1 and "already holds objects" in again.output


def test_cli_pull_of_the_tokenizer_only_leaves_the_weights(
    bucket: str, model: Path, s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("llmq.logging.configure_logging", lambda *a, **k: None)
    runner = CliRunner()
    uri = f"s3://{bucket}/cli/pull"
    args = ["--endpoint-url", s3_endpoint]
    assert runner.invoke(weights_app, ["push", str(model), uri, *args]).exit_code == 0
    gateway = tmp_path / "gateway"
    pulled = runner.invoke(weights_app, ["pull", uri, str(gateway), "--tokenizer-only", *args])
    assert pulled.exit_code == 0, pulled.output
    found = {str(p.relative_to(gateway)) for p in gateway.rglob("*") if p.is_file()}
    assert found == {"config.json", "tokenizer/tokenizer.json"}
    assert (gateway / "tokenizer/tokenizer.json").read_bytes() == FILES["tokenizer/tokenizer.json"]
    whole = tmp_path / "whole"
    assert runner.invoke(weights_app, ["pull", uri, str(whole), *args]).exit_code == 0
    assert folder_digest(whole) == folder_digest(model)
    empty = runner.invoke(weights_app, ["pull", f"s3://{bucket}/nothing", str(whole), *args])
    assert empty.exit_code == 1 and "nothing under" in empty.output

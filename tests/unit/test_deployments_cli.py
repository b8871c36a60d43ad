"""`llmq deployments`: the PUT body from options, the table, and errors, over a mock transport."""

from __future__ import annotations

import json

import httpx
import pytest

from llmq import deployments_cli as cli


def test_spec_from_options_sends_only_what_was_given() -> None:
    spec = cli.spec_from_options(
        version="2", path="/m", pool="p2", precision="float16", replicas_min=2,
        engine_args=["enforce_eager=true", "kv_cache_dtype=fp8", "block_size=16"],
    )  # fmt: skip
    assert spec == {
        "version": "2", "path": "/m", "pool": "p2", "precision": "float16",
        "replicas": {"min": 2, "max": 2},
        "engine_args": {"enforce_eager": True, "kv_cache_dtype": "fp8", "block_size": 16},
    }  # fmt: skip
    with pytest.raises(ValueError, match="KEY=VALUE"):
        cli.spec_from_options(version="2", path="/m", pool="p", engine_args=["oops"])


def _deployment() -> dict[str, object]:
    version = {"version": "1", "arm": "stable", "state": "ready", "ready_replicas": 2,
               "pool": "p", "precision": "bfloat16"}  # fmt: skip
    staged = {**version, "version": "2", "arm": "none", "state": "loading", "ready_replicas": 0}
    return {"id": "org/m", "versions": [version, staged]}


def test_put_and_list_over_http_with_the_admin_key() -> None:
    seen: list[tuple[str, str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.headers.get("authorization")))
        if request.method == "PUT":
            assert json.loads(request.content)["version"] == "2"
            return httpx.Response(200, json=_deployment())
        return httpx.Response(200, json={"object": "list", "data": [_deployment()]})

    client = httpx.Client(
        base_url="http://llmq/v1",
        headers={"Authorization": "Bearer sk-a"},
        transport=httpx.MockTransport(handler),
    )
    cli.put(client, "org/m", {"version": "2", "path": "/m", "pool": "p2"})
    lines = cli.format_table(cli.list_deployments(client))
    assert seen == [("PUT", "/v1/deployments/org/m", "Bearer sk-a"),
                    ("GET", "/v1/deployments", "Bearer sk-a")]  # fmt: skip
    assert lines[0].split() == ["DEPLOYMENT", "VERSION", "ARM", "STATE", "READY", "POOL",
                                "PRECISION"]  # fmt: skip
    assert lines[1].split() == ["org/m", "1", "stable", "ready", "2", "p", "bfloat16"]
    assert lines[2].split() == ["org/m", "2", "none", "loading", "0", "p", "bfloat16"]


def test_an_api_error_carries_the_servers_message() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        error = {"message": "Version `1` of `m` exists", "type": "invalid_request_error",
                 "param": "version", "code": "version_exists"}  # fmt: skip
        return httpx.Response(409, json={"error": error})

    client = httpx.Client(base_url="http://llmq/v1", transport=httpx.MockTransport(handler))
    with pytest.raises(cli.AdminApiError, match="HTTP 409: Version `1` of `m` exists"):
        cli.put(client, "m", {"version": "1", "path": "/m", "pool": "p"})


def test_a_stack_that_is_not_running_is_one_line_and_exit_code_1() -> None:
    from typer.testing import CliRunner

    from llmq import services
    from llmq.cli import app

    url = f"http://{services.LOCALHOST}:{services.free_port()}/v1"  # nothing listens there
    result = CliRunner().invoke(app, ["deployments", "list", "--base-url", url])
    assert result.exit_code == 1
    assert result.output.strip().startswith("error:") and "Traceback" not in result.output

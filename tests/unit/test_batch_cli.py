"""`llmq batch`: submit, follow, summary and exit codes against a mock Batch API (no server).

The client is a real ``openai.OpenAI`` whose HTTP transport is the mock transport of the HTTP
library the installed SDK is built on (httpx, or httpx2 in openai 3.x).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from llmq import batch_cli
from llmq.batch_cli import (
    BatchInputError,
    elapsed_s,
    exit_code,
    follow,
    format_errors,
    format_summary,
    parse_metadata,
    prepare_input,
    submit,
    watch,
)
from llmq.cli import app, batch_app

BASE_URL = "http://llmq.test/v1"
CREATED_AT = 1_700_000_000
LINES = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


def _http() -> Any:
    """The HTTP library the installed openai SDK is built on (httpx, or httpx2 in 3.x)."""
    return sys.modules[openai.DefaultHttpxClient.__mro__[1].__module__.split(".")[0]]


def batch_json(
    status: str, completed: int = 0, failed: int = 0, total: int = 0, **extra: Any
) -> dict[str, Any]:
    """A Batch object as the API returns it."""
    return {
        "id": "batch_1", "object": "batch", "endpoint": "/v1/chat/completions",
        "input_file_id": "file_in", "completion_window": "24h", "status": status,
        "created_at": CREATED_AT,
        "request_counts": {"completed": completed, "failed": failed, "total": total},
        **extra,
    }  # fmt: skip


def file_json(file_id: str, filename: str) -> dict[str, Any]:
    """A File object as the API returns it."""
    return {
        "id": file_id, "object": "file", "bytes": len(LINES), "created_at": CREATED_AT,
        "filename": filename, "purpose": "batch", "status": "processed",
    }  # fmt: skip


# in_progress -> finalizing -> completed, with output and error files at the end.
COMPLETED_SEQUENCE = [
    batch_json("in_progress", completed=3, failed=1, total=10),
    batch_json("finalizing", completed=9, failed=1, total=10),
    batch_json(
        "completed",
        completed=9,
        failed=1,
        total=10,
        completed_at=CREATED_AT + 4,
        output_file_id="file_out",
        error_file_id="file_err",
    ),
]


class FakeBatchApi:
    """The Files and Batches endpoints: ``retrieve`` walks ``sequence`` and stays on its last."""

    def __init__(self, sequence: list[dict[str, Any]]) -> None:
        self.sequence = sequence
        self.retrieved = 0
        self.requests: list[Any] = []

    def __call__(self, request: Any) -> Any:
        http = _http()
        request.read()
        self.requests.append(request)
        method, path = request.method, request.url.path
        if (method, path) == ("POST", "/v1/files"):
            return http.Response(200, json=file_json("file_in", "requests.jsonl"))
        if (method, path) == ("POST", "/v1/batches"):
            body = json.loads(request.content)
            return http.Response(200, json=batch_json("validating", **_echo(body)))
        if (method, path) == ("GET", "/v1/batches/batch_1"):
            batch = self.sequence[min(self.retrieved, len(self.sequence) - 1)]
            self.retrieved += 1
            return http.Response(200, json=batch)
        if (method, path) == ("POST", "/v1/batches/batch_1/cancel"):
            return http.Response(200, json=batch_json("cancelling"))
        if method == "GET" and path.startswith("/v1/files/") and path.endswith("/content"):
            file_id = path.split("/")[3]
            return http.Response(200, content=f"content of {file_id}\n".encode())
        return http.Response(404, json={"error": {"message": f"no route {method} {path}"}})

    def seen(self) -> list[tuple[str, str]]:
        """``(method, path)`` of every request, in order."""
        return [(r.method, r.url.path) for r in self.requests]


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    """The create request's fields a created batch repeats."""
    keys = ("input_file_id", "endpoint", "completion_window", "metadata")
    return {k: body[k] for k in keys if k in body}


def make_client(api: FakeBatchApi) -> openai.OpenAI:
    """A real SDK client whose transport is ``api``."""
    return openai.OpenAI(
        api_key="sk-test",
        base_url=BASE_URL,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(transport=_http().MockTransport(api)),
    )


def test_follow_reports_every_poll_until_completed() -> None:
    api = FakeBatchApi(COMPLETED_SEQUENCE)
    updates: list[tuple[str, int, int, int]] = []
    sleeps: list[float] = []

    def on_update(batch: Any) -> None:
        counts = batch.request_counts
        updates.append((batch.status, counts.completed, counts.failed, counts.total))

    batch = follow(make_client(api), "batch_1", 0.5, on_update, sleep=sleeps.append)

    assert updates == [
        ("in_progress", 3, 1, 10),
        ("finalizing", 9, 1, 10),
        ("completed", 9, 1, 10),
    ]
    assert sleeps == [0.5, 0.5]  # between polls, none after the terminal status
    assert api.seen() == [("GET", "/v1/batches/batch_1")] * 3
    assert batch.status == "completed" and exit_code(batch) == 0


@pytest.mark.parametrize(
    ("status", "code"), [("completed", 0), ("failed", 1), ("expired", 1), ("cancelled", 1)]
)
def test_follow_stops_at_each_terminal_status(status: str, code: int) -> None:
    api = FakeBatchApi([batch_json("in_progress"), batch_json(status), batch_json("in_progress")])
    batch = follow(make_client(api), "batch_1", 1.0, lambda _: None, sleep=lambda _: None)
    assert batch.status == status and api.retrieved == 2
    assert exit_code(batch) == code


def test_summary_uses_the_server_clock_and_falls_back_to_the_watch() -> None:
    api = FakeBatchApi(COMPLETED_SEQUENCE[-1:])
    batch = make_client(api).batches.retrieve("batch_1")
    assert elapsed_s(batch, watched_s=99.0) == 4.0
    assert format_summary(batch, 4.0) == (
        "batch_1 completed: 9 completed, 1 failed of 10 in 4.0s (2.5 lines/s)"
    )
    running = FakeBatchApi([batch_json("cancelled", completed=2, total=10)])
    cancelled = make_client(running).batches.retrieve("batch_1")
    assert elapsed_s(cancelled, watched_s=2.0) == 2.0  # no end time from the server
    assert "(1.0 lines/s)" in format_summary(cancelled, 2.0)
    assert "(0.0 lines/s)" in format_summary(cancelled, 0.0)


def test_watch_prints_the_summary_and_downloads_both_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeBatchApi(COMPLETED_SEQUENCE)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    ticks = iter([100.0, 107.0])

    code = watch(
        make_client(api), "batch_1", interval=0.0, output=out, errors=err,
        sleep=lambda _: None, clock=lambda: next(ticks),
    )  # fmt: skip

    assert code == 0
    assert out.read_text() == "content of file_out\n"
    assert err.read_text() == "content of file_err\n"
    stdout = capsys.readouterr().out
    assert stdout.strip().splitlines()[-1] == (
        "batch_1 completed: 9 completed, 1 failed of 10 in 4.0s (2.5 lines/s)"
    )
    assert api.seen()[-2:] == [
        ("GET", "/v1/files/file_out/content"),
        ("GET", "/v1/files/file_err/content"),
    ]


def test_a_batch_that_failed_validation_prints_its_errors_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    errors = {
        "object": "list",
        "data": [
            {"line": 2, "code": "invalid_json", "message": "line 2 is not JSON"},
            {"line": 5, "code": "missing_model", "message": "body.model is required"},
        ],
    }
    api = FakeBatchApi(
        [batch_json("validating"), batch_json("failed", errors=errors, failed_at=CREATED_AT + 1)]
    )
    out = tmp_path / "out.jsonl"

    code = watch(make_client(api), "batch_1", interval=0.0, output=out, sleep=lambda _: None)
    assert code == 1
    assert not out.exists()  # a failed validation has no output file
    captured = capsys.readouterr()
    assert "line 2: invalid_json: line 2 is not JSON" in captured.err
    assert "line 5: missing_model: body.model is required" in captured.err
    assert "has no output file" in captured.err
    assert "batch_1 failed: 0 completed, 0 failed of 0 in 1.0s" in captured.out
    batch = make_client(api).batches.retrieve("batch_1")
    assert len(format_errors(batch)) == 2


def test_submit_uploads_the_file_then_creates_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(LINES)
    api = FakeBatchApi(COMPLETED_SEQUENCE)

    batch = submit(
        make_client(api), path, endpoint="/v1/chat/completions", window="24h",
        metadata={"team": "search", "run": "7"},
    )  # fmt: skip

    assert batch.id == "batch_1"
    assert api.seen() == [("POST", "/v1/files"), ("POST", "/v1/batches")]
    upload, create = api.requests
    assert upload.headers["content-type"].startswith("multipart/form-data")
    assert b'name="purpose"\r\n\r\nbatch' in upload.content
    assert b'filename="requests.jsonl"' in upload.content and LINES in upload.content
    assert json.loads(create.content) == {
        "input_file_id": "file_in",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"team": "search", "run": "7"},
    }


def test_submit_without_metadata_leaves_it_out(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(LINES)
    api = FakeBatchApi(COMPLETED_SEQUENCE)
    submit(make_client(api), path, endpoint="/v1/embeddings", window="24h", metadata={})
    body = json.loads(api.requests[1].content)
    assert "metadata" not in body and body["endpoint"] == "/v1/embeddings"


def test_model_is_set_on_every_line_and_bad_lines_are_named(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(
        '{"custom_id": "a", "body": {"model": "old", "messages": []}}\n\n'
        '{"custom_id": "b", "body": {}}\n'
    )
    assert prepare_input(path, None) == path.read_bytes()
    rewritten = [json.loads(line) for line in prepare_input(path, "m").decode().splitlines()]
    assert [r["body"]["model"] for r in rewritten] == ["m", "m"]
    assert rewritten[0]["body"]["messages"] == []
    path.write_text('{"custom_id": "a", "body": {}}\n{"custom_id": "b"}\n')
    with pytest.raises(BatchInputError, match=r"requests.jsonl:2: expected an object"):
        prepare_input(path, "m")
    path.write_text("{not json\n")
    with pytest.raises(BatchInputError, match=r"requests.jsonl:1: not JSON"):
        prepare_input(path, "m")


def test_metadata_pairs() -> None:
    assert parse_metadata(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    for bad in ("novalue", "=v"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_metadata([bad])


@pytest.fixture
def cli_api(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeBatchApi, list[tuple[str, str]]]:
    """The `llmq batch` commands talk to a FakeBatchApi; the list records make_client's args."""
    api = FakeBatchApi(COMPLETED_SEQUENCE)
    calls: list[tuple[str, str]] = []

    def fake_make_client(base_url: str, api_key: str) -> openai.OpenAI:
        calls.append((base_url, api_key))
        return make_client(api)

    for name in ("LLMQ_BASE_URL", "LLMQ_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(batch_cli, "make_client", fake_make_client)
    return api, calls


def test_cli_submit_with_watch_prints_the_id_and_follows_it(
    tmp_path: Path, cli_api: tuple[FakeBatchApi, list[tuple[str, str]]]
) -> None:
    api, calls = cli_api
    path = tmp_path / "requests.jsonl"
    path.write_bytes(LINES)
    args = ["batch", "submit", str(path), "--metadata", "team=search", "--watch"]
    result = CliRunner().invoke(app, [*args, "--interval", "0"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "batch_1" and lines[-1].startswith("batch_1 completed: 9 completed")
    assert api.seen()[:2] == [("POST", "/v1/files"), ("POST", "/v1/batches")]
    assert json.loads(api.requests[1].content)["metadata"] == {"team": "search"}
    assert calls[0] == ("http://127.0.0.1:8000/v1", "sk-llmq-dev")


def test_cli_watch_exits_1_unless_completed_and_reads_the_environment(
    cli_api: tuple[FakeBatchApi, list[tuple[str, str]]],
) -> None:
    api, calls = cli_api
    api.sequence = [batch_json("in_progress", total=3), batch_json("expired", completed=1, total=3)]
    env = {"LLMQ_BASE_URL": "http://gw:9000/v1", "OPENAI_API_KEY": "sk-openai"}
    result = CliRunner(env=env).invoke(app, ["batch", "watch", "batch_1", "--interval", "0"])
    assert result.exit_code == 1, result.output
    assert "batch_1 expired: 1 completed, 0 failed of 3" in result.stdout
    assert calls == [("http://gw:9000/v1", "sk-openai")]
    env["LLMQ_API_KEY"] = "sk-llmq"
    CliRunner(env=env).invoke(app, ["batch", "watch", "batch_1", "--interval", "0"])
    assert calls[-1] == ("http://gw:9000/v1", "sk-llmq")


def test_cli_cancel_and_bad_metadata(
    tmp_path: Path, cli_api: tuple[FakeBatchApi, list[tuple[str, str]]]
) -> None:
    api, _ = cli_api
    result = CliRunner().invoke(app, ["batch", "cancel", "batch_1"])
    assert result.exit_code == 0 and result.stdout.strip() == "batch_1 cancelling"
    path = tmp_path / "requests.jsonl"
    path.write_bytes(LINES)
    result = CliRunner().invoke(app, ["batch", "submit", str(path), "--metadata", "oops"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.stderr
    assert api.seen() == [("POST", "/v1/batches/batch_1/cancel")]


def test_an_api_error_is_one_line_and_exit_1(
    cli_api: tuple[FakeBatchApi, list[tuple[str, str]]],
) -> None:
    result = CliRunner().invoke(app, ["batch", "watch", "batch_nope", "--interval", "0"])
    assert result.exit_code == 1 and "error: HTTP 404" in result.stderr


def test_batch_app_is_a_module_level_sub_app_others_can_extend() -> None:
    names = {c.name for c in batch_app.registered_commands}
    assert {"submit", "watch", "cancel"} <= names
    assert any(g.typer_instance is batch_app and g.name == "batch" for g in app.registered_groups)

"""The Files and Batch APIs end to end: the OpenAI SDK against the real stack (broker, Valkey,
moto S3, the real engine on the tiny model, the gateway and the batch service).

A batch's status lives in another process and has no event to await, so tests poll it, as an
SDK user does, under a deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from openai.types import Batch

from llmq import services
from llmq.services import LOCALHOST
from tests.e2e.conftest import IDLE_MODEL, SMALL_TEAM_KEY, Stack

pytestmark = pytest.mark.e2e

FINAL = {"completed", "failed", "expired", "cancelled"}


def jsonl(n: int, model: str, *, max_tokens: int = 6, prefix: str = "req") -> bytes:
    lines = [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Count to {i}."}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        }
        for i in range(n)
    ]
    return b"\n".join(json.dumps(line).encode() for line in lines) + b"\n"


def wait_for(
    client: openai.OpenAI, batch_id: str, accept: Callable[[Batch], bool], within: float
) -> Batch:
    deadline = time.monotonic() + within
    while True:
        batch = client.batches.retrieve(batch_id)
        if accept(batch):
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status} {batch.request_counts}")
        time.sleep(0.25)


def submit(client: openai.OpenAI, data: bytes, name: str = "in.jsonl") -> Batch:
    uploaded = client.files.create(file=(name, data, "application/jsonl"), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"test": name},
    )


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = client.files.content(file_id).read()
    return [json.loads(line) for line in content.splitlines() if line.strip()]


def test_sdk_flow_completes_with_one_output_line_per_custom_id(
    client: openai.OpenAI, stack: Stack
) -> None:
    batch = submit(client, jsonl(12, stack.model), "flow.jsonl")
    assert batch.status == "validating" and batch.metadata == {"test": "flow.jsonl"}
    done = wait_for(client, batch.id, lambda b: b.status in FINAL, within=240)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (12, 12)
    assert done.request_counts.failed == 0 and done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = lines_of(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(12))
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == stack.model
        assert 1 <= body["usage"]["completion_tokens"] <= 6
    listed = client.batches.list(limit=100)
    assert done.id in [b.id for b in listed.data]
    out_file = client.files.retrieve(done.output_file_id or "")
    assert out_file.purpose == "batch_output"


def test_invalid_file_fails_with_line_numbers(client: openai.OpenAI, stack: Stack) -> None:
    good = jsonl(1, stack.model)
    bad_method = good.replace(b'"POST"', b'"GET"')
    data = good + b"not json\n" + bad_method + jsonl(1, "no-such-model", prefix="x")
    batch = submit(client, data, "bad.jsonl")
    failed = wait_for(client, batch.id, lambda b: b.status in FINAL, within=60)
    assert failed.status == "failed" and failed.failed_at is not None
    assert failed.errors is not None and failed.errors.data is not None
    found = [(e.line, e.code) for e in failed.errors.data]
    assert found == [
        (2, "invalid_json_line"),
        (3, "invalid_method"),
        (4, "model_not_found"),
    ]


def test_cancel_mid_way_keeps_a_consistent_partial_output(
    client: openai.OpenAI, stack: Stack
) -> None:
    batch = submit(client, jsonl(150, stack.model, max_tokens=48), "cancel.jsonl")
    wait_for(
        client,
        batch.id,
        lambda b: b.request_counts is not None and b.request_counts.completed >= 1,
        within=180,
    )
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    ended = wait_for(client, batch.id, lambda b: b.status in FINAL, within=180)
    assert ended.status == "cancelled" and ended.cancelled_at is not None
    counts = ended.request_counts
    assert counts is not None and counts.total == 150
    assert counts.completed + counts.failed == 150
    assert 1 <= counts.completed < 150
    output = lines_of(client, ended.output_file_id)
    errors = lines_of(client, ended.error_file_id)
    assert len(output) == counts.completed and len(errors) == counts.failed
    ids = [line["custom_id"] for line in output + errors]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(150))  # each line exactly once
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}


@pytest.fixture(scope="module")
def short_window_gateway(stack: Stack) -> Iterator[str]:
    """A second gateway of the same stack whose `24h` window lasts 3 seconds."""
    port = services.free_port()
    env = {
        **stack.gateway_env,
        "LLMQ_PORT": str(port),
        "LLMQ_BATCH_COMPLETION_WINDOW_S": "3",
    }
    stack.processes.start("gateway-short-window", "gateway", env)
    url = f"http://{services.LOCALHOST}:{port}"
    stack.wait_ready(url)
    yield url
    services.stop(stack.processes.running.pop("gateway-short-window"))


def test_batch_past_its_window_expires_with_remaining_lines_in_the_error_file(
    stack: Stack, short_window_gateway: str
) -> None:
    client = openai.OpenAI(
        base_url=f"{short_window_gateway}/v1", api_key=stack.api_key, max_retries=0
    )
    batch = submit(client, jsonl(5, IDLE_MODEL), "expire.jsonl")
    assert batch.expires_at is not None and batch.expires_at - batch.created_at == 3
    ended = wait_for(client, batch.id, lambda b: b.status in FINAL, within=60)
    assert ended.status == "expired" and ended.expired_at is not None
    assert ended.request_counts is not None
    assert (ended.request_counts.total, ended.request_counts.failed) == (5, 5)
    errors = lines_of(client, ended.error_file_id)
    assert sorted(line["custom_id"] for line in errors) == [f"req-{i}" for i in range(5)]
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}
    assert ended.output_file_id is None


def test_killing_the_batch_service_and_gateway_mid_batch_loses_and_duplicates_nothing(
    client: openai.OpenAI, stack: Stack
) -> None:
    total = 60
    batch = submit(client, jsonl(total, stack.model, max_tokens=24), "restart.jsonl")
    wait_for(
        client,
        batch.id,
        lambda b: b.request_counts is not None and b.request_counts.completed >= 3,
        within=180,
    )
    stack.processes.kill("batch")
    stack.processes.kill("gateway")
    stack.processes.restart("gateway")
    stack.processes.restart("batch")
    stack.wait_ready()
    stack.wait_ready(f"http://{LOCALHOST}:{stack.probe_ports['batch']}")  # wholly up again
    done = wait_for(client, batch.id, lambda b: b.status in FINAL, within=300)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (total, total)
    output = lines_of(client, done.output_file_id)
    ids = [line["custom_id"] for line in output]
    assert len(ids) == total and sorted(set(ids)) == sorted(f"req-{i}" for i in range(total))


def test_another_team_cannot_see_a_batch_or_its_files(client: openai.OpenAI, stack: Stack) -> None:
    batch = submit(client, jsonl(1, IDLE_MODEL), "private.jsonl")
    other = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=SMALL_TEAM_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(batch.input_file_id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(batch.input_file_id)
    assert batch.id not in [b.id for b in other.batches.list(limit=100).data]
    assert batch.input_file_id not in [f.id for f in other.files.list()]
    with pytest.raises(openai.NotFoundError):
        other.batches.create(
            input_file_id=batch.input_file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    client.batches.cancel(batch.id)  # the owner can

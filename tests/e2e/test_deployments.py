"""Versions as callers and operators see them, on the real engine through the OpenAI SDK:
`system_fingerprint` names the version that served (`name@version`), a version can be pinned,
and `llmq deployments list` shows the registry with its ready replicas."""

from __future__ import annotations

import httpx
import openai
import pytest
from typer.testing import CliRunner

from llmq.cli import app
from tests.e2e.conftest import ADMIN_KEY, MAX_MODEL_LEN, MODEL, Stack
from tests.e2e.test_batches import FINAL, jsonl, lines_of, submit, wait_for

pytestmark = pytest.mark.e2e

HELLO = [{"role": "user", "content": "Say hello"}]


def test_responses_name_the_version_that_served_them(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)  # type: ignore[arg-type]
    assert completion.system_fingerprint == f"{MODEL}@1"
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, stream=True)  # type: ignore[arg-type]
    )
    assert chunks and {c.system_fingerprint for c in chunks} == {f"{MODEL}@1"}
    text = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4)
    assert text.system_fingerprint == f"{MODEL}@1"


def test_a_version_can_be_pinned_and_an_unknown_one_is_not_found(client: openai.OpenAI) -> None:
    pinned = client.chat.completions.create(model=f"{MODEL}@1", messages=HELLO, max_tokens=4)  # type: ignore[arg-type]
    assert pinned.system_fingerprint == f"{MODEL}@1" and pinned.model == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model=f"{MODEL}@no-such", messages=HELLO, max_tokens=4)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"


def test_the_cli_lists_the_registry_with_ready_replicas(stack: Stack) -> None:
    result = CliRunner().invoke(
        app,
        ["deployments", "list", "--base-url", f"{stack.base_url}/v1", "--admin-key", ADMIN_KEY],
    )
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()[1:]]
    mine = next(row for row in rows if row[0] == MODEL)
    assert mine[1:5] == ["1", "stable", "ready", "1"]  # version, arm, state, ready replicas
    refused = CliRunner().invoke(
        app, ["deployments", "list", "--base-url", f"{stack.base_url}/v1", "--admin-key", "x"]
    )
    assert refused.exit_code == 1 and "401" in refused.output


def test_a_deployment_registered_at_run_time_serves_chat_and_batch_lines(
    client: openai.OpenAI, stack: Stack
) -> None:
    """No process restarts: the gateway that took the PUT serves it at once, and the batch
    service (another process) fans out lines that name it."""
    alias = "tiny-llama-registered"
    spec = {"version": "r1", "path": str(stack.model_path), "pool": stack.pool,
            "max_model_len": MAX_MODEL_LEN, "ttft_slo_s": 30}  # fmt: skip
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    put = httpx.put(f"{stack.base_url}/v1/deployments/{alias}", json=spec, headers=admin)
    assert put.status_code == 201, put.text
    chat = client.chat.completions.create(model=alias, messages=HELLO, max_tokens=4)  # type: ignore[arg-type]
    assert chat.system_fingerprint == f"{alias}@r1" and chat.model == alias
    assert alias in [m.id for m in client.models.list().data]
    batch = submit(client, jsonl(3, alias, prefix="registered"), "registered.jsonl")
    done = wait_for(client, batch.id, lambda b: b.status in FINAL, within=240)
    assert done.status == "completed", done
    bodies = [line["response"]["body"] for line in lines_of(client, done.output_file_id)]
    assert [b["system_fingerprint"] for b in bodies] == [f"{alias}@r1"] * 3

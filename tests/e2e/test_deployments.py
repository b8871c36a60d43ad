"""Versions as callers and operators see them, on the real engine through the OpenAI SDK:
`system_fingerprint` names the version that served (`name@version`), a version can be pinned,
and `llmq deployments list` shows the registry with its ready replicas."""

from __future__ import annotations

import openai
import pytest
from typer.testing import CliRunner

from llmq.cli import app
from tests.e2e.conftest import ADMIN_KEY, MODEL, Stack

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

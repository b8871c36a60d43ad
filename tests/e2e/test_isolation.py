"""Hostile input on the real stack: one team's prompts never show in another team's cache, and
large or oversized bodies neither stall other streams nor leave memory behind."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.limits import default_max_request_bytes
from tests.e2e.conftest import MAX_MODEL_LEN, TEAM_KEYS, Stack

pytestmark = pytest.mark.e2e

LIMIT = default_max_request_bytes([MAX_MODEL_LEN])
"""The gateway's body limit: every deployment of the stack has MAX_MODEL_LEN."""
GAP_BUDGET_S = 0.05
"""What hostile bodies may add to a running stream's largest inter-token gap."""


def _system_prompt() -> str:
    """Unique to the test (nothing cached it before), and longer than two 128-token blocks."""
    tag = uuid.uuid4().hex
    return " ".join(f"{tag} rule {i}: answer politely and briefly." for i in range(40))


def _cached_tokens(stack: Stack, team: str, system: str) -> int:
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=TEAM_KEYS[team], max_retries=0)
    out = client.chat.completions.create(
        model=stack.model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi"}],
        max_tokens=2,
    )
    assert out.usage is not None and out.usage.prompt_tokens >= 256
    assert out.usage.prompt_tokens_details is not None
    return int(out.usage.prompt_tokens_details.cached_tokens or 0)


def test_a_teams_prompt_is_never_a_cache_hit_for_another_team(stack: Stack) -> None:
    system = _system_prompt()
    _cached_tokens(stack, "team-a", system)
    assert _cached_tokens(stack, "team-a", system) > 0  # the cache works, within team a
    assert _cached_tokens(stack, "team-b", system) == 0  # b learns nothing of a's prompt
    assert _cached_tokens(stack, "team-b", system) > 0  # and has a cache of its own


def test_teams_in_a_shared_set_share_cached_prefixes(stack: Stack) -> None:
    system = _system_prompt()
    assert _cached_tokens(stack, "team-c", system) == 0
    assert _cached_tokens(stack, "team-d", system) > 0  # c's blocks serve d at once


# --- large and oversized bodies -----------------------------------------------------------------


def _body_of_size(size: int, messages: int = 1) -> bytes:
    """A chat request of exactly `size` bytes: `messages` user messages padded with text."""
    base: dict[str, Any] = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": ""} for _ in range(messages)],
        "max_tokens": 1,
    }
    pad = size - len(json.dumps(base).encode())
    for i, message in enumerate(base["messages"]):
        message["content"] = "a" * (pad // messages + (pad % messages if i == 0 else 0))
    body = json.dumps(base).encode()
    assert len(body) == size
    return body


HOSTILE = [
    (_body_of_size(LIMIT), 400),  # one long message: refused before tokenizing
    (_body_of_size(LIMIT, messages=MAX_MODEL_LEN), 400),  # thousands of messages to validate
    (_body_of_size(LIMIT + 1), 413),  # over the limit: refused before parsing
]


def _send_hostile(stack: Stack, rounds: int) -> list[tuple[int, str]]:
    """Each hostile body `rounds` times; (status, error code) of every answer."""
    answers = []
    headers = {"Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"}
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        for _ in range(rounds):
            for body, _expected in HOSTILE:
                t0 = time.monotonic()
                response = client.post("/v1/chat/completions", content=body, headers=headers)
                took_ms = (time.monotonic() - t0) * 1000
                print(
                    f"hostile body of {len(body)} bytes: {response.status_code} in {took_ms:.0f} ms"
                )
                answers.append((response.status_code, response.json()["error"]["code"]))
    return answers


def _token_times(stack: Stack, seed: int, first_token: threading.Event) -> list[float]:
    """Arrival time of every content chunk of one long stream."""
    times: list[float] = []
    body = {
        "model": stack.model,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 1500,
        "seed": seed,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    url = f"{stack.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                times.append(time.monotonic())
                first_token.set()
    return times


def _largest_gap(times: list[float], start: float = 0.0, end: float = float("inf")) -> float:
    """The largest gap between consecutive tokens whose interval overlaps [start, end]."""
    gaps = [b - a for a, b in itertools.pairwise(times) if b >= start and a <= end]
    return max(gaps, default=0.0)


def _stream_beside_hostile_bodies(
    stack: Stack, seed: int
) -> tuple[list[float], tuple[float, float], list[tuple[int, str]]]:
    """One long stream; once its first token arrived, another thread sends the hostile
    bodies twice. Token times, the hostile window, and the hostile answers."""
    first_token = threading.Event()
    window: list[float] = []
    answers: list[tuple[int, str]] = []

    def hostile() -> None:
        first_token.wait(timeout=30)
        window.append(time.monotonic())
        answers.extend(_send_hostile(stack, rounds=2))
        window.append(time.monotonic())

    sender = threading.Thread(target=hostile)
    sender.start()
    times = _token_times(stack, seed, first_token)
    sender.join()
    return times, (window[0], window[1]), answers


def test_large_and_oversized_bodies_do_not_stall_a_running_stream(stack: Stack) -> None:
    for seed in range(8):  # a random model may end a stream early: try until one outlasts
        baseline = _token_times(stack, seed, threading.Event())
        during, window, answers = _stream_beside_hostile_bodies(stack, seed)
        if len(baseline) < 50 or not during or during[-1] < window[1]:
            continue  # the stream ended before the hostile bodies were all answered
        assert [status for status, _ in answers] == [expected for _, expected in HOSTILE] * 2
        assert {code for status, code in answers if status == 400} == {"context_length_exceeded"}
        assert {code for status, code in answers if status == 413} == {"request_too_large"}
        calm, stressed = _largest_gap(baseline), _largest_gap(during, *window)
        print(f"largest inter-token gap: alone {calm * 1000:.1f} ms, beside hostile bodies "
              f"{stressed * 1000:.1f} ms ({len(during)} tokens, window "
              f"{(window[1] - window[0]) * 1000:.0f} ms)")  # fmt: skip
        assert stressed <= calm + GAP_BUDGET_S
        return
    pytest.fail("no stream outlasted the hostile requests")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_maximal_refused_requests_leave_no_memory_behind(stack: Stack) -> None:
    pid = stack.processes.running["gateway"].pid
    before = _rss_bytes(pid)
    answers = _send_hostile(stack, rounds=7)  # 21 maximal bodies, every one refused
    after = _rss_bytes(pid)
    print(f"gateway RSS {before / 2**20:.0f} MiB -> {after / 2**20:.0f} MiB")
    assert len(answers) == 21 and all(status in (400, 413) for status, _ in answers)
    assert after - before <= 100 * 2**20

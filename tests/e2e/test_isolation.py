"""Hostile input on the real stack: one team's prompts never show in another team's cache, and
large or oversized bodies leave no memory behind (that they do not stall other streams is
measured in tests/integration/test_hostile_bodies.py, beside a steady worker: the CPU
engine's own step jitter would hide the 50 ms it allows)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import MAX_MODEL_LEN, TEAM_KEYS, Stack
from tests.hostile_bodies import hostile_bodies

pytestmark = pytest.mark.e2e


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


@pytest.fixture(scope="module")
def hostile(stack: Stack) -> list[tuple[bytes, int]]:
    return hostile_bodies(stack.model, stack.model_path, MAX_MODEL_LEN)


def _send_hostile(
    stack: Stack, hostile: list[tuple[bytes, int]], rounds: int
) -> list[tuple[int, str]]:
    """Each hostile body `rounds` times; (status, error code) of every answer."""
    answers = []
    headers = {"Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"}
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        for _ in range(rounds):
            for body, _expected in hostile:
                t0 = time.monotonic()
                response = client.post("/v1/chat/completions", content=body, headers=headers)
                took_ms = (time.monotonic() - t0) * 1000
                print(
                    f"hostile body of {len(body)} bytes: {response.status_code} in {took_ms:.0f} ms"
                )
                answers.append((response.status_code, response.json()["error"]["code"]))
    return answers


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_maximal_refused_requests_leave_no_memory_behind(
    stack: Stack, hostile: list[tuple[bytes, int]]
) -> None:
    """Memory left behind grows with every request; the allocator's high-water mark does not.

    The first rounds raise RSS in steps (each render thread's malloc arena grows to the largest
    body it parsed, and glibc keeps freed arena memory mapped, or returns some of it and takes
    it again). CI measured [428, 462, 504, 462, 521, 521, ...] MiB and, another day,
    [429, 444, 487, 447, 506, 523, 523, 525, ..., 530]: the steps end by round 6, so six rounds
    are the warm-up. The 80 bodies after them must not raise RSS more than 40 MiB above the
    warm-up's peak. 60 of them are parsed (the 413s never are): keeping each one's parsed form
    (1-2 MiB: the decoded text, or thousands of message objects) would add 60-120 MiB.
    """
    pid = stack.processes.running["gateway"].pid
    rss = [_rss_bytes(pid)]
    answers = []
    for _ in range(WARM_UP_ROUNDS + MEASURED_ROUNDS):
        answers += _send_hostile(stack, hostile, rounds=1)
        rss.append(_rss_bytes(pid))
    print("gateway RSS by round (MiB):", [round(r / 2**20) for r in rss])
    assert len(answers) == 4 * (WARM_UP_ROUNDS + MEASURED_ROUNDS)
    assert all(status in (400, 413) for status, _ in answers)
    assert rss[-1] - max(rss[: WARM_UP_ROUNDS + 1]) <= 40 * 2**20


WARM_UP_ROUNDS = 6
MEASURED_ROUNDS = 20

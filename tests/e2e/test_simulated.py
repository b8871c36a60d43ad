"""SIMULATED GPU engines: a simulated worker behind the real gateway, broker and Redis, and the
queue-less simulated server that benchmarks compare llmq against."""

from __future__ import annotations

import openai
import pytest
import redis

from llmq import services
from llmq.bench.sim_server import start_sim_server
from schemas.heartbeat import ReplicaHeartbeat
from tests.e2e.conftest import SIM_MODEL, SIM_POOL, Stack
from topics import catalog

pytestmark = pytest.mark.e2e

MAX_TOKENS = 12


def _heartbeat(redis_url: str, replica_id: str) -> ReplicaHeartbeat | None:
    raw = redis.Redis.from_url(redis_url).get(catalog.replica_key(replica_id))
    return None if raw is None else ReplicaHeartbeat.model_validate_json(raw)


def _queued(redis_url: str) -> int:
    raw = redis.Redis.from_url(redis_url).get(catalog.backlog_key(SIM_POOL, "interactive"))
    return 0 if raw is None else int(raw)


def test_a_simulated_worker_serves_through_the_whole_stack(stack: Stack) -> None:
    sim = stack.processes.running["sim-worker"]

    def ready() -> bool:
        beat = _heartbeat(stack.redis_url, "e2e-sim-0")
        return beat is not None and beat.state == "ready"

    services.wait_ready(ready, timeout=60, watch=[sim], what="the simulated worker's heartbeat")
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0)
    for _ in range(3):  # the first job teaches the worker its slot time; later ones use it
        stream = client.chat.completions.create(
            model=SIM_MODEL,
            messages=[{"role": "user", "content": "Count to ten."}],
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == MAX_TOKENS
        assert text == "tok " * MAX_TOKENS  # placeholder text, one token per engine step
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert reasons[-1] == "length"

    def timed() -> bool:  # the next heartbeat after a job ended reports its slot time
        beat = _heartbeat(stack.redis_url, "e2e-sim-0")
        return beat is not None and beat.mean_job_s > 0

    services.wait_ready(timed, timeout=10, watch=[sim], what="a heartbeat with a job time")
    beat = _heartbeat(stack.redis_url, "e2e-sim-0")
    assert beat is not None and beat.engine == "simulated"  # it says what it is
    assert beat.max_num_seqs == 16
    # Every job's prompt left the admission backlog when it started and its slot share
    # when it ended: nothing is left counted.
    services.wait_ready(lambda: _queued(stack.redis_url) == 0, 10, [sim], "an empty backlog")


def test_the_simulated_direct_server_speaks_openai(stack: Stack) -> None:
    proc, url = start_sim_server(
        SIM_MODEL, stack.model_path, max_num_seqs=4, max_model_len=stack.max_model_len
    )
    try:
        client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": "Count to ten."}
        ]
        whole = client.chat.completions.create(
            model=SIM_MODEL, messages=messages, max_tokens=MAX_TOKENS
        )
        assert whole.choices[0].message.content == "tok " * MAX_TOKENS
        assert whole.usage is not None and whole.usage.completion_tokens == MAX_TOKENS
        stream = client.chat.completions.create(
            model=SIM_MODEL,
            messages=messages,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        usage = chunks[-1].usage
        assert usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == MAX_TOKENS
    finally:
        services.stop(proc, timeout=10)

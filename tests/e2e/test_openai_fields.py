"""OpenAI's request fields that llmq maps or records, through the real stack and the SDK:
`service_tier`, `user` / `safety_identifier` / `metadata`, `prompt_cache_key`, and vLLM's
`stream_options.continuous_usage_stats`."""

from __future__ import annotations

import asyncio
import uuid

import openai
import pytest
from aiokafka import AIOKafkaConsumer

from schemas.messages import InferenceJob, UsageRecord
from tests.e2e.conftest import Stack
from tests.topic_reading import read_until
from topics import catalog

pytestmark = pytest.mark.e2e

HELLO = [{"role": "user", "content": "Say hello."}]


async def _jobs_with_partitions(stack: Stack, tier: str, ids: set[str]) -> dict[str, int]:
    """Request id -> the partition of the job topic its job was produced to."""
    consumer = AIOKafkaConsumer(
        catalog.job_topic(stack.pool, tier),  # type: ignore[arg-type]
        bootstrap_servers=stack.kafka_bootstrap,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    found: dict[str, int] = {}
    try:
        async with asyncio.timeout(15):
            while set(found) != ids:
                for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                    for record in records:
                        job = InferenceJob.model_validate_json(record.value or b"")
                        if job.request_id in ids:
                            found[job.request_id] = tp.partition
    finally:
        await consumer.stop()
    return found


async def test_service_tier_flex_runs_on_the_batch_tier_and_says_so(
    client: openai.OpenAI, stack: Stack
) -> None:
    flex = await asyncio.to_thread(
        client.chat.completions.create,
        model=stack.model, messages=HELLO, max_tokens=2, service_tier="flex",  # type: ignore[arg-type]
    )  # fmt: skip
    default = await asyncio.to_thread(
        client.chat.completions.create, model=stack.model, messages=HELLO, max_tokens=2
    )
    assert (flex.service_tier, default.service_tier) == ("flex", "default")
    assert await _jobs_with_partitions(stack, "batch", {flex.id})  # on the batch job topic


async def test_callers_tags_are_recorded_on_the_usage_record(
    client: openai.OpenAI, stack: Stack
) -> None:
    out = await asyncio.to_thread(
        client.chat.completions.create,
        model=stack.model, messages=HELLO, max_tokens=2, user="end-user-7",  # type: ignore[arg-type]
        safety_identifier="hash-7", metadata={"feature": "faq", "ticket": "T-1"},
    )  # fmt: skip
    (usage,) = await read_until(
        stack.kafka_bootstrap,
        catalog.USAGE_TOPIC,
        UsageRecord.model_validate_json,
        lambda u: u.request_id == out.id,
    )
    assert usage.caller is not None
    assert (usage.caller.user, usage.caller.safety_identifier) == ("end-user-7", "hash-7")
    assert usage.caller.metadata == {"feature": "faq", "ticket": "T-1"}


async def test_a_prompt_cache_key_sends_different_prompts_to_one_partition(
    client: openai.OpenAI, stack: Stack
) -> None:
    key = f"faq-{uuid.uuid4().hex[:8]}"
    ids = set()
    for i in range(6):
        out = await asyncio.to_thread(
            client.chat.completions.create,
            model=stack.model, max_tokens=1, prompt_cache_key=key,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": f"Question number {i} {'x' * 300 * i}"}],
        )  # fmt: skip
        ids.add(out.id)
    partitions = await _jobs_with_partitions(stack, "interactive", ids)
    assert len(set(partitions.values())) == 1


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(
    client: openai.OpenAI, stack: Stack
) -> None:
    chunks = list(
        client.chat.completions.create(
            model=stack.model, messages=HELLO, max_tokens=8, stream=True,  # type: ignore[call-overload]
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    content = [c for c in chunks if c.choices]
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in content]  # type: ignore[union-attr]
    assert counts == sorted(counts) and counts[-1] == 8
    assert len({c.usage.prompt_tokens for c in chunks}) == 1  # type: ignore[union-attr]

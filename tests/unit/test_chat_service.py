"""ChatService logic with in-memory adapters: limits, chunk order, usage, cancel on abandon."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.auth import Team
from gateway.errors import ApiError
from gateway.metrics import GatewayMetrics
from gateway.services.chat import ChatService
from gateway.services.registry import ModelRegistry, ReplicaView
from gateway.services.render import ChatRenderer
from gateway.settings import Deployment
from schemas.chat import ChatCompletionChunk, ChatCompletionRequest
from schemas.messages import (
    CancelEvent,
    FinishEvent,
    InferenceJob,
    ReplicaHeartbeat,
    TokenEvent,
    UsageCounts,
)
from topics.ports import JobReceipt
from topics.redis_relay import RedisReplyRelay


class CharTokenizer:
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        return "".join(m["content"] for m in conversation)

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        return [ord(c) for c in text]


class Directory:
    def __init__(self, *pools: str) -> None:
        self.beats = [
            ReplicaHeartbeat(replica_id=f"r-{p}", pool=p, model="m", state="ready", sent_at=0)
            for p in pools
        ]

    async def replicas(self) -> list[ReplicaHeartbeat]:
        return self.beats


class ScriptedQueue:
    """Each submitted job is answered at once with the given token texts and a finish."""

    def __init__(self, relay: RedisReplyRelay, texts: list[str]) -> None:
        self.relay = relay
        self.texts = texts
        self.jobs: list[InferenceJob] = []

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        self.jobs.append(job)
        for seq, text in enumerate(self.texts):
            event = TokenEvent(request_id=job.request_id, seq=seq, text=text, num_tokens=1)
            self.relay.deliver(event.to_bytes())
        usage = UsageCounts(
            prompt_tokens=len(job.prompt_token_ids), completion_tokens=len(self.texts)
        )
        self.relay.deliver(
            FinishEvent(request_id=job.request_id, finish_reason="stop", usage=usage).to_bytes()
        )
        return JobReceipt(topic="t", partition=0, offset=len(self.jobs) - 1)


class SilentQueue(ScriptedQueue):
    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        self.jobs.append(job)
        return JobReceipt(topic="t", partition=0, offset=0)


class Cancels:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    async def cancel(self, event: CancelEvent) -> None:
        self.cancelled.append(event.request_id)

    async def is_cancelled(self, request_id: str) -> bool:
        return request_id in self.cancelled


async def _service(
    queue_cls: type[ScriptedQueue] = ScriptedQueue, ready: bool = True
) -> tuple[ChatService, ScriptedQueue, Cancels]:
    relay = RedisReplyRelay(redis=None, gateway_id="g")  # type: ignore[arg-type]
    view = ReplicaView(Directory("p") if ready else Directory(), refresh_s=1)
    await view.refresh()
    registry = ModelRegistry([Deployment(name="m", path="/none", pool="p", max_model_len=20)], view)
    queue = queue_cls(relay, ["Hel", "lo"])
    cancels = Cancels()
    service = ChatService(
        registry,
        ChatRenderer({"m": CharTokenizer()}),
        queue,
        relay,
        cancels,
        GatewayMetrics(),
        request_timeout_s=5,
    )
    return service, queue, cancels


def _req(content: str = "hi", **extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": content}], **extra}
    )


async def test_job_carries_prompt_limits_and_reply_channel() -> None:
    service, _, _ = await _service()
    job = service.build_job(_req(max_tokens=3, temperature=0), Team("t"))
    assert job.prompt_token_ids == (ord("h"), ord("i"))
    assert job.sampling.max_tokens == 3 and job.sampling.temperature == 0
    assert job.reply_to == "llmq:reply:g" and job.team == "t" and job.pool == "p"
    default = service.build_job(_req(), Team("t"))
    assert default.sampling.max_tokens == 18  # the rest of the context


@pytest.mark.parametrize(
    ("req", "status", "code"),
    [
        (_req(model="nope"), 404, "model_not_found"),
        (_req("x" * 20), 400, "context_length_exceeded"),
        (_req("x" * 10, max_tokens=11), 400, "context_length_exceeded"),
    ],
)
async def test_refusals(req: ChatCompletionRequest, status: int, code: str) -> None:
    service, _, _ = await _service()
    with pytest.raises(ApiError) as info:
        service.build_job(req, Team("t"))
    assert (info.value.status, info.value.code) == (status, code)


async def test_no_ready_replica_is_503() -> None:
    service, _, _ = await _service(ready=False)
    with pytest.raises(ApiError) as info:
        service.build_job(_req(), Team("t"))
    assert info.value.status == 503


async def test_stream_chunks_in_openai_order_with_usage() -> None:
    service, _, cancels = await _service()
    active = await service.start(service.build_job(_req(), Team("t")))
    items = [c async for c in service.stream_chunks(active, include_usage=True)]
    chunks = [c for c in items if isinstance(c, ChatCompletionChunk)]
    assert len(chunks) == len(items) == 5
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == "Hello"
    assert chunks[3].choices[0].finish_reason == "stop"
    assert chunks[4].choices == [] and chunks[4].usage is not None
    assert chunks[4].usage.completion_tokens == 2 and chunks[4].usage.prompt_tokens == 2
    assert cancels.cancelled == []


async def test_complete_buffers_one_completion() -> None:
    service, _, _ = await _service()
    active = await service.start(service.build_job(_req(), Team("t")))
    completion = await service.complete(active)
    assert completion.choices[0].message.content == "Hello"
    assert completion.usage is not None and completion.usage.total_tokens == 4


async def test_abandoned_stream_is_cancelled() -> None:
    service, queue, cancels = await _service(SilentQueue)
    active = await service.start(service.build_job(_req(), Team("t")))
    stream = service.stream_chunks(active, include_usage=False)
    await anext(stream)  # the role chunk; then the client goes away
    await stream.aclose()
    await asyncio.sleep(0)  # let the cancel task run
    for _ in range(10):
        if cancels.cancelled:
            break
        await asyncio.sleep(0)
    assert cancels.cancelled == [queue.jobs[0].request_id]

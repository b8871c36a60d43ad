"""ChatService logic with in-memory adapters: limits, chunk order, usage, cancel on abandon."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from gateway.auth import Team
from gateway.errors import ApiError
from gateway.metrics import GatewayMetrics
from gateway.services.admission import AdmissionController
from gateway.services.chat import ChatService
from gateway.services.intake import INLINE_RENDER_CHARS, JobIntake
from gateway.services.quota import QuotaService
from gateway.services.registry import ModelRegistry, ReplicaView
from gateway.services.routing import PartitionRouter
from gateway.settings import Deployment
from schemas.chat import ChatCompletionChunk, ChatCompletionRequest
from schemas.heartbeat import ReplicaHeartbeat
from schemas.messages import CancelEvent, FinishEvent, InferenceJob, TokenEvent, UsageCounts
from schemas.render import ChatRenderer
from topics import catalog
from topics.ports import BacklogAdmission, BucketDecision, JobReceipt
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
        self.partitions_used: list[int | None] = []

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        self.jobs.append(job)
        self.partitions_used.append(partition)
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

    async def partitions(self, pool: str, tier: str) -> int:
        return 4


class Backlog:
    def __init__(self) -> None:
        self.tokens: dict[tuple[str, str], int] = {}

    async def add(
        self,
        pool: str,
        tier: str,
        prompt_tokens: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> None:
        self.tokens[(pool, tier)] = self.tokens.get((pool, tier), 0) + prompt_tokens

    async def try_add(
        self,
        pool: str,
        tier: str,
        prompt_tokens: int,
        limit: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> BacklogAdmission:
        queued = self.tokens.get((pool, tier), 0)
        if queued > 0 and queued + prompt_tokens > limit:
            return BacklogAdmission(False, queued, ahead=queued)
        self.tokens[(pool, tier)] = queued + prompt_tokens
        return BacklogAdmission(True, queued, ahead=queued)

    async def remove(
        self,
        pool: str,
        tier: str,
        prompt_tokens: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> None:
        self.tokens[(pool, tier)] = max(self.tokens.get((pool, tier), 0) - prompt_tokens, 0)

    async def queued(self, pool: str, tier: str) -> int:
        return self.tokens.get((pool, tier), 0)


class OpenBucket:
    async def reserve(self, team: str, tokens: int, tokens_per_minute: int) -> BucketDecision:
        return BucketDecision(allowed=True, remaining=10**9, retry_after_s=0)

    async def refund(self, team: str, tokens: int, tokens_per_minute: int) -> None:
        return None


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
    queue_cls: type[ScriptedQueue] = ScriptedQueue,
    ready: bool = True,
    backlog: Backlog | None = None,
    bucket: OpenBucket | None = None,
    max_model_len: int = 20,
    produce_timeout_s: float = 5.0,
    directory: Directory | None = None,
    offload: Any = None,
    ttft_slo_s: float = 1.0,
) -> tuple[ChatService, ScriptedQueue, Cancels]:
    relay = RedisReplyRelay(redis=None, gateway_id="g")  # type: ignore[arg-type]
    relay.connected = True
    view = ReplicaView(directory or (Directory("p") if ready else Directory()), refresh_s=1)
    await view.refresh()
    registry = ModelRegistry(
        [
            Deployment(
                name="m", path="/none", pool="p", max_model_len=max_model_len, ttft_slo_s=ttft_slo_s
            )
        ],
        view,
    )
    queue = queue_cls(relay, ["Hel", "lo"])
    cancels = Cancels()
    intake = JobIntake(
        registry,
        ChatRenderer({"m@1": CharTokenizer()}),
        queue,
        backlog or Backlog(),
        AdmissionController(),
        QuotaService(bucket or OpenBucket()),
        PartitionRouter(),
        request_timeout_s=5,
        produce_timeout_s=produce_timeout_s,
        offload=offload,
    )
    service = ChatService(intake, relay, cancels, GatewayMetrics())
    return service, queue, cancels


def _req(content: str = "hi", **extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": content}], **extra}
    )


async def test_job_carries_prompt_limits_and_reply_channel() -> None:
    service, _, _ = await _service()
    job = (await service.start(_req(max_tokens=3, temperature=0), Team("t"))).job
    assert job.prompt_token_ids == (ord("h"), ord("i"))
    assert job.sampling.max_tokens == 3 and job.sampling.temperature == 0
    assert job.reply_to == "llmq:reply:g" and job.team == "t" and job.pool == "p"
    default = (await service.start(_req(), Team("t"))).job
    assert default.sampling.max_tokens == 18  # the rest of the context


async def test_only_long_prompts_or_tools_are_tokenized_off_the_event_loop() -> None:
    offloaded: list[int] = []

    async def offload(fn: Any, *args: Any) -> Any:
        offloaded.append(len(args[1][0].content))  # the messages' first content
        return fn(*args)

    service, _, _ = await _service(max_model_len=8192, offload=offload, ttft_slo_s=60)
    short, long = "x" * INLINE_RENDER_CHARS, "x" * (INLINE_RENDER_CHARS + 1)
    jobs = [
        (await service.start(_req(text, max_tokens=1), Team("t"))).job for text in (short, long)
    ]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    await service.start(_req("hi", max_tokens=1, tools=[tool], tool_choice="required"), Team("t"))
    assert offloaded == [len(long), 2]  # the long prompt and the one with tools, not the short
    assert [len(job.prompt_token_ids) for job in jobs] == [len(short), len(long)]


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
        await service.start(req, Team("t"))
    assert (info.value.status, info.value.code) == (status, code)


async def test_no_ready_replica_is_503() -> None:
    service, _, _ = await _service(ready=False)
    with pytest.raises(ApiError) as info:
        await service.start(_req(), Team("t"))
    assert info.value.status == 503


async def test_stream_chunks_in_openai_order_with_usage() -> None:
    service, _, cancels = await _service()
    active = await service.start(_req(), Team("t"))
    items = [c async for c in service.stream_chunks(active, include_usage=True)]
    # The common chunk comes as its JSON already rendered: it must read as the same chunk.
    chunks = [
        ChatCompletionChunk.model_validate_json(c) if isinstance(c, str) else c for c in items
    ]
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert isinstance(items[1], str)  # "lo": choice 0's next text, nothing else
    assert len(chunks) == len(items) == 4
    # The role travels with the first token: no event before the first token exists.
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == "Hel"
    assert all(c.choices[0].delta.role is None for c in chunks[1:3])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == "Hello"
    assert chunks[2].choices[0].finish_reason == "stop"
    assert chunks[3].choices == [] and chunks[3].usage is not None
    assert chunks[3].usage.completion_tokens == 2 and chunks[3].usage.prompt_tokens == 2
    assert cancels.cancelled == []


async def test_complete_buffers_one_completion() -> None:
    service, _, cancels = await _service()
    active = await service.start(_req(), Team("t"))
    completion = await service.complete(active)
    assert completion.choices[0].message.content == "Hello"
    assert completion.usage is not None and completion.usage.total_tokens == 4
    for _ in range(5):  # give a (wrong) cancel task the chance to run
        await asyncio.sleep(0)
    assert cancels.cancelled == []  # a finished request is never cancelled


async def test_abandoned_stream_is_cancelled() -> None:
    service, queue, cancels = await _service(SilentQueue)
    active = await service.start(_req(), Team("t"))
    stream = service.stream_chunks(active, include_usage=False)
    first = asyncio.create_task(anext(stream))  # waits for a first token that never comes
    for _ in range(10):
        await asyncio.sleep(0)
    first.cancel()  # the client goes away, as Starlette cancels a stream whose client left
    with contextlib.suppress(asyncio.CancelledError):
        await first
    await stream.aclose()
    await asyncio.sleep(0)  # let the cancel task run
    for _ in range(10):
        if cancels.cancelled:
            break
        await asyncio.sleep(0)
    assert cancels.cancelled == [queue.jobs[0].request_id]


class EmptyBucket(OpenBucket):
    async def reserve(self, team: str, tokens: int, tokens_per_minute: int) -> BucketDecision:
        return BucketDecision(allowed=False, remaining=0, retry_after_s=7)


async def test_overloaded_pool_sheds_interactive_with_a_computed_retry_after() -> None:
    backlog = Backlog()
    await backlog.add("p", "interactive", 9_000)  # 4.5 s of prefill at the 2,000 tok/s fallback
    service, queue, _ = await _service(backlog=backlog)
    with pytest.raises(ApiError) as info:
        await service.start(_req(), Team("t"))
    assert info.value.status == 429 and info.value.code == "overloaded"
    assert info.value.headers is not None
    assert info.value.headers["Retry-After"] == "4"  # (9,002 - 0.95 x 2,000) / 2,000 -> 4
    assert queue.jobs == []  # nothing was queued
    assert await backlog.queued("p", "interactive") == 9_000  # and nothing counted
    batch = await service.start(_req(tier="batch"), Team("t"))  # batch waits, never refused
    assert batch.job.tier == "batch"


async def test_team_over_quota_gets_429_and_nothing_is_queued() -> None:
    backlog = Backlog()
    service, queue, _ = await _service(bucket=EmptyBucket(), backlog=backlog)
    with pytest.raises(ApiError) as info:
        await service.start(_req(), Team("t"))
    assert info.value.status == 429 and info.value.code == "rate_limit_exceeded"
    assert info.value.headers == {"Retry-After": "7"}
    assert queue.jobs == []
    assert backlog.tokens == {("p", "interactive"): 0}  # the admission's tokens were returned


async def test_shared_prefix_lands_on_one_partition_and_reserves_quota() -> None:
    service, queue, _ = await _service(max_model_len=4096)
    system = "s" * 600
    for question in ("a?", "bb?", "ccc?"):
        req = ChatCompletionRequest.model_validate(
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
            }
        )
        await service.start(req, Team("t"))
    assert len(set(queue.partitions_used)) == 1
    assert queue.jobs[0].reserved_tokens == len(queue.jobs[0].prompt_token_ids) + 5


class HangingQueue(ScriptedQueue):
    """A broker that takes the connection but never acknowledges."""

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        self.jobs.append(job)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_broker_that_never_acknowledges_gets_a_quick_503_and_nothing_is_left() -> None:
    backlog = Backlog()
    service, queue, cancels = await _service(HangingQueue, backlog=backlog, produce_timeout_s=0.05)
    with pytest.raises(ApiError) as info:
        await asyncio.wait_for(service.start(_req(max_tokens=3), Team("t")), 2)
    assert (info.value.status, info.value.code) == (503, "queue_unavailable")
    job = queue.jobs[0]
    assert cancels.cancelled == [job.request_id]  # if the job reaches the broker later: dropped
    assert await backlog.queued("p", "interactive") == 0  # nothing left queued for admission


async def test_jobs_carry_their_teams_cache_salt() -> None:
    service, _, _ = await _service()
    deployment = Deployment(name="m", path="/none", pool="p", max_model_len=20)
    a = (await service.start(_req(), Team("a"))).job
    b = (await service.start(_req(), Team("b"))).job
    narrowed = (await service.start(_req(cache_salt="mine"), Team("a"))).job
    assert a.cache_salt == deployment.cache_salt("a")
    assert b.cache_salt == deployment.cache_salt("b") != a.cache_salt
    assert narrowed.cache_salt == deployment.cache_salt("a", "mine")


async def test_admission_predicts_ttft_and_the_error_is_measured() -> None:
    backlog = Backlog()
    await backlog.add("p", "interactive", 1_000)  # 0.5 s of prefill at the 2,000 tok/s fallback
    service, _, _ = await _service(backlog=backlog)
    active = await service.start(_req(), Team("t"))
    # overhead 0.05 s + (1,000 queued + 2 own prompt tokens) / 2,000 tok/s
    assert active.prediction is not None
    assert active.prediction.ttft_s == pytest.approx(0.05 + 1_002 / 2_000)
    assert (await service.start(_req(tier="batch"), Team("t"))).prediction is None
    _ = [c async for c in service.stream_chunks(active, include_usage=False)]
    registry = service._metrics.registry
    count = registry.get_sample_value("llmq_ttft_prediction_abs_error_ratio_count", {"model": "m"})
    assert count == 1  # one interactive request reached its first token
    assert active.first_token_at is not None
    actual = active.first_token_at - active.arrived
    error = registry.get_sample_value("llmq_ttft_prediction_abs_error_ratio_sum", {"model": "m"})
    assert error == pytest.approx(abs(active.prediction.ttft_s - actual) / actual)
    signed = registry.get_sample_value("llmq_ttft_prediction_error_ratio_count", {"model": "m"})
    assert signed == 1


def _owner(**load: Any) -> Directory:
    """One ready replica owning every partition of pool p, with two slots both busy and
    `load` (slot ends, mean job time, ...) in its heartbeat, sent now."""
    directory = Directory()
    topic = catalog.job_topic("p", "interactive")
    directory.beats = [
        ReplicaHeartbeat(
            replica_id="r",
            pool="p",
            model="m",
            state="ready",
            partitions=tuple(f"{topic}:{n}" for n in range(4)),
            max_num_seqs=2,
            in_flight=2,
            sent_at=time.time(),
            **load,
        )
    ]
    return directory


async def test_a_routed_request_is_predicted_from_its_replicas_slots() -> None:
    directory = _owner(mean_job_s=1.0, slot_free_in_s=(0.3, 0.5), prefill_tokens_per_s=2_000)
    service, _, _ = await _service(directory=directory)
    first = await service.start(_req(), Team("t"))
    second = await service.start(_req(), Team("t"))
    assert first.prediction is not None and second.prediction is not None
    assert first.prediction.basis == "replica"
    assert first.prediction.pool_prediction is not None  # still learnt from, for the limit
    # Both slots busy: the first waits for the sooner end; the second, sent after the
    # heartbeat, is behind the first and takes the other slot.
    # (the heartbeat ages by the test's milliseconds)
    assert first.prediction.slot_wait_s == pytest.approx(0.3, abs=0.05)
    assert second.prediction.slot_wait_s == pytest.approx(0.5, abs=0.05)
    # and the first request's prompt (2 tokens) is still to prefill ahead of the second
    prefill_ahead = second.prediction.wait_s - second.prediction.slot_wait_s
    assert prefill_ahead == pytest.approx(2 / 2_000)
    assert second.prediction.ttft_s > first.prediction.ttft_s


class CountingBucket(OpenBucket):
    def __init__(self) -> None:
        self.reserved = self.refunded = 0

    async def reserve(self, team: str, tokens: int, tokens_per_minute: int) -> BucketDecision:
        self.reserved += 1
        return await super().reserve(team, tokens, tokens_per_minute)

    async def refund(self, team: str, tokens: int, tokens_per_minute: int) -> None:
        self.refunded += 1


async def test_a_replica_whose_slots_free_too_late_sheds_after_routing() -> None:
    # The pool's backlog is empty: only the replica's slots can tell.
    directory = _owner(mean_job_s=5.0, slot_free_in_s=(2.5, 3.0), buffered={"t": 1})
    backlog, bucket = Backlog(), CountingBucket()
    service, queue, _ = await _service(directory=directory, backlog=backlog, bucket=bucket)
    # Another team's first request there is admitted, however late (as at the backlog: a
    # team with nothing waiting is never refused, so one team cannot lock others out).
    first = await service.start(_req(), Team("other"))
    assert first.prediction is not None and first.prediction.ttft_s > 2.5
    queue.jobs.clear()
    backlog.tokens.clear()
    with pytest.raises(ApiError) as info:
        await service.start(_req(), Team("t"))
    assert (info.value.status, info.value.code) == (429, "overloaded")
    # Behind its own waiting job and the other team's (sent since the heartbeat), which take
    # the slots freeing at 2.5 and 3 s and hold them 5 s: it would start at 7.5 s.
    assert info.value.headers == {"Retry-After": "7"}
    assert queue.jobs == []
    assert backlog.tokens == {("p", "interactive"): 0}  # what admission took was returned
    # Shed before its quota was touched: only the first request reserved, nothing refunded.
    assert (bucket.reserved, bucket.refunded) == (1, 0)
    batch = await service.start(_req(tier="batch"), Team("t"))  # batch waits: never shed
    assert batch.prediction is None


class GatedBucket(OpenBucket):
    """Holds every reservation until `gate` opens: requests judged meanwhile overlap."""

    def __init__(self, refuse_first: bool = False) -> None:
        self.gate = asyncio.Event()
        self.waiting = 0
        self.refuse_first = refuse_first

    async def reserve(self, team: str, tokens: int, tokens_per_minute: int) -> BucketDecision:
        self.waiting += 1
        await self.gate.wait()
        if self.refuse_first:
            self.refuse_first = False
            return BucketDecision(allowed=False, remaining=0, retry_after_s=3)
        return await super().reserve(team, tokens, tokens_per_minute)


async def test_a_burst_judged_at_once_counts_its_own_earlier_requests() -> None:
    # Both slots busy until 2.5 and 3 s: a team's first request is admitted however late,
    # its second is not. Two arriving together must not both pass as the team's first while
    # the first awaits its quota.
    directory = _owner(mean_job_s=5.0, slot_free_in_s=(2.5, 3.0))
    bucket = GatedBucket()
    service, queue, _ = await _service(directory=directory, bucket=bucket)
    burst = [asyncio.create_task(service.start(_req(), Team("t"))) for _ in range(2)]
    # One of them is refused while the other awaits its quota (the timeout only bounds a
    # failing run, where both would await it).
    await asyncio.wait(burst, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert bucket.waiting == 1
    bucket.gate.set()
    results = await asyncio.gather(*burst, return_exceptions=True)
    refused = [r for r in results if isinstance(r, ApiError)]
    assert len(refused) == 1 and (refused[0].status, refused[0].code) == (429, "overloaded")
    assert len(queue.jobs) == 1


async def test_a_job_the_quota_refuses_is_not_counted_as_waiting_on_its_replica() -> None:
    directory = _owner(mean_job_s=5.0, slot_free_in_s=(2.5, 3.0))
    bucket = GatedBucket(refuse_first=True)
    bucket.gate.set()
    service, _, _ = await _service(directory=directory, bucket=bucket)
    with pytest.raises(ApiError) as info:
        await service.start(_req(), Team("t"))
    assert info.value.code != "overloaded"  # the quota's refusal
    # Nothing of the team waits on the replica: its next request is its first again.
    admitted = await service.start(_req(), Team("t"))
    assert admitted.prediction is not None and admitted.prediction.basis == "replica"


def _samples(service: ChatService, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one metric family: sorted labels -> value."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(service._metrics.registry).decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_metrics_break_requests_down_by_team_version_and_tier_never_by_free_text() -> None:
    service, _, _ = await _service()
    active = await service.start(_req(), Team("search"))
    _ = [c async for c in service.stream_chunks(active, include_usage=True)]
    for model in ("no-such-model", "another-invention"):
        with pytest.raises(ApiError):
            await service.start(_req(model=model), Team("search"))
    served = {"model": "m", "version": "1", "team": "search", "tier": "interactive"}
    requests = _samples(service, "llmq_requests_total")
    assert requests[tuple(sorted({**served, "status": "ok"}.items()))] == 1
    unrouted = {"model": "-", "version": "", "team": "search", "tier": "", "status": "404"}
    assert requests[tuple(sorted(unrouted.items()))] == 2  # unknown names are not labels
    assert not any("no-such-model" in str(key) for key in requests)
    refusals = _samples(service, "llmq_refusals_total")
    assert list(refusals.values()) == [2.0]
    assert dict(next(iter(refusals)))["code"] == "model_not_found"
    ttft = _samples(service, "llmq_time_to_first_token_seconds_count")
    assert ttft == {tuple(sorted(served.items())): 1.0}
    prompt = _samples(service, "llmq_prompt_tokens_total")
    hits = {dict(k)["cache"]: v for k, v in prompt.items()}
    assert hits["hit"] + hits["miss"] == 2  # "hi": two prompt tokens, none cached here

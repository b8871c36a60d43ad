"""Intake: a request becomes a queued job, or is refused before anything is queued.

In order: resolve the model (404), render the prompt and check the context (400), require a
ready replica (503), predict TTFT against the pool's SLO (429 with a computed Retry-After;
interactive only), choose the partition (prefix affinity with bounded load) and judge the TTFT
again on the replica that owns it (429), reserve the team's tokens (429), and finally produce
the job (503 when the broker refuses, with the quota reservation released). The quota comes
last of the refusals: a request shed for load costs no reservation and refund.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.auth import Team
from gateway.errors import ApiError
from gateway.services.admission import (
    BACKLOG_GATE_SLACK,
    AdmissionController,
    TtftPrediction,
    pool_prefill_rate,
    pool_slots,
)
from gateway.services.quota import QuotaService, quota_refusal
from gateway.services.registry import ModelRegistry
from gateway.services.replica_admission import ReplicaAdmission, shed
from gateway.services.routing import PartitionRouter, RouteDecision
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.deployment import Deployment, version_ref
from schemas.generation import GenerationRequest
from schemas.heartbeat import ReplicaHeartbeat
from schemas.messages import AdapterRef, Arm, CallerTags, InferenceJob, sampling_settings
from schemas.render import BadTokenIds, ChatRenderer, NoFillInTheMiddle, PromptTooLong
from schemas.tools import ToolPlan
from topics import catalog
from topics.ports import AdapterDemand, JobQueue, JobReceipt, QueueBacklog

log = structlog.get_logger()

Offload = Callable[..., Awaitable[Any]]
"""Runs a blocking callable off the event loop (`ThreadOffload.run`)."""

INLINE_RENDER_CHARS = 4096
"""Prompts up to this many characters (about 1,000 tokens, under half a millisecond of
templating and tokenizing) are tokenized on the event loop: a thread hop costs more than that
(two loop wake-ups, a pool thread taking the GIL from the loop). Longer ones, and any with
tools (their schemas go through the template too), go to the offload pool."""


def context_length_exceeded(message: str, param: str = "messages") -> ApiError:
    return ApiError(400, message, param=param, code="context_length_exceeded")


@dataclass(frozen=True)
class AdmittedJob:
    job: InferenceJob
    partition: int | None
    prediction: TtftPrediction | None = None
    """Admission's prediction of the time to first token (interactive jobs), checked
    against the actual one when the first token arrives."""
    tools: ToolPlan | None = None
    """How the answer becomes tool calls (chat requests with a tool choice)."""


class JobIntake:
    def __init__(
        self,
        registry: ModelRegistry,
        renderer: ChatRenderer,
        queue: JobQueue,
        backlog: QueueBacklog,
        admission: AdmissionController,
        quota: QuotaService,
        router: PartitionRouter | None,
        request_timeout_s: float,
        produce_timeout_s: float = 5.0,
        offload: Offload | None = None,
        demand: AdapterDemand | None = None,
    ) -> None:
        self._registry = registry
        self._renderer = renderer
        self._queue = queue
        self._backlog = backlog
        self._admission = admission
        self._quota = quota
        self._router = router
        self._timeout_s = request_timeout_s
        self._produce_timeout_s = produce_timeout_s
        self._offload = offload
        self._demand = demand
        self._second_look = ReplicaAdmission(admission)

    async def admit(self, request: ChatCompletionRequest, team: Team, reply_to: str) -> AdmittedJob:
        """A chat request up to producing: refusals are raised as `ApiError`s."""
        route = self._registry.route_for(team.name, request.model, request.sticky_key)
        deployment = route.deployment
        tools = request.tool_plan
        if tools is not None and tools.mode == "auto":
            if deployment.tool_call_parser is None:
                raise ApiError(
                    400,
                    f'tool_choice "auto" (the default when tools are given) needs a parser of '
                    f"the model's free text into calls, and `{deployment.name}` names none; use "
                    'tool_choice "required" or name a function.',
                    param="tool_choice",
                )
            tools = dataclasses.replace(tools, parser=deployment.tool_call_parser)
        prompt = await self._render(deployment.ref, request)
        admitted = await self.admit_prompt(
            deployment, request, prompt, team, reply_to, "chatcmpl", route.arm, route.adapter
        )
        return dataclasses.replace(admitted, tools=tools)

    async def admit_completion(
        self, request: CompletionRequest, team: Team, reply_to: str
    ) -> list[AdmittedJob]:
        """A completions request, one job per prompt, all admitted or none: a refusal
        releases what the prompts admitted before it."""
        route = self._registry.route_for(team.name, request.model, request.sticky_key)
        deployment = route.deployment
        prompts = [await self._encode(deployment.ref, request, p) for p in request.prompts]
        admitted: list[AdmittedJob] = []
        try:
            for prompt in prompts:
                admitted.append(
                    await self.admit_prompt(
                        deployment,
                        request,
                        prompt,
                        team,
                        reply_to,
                        "cmpl",
                        route.arm,
                        route.adapter,
                    )
                )
        except ApiError:
            for job in admitted:
                await self.release(job)
            raise
        return admitted

    async def admit_prompt(
        self,
        deployment: Deployment,
        request: GenerationRequest,
        prompt: list[int],
        team: Team,
        reply_to: str,
        id_prefix: str,
        arm: Arm | None = None,
        adapter: AdapterRef | None = None,
    ) -> AdmittedJob:
        """One prompt's job up to producing: context, readiness, load shedding, quota and
        routing; refusals are raised as `ApiError`s."""
        prompt = request.truncate(prompt, deployment.max_model_len)
        room = deployment.max_model_len - len(prompt)
        wanted = request.output_limit
        if room < 1 or (wanted is not None and wanted > room):
            raise context_length_exceeded(
                f"This model's maximum context length is {deployment.max_model_len} tokens. "
                f"However, you requested {len(prompt) + (wanted or 1)} tokens "
                f"({len(prompt)} in the prompt, {wanted or 1} in the completion).",
                "messages" if isinstance(request, ChatCompletionRequest) else "prompt",
            )
        self._registry.require_ready(deployment)
        replicas = self._registry.replicas.ready(deployment.pool)
        max_tokens = wanted or room
        choices = request.choices  # each may use max_tokens: all are reserved, all are billed

        pool, tier = deployment.pool, request.effective_tier
        predicted: TtftPrediction | None = None
        units, team_queued = len(prompt), 0
        if tier == "interactive":
            rate = pool_prefill_rate(replicas)
            slots = pool_slots(replicas)
            units = self._admission.job_units(
                prompt_tokens=len(prompt), prefill_tokens_per_s=rate, slots=slots
            )
            limit = self._admission.queue_limit(
                prompt_tokens=len(prompt),
                prefill_tokens_per_s=rate,
                slo_s=deployment.ttft_slo_s,
                pool=pool,
                slots=slots,
                # A coarse bound: the typical TTFT at the raw wait (a pool-wide factor learnt
                # from short waits that took a whole engine step refused most of what the
                # engine served in time), with slack; the request itself is judged after
                # routing, on its replica's slots where the heartbeat tells.
                margin=False,
                max_factor=1.0,
                slack=BACKLOG_GATE_SLACK,
            )
            outcome = await self._backlog.try_add(
                pool, tier, units, limit, team=team.name, waiting_tokens=len(prompt)
            )
            team_queued = outcome.team_queued
            if not outcome.added:
                # The wait that matters is what fair queuing serves before this request: a
                # flooding team is refused while other teams are still admitted.
                decision = self._admission.decide(
                    tier=tier,
                    prompt_tokens=len(prompt),
                    queued_tokens=outcome.ahead,
                    prefill_tokens_per_s=rate,
                    slo_s=deployment.ttft_slo_s,
                    pool=pool,
                    slots=slots,
                )
                retry_after = decision.retry_after_s or 1
                predicted_s = decision.predicted_ttft_s
                raise shed(deployment, team.name, predicted_s, retry_after, "backlog")

            predicted = self._admission.predict(
                prompt_tokens=len(prompt),
                queued_tokens=outcome.ahead,
                prefill_tokens_per_s=rate,
                pool=pool,
                slots=slots,
            )
        else:
            await self._backlog.add(pool, tier, units, team.name, len(prompt))  # never refused

        policy = team.policy
        now = time.time()
        job = InferenceJob(
            request_id=f"{id_prefix}-{uuid.uuid4().hex}",
            team=team.name,
            model=deployment.name,
            pool=deployment.pool,
            model_version=deployment.version,
            arm=arm,
            adapter=adapter,
            tier=tier,
            team_weight=policy.weight,
            prompt_token_ids=tuple(prompt),
            sampling=sampling_settings(request, max_tokens),
            reserved_tokens=len(prompt) + max_tokens * choices,
            queue_units=units,
            stream=bool(request.stream),
            created_at=now,
            deadline=now + self._timeout_s,
            reply_to=reply_to,
            cache_salt=deployment.cache_salt(team.name, request.cache_salt),
            caller=CallerTags.of(request),
        )
        route = await self._route(request, job, replicas)
        owner_id = route.owner_replica_id if route is not None else None
        owner = next((r for r in replicas if r.replica_id == owner_id), None)
        if predicted is not None:
            judged = self._second_look.judge(
                job, owner, predicted, deployment.ttft_slo_s, team_queued
            )
            if judged.retry_after_s is not None:  # refused before the quota is touched
                await self._unqueue(job)
                raise self._second_look.refusal(deployment, team.name, judged)
            predicted = judged.prediction
            self._second_look.sent(job, owner)  # before any await: see `sent`
        reservation = await self._quota.reserve_for(
            team.name, policy.tokens_per_minute, len(prompt), max_tokens * choices
        )
        if not reservation.allowed:
            await self._unqueue(job)
            raise quota_refusal(team.name, policy.tokens_per_minute, job, reservation)
        partition = route.partition if route is not None else None
        return AdmittedJob(job=job, partition=partition, prediction=predicted)

    async def _route(
        self, request: GenerationRequest, job: InferenceJob, replicas: list[ReplicaHeartbeat]
    ) -> RouteDecision | None:
        """The job's partition (prefix affinity with bounded load); None with random
        routing, where the broker's partitioner decides."""
        if self._router is None:
            return None
        partitions = await self._queue.partitions(job.pool, job.tier)
        demand = 0
        adapter = job.adapter
        if adapter is not None and self._demand is not None:
            demand = await self._demand.started(job.pool, adapter.id, job.request_id, job.deadline)
        return self._router.choose(
            pool=job.pool,
            salt=job.cache_salt or job.team,
            prompt_token_ids=job.prompt_token_ids,
            adapter=adapter.id if adapter is not None else None,
            partitions=partitions,
            replicas=replicas,
            topic=catalog.job_topic(job.pool, job.tier),
            cache_key=request.prompt_cache_key,
            adapter_demand=demand,
            spread_key=job.request_id,
        )

    async def _render(self, model: str, request: ChatCompletionRequest) -> list[int]:
        """The prompt's token ids, tokenized off the event loop unless short; what cannot fit is
        refused before any tokenizing."""
        try:
            chars = self._renderer.check_fits(model, request.messages)
            tools = request.template_tools()
            if self._offload is None or (not tools and chars <= INLINE_RENDER_CHARS):
                return self._renderer.tokenize(model, request.messages, tools)
            prompt: list[int] = await self._offload(
                self._renderer.tokenize, model, request.messages, tools
            )
        except PromptTooLong as exc:
            raise context_length_exceeded(str(exc)) from exc
        return prompt

    async def _encode(
        self, model: str, request: CompletionRequest, prompt: str | list[int]
    ) -> list[int]:
        """A completions prompt's token ids, tokenized off the event loop unless short."""
        args = (model, prompt, request.suffix, request.add_special_tokens)
        chars = len(prompt) + len(request.suffix or "")  # token ids: cheaper still
        try:
            if self._offload is None or chars <= INLINE_RENDER_CHARS:
                return self._renderer.completion_prompt(*args)
            ids: list[int] = await self._offload(self._renderer.completion_prompt, *args)
        except NoFillInTheMiddle as exc:
            raise ApiError(400, str(exc), param="suffix") from exc
        except BadTokenIds as exc:
            raise ApiError(400, str(exc), param="prompt") from exc
        except PromptTooLong as exc:
            raise context_length_exceeded(str(exc), "prompt") from exc
        return ids

    def observe_ttft(self, job: InferenceJob, prediction: TtftPrediction, actual_s: float) -> float:
        """Calibrate the pool's TTFT predictions with one request's actual TTFT; return the
        pool's new calibration factor."""
        self._second_look.started(job.request_id)
        return self._admission.observe(job.pool, prediction, actual_s)

    def prompt_text(self, job: InferenceJob) -> str:
        """The text of a job's prompt (for `echo` of a prompt given as token ids)."""
        ref = version_ref(job.model, job.model_version or "1") or job.model
        return self._renderer.decode(ref, list(job.prompt_token_ids))

    async def release(self, admitted: AdmittedJob) -> None:
        """Give back what admitting a job took (its quota reservation and backlog entry)."""
        job = admitted.job
        policy_tpm = self._quota.policy_for(job.team).tokens_per_minute
        await self._quota.release(job.team, policy_tpm, job.reserved_tokens)
        await self._unqueue(job)

    async def _unqueue(self, job: InferenceJob) -> None:
        """Take a job that will not be produced out of the backlog, admission's second look
        and its adapter's demand."""
        await self._backlog.remove(
            job.pool, job.tier, job.backlog_units, job.team, len(job.prompt_token_ids)
        )
        self._second_look.withdrawn(job.request_id)
        await self._adapter_ended(job)

    async def ended(self, job: InferenceJob) -> None:
        """A job's request ended: its adapter's demand no longer counts it, nor does
        admission's second look count it as waiting."""
        self._second_look.started(job.request_id)
        await self._adapter_ended(job)

    async def _adapter_ended(self, job: InferenceJob) -> None:
        if job.adapter is not None and self._demand is not None:
            await self._demand.ended(job.pool, job.adapter.id, job.request_id)

    async def produce(self, admitted: AdmittedJob) -> JobReceipt:
        """Queue the job: 503 if the broker refuses or does not acknowledge within
        ``produce_timeout_s`` (the quota reservation and backlog are released; the caller
        cancels the request id in case the broker still takes the job later)."""
        job = admitted.job
        try:
            async with asyncio.timeout(self._produce_timeout_s):
                receipt = await self._queue.submit(job, partition=admitted.partition)
        except Exception as exc:
            log.warning("job_produce_failed", request_id=job.request_id, error=type(exc).__name__)
            await self.release(admitted)
            raise ApiError(
                503,
                "The request queue is unavailable; retry shortly.",
                type_="server_error",
                code="queue_unavailable",
            ) from exc
        return receipt

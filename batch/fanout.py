"""Validation and fan-out: a created batch becomes one job per line on its pool's batch topic.

Resumable: the number of lines produced (the cursor) is saved after every chunk, once the broker
has acknowledged the chunk. A restart resumes at the cursor; at most one chunk is produced again,
and those copies are harmless: a line's request id is deterministic, so the job ledger skips a
copy that finished and the collector records each line once.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from batch.finalize import BatchEnd, BatchFinalizer
from batch.ports import FileStore, iter_lines
from batch.quota import LineQuota
from batch.results import error_line, line_id, stored
from batch.state_port import BatchStore, StoredBatch
from batch.validation import (
    BatchLine,
    LineError,
    custom_id_of,
    numbered_requests,
    parse_line,
    validate,
)
from control.registry import AdapterCatalog
from control.served import ServedModels
from schemas.batches import BatchError, BatchErrors, endpoint_of
from schemas.completions import CompletionRequest
from schemas.deployment import Deployment
from schemas.messages import AdapterRef, BatchLineRef, InferenceJob, sampling_settings
from schemas.render import BadTokenIds, ChatRenderer, NoFillInTheMiddle, PromptTooLong
from topics import catalog
from topics.ports import JobQueue, QueueBacklog

log = structlog.get_logger()


class BatchFanout:
    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        queue: JobQueue,
        backlog: QueueBacklog,
        renderer: ChatRenderer,
        models: ServedModels,
        finalizer: BatchFinalizer,
        *,
        max_requests: int,
        chunk: int,
        quota: LineQuota | None = None,
        adapters: AdapterCatalog | None = None,
    ) -> None:
        self._adapters = adapters
        self._store = store
        self._files = files
        self._queue = queue
        self._backlog = backlog
        self._renderer = renderer
        self._models = models
        self._finalizer = finalizer
        self._max_requests = max_requests
        self._chunk = chunk
        self._quota = quota
        self.queued = 0
        """Lines this process produced to the job topics as jobs."""

    async def handle(self, batch_id: str) -> None:
        """Validate the batch if it still needs it, then produce the lines not yet produced."""
        current = await self._store.get(batch_id)
        if current is None:
            log.warning("batch_unknown", batch_id=batch_id)
            return
        if current.batch.status == "validating":
            current = await self._validate(current)
        if current is None:
            return
        if current.batch.status == "cancelling" and current.batch.model is None:
            # Cancelled before it was validated (the cancel beat this event): no line was
            # produced, so none will report; it ends now, with empty output.
            await self._finalizer.finalize(batch_id, "cancelled")
            log.info("batch_cancelled_before_validation", batch_id=batch_id)
            return
        if current.batch.status in ("in_progress", "cancelling"):
            await self._fan_out(current)

    async def _validate(self, current: StoredBatch) -> StoredBatch | None:
        batch = current.batch
        started = time.monotonic()
        try:
            lines = iter_lines(self._files.read(batch.input_file_id))
            report = await validate(
                lines,
                self._models.stable.keys(),
                self._max_requests,
                endpoint_of(batch),
                self._adapter_bases(current.team),
            )
        except FileNotFoundError:
            report = None
        if report is None or not report.ok:
            errors = (
                report.errors
                if report is not None
                else [BatchError(code="file_not_found", message="The input file is gone.")]
            )
            await self._store.set_errors(batch.id, BatchErrors(data=errors))
            await self._store.transition(batch.id, "failed", ("validating",))
            log.info("batch_invalid", batch_id=batch.id, errors=len(errors))
            return None
        assert report.model is not None  # a valid report names its one model
        deployment = self._models.stable[report.model]
        await self._store.update(
            batch.id, total=report.requests, model=report.model, pool=deployment.pool
        )
        await self._store.transition(batch.id, "in_progress", ("validating",))
        log.info(
            "batch_validated",
            batch_id=batch.id,
            team=current.team,
            requests=report.requests,
            seconds=round(time.monotonic() - started, 3),
        )
        return await self._store.get(batch.id)

    def _adapter_bases(self, team: str) -> dict[str, str]:
        """Team `team`'s usable adapters: name -> base deployment."""
        if self._adapters is None:
            return {}
        return {
            a.name: a.base
            for a in self._adapters.adapters
            if a.team == team and a.status == "ready"
        }

    def _adapter_ref(self, team: str, model: str, deployment: Deployment) -> AdapterRef | None:
        """The adapter a line names (None: the line names the deployment itself)."""
        if model == deployment.name:
            return None
        adapter = self._adapters.adapter(team, model) if self._adapters is not None else None
        if adapter is None or adapter.base != deployment.name or adapter.status != "ready":
            raise LineError("model_not_found", f"The model `{model}` does not exist (any more).")
        return adapter.ref

    async def _fan_out(self, current: StoredBatch) -> None:
        batch = current.batch
        assert batch.model is not None
        deployment = self._models.find(batch.model)
        if deployment is None:  # deleted from the registry since: its lines wait, then expire
            log.warning("batch_model_gone", batch_id=batch.id, model=batch.model)
            return
        cursor = current.cursor
        total = batch.request_counts.total
        started = time.monotonic()
        chunk: list[tuple[int, int, bytes]] = []
        lines = iter_lines(self._files.read(batch.input_file_id))
        cancelled = batch.status == "cancelling"
        async for index, line_no, raw in numbered_requests(lines):
            if cancelled or index < cursor:
                continue
            chunk.append((index, line_no, raw))
            if len(chunk) >= self._chunk:
                cursor = await self._send(current, deployment, chunk)
                chunk = []
                latest = await self._store.get(batch.id)
                cancelled = latest is None or latest.batch.status != "in_progress"
        if chunk and not cancelled:
            cursor = await self._send(current, deployment, chunk)
        if cancelled:
            filled = await self._finalizer.fill_missing(
                current, "batch_cancelled", "The batch was cancelled before this line ran.",
                start=cursor,
            )  # fmt: skip
            await self._store.advance_cursor(batch.id, total)
            log.info("batch_fanout_stopped", batch_id=batch.id, produced=cursor, cancelled=filled)
            await self._finalize_if_done(batch.id)
            return
        log.info(
            "batch_fanned_out",
            batch_id=batch.id,
            team=current.team,
            pool=deployment.pool,
            lines=total,
            resumed_at=current.cursor,
            seconds=round(time.monotonic() - started, 3),
        )

    async def _send(
        self, current: StoredBatch, deployment: Deployment, chunk: list[tuple[int, int, bytes]]
    ) -> int:
        """Prepare one chunk's jobs in order (each reserves its team's quota, waiting while the
        bucket is short), produce them concurrently, then save the cursor past the chunk."""
        jobs = [await self._prepare(current, deployment, *item) for item in chunk]
        await asyncio.gather(*(self._submit(job) for job in jobs if job is not None))
        cursor = chunk[-1][0] + 1
        await self._store.advance_cursor(current.batch.id, cursor)
        return cursor

    async def _prepare(
        self, current: StoredBatch, deployment: Deployment, index: int, line_no: int, raw: bytes
    ) -> InferenceJob | None:
        """The line's job, its quota reserved; None when the line failed (it is recorded)."""
        batch = current.batch
        try:
            line = parse_line(raw, index, line_no, endpoint_of(batch))
            job = await self._job(current, deployment, line)
            if self._quota is not None:
                wanted = len(job.prompt_token_ids) + job.sampling.max_tokens
                reserved = await self._quota.reserve(job.team, wanted)
                job = job.model_copy(update={"reserved_tokens": reserved})
        except LineError as exc:
            ref = BatchLineRef(batch_id=batch.id, line=index, custom_id=custom_id_of(raw))
            failed = error_line(ref, line_id(batch.id, index), exc.code, exc.message)
            await self._store.record_line(batch.id, index, False, stored(False, failed))
            await self._finalize_if_done(batch.id)
            return None
        return job

    async def _submit(self, job: InferenceJob) -> None:
        await self._backlog.add(job.pool, "batch", len(job.prompt_token_ids), job.team)
        await self._queue.submit(job)
        self.queued += 1

    async def _job(
        self, current: StoredBatch, deployment: Deployment, line: BatchLine
    ) -> InferenceJob:
        batch = current.batch
        adapter = self._adapter_ref(current.team, line.body.model, deployment)
        prompt = await self._prompt(deployment, line)
        room = deployment.max_model_len - len(prompt)
        max_tokens = line.body.output_limit or room
        if room <= 0 or len(prompt) + max_tokens > deployment.max_model_len:
            raise LineError(
                "context_length_exceeded",
                f"This model's maximum context length is {deployment.max_model_len} tokens; "
                f"this request needs {len(prompt) + max(max_tokens, 1)}.",
            )
        now = time.time()
        return InferenceJob(
            request_id=line_id(batch.id, line.index),
            team=current.team,
            model=deployment.name,
            pool=deployment.pool,
            model_version=deployment.version,
            adapter=adapter,
            tier="batch",
            team_weight=self._quota.policy(current.team).weight if self._quota else 1.0,
            prompt_token_ids=tuple(prompt),
            sampling=sampling_settings(line.body, max_tokens),
            stream=False,
            created_at=now,
            deadline=float(batch.expires_at or now + 86_400),
            reply_to=catalog.RESULTS_TOPIC,
            batch=BatchLineRef(
                batch_id=batch.id,
                line=line.index,
                custom_id=line.custom_id,
                endpoint=endpoint_of(batch),
            ),
            cache_salt=deployment.cache_salt(current.team, line.body.cache_salt),
        )

    async def _prompt(self, deployment: Deployment, line: BatchLine) -> list[int]:
        """The line's prompt token ids, tokenized off the event loop (a long line must not
        hold up the service's consumers)."""
        body = line.body
        try:
            if isinstance(body, CompletionRequest):
                (prompt,) = body.prompts
                return await asyncio.to_thread(
                    self._renderer.completion_prompt,
                    deployment.ref, prompt, body.suffix, body.add_special_tokens,
                )  # fmt: skip
            self._renderer.check_fits(deployment.ref, body.messages)
            return await asyncio.to_thread(self._renderer.tokenize, deployment.ref, body.messages)
        except PromptTooLong as exc:
            raise LineError("context_length_exceeded", str(exc)) from exc
        except (NoFillInTheMiddle, BadTokenIds) as exc:
            raise LineError("invalid_request", str(exc)) from exc

    async def _finalize_if_done(self, batch_id: str) -> None:
        current = await self._store.get(batch_id)
        if current is None:
            return
        counts = current.batch.request_counts
        if counts.total and counts.completed + counts.failed >= counts.total:
            end: BatchEnd = "cancelled" if current.batch.status == "cancelling" else "completed"
            await self._finalizer.finalize(batch_id, end)

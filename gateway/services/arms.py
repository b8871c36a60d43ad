"""What the gateway tells the rollout controller: each finished request of a deployment in
rollout, as a sample of its arm (stable or canary), recorded in the background."""

from __future__ import annotations

import asyncio
import time

import structlog

from control.served import ServedModels
from schemas.deployment import version_ref
from schemas.messages import InferenceJob
from schemas.rollout import ArmSample
from topics.ports import ArmStats

log = structlog.get_logger()

NOT_THE_VERSIONS_FAULT = frozenset({"abandoned", "invalid_request"})
"""Outcomes that say nothing of the version that ran the request: its caller left, or the
engine refused the request itself (a 400)."""


class ArmRecorder:
    def __init__(self, stats: ArmStats, served: ServedModels) -> None:
        self._stats = stats
        self._served = served
        self._background: set[asyncio.Task[None]] = set()

    def finished(
        self, job: InferenceJob, outcome: str, ttft_s: float | None, tpot_s: float | None
    ) -> None:
        """Record a finished request when its deployment has a canary and it ran on an arm
        of the split (a pinned request is no sample of either)."""
        if job.arm not in ("stable", "canary") or outcome in NOT_THE_VERSIONS_FAULT:
            return
        if not self._served.in_rollout(job.model):
            return
        ref = version_ref(job.model, job.model_version)
        if ref is None:
            return
        sample = ArmSample(at=time.time(), ok=outcome == "ok", ttft_s=ttft_s, tpot_s=tpot_s)
        task = asyncio.create_task(self._record(ref, sample))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _record(self, ref: str, sample: ArmSample) -> None:
        try:
            await self._stats.record(ref, sample)
        except Exception as exc:  # Redis away: a rollout judges on the samples it has
            log.warning("arm_sample_lost", model=ref, error=type(exc).__name__)

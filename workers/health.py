"""Health that runs the model: a probe generation and a step watchdog.

A heartbeat only proves the process's event loop is alive. A GPU that threw an Xid error, a
wedged NCCL collective or a deadlocked engine keeps heartbeating while every stream on it
stalls. So the worker asks the engine itself:

- the probe runs a one-token generation on a fixed prompt every `interval_s`, with a deadline;
  `failures_allowed` failures in a row make the worker unhealthy. It is skipped while real jobs
  produced tokens within the interval: they already prove the engine runs, and a probe's
  prefill stalls their streams (on the CPU engine every running stream paused 260-330 ms at
  each probe, every 5 s);
- the watchdog notices when the engine holds jobs but has produced nothing for `stall_s`
  (normal steps take tens of milliseconds on a GPU, under a second on this CPU).

Either way `watch()` returns the reason, and the worker reports itself unhealthy in its
heartbeat (the gateway stops routing to it), abandons its jobs uncommitted (the partitions'
next owner runs them) and exits non-zero for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import structlog

from schemas.messages import InferenceJob, SamplingSettings
from workers.engine.port import EngineClient
from workers.load import LoadTracker

log = structlog.get_logger()

PROBE_PROMPT: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
"""Token ids of the probe's prompt: any model's vocabulary has them."""


class EngineHealth:
    def __init__(
        self,
        engine: EngineClient,
        load: LoadTracker,
        *,
        replica_id: str,
        model: str,
        pool: str,
        interval_s: float,
        timeout_s: float,
        failures_allowed: int = 2,
        stall_s: float = 30.0,
    ) -> None:
        self._engine = engine
        self._load = load
        self._replica_id = replica_id
        self._model = model
        self._pool = pool
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._failures_allowed = failures_allowed
        self._stall_s = stall_s
        self._probes = itertools.count(1)

    async def watch(self) -> str:
        """Return (the reason) once the engine is unhealthy; run forever while it is not.

        With `interval_s` 0 the probe is off (the watchdog still runs)."""
        checks = [asyncio.create_task(self._watchdog())]
        if self._interval_s > 0:
            checks.append(asyncio.create_task(self._probe_loop()))
        try:
            done, _ = await asyncio.wait(checks, return_when=asyncio.FIRST_COMPLETED)
            return next(iter(done)).result()
        finally:
            for task in checks:
                task.cancel()

    async def _probe_loop(self) -> str:
        failures = 0
        while True:
            await asyncio.sleep(self._interval_s)
            if self.busy_and_progressing():
                failures = 0
                continue
            error = await self.probe()
            if error is None:
                failures = 0
                continue
            failures += 1
            log.warning("health_probe_failed", error=error, failures=failures)
            if failures >= self._failures_allowed:
                return f"probe failed {failures} times in a row ({error})"

    def busy_and_progressing(self) -> bool:
        """Whether held jobs produced output within the last interval (a stall is the
        watchdog's business)."""
        silent = self._load.silent_for()
        return silent is not None and silent < self._interval_s

    async def probe(self) -> str | None:
        """One one-token generation under the deadline: None if it answered, else why not."""
        now = time.time()
        job = InferenceJob(
            request_id=f"health-{self._replica_id}-{next(self._probes)}",
            team="llmq-health",
            model=self._model,
            pool=self._pool,
            prompt_token_ids=PROBE_PROMPT,
            sampling=SamplingSettings(max_tokens=1, temperature=0.0),
            created_at=now,
            deadline=now + self._timeout_s,
            reply_to="",
        )
        produced = 0
        try:
            async with asyncio.timeout(self._timeout_s):
                async for step in self._engine.generate(job):
                    produced += step.num_new_tokens
        except TimeoutError:
            await self._abort(job.request_id)
            return f"no token within {self._timeout_s}s"
        except Exception as exc:
            await self._abort(job.request_id)
            return type(exc).__name__
        return None if produced > 0 else "no token produced"

    async def _abort(self, request_id: str) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._engine.abort(request_id)
        except Exception as exc:  # a hung engine may not abort either
            log.warning("health_probe_abort_failed", error=type(exc).__name__)

    async def _watchdog(self) -> str:
        period = min(1.0, self._stall_s / 4)
        while True:
            await asyncio.sleep(period)
            silent = self._load.silent_for()
            if silent is not None and silent > self._stall_s:
                return f"engine produced nothing for {silent:.0f}s while holding jobs"

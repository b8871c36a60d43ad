"""The replica heartbeat: pool, model, state, assigned partitions and engine load."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Literal

import structlog

from schemas.heartbeat import ReplicaHeartbeat, ReplicaState
from topics.redis_relay import RedisReplicaDirectory
from workers.engine.port import EngineClient, EngineStats
from workers.load import LoadTracker

log = structlog.get_logger()


class Heartbeat:
    def __init__(
        self,
        directory: RedisReplicaDirectory,
        *,
        replica_id: str,
        pool: str,
        model: str,
        interval_s: float,
        engine_kind: Literal["vllm", "simulated"] = "vllm",
    ) -> None:
        self._directory = directory
        self._replica_id = replica_id
        self._pool = pool
        self._model = model
        self._interval_s = interval_s
        self._engine_kind: Literal["vllm", "simulated"] = engine_kind
        self.state: ReplicaState = "loading"
        self.healthy = True
        self.engine: EngineClient | None = None
        self.partitions: Callable[[], list[str]] = list
        self.load: LoadTracker | None = None
        self.buffered: Callable[[], tuple[dict[str, int], int]] = lambda: ({}, 0)
        """Jobs waiting in this worker for a slot by team, and their prompt tokens."""
        self.startable: Callable[[], dict[str, int]] = dict
        """The slots each team could start a job in now (`PullLoop.startable_by_team`)."""
        self.slot_reserve: Callable[[int], int] = lambda max_num_seqs: 0
        """The slots a team holding a job leaves to others (`HeadroomPolicy.slot_reserve`)."""

    def current(self) -> ReplicaHeartbeat:
        stats = self.engine.stats() if self.engine is not None and self.state != "loading" else None
        buffered, buffered_tokens = self.buffered()
        slots = self._slots(stats)
        return ReplicaHeartbeat(
            replica_id=self._replica_id,
            pool=self._pool,
            model=self._model,
            state=self.state,
            healthy=self.healthy,
            partitions=tuple(self.partitions()),
            kv_cache_usage=stats.kv_cache_usage if stats else 0.0,
            running=stats.running if stats else 0,
            waiting=stats.waiting if stats else 0,
            in_flight=self.load.in_flight if self.load else 0,
            outstanding_tokens=self.load.outstanding_tokens() if self.load else 0,
            prefill_tokens_per_s=self._prefill_rate(stats),
            max_num_seqs=slots,
            slot_reserve=self.slot_reserve(slots),
            startable=self.startable() if self.state == "ready" else {},
            teams_running=self.load.teams() if self.load else (),
            mean_job_s=self.load.mean_job_s() if self.load else 0.0,
            buffered=buffered,
            prefill_waiting_tokens=buffered_tokens
            + (self.load.prefill_waiting_tokens() if self.load else 0),
            slot_free_in_s=self.load.slot_ends_in_s() if self.load else (),
            adapters=stats.adapters if stats else (),
            engine=self._engine_kind,
            sent_at=time.time(),
        )

    def _slots(self, stats: EngineStats | None) -> int:
        """The sequence slots this replica offers: the engine's ``max_num_seqs``, or fewer
        under the TPOT cap (`LoadTracker.seq_cap`), so admission counts only slots that
        jobs may really start in (the pull loop asks the same, `workers.load_view`); 0 before
        the engine is there."""
        if self.engine is None:
            return 0
        limit = self.engine.max_num_seqs
        rate = stats.prefill_tokens_per_s if stats is not None else 0.0
        return self.load.seq_cap(limit, rate) if self.load is not None else limit

    def _prefill_rate(self, stats: EngineStats | None) -> float:
        """The engine's own measure when it has one, else first-token timings of jobs."""
        if stats is not None and stats.prefill_tokens_per_s > 0:
            return stats.prefill_tokens_per_s
        return self.load.prefill_tokens_per_s() if self.load else 0.0

    async def beat_now(self) -> None:
        await self._directory.beat(self.current())

    async def run(self) -> None:
        while True:
            try:
                await self.beat_now()
            except Exception as exc:  # Redis away: keep beating, it comes back
                log.warning("heartbeat_failed", error=type(exc).__name__)
            await asyncio.sleep(self._interval_s)

    async def remove(self) -> None:
        await self._directory.remove(self._replica_id)

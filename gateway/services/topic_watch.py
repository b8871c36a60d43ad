"""The job topics' lag and the dead-letter topic, refreshed in the background for `/metrics`
and the operator page (reading a topic per scrape or per page poll would cost a consumer
each time; a snapshot every few seconds is what both need)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog
from pydantic import ValidationError

from schemas.admin import DeadLetterState
from schemas.messages import DeadLetter
from topics import catalog
from topics.catalog import PRIORITY_CLASSES
from topics.ports import TopicWatch

log = structlog.get_logger()


@dataclass(frozen=True)
class TopicsSnapshot:
    taken_at: float
    lag: dict[tuple[str, str], int] = field(default_factory=dict)
    """(pool, class) -> job records its workers have not committed (waiting or running)."""
    dead_letters: int = 0
    """Records the dead-letter topic holds."""
    recent_dead_letters: tuple[DeadLetterState, ...] = ()
    """The newest ones, newest last (no payloads: never content)."""


class TopicMonitor:
    def __init__(
        self,
        watch: TopicWatch,
        pools: Callable[[], Iterable[str]],
        *,
        interval_s: float,
        dead_letters_shown: int = 10,
    ) -> None:
        self._watch = watch
        self._pools = pools
        self._interval_s = interval_s
        self._shown = dead_letters_shown
        self.snapshot: TopicsSnapshot | None = None
        """The last refresh that succeeded (None before the first)."""

    async def refresh(self) -> TopicsSnapshot:
        lag: dict[tuple[str, str], int] = {}
        for pool in sorted(set(self._pools())):
            topics = {catalog.job_topic(pool, tier): tier for tier in PRIORITY_CLASSES}
            try:
                found = await self._watch.lag(catalog.worker_group(pool), list(topics))
            except Exception as exc:  # one pool's topics unreadable: the others still count
                log.warning("topic_lag_failed", pool=pool, error=type(exc).__name__)
                continue
            for topic, records in found.items():
                lag[(pool, topics[topic])] = records
        held, values = await self._watch.tail(catalog.DEAD_TOPIC, self._shown)
        snapshot = TopicsSnapshot(time.time(), lag, held, tuple(_summaries(values)))
        self.snapshot = snapshot
        return snapshot

    async def run(self) -> None:
        """Refresh every `interval_s` until cancelled; a failed refresh keeps the last one."""
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # the broker away: try again next time
                log.warning("topic_watch_failed", error=type(exc).__name__)
            await asyncio.sleep(self._interval_s)


def _summaries(values: list[bytes]) -> Iterable[DeadLetterState]:
    for value in values:
        try:
            letter = DeadLetter.model_validate_json(value)
        except ValidationError:
            continue
        yield DeadLetterState.model_validate(
            letter.model_dump(include=set(DeadLetterState.model_fields))
        )

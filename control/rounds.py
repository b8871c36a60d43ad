"""A controller's rounds: `reconcile()` every `interval_s` in a background task, a failed round
logged and retried at the next one (Redis or the broker away is not a reason to stop)."""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod

import structlog

log = structlog.get_logger()


class Rounds(ABC):
    def __init__(self, name: str, interval_s: float) -> None:
        self._name = name
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    @abstractmethod
    async def reconcile(self) -> None:
        """One round."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self._name)

    @property
    def running(self) -> bool:
        """Whether its rounds go on (started, not stopped, not crashed)."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:
                log.exception("round_failed", controller=self._name)
            await asyncio.sleep(self._interval_s)

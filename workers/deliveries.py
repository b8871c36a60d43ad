"""A job's token events on their way to its gateway, sent without waiting for each one.

The runner hands each step's event to the relay (`EventPublisher.push`) and goes on to the
next step; the relay's answers (did a gateway receive it?) are read as they come back, in
order, since the relay sends one batch at a time. Waiting for every event would cost each
running job a second wake-up per token, and the worker's CPU per token is the platform's own
overhead on top of the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from schemas.messages import UsageCounts


class CallerGone(Exception):
    """A token event reached no gateway: nobody waits for this request any more."""


Counts = tuple[int, int, int]
"""Usage as plain numbers on the per-token path: prompt, cached and completion tokens."""


class Deliveries:
    """The unanswered sends of one job, and the usage its gateway is known to have received."""

    def __init__(self, channel: str) -> None:
        self._channel = channel
        self._waiting: deque[tuple[asyncio.Future[dict[str, int]], Counts]] = deque()
        self._received: Counts | None = None

    @property
    def received(self) -> UsageCounts | None:
        """The usage sent with the last event a gateway received (None: none received)."""
        if self._received is None:
            return None
        prompt, cached, completion = self._received
        return UsageCounts(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion)

    def sent(self, answer: asyncio.Future[dict[str, int]], counts: Counts) -> None:
        """One event handed to the relay, with the usage the job had produced with it."""
        self._waiting.append((answer, counts))

    def check(self) -> None:
        """Read the answers that came back. Raises `CallerGone` when an event reached no
        gateway, and the relay's own error when its send failed."""
        waiting = self._waiting
        while waiting and waiting[0][0].done():
            self._read(*waiting.popleft())

    async def settle(self) -> None:
        """Wait for every answer (before the job's last event, or to bill an interrupted job
        exactly what its caller saw)."""
        while self._waiting:
            answer, counts = self._waiting.popleft()
            await asyncio.shield(answer)  # the batch is shared: never cancel it for others
            self._read(answer, counts)

    async def settle_quietly(self) -> None:
        """`settle`, for a job that is ending anyway: a send that failed counts as not
        received, and reading stops at the first event nobody received."""
        while self._waiting:
            answer, counts = self._waiting.popleft()
            with contextlib.suppress(Exception):
                await asyncio.shield(answer)
            if answer.exception() is not None:
                continue
            try:
                self._read(answer, counts)
            except CallerGone:
                return

    def _read(self, answer: asyncio.Future[dict[str, int]], counts: Counts) -> None:
        if answer.result()[self._channel] == 0:
            self._waiting.clear()
            raise CallerGone
        self._received = counts

"""A job's token events sent without waiting: the relay's answers are read in order, a send
nobody received stops the job, and what the caller saw is exactly what was received."""

from __future__ import annotations

import asyncio

import pytest

from schemas.messages import UsageCounts
from workers.deliveries import CallerGone, Deliveries

CHANNEL = "llmq:reply:g1"


def _answer(reached: int | None) -> asyncio.Future[dict[str, int]]:
    """A relay batch's answer: `reached` subscribers on the job's channel (None: not back)."""
    answer: asyncio.Future[dict[str, int]] = asyncio.get_running_loop().create_future()
    if reached is not None:
        answer.set_result({CHANNEL: reached, "llmq:reply:other": 1})
    return answer


def _usage(completion: int) -> UsageCounts:
    return UsageCounts(prompt_tokens=10, cached_tokens=4, completion_tokens=completion)


async def test_answers_are_read_in_order_as_they_come_back() -> None:
    deliveries = Deliveries(CHANNEL)
    later = _answer(None)
    deliveries.sent(_answer(1), (10, 4, 1))
    deliveries.sent(later, (10, 4, 2))
    deliveries.sent(_answer(1), (10, 4, 3))  # back, but behind one that is not
    deliveries.check()
    assert deliveries.received == _usage(1)
    later.set_result({CHANNEL: 1})
    deliveries.check()
    assert deliveries.received == _usage(3)


async def test_an_event_nobody_received_means_the_caller_is_gone() -> None:
    deliveries = Deliveries(CHANNEL)
    assert deliveries.received is None
    deliveries.sent(_answer(1), (10, 4, 1))
    deliveries.sent(_answer(0), (10, 4, 2))
    deliveries.sent(_answer(0), (10, 4, 3))
    with pytest.raises(CallerGone):
        deliveries.check()
    assert deliveries.received == _usage(1)  # billed: what reached a gateway
    deliveries.check()  # nothing left to read: the job has stopped already


async def test_settle_waits_for_every_answer() -> None:
    deliveries = Deliveries(CHANNEL)
    last = _answer(None)
    deliveries.sent(_answer(1), (10, 4, 1))
    deliveries.sent(last, (10, 4, 2))
    asyncio.get_running_loop().call_soon(last.set_result, {CHANNEL: 1})
    await asyncio.wait_for(deliveries.settle(), 5)
    assert deliveries.received == _usage(2)


async def test_a_failed_send_is_raised_by_settle_and_counts_as_unseen_when_quiet() -> None:
    failed = _answer(None)
    failed.set_exception(ConnectionError("redis went away"))
    deliveries = Deliveries(CHANNEL)
    deliveries.sent(_answer(1), (10, 4, 1))
    deliveries.sent(failed, (10, 4, 2))
    with pytest.raises(ConnectionError):
        await deliveries.settle()
    assert deliveries.received == _usage(1)

    quiet = Deliveries(CHANNEL)
    quiet.sent(_answer(1), (10, 4, 1))
    quiet.sent(failed, (10, 4, 2))
    quiet.sent(_answer(1), (10, 4, 3))  # a later batch went out after all
    quiet.sent(_answer(0), (10, 4, 4))
    quiet.sent(_answer(1), (10, 4, 5))  # read no further than the one nobody received
    await quiet.settle_quietly()
    assert quiet.received == _usage(3)

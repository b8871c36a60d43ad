"""What `llmq replay` accepts on its command line: times, topic names, and the error for an
impossible request (exit code 2)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

from topics import catalog


class ReplayUsageError(ValueError):
    """The command line asks for something impossible (exit code 2)."""


def parse_time(text: str) -> float:
    """Epoch seconds from ``1767225600[.5]`` or ISO-8601 (a time without a zone is UTC).

    Raises `ReplayUsageError`, a ValueError, so it serves as a typer option parser too."""
    with contextlib.suppress(ValueError):
        return float(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ReplayUsageError(f"not epoch seconds or ISO-8601: {text!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def is_job_topic(topic: str) -> bool:
    """Whether `topic` is named like ``llmq.jobs.<pool>.<interactive|batch>``."""
    pool, _, tier = topic.removeprefix("llmq.jobs.").rpartition(".")
    return topic.startswith("llmq.jobs.") and bool(pool) and tier in catalog.PRIORITY_CLASSES

"""Services that consume a topic, do their work and commit, as FastStream subscribers.

The batch service's fan-out (batch control topic) and result collector (results topic) and
the gateways' quota reconciler (usage topic) each subscribe to one topic in one consumer group
with a typed handler: `subscribe()` decodes the record into its pydantic message, awaits the
handler (the side effect) and only then acknowledges (commits) it. So the guarantees are the
ones the hand-written loops gave:

- commit after effect: a crash between the two re-delivers the record to the partition's next
  owner, and every handler is idempotent by id (a batch line is recorded once, a fan-out
  resumes at its cursor, a refund at worst loosens a quota by one request);
- a record that is not a message (wrong JSON, unknown schema version) is logged and
  acknowledged: it can never become one, and must not block its partition;
- a handler that fails (Redis or S3 away) acknowledges nothing: after `retry_s` the record is
  rewound (`nack`) and handled again, so one outage delays the topic instead of losing it.

Records are taken one at a time (FastStream's default subscriber reads with `getone`), so a
commit never covers a record whose handler has not finished. Stopping the broker lets a running
handler finish (its graceful timeout) before the consumers leave their groups.

The workers' pull loop is not here: it fetches only while its engine has KV headroom and
pauses partitions, which needs aiokafka's consumer directly (`workers.pull_loop`). Neither is
the registry follower (`topics.kafka_registry`): every process reads the whole registry log
from its start with no group and commits nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog
from aiokafka.helpers import create_ssl_context
from faststream import AckPolicy, BaseMiddleware
from faststream.exceptions import NackMessage
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.message import StreamMessage
from faststream.security import BaseSecurity, SASLOAuthBearer
from pydantic import BaseModel, ValidationError

from topics.kafka_connection import MskIamTokenProvider, kafka_connection

log = structlog.get_logger()

M = TypeVar("M", bound=BaseModel)

STREAM_FETCH_MAX_WAIT_MS = 500
"""How long a subscriber's fetch waits for records: usage, batch control and batch results are
not latency-critical (a quota refund or a batch line half a second later), and a broker that
answers only when the wait expires (Tansu) is spared most of their idle polls."""


@dataclass(frozen=True)
class Stream(Generic[M]):
    """One topic read by one consumer group, as `model` messages."""

    topic: str
    group: str
    model: type[M]
    description: str
    """What the records are, who publishes them and what the group does with them."""
    from_start: bool = False
    """Where a new group starts: the topic's first record, or its end."""
    max_poll_interval_ms: int = 300_000
    """Longest a handler may run before the group gives its partitions to another member."""


class RejectedRecordLog(BaseMiddleware):
    """Logs a record that is not its stream's message (then acknowledged by `AckPolicy.ACK`)
    by topic and size: never its content (pydantic's error would quote it)."""

    async def consume_scope(
        self, call_next: Callable[[StreamMessage[Any]], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        try:
            return await call_next(msg)
        except ValidationError:
            topic = getattr(msg.raw_message, "topic", None)
            log.warning("record_rejected", topic=topic, size=len(msg.body))
            return None


def kafka_broker(bootstrap: str, client_id: str, graceful_timeout_s: float = 15.0) -> KafkaBroker:
    """A FastStream broker on the configured connection (plaintext, or MSK with TLS and IAM)."""
    connection = kafka_connection()
    extra: dict[str, Any] = {}
    if connection.sasl_mechanism == "OAUTHBEARER":
        assert connection.aws_region is not None
        extra["security"] = SASLOAuthBearer(ssl_context=create_ssl_context())
        extra["sasl_oauth_token_provider"] = MskIamTokenProvider(connection.aws_region)
    elif connection.security_protocol == "SSL":
        extra["security"] = BaseSecurity(ssl_context=create_ssl_context())
    return KafkaBroker(
        bootstrap,
        client_id=client_id,
        graceful_timeout=graceful_timeout_s,
        middlewares=[RejectedRecordLog],
        logger=None,  # structlog logs what matters, never a record's content
        **extra,
    )


def subscribe(
    broker: KafkaBroker,
    stream: Stream[M],
    handle: Callable[[M], Awaitable[None]],
    *,
    retry_s: float = 1.0,
) -> None:
    """Handle every record of the stream, committing each once `handle` returned (see the
    module's docstring for what happens when it does not)."""

    async def on_record(event: Any, message: KafkaMessage) -> None:
        try:
            await handle(event)
        except Exception as exc:
            log.warning("record_handling_failed", topic=stream.topic, error=type(exc).__name__)
            await asyncio.sleep(retry_s)  # an outage: do not spin on it
            raise NackMessage() from exc  # rewound: the record is handled again
        await message.ack()  # the commit, after the effect

    # The message type FastStream decodes into (and documents in the AsyncAPI schema).
    on_record.__annotations__ = {"event": stream.model, "message": KafkaMessage, "return": None}
    broker.subscriber(
        stream.topic,
        group_id=stream.group,
        auto_offset_reset="earliest" if stream.from_start else "latest",
        ack_policy=AckPolicy.ACK,  # a record that does not decode: acknowledged, skipped
        fetch_max_wait_ms=STREAM_FETCH_MAX_WAIT_MS,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        max_poll_interval_ms=stream.max_poll_interval_ms,
        title=f"{stream.topic}:{stream.group}",
        description=stream.description,
    )(on_record)

"""The streams llmq's services consume through FastStream (`topics.kafka_streams`): each topic
with its consumer group, its message and what the group does with it."""

from __future__ import annotations

from schemas.messages import BatchCreatedEvent, BatchResultEvent, UsageRecord
from topics import catalog
from topics.kafka_streams import Stream

BATCH_CONTROL: Stream[BatchCreatedEvent] = Stream(
    catalog.BATCHES_TOPIC,
    catalog.BATCH_FANOUT_GROUP,
    BatchCreatedEvent,
    "A batch was created (published by the gateway that accepted it, keyed by batch id). One "
    "batch service fans its file out into jobs on the pool's batch topic, resuming at its "
    "cursor after a crash, then commits.",
    from_start=True,
    max_poll_interval_ms=3_600_000,  # a large file fans out for minutes
)

BATCH_RESULTS: Stream[BatchResultEvent] = Stream(
    catalog.RESULTS_TOPIC,
    catalog.BATCH_COLLECTOR_GROUP,
    BatchResultEvent,
    "A batch line ended (published by the worker that ran it, keyed by batch id). One batch "
    "service records the line's result once (a redelivery is a duplicate, dropped), finalizes "
    "the batch when every line is accounted for, then commits.",
    from_start=True,
)

USAGE: Stream[UsageRecord] = Stream(
    catalog.USAGE_TOPIC,
    catalog.QUOTA_GROUP,
    UsageRecord,
    "A request finished (published by its worker, keyed by team): tokens used, for metering. "
    "The gateways' quota reconcilers (one group over every gateway) refund the tokens a "
    "request reserved but did not use, then commit.",
)

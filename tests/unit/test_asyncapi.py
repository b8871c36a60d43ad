"""docs/asyncapi.yaml is what FastStream generates from llmq's subscribers and channels, and
it names every topic and Redis channel with its message."""

from __future__ import annotations

from pathlib import Path

import yaml

from llmq.asyncapi import render
from topics import catalog

DOCUMENT = Path(__file__).parents[2] / "docs/asyncapi.yaml"


def test_the_committed_document_is_what_faststream_generates() -> None:
    assert DOCUMENT.read_text() == render(), "regenerate: llmq topics asyncapi --out " + str(
        DOCUMENT
    )


def test_every_topic_and_channel_is_there_with_its_message() -> None:
    document = yaml.safe_load(render())
    assert document["asyncapi"] == "3.0.0"
    addresses = {channel["address"] for channel in document["channels"].values()}
    topics = set(catalog.all_topics(["{pool}"])) | {catalog.REGISTRY_TOPIC}
    channels = {catalog.reply_channel("{gateway_id}"), catalog.CANCEL_CHANNEL,
                catalog.wake_channel("{pool}")}  # fmt: skip
    assert addresses == topics | channels
    schemas = document["components"]["schemas"]
    for name in ("InferenceJob", "UsageRecord", "BatchResultEvent", "BatchCreatedEvent",
                 "DeadLetter", "DeploymentRecord", "AdapterRecord", "CancelEvent",
                 "TokenEvent", "FinishEvent", "ErrorEvent", "ReplyBatchEvent"):  # fmt: skip
        assert schemas[name]["additionalProperties"] is False, name  # extra="forbid"
    # The consumer groups FastStream runs receive; everything llmq writes is sent.
    actions = {name: op["action"] for name, op in document["operations"].items()}
    assert actions["llmq.usage:llmq.gateways.quota"] == "receive"
    assert actions["llmq.results:llmq.batch.collector"] == "receive"
    assert actions["llmq.batches:llmq.batch.fanout"] == "receive"
    assert actions[catalog.DEAD_TOPIC] == "send"
    subscribed = document["components"]["messages"][
        "llmq.usage:llmq.gateways.quota:SubscribeMessage"
    ]
    assert subscribed["payload"] == {"$ref": "#/components/schemas/UsageRecord"}

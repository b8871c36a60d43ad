"""How Kafka clients connect: plaintext by default, TLS with MSK IAM tokens when configured."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import pytest
from pydantic import ValidationError

from gateway.settings import GatewaySettings
from topics import kafka_connection
from topics.kafka_connection import (
    KafkaConnection,
    MskIamTokenProvider,
    client_kwargs,
    configure_kafka,
)

MSK = KafkaConnection(
    security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", aws_region="eu-west-1",
    replication_factor=3,
)  # fmt: skip


@pytest.fixture(autouse=True)
def restore() -> Iterator[None]:
    before = kafka_connection.kafka_connection()
    yield
    configure_kafka(before)


def test_the_default_is_the_plaintext_local_broker() -> None:
    configure_kafka(KafkaConnection())
    assert client_kwargs() == {}


def test_msk_iam_uses_tls_and_oauthbearer_tokens() -> None:
    configure_kafka(MSK)
    kwargs = client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "OAUTHBEARER"
    assert kwargs["ssl_context"].check_hostname
    assert isinstance(kwargs["sasl_oauth_token_provider"], MskIamTokenProvider)


def test_incomplete_connections_are_refused() -> None:
    with pytest.raises(ValidationError, match="sasl_mechanism"):
        KafkaConnection(security_protocol="SASL_SSL")
    with pytest.raises(ValidationError, match="aws_region"):
        KafkaConnection(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER")


def test_process_settings_read_the_connection_from_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMQ_KAFKA_CONNECTION", MSK.model_dump_json())
    assert GatewaySettings().kafka_connection == MSK


async def test_tokens_are_signed_locally_for_the_region_and_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    provider = MskIamTokenProvider("eu-west-1")
    token = await provider.token()
    url = urlparse(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode())
    assert url.hostname == "kafka.eu-west-1.amazonaws.com"
    assert parse_qs(url.query)["Action"] == ["kafka-cluster:Connect"]
    assert await provider.token() == token  # reused until shortly before it expires

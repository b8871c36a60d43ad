"""How llmq's Kafka clients connect: plaintext to the local broker, or TLS with IAM to
Amazon MSK (SASL OAUTHBEARER, tokens signed locally from the pod's IRSA credentials).

Every process builds its settings once at start-up and calls `configure_kafka` with their
`kafka_connection` before it opens a Kafka client; every adapter that opens one spreads
`client_kwargs()` into it. (One process, one broker: a module-level setting, like structlog's
configuration, rather than a parameter threaded through every adapter.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from aiokafka.abc import AbstractTokenProvider
from aiokafka.helpers import create_ssl_context
from pydantic import BaseModel, ConfigDict, Field, model_validator

TOKEN_REFRESH_MARGIN_S = 60.0
"""A signed MSK token is replaced this long before it expires."""


class KafkaConnection(BaseModel):
    """`LLMQ_KAFKA_CONNECTION` (JSON) of every process; the default is the local broker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_SSL"] = "PLAINTEXT"
    """`SASL_SSL` for MSK with IAM (port 9098), `SSL` for TLS without authentication."""
    sasl_mechanism: Literal["OAUTHBEARER"] | None = None
    """`OAUTHBEARER`: MSK IAM tokens signed with the process's AWS credentials."""
    aws_region: str | None = None
    """The MSK cluster's region (tokens are signed for it)."""
    replication_factor: int = Field(default=1, ge=1)
    """Replicas of the topics llmq creates (3 on MSK; the local broker has one node)."""

    @model_validator(mode="after")
    def _complete(self) -> KafkaConnection:
        if self.security_protocol == "SASL_SSL" and self.sasl_mechanism is None:
            raise ValueError("SASL_SSL needs sasl_mechanism (OAUTHBEARER for MSK IAM)")
        if self.sasl_mechanism == "OAUTHBEARER" and not self.aws_region:
            raise ValueError("MSK IAM tokens need aws_region")
        return self


class MskIamTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """MSK IAM tokens (`aws-msk-iam-sasl-signer-python`), reused until shortly before expiry."""

    def __init__(self, region: str) -> None:
        self._region = region
        self._token: str | None = None
        self._expires_at = 0.0

    async def token(self) -> str:
        if self._token is None or time.time() > self._expires_at - TOKEN_REFRESH_MARGIN_S:
            from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

            # Credential lookup may read files or call STS: off the event loop.
            token, expiry_ms = await asyncio.to_thread(
                MSKAuthTokenProvider.generate_auth_token, self._region
            )
            self._token, self._expires_at = token, expiry_ms / 1000
        return self._token


_connection = KafkaConnection()


def configure_kafka(connection: KafkaConnection) -> None:
    """Set how this process's Kafka clients connect (once, at start-up)."""
    global _connection
    _connection = connection


def kafka_connection() -> KafkaConnection:
    return _connection


def client_kwargs() -> dict[str, Any]:
    """The aiokafka keyword arguments of the configured connection (none for plaintext)."""
    c = _connection
    if c.security_protocol == "PLAINTEXT":
        return {}
    kwargs: dict[str, Any] = {
        "security_protocol": c.security_protocol,
        "ssl_context": create_ssl_context(),
    }
    if c.sasl_mechanism == "OAUTHBEARER":
        assert c.aws_region is not None
        kwargs["sasl_mechanism"] = "OAUTHBEARER"
        kwargs["sasl_oauth_token_provider"] = MskIamTokenProvider(c.aws_region)
    return kwargs

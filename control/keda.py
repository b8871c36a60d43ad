"""KEDA objects that autoscale a pool's workers: a `ScaledObject` per worker `Deployment` and
the `TriggerAuthentication` its Kafka triggers use to reach MSK with IAM. Plain dicts, as
`control.k8s_manifests` renders the workers; checked against KEDA's CRD schema (vendored in
`infra/k8s/schemas/`).

What scales a pool (seed 000: never GPU utilisation):
- the consumer lag of its interactive job topic (a few waiting jobs per replica is already
  TTFT lost, so the threshold is small) and of its batch topic (batch work fills idle
  capacity and has a day: only a deep backlog adds replicas); KEDA takes the largest
  demand of its triggers, so interactive lag weighs far more than batch lag;
- KV cache use and TTFT p95 against the SLO, from the gateways' /metrics through Prometheus,
  as `Value` metrics (desired = current x value / target): KV use above 80% or TTFT near its
  SLO adds replicas before requests are refused.
KEDA caps a Kafka-scaled target at the topic's partition count, so a pool's partitions bound
its scale-out (`llmq plan`'s `max_replicas` is what to create). Scale-in is slow (one pod per
two minutes after ten calm minutes): a cold 70B replica takes minutes to come back.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt

from control.k8s_manifests import Manifest
from schemas.registry import DeploymentVersion
from topics.catalog import job_topic, worker_group

KEDA_API = "keda.sh/v1alpha1"
MSK_AUTH = "llmq-msk-iam"
"""The `TriggerAuthentication` of the Kafka triggers."""


class PoolScaling(BaseModel):
    """How one pool's workers scale (from `llmq plan`: its replicas' bounds)."""

    pool: str
    model: str
    """The deployment name (the gateways' `model` label on TTFT)."""
    min_replicas: int = Field(ge=0)
    """The warm floor."""
    max_replicas: PositiveInt
    ttft_slo_s: PositiveFloat
    sequences_per_replica: PositiveFloat | None = None
    """Running sequences per replica to aim at (None: no such trigger)."""
    interactive_lag_per_replica: PositiveInt = 4
    batch_lag_per_replica: PositiveInt = 256
    kv_cache_target: float = Field(default=0.8, gt=0, le=1)
    ttft_target_share: float = Field(default=0.8, gt=0, le=1)
    """Scale out when TTFT p95 passes this share of the SLO."""


class KafkaAccess(BaseModel):
    """Where KEDA reads the job topics' consumer lag (MSK, TLS and IAM, as `MSK_AUTH`)."""

    bootstrap_servers: str
    aws_region: str


def msk_trigger_authentication(namespace: str, role_arn: str) -> Manifest:
    """The `TriggerAuthentication` of MSK with IAM: KEDA assumes `role_arn` (the IRSA role
    Terraform made for it: describe the workers' consumer groups and topics) itself."""
    return {
        "apiVersion": KEDA_API,
        "kind": "TriggerAuthentication",
        "metadata": {"name": MSK_AUTH, "namespace": namespace},
        "spec": {"podIdentity": {"provider": "aws", "roleArn": role_arn}},
    }


def version_scaling(name: str, version: DeploymentVersion) -> PoolScaling:
    """How the workers of `version` of deployment `name` scale: between its replica bounds,
    against its TTFT SLO."""
    return PoolScaling(
        pool=version.pool, model=name, min_replicas=version.replicas.min,
        max_replicas=max(version.replicas.max, 1), ttft_slo_s=version.ttft_slo_s,
        sequences_per_replica=version.replicas.target_sequences,
    )  # fmt: skip


def _lag_trigger(
    scaling: PoolScaling, kafka: KafkaAccess, tier: str, lag: int, activation: int
) -> Manifest:
    return {
        "type": "kafka",
        "name": f"{tier}-lag",
        "metadata": {
            "bootstrapServers": kafka.bootstrap_servers,
            "consumerGroup": worker_group(scaling.pool),
            "topic": job_topic(scaling.pool, "interactive" if tier == "interactive" else "batch"),
            "lagThreshold": str(lag),
            "activationLagThreshold": str(activation),
            "limitToPartitionsWithLag": "false",
            "offsetResetPolicy": "earliest",
            "sasl": "oauthbearer",
            "saslTokenProvider": "aws_msk_iam",
            "tls": "enable",
            "awsRegion": kafka.aws_region,
        },
        "authenticationRef": {"name": MSK_AUTH},
    }


def _prometheus_trigger(name: str, server: str, query: str, threshold: float) -> Manifest:
    return {
        "type": "prometheus",
        "name": name,
        "metricType": "Value",
        "metadata": {"serverAddress": server, "query": query, "threshold": f"{threshold:g}"},
    }


def _running_trigger(scaling: PoolScaling, prometheus: str) -> list[Manifest]:
    """Sequences running in the pool over the per-replica target (Little's law: this tracks
    the served rate, so replicas follow load before queues or TTFT move)."""
    if scaling.sequences_per_replica is None:
        return []
    query = f'sum(llmq_pool_running_sequences{{pool="{scaling.pool}"}})'
    return [
        {
            "type": "prometheus",
            "name": "running-sequences",
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": prometheus,
                "query": query,
                "threshold": f"{scaling.sequences_per_replica:.0f}",
            },
        }
    ]


def scaled_object(
    target: str, namespace: str, scaling: PoolScaling, kafka: KafkaAccess, prometheus: str
) -> Manifest:
    """The `ScaledObject` of the worker `Deployment` named `target`."""
    pool, model = scaling.pool, scaling.model
    ttft_p95 = (
        "histogram_quantile(0.95, sum by (le) (rate("
        f'llmq_time_to_first_token_seconds_bucket{{model="{model}"}}[2m])))'
    )
    return {
        "apiVersion": KEDA_API,
        "kind": "ScaledObject",
        "metadata": {"name": target, "namespace": namespace, "labels": {"llmq.dev/pool": pool}},
        "spec": {
            "scaleTargetRef": {"name": target},
            "minReplicaCount": scaling.min_replicas,
            "maxReplicaCount": scaling.max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": 600,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {
                            "stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 60}],
                        },
                        "scaleDown": {
                            "stabilizationWindowSeconds": 600,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                        },
                    }
                }
            },
            "triggers": [
                *_running_trigger(scaling, prometheus),
                _lag_trigger(scaling, kafka, "interactive", scaling.interactive_lag_per_replica, 1),
                _lag_trigger(scaling, kafka, "batch", scaling.batch_lag_per_replica, 1),
                _prometheus_trigger(
                    "kv-cache-use",
                    prometheus,
                    f'llmq_pool_kv_cache_usage{{pool="{pool}"}}',
                    scaling.kv_cache_target,
                ),
                _prometheus_trigger(
                    "ttft-p95", prometheus, ttft_p95, scaling.ttft_slo_s * scaling.ttft_target_share
                ),
            ],
        },
    }

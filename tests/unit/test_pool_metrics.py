"""The gateway's per-pool replica gauges: what KEDA's Prometheus trigger and dashboards read."""

from __future__ import annotations

from prometheus_client import generate_latest

from gateway.metrics import GatewayMetrics
from schemas.heartbeat import ReplicaHeartbeat


def replica(rid: str, pool: str, kv: float, **fields: object) -> ReplicaHeartbeat:
    return ReplicaHeartbeat.model_validate(
        {"replica_id": rid, "pool": pool, "model": "m", "state": "ready", "kv_cache_usage": kv,
         "sent_at": 1.0, **fields}
    )  # fmt: skip


def test_pool_gauges_follow_the_replica_view_at_each_scrape() -> None:
    view: dict[str, list[ReplicaHeartbeat]] = {
        "big": [
            replica("a", "big", 0.5, running=10, waiting=2),
            replica("b", "big", 0.7, running=20, waiting=0),
            replica("c", "big", 0.99, healthy=False, running=99),
            replica("d", "big", 0.0, state="loading"),
        ]
    }
    metrics = GatewayMetrics()
    metrics.watch_replicas(lambda: view)
    text = generate_latest(metrics.registry).decode()
    assert 'llmq_pool_kv_cache_usage{pool="big"} 0.6' in text  # ready and healthy only
    assert 'llmq_pool_running_sequences{pool="big"} 30.0' in text
    assert 'llmq_pool_waiting_sequences{pool="big"} 2.0' in text
    assert 'llmq_pool_replicas{pool="big",state="ready"} 2.0' in text
    assert 'llmq_pool_replicas{pool="big",state="unhealthy"} 1.0' in text
    assert 'llmq_pool_replicas{pool="big",state="loading"} 1.0' in text
    view["big"] = []
    view["small"] = [replica("e", "small", 0.1)]
    text = generate_latest(metrics.registry).decode()
    assert 'llmq_pool_kv_cache_usage{pool="small"} 0.1' in text
    assert 'pool="big",state' not in text


def test_each_served_models_slos_are_exported() -> None:
    from schemas.deployment import Deployment

    models = [
        Deployment(name="big", path="/m", pool="h100", ttft_slo_s=1.0, tpot_slo_s=0.05),
        Deployment(name="small", path="/m", pool="l4", ttft_slo_s=0.3),
    ]
    metrics = GatewayMetrics()
    metrics.watch_models(lambda: models)
    text = generate_latest(metrics.registry).decode()
    assert 'llmq_model_ttft_slo_seconds{model="big",pool="h100"} 1.0' in text
    assert 'llmq_model_ttft_slo_seconds{model="small",pool="l4"} 0.3' in text
    assert 'llmq_model_tpot_slo_seconds{model="big",pool="h100"} 0.05' in text
    assert 'llmq_model_tpot_slo_seconds{model="small"' not in text

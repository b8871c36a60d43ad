"""The Grafana dashboard (infra/grafana/llmq.json): a well-formed dashboard whose every query
names metrics a gateway, worker or batch service exports (the e2e suite checks the same against
a running stack)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from redis.asyncio import Redis

from batch.metrics import ActiveBatches, BatchServiceCollector, batch_exposition
from gateway.metrics import GatewayMetrics
from tests.unit.test_process_metrics import Counts
from topics.redis_relay import RedisReplicaDirectory
from workers.heartbeat import Heartbeat
from workers.load import LoadTracker
from workers.metrics import WorkerMetrics

DASHBOARD = Path(__file__).parents[2] / "infra/grafana/llmq.json"
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queried_metrics() -> set[str]:
    """Every llmq metric name a panel's query uses."""
    return {
        name
        for panel in dashboard()["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bllmq_[a-z0-9_]+", target["expr"])
    }


def exported_families(text: str) -> set[str]:
    """The metric families a /metrics page declares (its `# TYPE` lines)."""
    return set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))


def missing(queried: set[str], families: set[str]) -> set[str]:
    """Queried names no family exports (a counter's family is named without `_total`...)."""

    def known(name: str) -> bool:
        stems = {name} | {name.removesuffix(s) for s in SUFFIXES if name.endswith(s)}
        return bool(stems & families)

    return {name for name in queried if not known(name)}


def test_the_dashboard_is_well_formed() -> None:
    board = dashboard()
    panels = board["panels"]
    assert board["uid"] and len(panels) >= 10
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for panel in panels:
        assert panel["title"] and panel["description"] and panel["targets"]
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def test_every_query_names_a_metric_a_process_exports() -> None:
    metrics = GatewayMetrics()
    metrics.watch_replicas(lambda: {})
    metrics.watch_models(lambda: [])
    metrics.watch_topics(lambda: None)
    metrics.watch_relay(Relay())
    heartbeat = Heartbeat(RedisReplicaDirectory(Redis()), replica_id="w", pool="p", model="m",
                          interval_s=1.0)  # fmt: skip
    worker = WorkerMetrics(heartbeat)
    heartbeat.load = LoadTracker()
    counts = Counts()
    pages = [
        generate_latest(metrics.registry),
        worker.exposition(),
        batch_exposition(BatchServiceCollector(counts, counts, counts, ActiveBatches))(),
    ]
    families = set().union(*(exported_families(page.decode()) for page in pages))
    queried = queried_metrics()
    assert len(queried) >= 10
    assert missing(queried, families) == set()
    assert missing({"llmq_no_such_metric_total"}, families) == {"llmq_no_such_metric_total"}


class Relay:
    connected = True
    disconnects = 0

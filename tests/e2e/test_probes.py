"""Every process answers /healthz and /readyz: the gateway on its API port, the worker and the
batch service on their probe ports (where they also serve /metrics)."""

from __future__ import annotations

import httpx
import pytest

from llmq.services import LOCALHOST
from tests.e2e.conftest import Stack

pytestmark = pytest.mark.e2e


def test_every_process_is_healthy_and_ready(stack: Stack) -> None:
    stack.wait_ready()
    urls = [stack.base_url] + [f"http://{LOCALHOST}:{port}" for port in stack.probe_ports.values()]
    for url in urls:
        for path in ("/healthz", "/readyz"):
            response = httpx.get(url + path, timeout=10)
            assert response.status_code == 200, f"{url}{path}: {response.text}"
    for process, family in (("worker", "llmq_worker_healthy"), ("batch", "llmq_batches")):
        response = httpx.get(f"http://{LOCALHOST}:{stack.probe_ports[process]}/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert f"# TYPE {family} gauge" in response.text
    # vLLM's liveness path, which benchmark clients made for vLLM check before they start.
    assert httpx.get(f"{stack.base_url}/health", timeout=10).status_code == 200

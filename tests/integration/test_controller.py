"""The pool controller process on the real broker and Redis, with SIMULATED engine workers:
a registered version gets its replica, a rolled-back canary drains and retires, a canary that
regresses is rolled back by the rollout controller and a healthy one is promoted by it, and
requests keep succeeding through all of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llmq import services, starters
from llmq.modelbuild import ensure_model
from tests.polling import eventually

pytestmark = pytest.mark.integration

NAME, TEAM_KEY, ADMIN_KEY = "ctl-llama", "sk-ctl-team", "sk-ctl-admin"


@pytest.fixture(scope="module")
def stack(
    own_kafka: str, redis_url: str, s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    kafka_bootstrap = own_kafka
    model_path = str(ensure_model("tiny-llama"))
    logs = tmp_path_factory.mktemp("controller")
    seed = [{"name": NAME, "path": model_path, "pool": "ctl-v1", "max_model_len": 1024,
             "ttft_slo_s": 30, "replicas": {"min": 1, "max": 1}}]  # fmt: skip
    common = {"LLMQ_KAFKA_BOOTSTRAP": kafka_bootstrap, "LLMQ_REDIS_URL": redis_url,
              "LLMQ_DEPLOYMENTS": json.dumps(seed), "LLMQ_REGISTRY_POLL_MS": "50",
              "LLMQ_JOB_TOPIC_PARTITIONS": "2"}  # fmt: skip
    worker_env = {
        "LLMQ_KAFKA_BOOTSTRAP": kafka_bootstrap, "LLMQ_REDIS_URL": redis_url,
        "LLMQ_ENGINE": "simulated", "LLMQ_SIM_MODEL": "llama-3-8b", "LLMQ_DRAIN_GRACE_S": "10",
    }  # fmt: skip
    controller_env = {
        **common,
        "LLMQ_WORKER_ENV": json.dumps(worker_env),
        "LLMQ_WORKER_LOG_DIR": str(logs),
        "LLMQ_MANAGED_DEPLOYMENTS": json.dumps([NAME]),
        "LLMQ_RECONCILE_INTERVAL_S": "0.2",
        "LLMQ_ROLLOUT_INTERVAL_S": "0.2",
    }
    port = services.free_port()
    gateway_env = {
        **common, "LLMQ_PORT": str(port), "LLMQ_API_KEYS": json.dumps({TEAM_KEY: "ctl"}),
        "LLMQ_ADMIN_KEYS": json.dumps([ADMIN_KEY]), "LLMQ_S3_ENDPOINT_URL": s3_endpoint,
        "LLMQ_S3_BUCKET": "llmq-ctl", "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
    }  # fmt: skip
    controller = starters.start_llmq("controller", controller_env, logs / "controller.log")
    gateway = starters.start_llmq("gateway", gateway_env, logs / "gateway.log")
    url = f"http://{services.LOCALHOST}:{port}"
    try:
        services.wait_ready(
            lambda: services.http_status(f"{url}/readyz") == 200,
            timeout=120,
            watch=[controller, gateway],
            what="gateway /readyz (the controller's first worker ready)",
        )
        yield {"url": url, "path": model_path}
    finally:
        services.stop(gateway)
        services.stop(controller, timeout=60)  # it drains and stops its workers first


async def test_versions_get_replicas_and_a_rolled_back_canary_drains_and_retires(
    stack: dict[str, Any],
) -> None:
    admin = httpx.AsyncClient(
        base_url=f"{stack['url']}/v1", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    team = httpx.AsyncClient(
        base_url=f"{stack['url']}/v1", headers={"Authorization": f"Bearer {TEAM_KEY}"}
    )
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    async def states() -> dict[str, tuple[str, int]]:
        body = (await admin.get(f"/deployments/{NAME}")).json()
        return {v["version"]: (v["state"], v["ready_replicas"]) for v in body["versions"]}

    async def served() -> set[str]:
        fingerprints = set()
        for i in range(20):
            response = await team.post("/chat/completions", json={**chat, "user": f"u{i}"})
            assert response.status_code == 200, response.text
            fingerprints.add(response.json()["system_fingerprint"])
        return fingerprints

    async with admin, team:
        spec = {"version": "2", "path": stack["path"], "pool": "ctl-v2", "max_model_len": 1024,
                "ttft_slo_s": 30}  # fmt: skip
        assert (await admin.put(f"/deployments/{NAME}", json=spec)).status_code == 200
        await eventually(states, lambda s: s["2"] == ("ready", 1), within=60, interval=0.2)
        canary = await admin.post(f"/deployments/{NAME}:canary", json={"version": "2",
                                                                      "percent": 50})  # fmt: skip
        assert canary.status_code == 200
        assert await served() == {f"{NAME}@1", f"{NAME}@2"}
        assert (await admin.post(f"/deployments/{NAME}:rollback")).status_code == 200
        assert await served() == {f"{NAME}@1"}
        final = await eventually(
            states, lambda s: s["2"] == ("retired", 0), within=60, interval=0.2
        )
        assert final["1"] == ("ready", 1)
        for replicas in (2, 1):  # scale out, then in (the replica stopped drains)
            scaled = await admin.patch(
                f"/deployments/{NAME}",
                json={"version": "1", "replicas": {"min": replicas, "max": replicas}},
            )
            assert scaled.status_code == 200, scaled.text
            await eventually(
                states, lambda s, n=replicas: s["1"] == ("ready", n), within=60, interval=0.2
            )
            assert await served() == {f"{NAME}@1"}


async def _rollout(
    stack: dict[str, Any], version: str, engine_args: dict[str, Any]
) -> dict[str, Any]:
    """Register `version`, start an automatic rollout of it (20% then 100%, judged on 20
    requests per arm), send requests until the rollout controller decides, and return the
    deployment as it decided."""
    admin = httpx.AsyncClient(
        base_url=f"{stack['url']}/v1", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    team = httpx.AsyncClient(
        base_url=f"{stack['url']}/v1", headers={"Authorization": f"Bearer {TEAM_KEY}"}
    )
    async with admin, team:

        async def deployment() -> dict[str, Any]:
            body: dict[str, Any] = (await admin.get(f"/deployments/{NAME}")).json()
            return body

        def state(body: dict[str, Any]) -> str:
            return next(v["state"] for v in body["versions"] if v["version"] == version)

        spec = {"version": version, "path": stack["path"], "pool": f"ctl-{version}",
                "max_model_len": 1024, "ttft_slo_s": 30, "engine_args": engine_args}  # fmt: skip
        assert (await admin.put(f"/deployments/{NAME}", json=spec)).status_code == 200
        await eventually(deployment, lambda d: state(d) == "ready", within=60, interval=0.2)
        policy = {"steps": [20, 100], "min_requests": 20, "min_step_s": 0}
        started = await admin.post(
            f"/deployments/{NAME}:canary", json={"version": version, "policy": policy}
        )
        assert started.status_code == 200, started.text
        assert started.json()["traffic"]["canary_percent"] == 20
        served: dict[str, int] = {}
        for i in range(400):
            chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8, "user": f"caller-{i}"}  # fmt: skip
            response = await team.post("/chat/completions", json=chat)
            assert response.status_code == 200, response.text
            fingerprint = response.json()["system_fingerprint"]
            served[fingerprint] = served.get(fingerprint, 0) + 1
            decided = await deployment()
            if decided["traffic"]["canary"] is None:
                assert served.get(f"{NAME}@{version}", 0) >= 20  # judged on its own requests
                return decided
        raise AssertionError(f"no decision after 400 requests: {served}")


async def test_the_rollout_controller_rolls_back_a_canary_that_regresses(
    stack: dict[str, Any],
) -> None:
    # The injected regression: the canary's simulated GPU runs 20 times slower.
    decided = await _rollout(stack, "slow", {"sim_time_scale": 0.05})
    assert decided["traffic"]["stable"] != "slow"
    assert [v["state"] for v in decided["versions"] if v["version"] == "slow"] != ["ready"]
    last = decided["history"][-1]
    assert (last["action"], last["version"], last["by"]) == ("rolled_back", "slow", "controller")
    assert "p95" in last["reason"] and "x stable" in last["reason"]


async def test_the_rollout_controller_promotes_a_healthy_canary(stack: dict[str, Any]) -> None:
    decided = await _rollout(stack, "same", {})
    assert decided["traffic"]["stable"] == "same"
    last = decided["history"][-1]
    assert (last["action"], last["by"]) == ("promoted", "controller")
    assert "canary: " in last["reason"] and "stable: " in last["reason"]

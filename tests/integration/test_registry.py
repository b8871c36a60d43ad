"""The registry on the real broker: two gateway processes share `llmq.registry`; a version
registered through one is served by the other without a restart; a gateway started later
folds the log (the registry wins over its own `LLMQ_DEPLOYMENTS`); admin and team keys stay
apart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aioboto3
import httpx
import pytest

from llmq import services, starters
from llmq.adapterbuild import BROKEN_ADAPTER
from llmq.modelbuild import ensure_model
from tests.polling import eventually
from topics.kafka import ensure_topics
from workers.s3_weights import S3WeightsSource
from workers.weights import folder_digest

pytestmark = pytest.mark.integration

NAME, POOL, TEAM_KEY, ADMIN_KEY = "registry-llama", "registry-v1", "sk-reg-team", "sk-reg-admin"


def _start_gateway(
    name: str, env: dict[str, str], logs: Path, deployments: list[dict[str, Any]]
) -> tuple[services.ManagedProcess, str]:
    port = services.free_port()
    full = {**env, "LLMQ_PORT": str(port), "LLMQ_DEPLOYMENTS": json.dumps(deployments)}
    gateway = starters.start_llmq("gateway", full, logs / f"{name}.log", name=name)
    url = f"http://{services.LOCALHOST}:{port}"
    services.wait_ready(
        lambda: services.http_status(f"{url}/healthz") == 200,
        timeout=120,
        watch=[gateway],
        what=f"{name} /healthz",
    )
    return gateway, url


@pytest.fixture(scope="module")
def gateways(
    own_kafka: str, redis_url: str, s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    kafka_bootstrap = own_kafka
    model_path = str(ensure_model("tiny-llama"))
    logs = tmp_path_factory.mktemp("registry")
    env = {
        "LLMQ_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LLMQ_REDIS_URL": redis_url,
        "LLMQ_API_KEYS": json.dumps({TEAM_KEY: "reg"}),
        "LLMQ_ADMIN_KEYS": json.dumps([ADMIN_KEY]),
        "LLMQ_REGISTRY_POLL_MS": "50",
        "LLMQ_JOB_TOPIC_PARTITIONS": "2",
        "LLMQ_S3_ENDPOINT_URL": s3_endpoint,
        "LLMQ_S3_BUCKET": "llmq-registry",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    # A generous TTFT SLO: what is measured here is the split, not admission.
    seed = [{"name": NAME, "path": model_path, "pool": POOL, "max_model_len": 1024,
             "ttft_slo_s": 30}]  # fmt: skip
    started: list[services.ManagedProcess] = []
    try:
        a, url_a = _start_gateway("gateway-a", env, logs, seed)
        started.append(a)
        b, url_b = _start_gateway("gateway-b", env, logs, seed)
        started.append(b)
        yield {"a": url_a, "b": url_b, "env": env, "logs": logs, "path": model_path,
               "started": started}  # fmt: skip
    finally:
        for process in reversed(started):
            services.stop(process)


def _admin(url: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.AsyncClient(base_url=f"{url}/v1", headers=headers, timeout=30)


def _team(url: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {TEAM_KEY}"}
    return httpx.AsyncClient(base_url=f"{url}/v1", headers=headers, timeout=30)


async def test_a_version_registered_on_one_gateway_is_served_by_another_without_restart(
    gateways: dict[str, Any],
) -> None:
    spec = {"version": "2", "path": gateways["path"], "pool": "registry-v2",
            "precision": "float16", "max_model_len": 1024}  # fmt: skip
    async with _admin(gateways["a"]) as admin_a, _admin(gateways["b"]) as admin_b:
        seeded = (await admin_b.get(f"/deployments/{NAME}")).json()
        assert [v["version"] for v in seeded["versions"]] == ["1"]
        put = await admin_a.put(f"/deployments/{NAME}", json=spec)
        assert put.status_code == 200, put.text
        assert [(v["version"], v["arm"]) for v in put.json()["versions"]] == [
            ("1", "stable"), ("2", "none"),
        ]  # fmt: skip

        async def versions_on_b() -> list[str]:
            body = (await admin_b.get(f"/deployments/{NAME}")).json()
            return [v["version"] for v in body["versions"]]

        await eventually(versions_on_b, lambda v: v == ["1", "2"], within=10)
        again = await admin_b.put(f"/deployments/{NAME}", json=spec)  # a retry, elsewhere
        assert again.status_code == 200 and again.json()["revision"] == put.json()["revision"]
        changed = await admin_b.put(f"/deployments/{NAME}", json={**spec, "max_model_len": 512})
        assert changed.status_code == 409
        assert changed.json()["error"]["code"] == "version_exists"

    async with _team(gateways["b"]) as team_b:
        body = {"model": f"{NAME}@2", "messages": [{"role": "user", "content": "hi"}]}

        async def pinned_status() -> int:
            return (await team_b.post("/chat/completions", json=body)).status_code

        # Resolved on gateway B (503: version 2 has no worker yet), not unknown (404).
        assert await eventually(pinned_status, lambda s: s != 404, within=10) == 503
        unknown = await team_b.post("/chat/completions", json={**body, "model": f"{NAME}@9"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
        models = (await team_b.get("/models")).json()["data"]
        assert NAME in [m["id"] for m in models]


async def test_a_gateway_started_later_folds_the_registry_over_its_own_settings(
    gateways: dict[str, Any],
) -> None:
    other = [{"name": NAME, "path": gateways["path"], "pool": "elsewhere", "max_model_len": 64}]
    late, url = _start_gateway("gateway-late", gateways["env"], gateways["logs"], other)
    gateways["started"].append(late)
    async with _admin(url) as admin:
        deployment = (await admin.get(f"/deployments/{NAME}")).json()
    stable = next(v for v in deployment["versions"] if v["arm"] == "stable")
    assert (stable["version"], stable["pool"], stable["max_model_len"]) == ("1", POOL, 1024)


async def test_admin_and_team_keys_stay_apart(gateways: dict[str, Any]) -> None:
    async with _team(gateways["a"]) as team, _admin(gateways["a"]) as admin:
        refused = await team.get("/deployments")
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        chat = await admin.post(
            "/chat/completions",
            json={"model": NAME, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 403 and chat.json()["error"]["code"] == "permission_denied"
        listed = await admin.get("/deployments")
        assert listed.status_code == 200 and NAME in [d["id"] for d in listed.json()["data"]]
        anonymous = await admin.get("/deployments", headers={"Authorization": "Bearer nope"})
        assert anonymous.status_code == 401


def _start_sim_worker(gateways: dict[str, Any], pool: str) -> None:
    env = {
        "LLMQ_KAFKA_BOOTSTRAP": gateways["env"]["LLMQ_KAFKA_BOOTSTRAP"],
        "LLMQ_REDIS_URL": gateways["env"]["LLMQ_REDIS_URL"],
        "LLMQ_ENGINE": "simulated",
        "LLMQ_SIM_MODEL": "llama-3-8b",
        "LLMQ_MODEL": NAME,
        "LLMQ_POOL": pool,
        "LLMQ_MAX_NUM_SEQS": "16",
        "LLMQ_REPLICA_ID": f"{pool}-sim",
    }
    worker = starters.start_llmq("worker", env, gateways["logs"] / f"{pool}.log", name=pool)
    gateways["started"].append(worker)


async def _fingerprints(url: str, users: list[str]) -> list[str | None]:
    """One request per user (its `user` keeps it on one arm of a split), 4 at a time."""
    limit = asyncio.Semaphore(4)
    async with _team(url) as team:

        async def one(user: str) -> str | None:
            body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2, "user": user}  # fmt: skip
            async with limit:
                response = await team.post("/chat/completions", json=body)
            assert response.status_code == 200, response.text
            fingerprint: str | None = response.json()["system_fingerprint"]
            return fingerprint

        return list(await asyncio.gather(*(one(user) for user in users)))


async def test_a_canary_takes_its_share_and_a_rollback_ends_it_for_every_later_request(
    gateways: dict[str, Any],
) -> None:
    await ensure_topics(gateways["env"]["LLMQ_KAFKA_BOOTSTRAP"], [POOL], partitions=2)
    for pool in (POOL, "registry-v3"):
        _start_sim_worker(gateways, pool)
    spec = {"version": "3", "path": gateways["path"], "pool": "registry-v3",
            "max_model_len": 1024, "ttft_slo_s": 30}  # fmt: skip
    async with _admin(gateways["a"]) as admin:
        assert (await admin.put(f"/deployments/{NAME}", json=spec)).status_code == 200
        gated = await admin.post(f"/deployments/{NAME}:canary", json={"version": "2",
                                                                     "percent": 20})  # fmt: skip
        assert gated.status_code == 409 and gated.json()["error"]["code"] == "eval_required"

        async def ready() -> dict[str, int]:
            body = (await admin.get(f"/deployments/{NAME}")).json()
            return {v["version"]: v["ready_replicas"] for v in body["versions"]}

        await eventually(ready, lambda r: r["1"] >= 1 and r["3"] >= 1, within=60)
        canary = await admin.post(f"/deployments/{NAME}:canary", json={"version": "3",
                                                                      "percent": 20})  # fmt: skip
        assert canary.status_code == 200, canary.text
        revision = canary.json()["revision"]

    async with _admin(gateways["b"]) as admin_b:  # gateway B serves the split it has folded

        async def on_b() -> tuple[int, dict[str, int]]:
            body = (await admin_b.get(f"/deployments/{NAME}")).json()
            ready = {v["version"]: v["ready_replicas"] for v in body["versions"]}
            return int(body["revision"]), ready

        # Its own view of the replicas too: each gateway refreshes heartbeats on its own tick.
        await eventually(
            on_b, lambda b: b[0] >= revision and b[1]["1"] >= 1 and b[1]["3"] >= 1, within=10
        )
    # 300 callers: each one's arm is drawn from a hash of its `user` (so this share is the
    # same every run; random draws would miss 20 +- 5% in 3% of runs).
    served = await _fingerprints(gateways["b"], [f"caller-{i}" for i in range(300)])
    share = served.count(f"{NAME}@3") / len(served)
    print(f"canary at 20%: {share:.1%} of 300 requests by system_fingerprint")
    assert set(served) == {f"{NAME}@1", f"{NAME}@3"}
    assert 0.15 <= share <= 0.25
    for caller in ("caller-0", "caller-1", "caller-2"):  # one caller, one arm, every time
        assert len(set(await _fingerprints(gateways["b"], [caller] * 10))) == 1

    async with _admin(gateways["a"]) as admin:
        rolled = await admin.post(f"/deployments/{NAME}:rollback")
        assert rolled.status_code == 200
        assert [v["state"] for v in rolled.json()["versions"] if v["version"] == "3"] == [
            "draining"
        ]
    # Gateway A wrote the rollback, and folded it before it answered.
    after = await _fingerprints(gateways["a"], [f"caller-{i}" for i in range(100)])
    assert set(after) == {f"{NAME}@1"}


async def test_every_gateway_lists_the_same_adapters_and_only_to_their_team(
    gateways: dict[str, Any],
) -> None:
    """An adapter registered on gateway A is listed and resolved by gateway B (the registry
    log), only for its team; a delete on B is seen by A."""
    folder = ensure_model(BROKEN_ADAPTER)  # files that pass registration's checks (no base)
    env = gateways["env"]
    session = aioboto3.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    endpoint = env["LLMQ_S3_ENDPOINT_URL"]
    async with session.client("s3", endpoint_url=endpoint) as s3:
        await s3.create_bucket(Bucket="llmq-registry-adapters")
    uri = "s3://llmq-registry-adapters/tuned"
    async with S3WeightsSource(session, endpoint_url=endpoint) as source:
        await source.push(folder, uri)
    base = {"version": "1", "path": gateways["path"], "pool": "registry-lora",
            "max_model_len": 1024, "engine_args": {"max_lora_rank": 8}}  # fmt: skip
    adapter = {"base": "lora-base", "weights_uri": uri, "sha256": folder_digest(folder), "rank": 8}
    async with _admin(gateways["a"]) as admin_a, _team(gateways["a"]) as team_a:
        assert (await admin_a.put("/deployments/lora-base", json=base)).status_code == 201
        put = await team_a.put("/adapters/tuned", json=adapter)
        assert put.status_code == 201, put.text
        assert put.json()["owned_by"] == "reg" and put.json()["status"] == "ready"
        mismatch = await team_a.put("/adapters/other", json={**adapter, "sha256": "0" * 64})
        assert mismatch.status_code == 400
        assert mismatch.json()["error"]["code"] == "sha256_mismatch"
    async with _team(gateways["b"]) as team_b, _admin(gateways["b"]) as admin_b:

        async def adapters_on_b() -> list[str]:
            return [a["id"] for a in (await team_b.get("/adapters")).json()["data"]]

        assert await eventually(adapters_on_b, lambda ids: ids == ["tuned"], within=10)
        models = {m["id"]: m for m in (await team_b.get("/models")).json()["data"]}
        assert models["tuned"]["parent"] == "lora-base"
        everyone = (await admin_b.get("/adapters")).json()["data"]
        assert [(a["owned_by"], a["id"]) for a in everyone] == [("reg", "tuned")]
        body = {"model": "tuned", "messages": [{"role": "user", "content": "hi"}]}
        # Resolved to its base on B (503: no worker runs the base here), not unknown (404).
        assert (await team_b.post("/chat/completions", json=body)).status_code == 503
        deleted = await team_b.delete("/adapters/tuned")
        assert deleted.status_code == 200 and deleted.json() == {
            "id": "tuned", "object": "adapter", "deleted": True,
        }  # fmt: skip
    async with _team(gateways["a"]) as team_a:

        async def adapters_on_a() -> list[str]:
            return [a["id"] for a in (await team_a.get("/adapters")).json()["data"]]

        await eventually(adapters_on_a, lambda ids: ids == [], within=10)
        gone = await team_a.post("/chat/completions", json=body)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"

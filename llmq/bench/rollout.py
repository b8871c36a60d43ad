"""``llmq bench rollout``: a version rolled out under steady load on the local stack.

Poisson arrivals of chat completions (streaming and not) run throughout. After `before_s` the
candidate version is registered (its replicas start: on one machine they compete with the
serving engine, which is part of what a rollout costs here), then an automatic canary starts
and the rollout controller steps it to 100% (or rolls it back); the old version then drains
and retires. Every request's outcome is checked against the usage topic as in `llmq bench
chaos` (0 failed, 0 interrupted, 0 lost, 0 duplicated is the promise), and TTFT p95 is
reported per phase: before, while the candidate loads, during the canary, after.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import httpx
import openai
from pydantic import BaseModel

from control.rollout import p95
from llmq.bench.chaos import ChaosSettings, send_request, usage_counts
from llmq.bench.chaos_model import ChaosFigures, ChaosRequest, tally


class RolloutBenchSettings(BaseModel):
    """One rollout run (JSON through ``--settings``)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    api_key: str = "sk-llmq-dev"
    admin_key: str = "sk-llmq-admin"
    model: str = "smollm2-135m-instruct"
    candidate: dict[str, Any] = {}
    """The new version's spec (`PUT /v1/deployments/{model}`); empty: the stable version's
    spec as version `<stable>-next` in pool `<pool>-next`."""
    rate: float = 1.0
    """Requests per second (Poisson)."""
    stream_share: float = 0.8
    max_tokens: int = 32
    before_s: float = 30.0
    """Load before the candidate is registered (the baseline)."""
    after_s: float = 20.0
    """Load after the old version retired."""
    steps: list[float] = [20.0, 50.0, 100.0]
    min_requests: int = 20
    """Requests per arm and step before the controller judges it."""
    min_step_s: float = 10.0
    timeout_s: float = 900.0
    """Most seconds to wait for the candidate's readiness, the rollout, and the drain."""
    kafka_bootstrap: str = "127.0.0.1:9092"
    settle_s: float = 60.0
    seed: int = 0


PHASES = ("before", "loading", "canary", "after")


class RolloutRun:
    def __init__(self, s: RolloutBenchSettings) -> None:
        self.s = s
        self.marks: dict[str, float] = {}
        """Seconds since the first request at which each phase began."""
        self.timeline: list[str] = []
        self.t0 = 0.0

    def mark(self, phase: str, note: str) -> None:
        self.marks[phase] = time.monotonic() - self.t0
        self.timeline.append(f"{self.marks[phase]:6.1f}s {note}")

    async def _deployment(self, admin: httpx.AsyncClient) -> dict[str, Any]:
        response = await admin.get(f"/deployments/{self.s.model}")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    async def _until(self, admin: httpx.AsyncClient, check: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.s.timeout_s
        while time.monotonic() < deadline:
            body = await self._deployment(admin)
            if check(body):
                return body
            await asyncio.sleep(1.0)  # another process's state: polled
        raise TimeoutError(f"{what} took over {self.s.timeout_s:.0f}s")

    async def drive(self, admin: httpx.AsyncClient) -> str:
        """Register, canary, wait for the controller's decision and the drain; the outcome."""
        s = self.s
        await asyncio.sleep(s.before_s)
        current = await self._deployment(admin)
        old = current["traffic"]["stable"]
        spec = s.candidate or _next_spec(current)
        new = spec["version"]
        self.mark("loading", f"registering version {new} (its replicas start)")
        response = await admin.put(f"/deployments/{s.model}", json=spec)
        response.raise_for_status()

        def state(body: dict[str, Any], version: str) -> str:
            return next(str(v["state"]) for v in body["versions"] if v["version"] == version)

        await self._until(admin, lambda b: state(b, new) == "ready", f"version {new} ready")
        policy = {"steps": s.steps, "min_requests": s.min_requests, "min_step_s": s.min_step_s}
        self.mark("canary", f"canary {new} at {s.steps[0]:g}%")
        started = await admin.post(
            f"/deployments/{s.model}:canary", json={"version": new, "policy": policy}
        )
        started.raise_for_status()
        decided = await self._until(
            admin, lambda b: b["traffic"]["canary"] is None, "the rollout's decision"
        )
        outcome = str(decided["history"][-1]["action"])
        self.mark("after", f"{outcome}: {decided['history'][-1]['reason']}")
        leaving = new if outcome == "rolled_back" else old
        await self._until(
            admin, lambda b: state(b, leaving) == "retired", f"version {leaving} retired"
        )
        self.timeline.append(f"{time.monotonic() - self.t0:6.1f}s version {leaving} retired")
        await asyncio.sleep(s.after_s)
        return outcome

    async def run(self) -> tuple[ChaosFigures, dict[str, tuple[int, float | None]], Counter[str]]:
        s = self.s
        load = ChaosSettings(
            base_url=s.base_url, api_key=s.api_key, model=s.model, rate=s.rate,
            stream_share=s.stream_share, batch_share=0.0, max_tokens=s.max_tokens,
            kafka_bootstrap=s.kafka_bootstrap, settle_s=s.settle_s,
        )  # fmt: skip
        client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0,
                                    timeout=300.0)  # fmt: skip
        admin = httpx.AsyncClient(
            base_url=s.base_url, headers={"Authorization": f"Bearer {s.admin_key}"}, timeout=60
        )
        rng = random.Random(s.seed)
        since = time.time() - 1.0
        self.t0 = time.monotonic()
        self.mark("before", "load started")
        driver = asyncio.create_task(self.drive(admin))
        requests: list[ChaosRequest] = []
        tasks: list[asyncio.Task[None]] = []
        at = rng.expovariate(s.rate)
        while not driver.done():
            await asyncio.sleep(max(0.0, self.t0 + at - time.monotonic()))
            req = ChaosRequest(len(requests), rng.random() < s.stream_share, "interactive", at)
            requests.append(req)
            tasks.append(asyncio.create_task(send_request(client, load, req)))
            at += rng.expovariate(s.rate)
        outcome = await driver  # raises if the rollout itself failed
        self.timeline.append(f"{time.monotonic() - self.t0:6.1f}s load stopped ({outcome})")
        await asyncio.gather(*tasks)
        accepted = {r.request_id for r in requests if r.request_id and r.outcome != "refused"}
        counts = await usage_counts(load, since, accepted)
        await client.close()
        await admin.aclose()
        return tally(requests, counts, {}), self.ttft_by_phase(requests), _served(requests)

    def ttft_by_phase(self, requests: list[ChaosRequest]) -> dict[str, tuple[int, float | None]]:
        """Per phase: streams started in it, and their TTFT p95."""
        bounds = [(p, self.marks.get(p, float("inf"))) for p in PHASES]
        result = {}
        for i, (phase, start) in enumerate(bounds):
            end = bounds[i + 1][1] if i + 1 < len(bounds) else float("inf")
            ttfts = [r.ttft_s for r in requests if start <= r.started_s < end and r.ttft_s]
            result[phase] = (len(ttfts), p95([t for t in ttfts if t is not None]))
        return result


def _next_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    stable = next(v for v in deployment["versions"] if v["arm"] == "stable")
    keep = ("path", "precision", "max_model_len", "engine_args", "ttft_slo_s", "tpot_slo_s",
            "replicas", "tool_call_parser", "weights_uri", "sha256")  # fmt: skip
    spec = {k: stable[k] for k in keep if stable.get(k) is not None}
    suffix = f"r{int(time.time()) % 100000}"
    return {
        **spec,
        "version": f"{stable['version']}-{suffix}",
        "pool": f"{stable['pool']}-{suffix}",
    }


def _served(requests: list[ChaosRequest]) -> Counter[str]:
    return Counter(r.served_by or "-" for r in requests if r.outcome == "completed")


def format_rollout(
    figures: ChaosFigures,
    ttft: dict[str, tuple[int, float | None]],
    served: Counter[str],
    timeline: list[str],
) -> str:
    lines = [*timeline, *figures.lines()]
    for phase, (n, value) in ttft.items():
        shown = "-" if value is None else f"{value * 1000:.0f} ms"
        lines.append(f"ttft_p95[{phase}]: {shown} ({n} streams)")
    lines += [f"served_by[{ref}]: {n}" for ref, n in sorted(served.items())]
    return "\n".join(lines)

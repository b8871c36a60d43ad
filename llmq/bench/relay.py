"""``llmq bench relay``: the platform's own ceiling, measured on SIMULATED GPU workers.

With simulated workers (a modelled GPU at real speed) what limits llmq is the platform itself:
gateway, worker outside its engine, broker, Redis. A lean client (raw asyncio sockets, one
HTTP/1.1 POST per request) keeps N streams busy back to back for a fixed time on llmq and on the
queue-less simulated server over the same modelled GPU ("direct"), llmq first at each
concurrency; requests in flight at the end are cut off, their tokens so far counted. CPU comes
from ``/proc`` before and after each phase; an idle phase first gives each process's idle rate.
After each concurrency's phases the direct server drains its engine alone at that concurrency
(`llmq.bench.engine_alone`), which tells the worker's CPU outside its engine from its engine's.
A last phase of one-token requests gives completed jobs/s. `llmq.bench.relay_report` prints it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import uvloop
from pydantic import BaseModel, Field, PositiveInt, model_validator

from llmq import services
from llmq.bench.cpu import cpu_snapshot, dev_stack_pids
from llmq.bench.engine_alone import EngineAloneResult, measure_engine_alone
from llmq.bench.goodput import simulated_engine_description
from llmq.bench.load_model import LOOPBACK_HOSTS
from llmq.bench.overhead import Target, machine_description
from llmq.bench.stats import percentile, ratio
from llmq.devstack_settings import DevStackSettings

TOKEN = re.compile(rb'"content": ?"')  # text in a delta (compact or spaced JSON); not null
DONE, ERROR = b"data: [DONE]", b'"error"'
TAIL = 11  # bytes kept from the last read: a 12-byte mark split across reads is found once
PROMPT = "Count from one to one hundred, one number per line."
ERROR_BACKOFF_S = 0.05  # a stream's pause after a failure, so a refusing target isn't hammered
WORKER_RATE = 2_000.0  # tokens/s at which the worker's share of a core is stated (the issue's)


class RelayError(RuntimeError):
    """No stack to measure, or a target that does not answer."""


class RelaySettings(BaseModel):
    """What to measure; the defaults match the local stack (`llmq dev up`)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """llmq's OpenAI-compatible base URL (plain HTTP on a loopback address)."""
    api_key: str = Field(default="sk-llmq-dev", exclude=True)
    model: str = "smollm2-135m-instruct"
    streams: list[PositiveInt] = Field(default=[8, 32, 64], min_length=1)
    """Concurrent streams of each streaming phase."""
    duration_s: float = Field(default=15.0, gt=0, le=600)
    """Length of each phase."""
    max_tokens: PositiveInt = 256
    max_num_seqs: PositiveInt = 64
    """The direct server's sequence slots (set it to the stack's ``LLMQ_DEV_MAX_NUM_SEQS``)."""
    max_model_len: PositiveInt = 2048
    idle_s: float = Field(default=5.0, gt=0, le=600)
    """Length of the idle phase that measures each process's CPU with nothing running."""
    jobs_streams: PositiveInt = 64
    """Concurrent streams of the jobs/s phase (one-token requests)."""
    partitions: PositiveInt = Field(default_factory=lambda: DevStackSettings().partitions)
    """Partitions of the pool's interactive topic (``LLMQ_DEV_PARTITIONS``, 8 by default)."""
    targets: list[Target] = Field(default=["llmq", "direct"], min_length=1)

    @model_validator(mode="after")
    def _loopback(self) -> RelaySettings:
        url = urlparse(self.base_url)
        if url.scheme != "http" or url.hostname not in LOOPBACK_HOSTS:
            raise ValueError(f"base_url must be http:// on a loopback address, got {self.base_url}")
        return self


@dataclass(frozen=True)
class Endpoint:
    """Where to connect, and the whole HTTP request each stream sends."""

    host: str
    port: int
    request: bytes


def build_endpoint(base_url: str, api_key: str, model: str, max_tokens: int) -> Endpoint:
    """A streaming chat completion POST (``Connection: close``) to base_url."""
    url = urlparse(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    message = {"role": "user", "content": PROMPT}
    body = json.dumps(
        {"model": model, "messages": [message], "max_tokens": max_tokens, "stream": True}
    ).encode()
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    head = (
        f"POST {url.path.rstrip('/')}/chat/completions HTTP/1.1\r\nHost: {authority}\r\n"
        f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return Endpoint(host, port, head.encode() + body)


@dataclass
class PhaseTally:
    """What all streams of one phase saw (gaps in seconds)."""

    tokens: int = 0
    requests: int = 0
    errors: int = 0
    refused: int = 0
    gaps: list[float] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass(slots=True)
class ResponseScan:
    """One response's bytes as they arrive: status, tokens, gaps, error and end of stream."""

    tally: PhaseTally
    tokens: int = 0
    status: int | None = None
    head: bytes = b""
    tail: bytes = b""
    last: float | None = None
    error: bool = False
    done: bool = False

    def feed(self, data: bytes, now: float) -> None:
        """Account one read that arrived at `now` (seconds, any monotonic clock)."""
        if self.status is None:
            self.head += data
            if b"\r\n" in self.head:
                line = self.head.split(b"\r\n", 1)[0].split()
                self.status = int(line[1]) if len(line) > 1 and line[1].isdigit() else 0
                self.head = b""
        window, start = self.tail + data, len(self.tail)
        k = sum(1 for m in TOKEN.finditer(window) if m.end() > start)
        if k:  # one gap for the read (none for a request's first token), 0 for the others
            if self.last is not None:
                self.tally.gaps.append(now - self.last)
            self.tally.gaps.extend([0.0] * (k - 1))
            self.last, self.tokens, self.tally.tokens = now, self.tokens + k, self.tally.tokens + k
        self.error = self.error or ERROR in window
        self.done = self.done or DONE in window
        self.tail = window[-TAIL:]

    @property
    def ok(self) -> bool:
        return self.done and self.status == 200 and not self.error


async def stream_once(endpoint: Endpoint, tally: PhaseTally) -> ResponseScan:
    """Send one request and read its response until ``data: [DONE]`` or the connection ends."""
    scan = ResponseScan(tally)
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    try:
        writer.write(endpoint.request)
        while not scan.done and (data := await reader.read(65536)):
            scan.feed(data, time.perf_counter())
    finally:
        writer.close()
    return scan


async def _stream_loop(endpoint: Endpoint, tally: PhaseTally) -> None:
    while True:
        try:
            scan = await stream_once(endpoint, tally)
            if scan.ok:
                tally.requests += 1
                continue
            tally.refused += scan.status == 429
        except OSError:
            pass
        tally.errors += 1
        await asyncio.sleep(ERROR_BACKOFF_S)


async def run_phase(endpoint: Endpoint, streams: int, duration_s: float) -> PhaseTally:
    """`streams` loops sending requests back to back for duration_s, then cut off."""
    tally, start = PhaseTally(), time.perf_counter()
    tasks = [asyncio.create_task(_stream_loop(endpoint, tally)) for _ in range(streams)]
    try:
        await asyncio.sleep(duration_s)
    finally:
        for task in tasks:
            task.cancel()
        tally.wall_s = time.perf_counter() - start
        await asyncio.gather(*tasks, return_exceptions=True)
    return tally


class PhaseResult(BaseModel):
    """One target in one phase (CPU keyed by role: gateway, worker, tansu, valkey, server)."""

    target: Target
    streams: int
    max_tokens: int
    wall_s: float
    tokens: int
    tokens_per_s: float
    requests: int
    requests_per_s: float
    errors: int
    refused: int
    gap_p50_s: float | None
    gap_p99_s: float | None
    cpu_s: dict[str, float] = Field(default_factory=dict)
    cpu_s_per_1k: dict[str, float] = Field(default_factory=dict)
    net_cpu_s_per_1k: dict[str, float] = Field(default_factory=dict)
    """CPU per 1,000 tokens less the process's idle rate x the phase's wall time."""
    client_cpu_s: float = 0.0
    """This benchmark's own CPU (it shares the machine)."""


def by_role(values: dict[str, float]) -> dict[str, float]:
    """Sum per-process figures by role (``worker-0``, ``worker-1`` -> ``worker``)."""
    roles: dict[str, float] = {}
    for name, value in values.items():
        role = "worker" if name.startswith("worker") else name
        roles[role] = roles.get(role, 0.0) + value
    return roles


def summarize_phase(
    target: Target, streams: int, max_tokens: int, tally: PhaseTally, cpu_s: dict[str, float],
    idle_rates: dict[str, float], client_cpu_s: float = 0.0,
) -> PhaseResult:  # fmt: skip
    """A phase's figures from its tally and the CPU seconds each role spent in it."""
    wall, tokens = tally.wall_s, tally.tokens
    net_cpu_s = {k: v - idle_rates.get(k, 0.0) * wall for k, v in cpu_s.items()}
    per_1k = {k: v * 1000 / tokens for k, v in cpu_s.items()} if tokens else {}
    net = {k: v * 1000 / tokens for k, v in net_cpu_s.items()} if tokens else {}
    return PhaseResult(
        target=target, streams=streams, max_tokens=max_tokens, wall_s=wall, tokens=tokens,
        tokens_per_s=ratio(tokens, wall) or 0.0, requests=tally.requests,
        requests_per_s=ratio(tally.requests, wall) or 0.0, errors=tally.errors,
        refused=tally.refused, gap_p50_s=percentile(tally.gaps, 50),
        gap_p99_s=percentile(tally.gaps, 99), cpu_s=cpu_s, cpu_s_per_1k=per_1k,
        net_cpu_s_per_1k=net, client_cpu_s=client_cpu_s,
    )  # fmt: skip


def gateway_tokens_per_core(llmq: PhaseResult) -> float | None:
    """Tokens/s one gateway core relays: 1,000 / its CPU seconds per 1,000 tokens."""
    return ratio(1000.0, llmq.cpu_s_per_1k.get("gateway"))


def added_gap_p99_s(llmq: PhaseResult, direct: PhaseResult) -> float | None:
    """llmq's inter-token gap p99 less the direct server's at the same concurrency."""
    if llmq.gap_p99_s is None or direct.gap_p99_s is None:
        return None
    return llmq.gap_p99_s - direct.gap_p99_s


def worker_core_share(
    llmq: PhaseResult, tokens_per_s: float = WORKER_RATE, net: bool = True
) -> float | None:
    """Share of a core the worker spends at tokens_per_s (net of its idle rate, or raw)."""
    per_1k = (llmq.net_cpu_s_per_1k if net else llmq.cpu_s_per_1k).get("worker")
    return None if per_1k is None else per_1k * tokens_per_s / 1000


def jobs_per_partition(llmq: PhaseResult, partitions: int) -> float:
    """Completed jobs/s per partition of the pool's topic."""
    return llmq.requests_per_s / partitions


class RelayReport(BaseModel):
    settings: RelaySettings
    machine: str
    engine: str
    idle_cpu_s_per_s: dict[str, float] = Field(default_factory=dict)
    streaming: list[PhaseResult] = Field(default_factory=list)
    jobs: list[PhaseResult] = Field(default_factory=list)
    engine_alone: list[EngineAloneResult] = Field(default_factory=list)
    """The simulated engine drained alone in the direct server, per concurrency."""

    def result(self, target: Target, streams: int) -> PhaseResult | None:
        return next((r for r in self.streaming if (r.target, r.streams) == (target, streams)), None)

    def alone(self, streams: int) -> EngineAloneResult | None:
        return next((r for r in self.engine_alone if r.streams == streams), None)


async def _measure(
    s: RelaySettings, report: RelayReport, urls: dict[Target, str],
    pids: dict[Target, dict[str, int]],
) -> None:  # fmt: skip
    order = [t for t in ("llmq", "direct") if t in urls]
    for target in order:  # warm up, and fail early on a target that does not answer
        try:
            warm = build_endpoint(urls[target], s.api_key, s.model, 2)
            scan = await asyncio.wait_for(stream_once(warm, PhaseTally()), 60)
        except (OSError, TimeoutError) as exc:
            raise RelayError(f"{target} at {urls[target]} does not answer: {exc!r}") from exc
        if not scan.ok:
            raise RelayError(f"{target} at {urls[target]} answered status {scan.status}")
    everything = {name: pid for target_pids in pids.values() for name, pid in target_pids.items()}
    before, start = cpu_snapshot(everything), time.perf_counter()
    await asyncio.sleep(s.idle_s)
    after, idle = cpu_snapshot(everything), time.perf_counter() - start
    rates = report.idle_cpu_s_per_s = by_role({k: (after[k] - before[k]) / idle for k in after})

    async def phase(target: Target, streams: int, max_tokens: int) -> PhaseResult:
        endpoint = build_endpoint(urls[target], s.api_key, s.model, max_tokens)
        before, client = cpu_snapshot(pids[target]), time.process_time()
        tally = await run_phase(endpoint, streams, s.duration_s)
        after, client = cpu_snapshot(pids[target]), time.process_time() - client
        cpu = by_role({name: after[name] - before[name] for name in after})
        return summarize_phase(target, streams, max_tokens, tally, cpu, rates, client)

    for streams in s.streams:
        for target in order:
            report.streaming.append(await phase(target, streams, s.max_tokens))
        if "direct" in urls:  # the engine alone, in the direct server's process
            direct = urls["direct"]
            alone = measure_engine_alone(direct, streams, s.duration_s, s.max_tokens, PROMPT)
            report.engine_alone.append(await alone)
    for target in order:
        report.jobs.append(await phase(target, s.jobs_streams, 1))


def run_relay(settings: RelaySettings) -> RelayReport:
    """Every phase on every target; starts and stops the direct simulated server."""
    stack = dev_stack_pids()
    if not any(services.is_alive(pid) for pid in stack.values()):
        raise RelayError("no local stack is running: `llmq dev up --detach --engine simulated`")
    report = RelayReport(
        settings=settings, machine=machine_description(), engine=simulated_engine_description()
    )
    llmq = "llmq" in settings.targets
    urls: dict[Target, str] = {"llmq": settings.base_url} if llmq else {}
    pids: dict[Target, dict[str, int]] = {"llmq": stack} if llmq else {}
    server: services.ManagedProcess | None = None
    try:
        if "direct" in settings.targets:
            from llmq.bench.sim_server import start_sim_server
            from llmq.modelbuild import ensure_model

            server, urls["direct"] = start_sim_server(
                settings.model, ensure_model(settings.model),
                max_num_seqs=settings.max_num_seqs, max_model_len=settings.max_model_len,
            )  # fmt: skip
            pids["direct"] = {"server": server.pid}
        uvloop.run(_measure(settings, report, urls, pids))
    finally:
        if server is not None:
            services.stop(server, timeout=10)
    return report

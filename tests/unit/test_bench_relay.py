"""`llmq bench relay`'s pure parts: counting tokens and gaps in streamed bytes, the derived
figures, the report's text and the settings; and its client against a tiny local server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence

import pytest
from pydantic import ValidationError

from llmq.bench.engine_alone import EngineAloneResult
from llmq.bench.relay import (
    PhaseTally,
    RelayReport,
    RelaySettings,
    ResponseScan,
    added_gap_p99_s,
    build_endpoint,
    by_role,
    gateway_tokens_per_core,
    jobs_per_partition,
    run_phase,
    stream_once,
    summarize_phase,
    worker_core_share,
)
from llmq.bench.relay_report import format_report

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
FIRST = (
    b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"tok "}}]}\n\n'
)
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'
FINISH = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":null},"finish_reason":"length"}]}\n\n'  # noqa: E501
DONE = b"data: [DONE]\n\n"


def scan_of(reads: Sequence[tuple[bytes, float]]) -> tuple[ResponseScan, PhaseTally]:
    tally = PhaseTally()
    scan = ResponseScan(tally)
    for data, now in reads:
        scan.feed(data, now)
    return scan, tally


def test_tokens_and_gaps_are_counted_per_read() -> None:
    scan, tally = scan_of(
        [
            (HEAD + FIRST, 1.0),  # the first token: no gap
            (TOKEN, 1.25),
            (TOKEN + TOKEN, 1.5),  # two tokens in one read: one gap, then a zero gap
            (FINISH + b"data: [DO", 1.75),  # null content is no token
            (b"NE]\n\n", 1.8),  # [DONE] split across two reads
        ]
    )
    assert (scan.status, scan.tokens, tally.tokens) == (200, 4, 4)
    assert tally.gaps == pytest.approx([0.25, 0.25, 0.0])
    assert scan.done and scan.ok and not scan.error


def test_marks_split_across_reads_count_once_and_chunk_sizes_do_not_confuse() -> None:
    body = b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in (FIRST, TOKEN, TOKEN))
    cut = body.index(b'"content":"tok', len(FIRST)) + 5  # inside the second token's mark
    scan, tally = scan_of([(HEAD + body[:cut], 1.0), (body[cut:], 2.0), (b"e\r\n" + DONE, 3.0)])
    assert tally.tokens == 3 and tally.gaps == pytest.approx([1.0, 0.0])
    assert scan.done


def test_spaced_json_counts_as_the_direct_server_writes_it() -> None:
    spaced = json.dumps({"choices": [{"delta": {"content": "tok "}}]}).encode()
    scan, tally = scan_of([(HEAD + b"data: " + spaced + b"\n\n", 0.0), (DONE, 0.1)])
    assert tally.tokens == 1 and tally.gaps == [] and scan.ok


def test_a_refusal_or_an_error_event_is_not_ok() -> None:
    refused, _ = scan_of([(b'HTTP/1.1 429 Too Many Requests\r\n\r\n{"error":{}}', 0.0)])
    assert refused.status == 429 and not refused.ok
    failed, tally = scan_of([(HEAD + FIRST + b'data: {"error": {"message": "x"}}\n\n' + DONE, 0)])
    assert failed.done and failed.error and not failed.ok and tally.tokens == 1
    partial, _ = scan_of([(b"HTTP/1.1 2", 0.0), (b"00 OK\r\n\r\n" + FIRST, 0.1)])
    assert partial.status == 200 and not partial.done


def tally_of(tokens: int, requests: int, wall_s: float, gaps: list[float]) -> PhaseTally:
    return PhaseTally(tokens=tokens, requests=requests, wall_s=wall_s, gaps=gaps)


def test_the_derived_figures() -> None:
    cpu = by_role({"gateway": 4.0, "worker-0": 1.0, "worker-1": 1.5, "tansu": 0.5})
    assert cpu == {"gateway": 4.0, "worker": 2.5, "tansu": 0.5}
    idle = {"worker": 0.1, "tansu": 0.01}
    gaps = [i / 1000 for i in range(101)]  # 0..100 ms: p50 50 ms, p99 99 ms
    llmq = summarize_phase("llmq", 8, 256, tally_of(20_000, 80, 10.0, gaps), cpu, idle, 1.0)
    assert llmq.tokens_per_s == 2_000 and llmq.requests_per_s == 8
    assert llmq.cpu_s_per_1k == pytest.approx({"gateway": 0.2, "worker": 0.125, "tansu": 0.025})
    # worker: 2.5 s less 0.1 s/s x 10 s idle = 1.5 s over 20k tokens
    assert llmq.net_cpu_s_per_1k["worker"] == pytest.approx(0.075)
    assert gateway_tokens_per_core(llmq) == pytest.approx(5_000)
    assert worker_core_share(llmq) == pytest.approx(0.15)
    assert worker_core_share(llmq, net=False) == pytest.approx(0.25)
    direct = summarize_phase("direct", 8, 256, tally_of(20_000, 80, 10.0, [0.09]), {}, {})
    assert llmq.gap_p99_s == pytest.approx(0.099)
    assert added_gap_p99_s(llmq, direct) == pytest.approx(0.009)
    assert jobs_per_partition(llmq, 8) == pytest.approx(1.0)
    empty = summarize_phase("llmq", 8, 256, tally_of(0, 0, 10.0, []), cpu, idle)
    assert empty.cpu_s_per_1k == {} and empty.gap_p99_s is None
    assert gateway_tokens_per_core(empty) is None and added_gap_p99_s(empty, direct) is None


def test_the_report_prints_measured_figures_beside_the_issues_targets() -> None:
    report = RelayReport(
        settings=RelaySettings(streams=[8], partitions=8), machine="2 CPUs", engine="SIMULATED x"
    )
    report.idle_cpu_s_per_s = {"worker": 0.1}
    cpu = {"gateway": 4.0, "worker": 2.5, "tansu": 0.5, "valkey": 0.2}
    gaps = [i / 1000 for i in range(101)]
    idle = report.idle_cpu_s_per_s
    report.streaming = [
        summarize_phase("llmq", 8, 256, tally_of(20_000, 80, 10.0, gaps), cpu, idle, 1.0),
        summarize_phase("direct", 8, 256, tally_of(20_000, 80, 10.0, [0.09]), {"server": 1.0}, {}),
    ]
    report.jobs = [summarize_phase("llmq", 64, 1, tally_of(1_000, 1_000, 10.0, []), {}, {})]
    text = format_report(report)
    assert text.startswith("llmq bench relay: SIMULATED x")
    assert "added gap p99 9.00 ms" in text and "5,000 tok/s per core" in text
    assert "worker outside its engine - of a core (with it 15.0%, raw 25.0%)" in text
    report.engine_alone = [EngineAloneResult(streams=8, tokens=10_000, wall_s=10.0, cpu_s=0.25)]
    text = format_report(report)
    assert "worker outside its engine 10.0% of a core (with it 15.0%, raw 25.0%)" in text
    row = next(line for line in text.splitlines() if line.split()[:2] == ["8", "llmq"])
    assert row.split()[10] == "0.025"  # the engine alone's CPU per 1k tokens
    assert "<= 5 ms" in text and ">= 20,000" in text and "<= 5%" in text
    assert "llmq: 100.0 jobs/s, 12.5 per partition of 8" in text
    row = next(line for line in text.splitlines() if line.split()[:2] == ["8", "direct"])
    assert "0.050" in row  # the direct server's CPU per 1k tokens


def test_settings_refuse_what_is_not_a_local_plain_http_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for url in ("http://10.0.0.5:8000/v1", "https://127.0.0.1:8000/v1"):
        with pytest.raises(ValidationError, match="loopback"):
            RelaySettings(base_url=url)
    with pytest.raises(ValidationError):
        RelaySettings.model_validate({"targets": ["elsewhere"]})
    monkeypatch.setenv("LLMQ_DEV_PARTITIONS", "4")
    assert RelaySettings(base_url="http://localhost:9/v1").partitions == 4


async def serve(status: bytes, events: Sequence[bytes], bodies: list[bytes]) -> asyncio.Server:
    """A server on a free loopback port that answers each request with status and events."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if b"Content-Length" in line
        )
        bodies.append(await reader.readexactly(length))
        writer.write(b"HTTP/1.1 " + status + b"\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


@contextlib.asynccontextmanager
async def running(server: asyncio.Server) -> AsyncIterator[str]:
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


async def test_the_client_streams_from_a_local_server() -> None:
    bodies: list[bytes] = []
    async with running(await serve(b"200 OK", [FIRST, TOKEN, TOKEN, FINISH, DONE], bodies)) as url:
        endpoint = build_endpoint(url, "sk-test", "m", 3)
        tally = PhaseTally()
        scan = await stream_once(endpoint, tally)
        assert scan.ok and scan.tokens == 3 and len(tally.gaps) == 2
        request = json.loads(bodies[0])
        assert request["stream"] is True and request["max_tokens"] == 3
        assert request["model"] == "m"
        tally = await run_phase(endpoint, 2, 0.3)
        assert tally.requests >= 1 and tally.errors == 0
        assert tally.tokens >= 3 * tally.requests and tally.wall_s >= 0.3


async def test_the_client_counts_refusals_as_errors() -> None:
    refusal = b'{"error": {"message": "overloaded"}}'
    async with running(await serve(b"429 Too Many Requests", [refusal], [])) as url:
        tally = await run_phase(build_endpoint(url, "k", "m", 3), 2, 0.2)
        assert tally.requests == 0 and tally.errors >= 1 and tally.refused == tally.errors

"""The simulated engine drained alone (what `llmq bench relay` subtracts from a worker's CPU)."""

from __future__ import annotations

import pytest

from llmq.bench.engine_alone import EngineAloneResult, drain, outside_engine_share
from workers.engine.simulated import SimulatedGpuEngine


async def test_callers_run_requests_back_to_back_and_leave_nothing_running() -> None:
    engine = SimulatedGpuEngine(max_num_seqs=2, time_scale=1_000.0)
    await engine.start()
    try:
        result = await drain(engine, [5] * 64, streams=3, duration_s=0.2, max_tokens=5)
    finally:
        stats = engine.stats()
        await engine.shutdown()
    assert result.streams == 3 and result.wall_s >= 0.2
    assert result.tokens > 3 * 5  # more than one request per caller, one after another
    assert result.cpu_s > 0 and result.cpu_s_per_1k == pytest.approx(
        result.cpu_s * 1000 / result.tokens
    )
    assert stats.running == 0 and stats.waiting == 0  # the callers' last requests were aborted


def test_the_worker_outside_its_engine_is_its_cpu_less_the_engine_alone() -> None:
    alone = EngineAloneResult(streams=32, tokens=10_000, wall_s=10.0, cpu_s=0.25)
    assert outside_engine_share(0.075, alone, 2_000) == pytest.approx(0.10)
    assert outside_engine_share(None, alone, 2_000) is None
    assert outside_engine_share(0.075, None, 2_000) is None
    idle = EngineAloneResult(streams=32, tokens=0, wall_s=10.0, cpu_s=0.25)
    assert outside_engine_share(0.075, idle, 2_000) is None

"""The simulated GPU replica: its step-time arithmetic against the seeds, and its scheduling."""

from __future__ import annotations

import asyncio
import time

import pytest

from schemas.messages import InferenceJob, SamplingSettings
from workers.engine.port import EngineClient, EngineStep
from workers.engine.simulated import (
    H100_SXM,
    H200,
    LLAMA_8B,
    LLAMA_70B,
    GpuProfile,
    ReplicaProfile,
    SimulatedGpuEngine,
)

FAST = 1e5  # simulated seconds per wall second: a 13 ms step sleeps 0.13 us


def job(
    request_id: str, prompt: list[int], max_tokens: int, tier: str = "interactive"
) -> InferenceJob:
    now = time.time()
    return InferenceJob.model_validate(
        {
            "request_id": request_id, "team": "t", "model": "m", "pool": "p", "tier": tier,
            "prompt_token_ids": prompt, "sampling": SamplingSettings(max_tokens=max_tokens),
            "created_at": now, "deadline": now + 60, "reply_to": "r",
        }
    )  # fmt: skip


async def collect(engine: EngineClient, j: InferenceJob) -> list[EngineStep]:
    return [step async for step in engine.generate(j)]


# -- the arithmetic (seed 000, "Back-of-envelope estimates") --------------------------------


def test_kv_bytes_per_token_match_the_seed() -> None:
    assert LLAMA_70B.kv_bytes_per_token == 327_680  # 320 KiB
    assert LLAMA_8B.kv_bytes_per_token == 131_072  # 128 KiB
    assert LLAMA_70B.weight_bytes == pytest.approx(140e9)


def test_decode_at_batch_one_is_about_13_ms_on_70b_tp4_h100() -> None:
    replica = ReplicaProfile(gpu=H100_SXM, model=LLAMA_70B, tensor_parallel=4)
    assert replica.memory_time(0) == pytest.approx(35e9 / 3.35e12 / 0.8)
    step = replica.step_time(prefill_tokens=0, decode_tokens=1, kv_tokens=1_500)
    assert step == pytest.approx(0.013, rel=0.03)
    assert 1 / step == pytest.approx(76, rel=0.03)  # tokens/s for a lone sequence


def test_prefill_of_1500_tokens_is_about_130_ms_at_40_percent() -> None:
    replica = ReplicaProfile(gpu=H100_SXM, model=LLAMA_70B, tensor_parallel=4)
    assert replica.compute_time(1_500) == pytest.approx(0.130, rel=0.03)
    assert replica.compute_time(488) == pytest.approx(0.045, rel=0.05)  # 1,024 of 1,512 cached


def test_decode_stays_memory_bound_at_batch_128() -> None:
    replica = ReplicaProfile()
    kv = 128 * 1_650
    assert replica.compute_time(128) < replica.memory_time(kv)
    assert replica.step_time(0, 128, kv) == pytest.approx(replica.memory_time(kv))
    assert replica.memory_time(kv) == pytest.approx(0.0195, rel=0.03)  # the seed's 19.5 ms


def test_step_time_sums_decode_and_prefill() -> None:
    replica = ReplicaProfile()
    assert replica.step_time(0, 0, 0) == 0.0
    both = replica.step_time(2_000, 10, 10_000)
    assert both == pytest.approx(replica.memory_time(10_000) + replica.compute_time(2_000))


def test_kv_capacity_is_about_420k_tokens_on_70b_tp4_h100() -> None:
    engine = SimulatedGpuEngine(ReplicaProfile(gpu=H100_SXM, model=LLAMA_70B, tensor_parallel=4))
    assert engine.kv_capacity_tokens == pytest.approx(420_000, rel=0.02)
    assert engine.kv_capacity_tokens % 16 == 0


def test_h200_holds_more_and_reads_faster() -> None:
    h100 = ReplicaProfile(gpu=H100_SXM, tensor_parallel=4)
    h200 = ReplicaProfile(gpu=H200, tensor_parallel=4)
    assert h200.kv_capacity_tokens > 2 * h100.kv_capacity_tokens
    assert h200.memory_time(0) == pytest.approx(h100.memory_time(0) * 3.35 / 4.8)


def test_a_model_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        SimulatedGpuEngine(ReplicaProfile(tensor_parallel=1))  # 140 GB on one 80 GB GPU


# -- scheduling, in virtual time (the synchronous core) ---------------------------------------


def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    engine = SimulatedGpuEngine()
    seq = engine.submit("long", list(range(5_000)), max_tokens=2)
    budgets = [engine.step().prefill_tokens for _ in range(3)]
    assert budgets == [2_048, 2_048, 904]
    assert seq.generated == 1  # the step that finishes prefill samples the first token
    assert engine.step().decode_tokens == 1
    assert seq.state == "done" and seq.finish_reason == "length"
    assert not engine.has_work
    assert engine.outstanding_tokens == 0


def test_interactive_goes_before_earlier_batch_when_the_engine_is_full() -> None:
    engine = SimulatedGpuEngine(max_num_seqs=1)
    first = engine.submit("batch-1", list(range(100)), max_tokens=3, priority=10)
    engine.step()
    later_batch = engine.submit("batch-2", list(range(200, 300)), max_tokens=3, priority=10)
    interactive = engine.submit("chat", list(range(400, 500)), max_tokens=3, priority=0)
    assert engine.stats().running == 1 and engine.stats().waiting == 2
    order: list[str] = []
    while engine.has_work:
        for seq in engine.step().emitted:
            if seq.generated == 1:
                order.append(seq.request_id)
    assert order == ["chat", "batch-2"]
    assert first.generated == later_batch.generated == interactive.generated == 3


def test_a_full_kv_cache_preempts_the_lowest_priority_sequence() -> None:
    small = GpuProfile("tiny", memory_bytes=160e9 / 0.92, bandwidth_bytes_per_s=3.35e12,
                       peak_flops=989e12)  # fmt: skip
    profile = ReplicaProfile(gpu=small, tensor_parallel=1, activation_reserve_bytes_per_gpu=0)
    engine = SimulatedGpuEngine(profile, max_model_len=16_384)
    assert engine.kv_capacity_tokens == pytest.approx(61_035, abs=16)
    seqs = [
        engine.submit(f"b{i}", [i] * 10_000, max_tokens=3_000, priority=10) for i in range(5)
    ] + [engine.submit("i", [9] * 10_000, max_tokens=3_000, priority=0)]
    while engine.has_work:
        engine.step()
        assert engine.stats().kv_cache_usage <= 1.0
    assert all(s.generated == 3_000 and s.finish_reason == "length" for s in seqs)
    assert seqs[-1].preemptions == 0
    assert sum(s.preemptions for s in seqs) > 0


def test_aborting_a_waiting_request_drops_it() -> None:
    engine = SimulatedGpuEngine(max_num_seqs=1)
    engine.submit("a", [1] * 100, max_tokens=5)
    engine.step()
    engine.submit("b", [2] * 100, max_tokens=5)
    assert engine.stats().waiting == 1
    aborted = engine.abort_request("b")
    assert aborted is not None and aborted.finish_reason == "abort"
    assert engine.stats().waiting == 0
    while engine.has_work:
        engine.step()
    assert engine.outstanding_tokens == 0


# -- the EngineClient port (asyncio, high time_scale) -----------------------------------------


async def test_a_request_streams_exactly_max_tokens_tokens() -> None:
    engine = SimulatedGpuEngine(time_scale=FAST)
    await engine.start()
    try:
        steps = await collect(engine, job("r1", list(range(300)), max_tokens=17))
    finally:
        await engine.shutdown()
    assert sum(s.num_new_tokens for s in steps) == 17
    assert "".join(s.text for s in steps) == "tok " * 17
    assert [s.finished for s in steps] == [False] * 16 + [True]
    assert steps[-1].finish_reason == "length"
    assert all(s.prompt_tokens == 300 for s in steps)


async def test_a_repeated_prompt_reports_cached_tokens() -> None:
    engine = SimulatedGpuEngine(time_scale=FAST)
    await engine.start()
    prompt = list(range(1_000, 1_100))  # 6 full blocks of 16 and 4 tokens
    try:
        cold = await collect(engine, job("cold", prompt, max_tokens=2))
        warm = await collect(engine, job("warm", prompt, max_tokens=2))
        other = await collect(engine, job("other", [7, *prompt], max_tokens=2))
    finally:
        await engine.shutdown()
    assert cold[-1].cached_tokens == 0
    assert warm[-1].cached_tokens == 96
    assert other[-1].cached_tokens == 0  # a different first block: nothing shared
    assert engine.stats().kv_cache_usage == 0.0


async def test_abort_frees_the_slot_for_the_next_request() -> None:
    engine = SimulatedGpuEngine(max_num_seqs=1, time_scale=1_000.0)
    await engine.start()
    try:
        long_stream = engine.generate(job("long", [1] * 64, max_tokens=100_000))
        first = await anext(long_stream)
        assert first.num_new_tokens == 1 and not first.finished
        short = asyncio.create_task(collect(engine, job("short", [2] * 64, max_tokens=3)))
        await asyncio.sleep(0.01)
        assert engine.stats().running == 1 and engine.stats().waiting == 1
        await engine.abort("long")
        rest = [step async for step in long_stream]
        assert rest[-1].finished
        steps = await asyncio.wait_for(short, timeout=5)
    finally:
        await engine.shutdown()
    assert sum(s.num_new_tokens for s in steps) == 3
    assert engine.stats().running == 0 and engine.stats().kv_cache_usage == 0.0


async def test_closing_the_stream_aborts_the_request() -> None:
    engine = SimulatedGpuEngine(time_scale=1_000.0)
    await engine.start()
    try:
        stream = engine.generate(job("gone", [3] * 64, max_tokens=100_000))
        await anext(stream)
        await stream.aclose()  # type: ignore[attr-defined]
        assert engine.stats().running == 0 and not engine.has_work
    finally:
        await engine.shutdown()


async def test_a_prompt_longer_than_the_context_is_rejected() -> None:
    from workers.engine.port import EngineRequestError

    engine = SimulatedGpuEngine(max_model_len=128, time_scale=FAST)
    await engine.start()
    try:
        with pytest.raises(EngineRequestError):
            await collect(engine, job("big", [1] * 200, max_tokens=1))
    finally:
        await engine.shutdown()


# -- the in-process pool (llmq.bench.simulate) ------------------------------------------------


def test_a_small_simulated_pool_meets_its_slos_and_reports_cache_hits() -> None:
    from llmq.bench.simulate import SimulationSettings, format_simulation, run_simulation

    settings = SimulationSettings(
        model="llama-8b", tensor_parallel=1, replicas=2, rate=20.0, prompt_tokens=512,
        output_tokens=40, shared_prefix_tokens=256, prefixes=2, warmup_s=2.0, duration_s=4.0,
    )  # fmt: skip
    report = run_simulation(settings)
    assert report.requests > 40 and report.completed == report.requests
    assert report.goodput_share == 1.0
    assert report.ttft_p50_s is not None and 0.0 < report.ttft_p50_s < 0.8
    assert report.tpot_p99_s is not None and report.tpot_p99_s < 0.04
    assert report.prompt_cache_hit_rate == pytest.approx(256 / 512, abs=0.05)
    assert report.output_tokens_per_s == pytest.approx(20.0 * 40, rel=0.3)
    assert "SIMULATION" in format_simulation(report)

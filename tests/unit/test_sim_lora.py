"""The simulated replica's LoRA adapters: at most max_loras per step, loads stall the step."""

from __future__ import annotations

import pytest

from workers.engine.port import EngineRequestError
from workers.engine.sim_lora import LoraTimings, SimLoraSlots
from workers.engine.simulated import SimulatedGpuEngine

TIMINGS = LoraTimings(load_s=0.5, activate_s=0.01)


def first_tokens(engine: SimulatedGpuEngine) -> list[str]:
    """Run the engine dry; the request ids in the order of their first tokens."""
    order: list[str] = []
    while engine.has_work:
        order += [s.request_id for s in engine.step().emitted if s.generated == 1]
    return order


def test_a_step_runs_at_most_max_loras_adapters_and_skips_blocked_requests() -> None:
    engine = SimulatedGpuEngine(max_loras=1, lora_timings=TIMINGS)
    engine.submit("a-1", [1] * 64, max_tokens=20, adapter="t/a")
    engine.submit("b-1", [2] * 64, max_tokens=20, adapter="t/b")
    engine.submit("base", [3] * 64, max_tokens=20)
    engine.submit("a-2", [4] * 64, max_tokens=20, adapter="t/a")
    engine.step()
    running = {s.request_id for s in engine._running}
    # b-1 waits for a slot; the base request and a-2 (same adapter) go ahead of it.
    assert running == {"a-1", "base", "a-2"}
    assert engine.stats().waiting == 1
    assert first_tokens(engine) == ["b-1"]
    assert engine.outstanding_tokens == 0


def test_loading_an_adapter_stalls_the_step_and_evictions_cost_reloads() -> None:
    engine = SimulatedGpuEngine(max_loras=1, max_cpu_loras=2, lora_timings=TIMINGS)
    plain = engine.profile.step_time(64, 0, 64)
    engine.submit("a", [1] * 64, max_tokens=1, adapter="t/a")
    step = engine.step()
    assert step.duration_s == pytest.approx(plain + 0.5 + 0.01)  # disk -> CPU -> GPU slot
    for adapter in ("t/b", "t/a", "t/c", "t/a", "t/b"):
        engine.submit(f"x-{adapter}", [1] * 64, max_tokens=1, adapter=adapter)
        first_tokens(engine)
    assert engine.lora is not None
    # Loads: a, b, then c evicts b (a was used more recently), then b again evicts c.
    assert (engine.lora.loads, engine.lora.activations) == (4, 6)
    assert engine.stats().adapters == ("t/a", "t/b")


def test_adapter_requests_need_lora_enabled() -> None:
    with pytest.raises(EngineRequestError, match="LoRA is not enabled"):
        SimulatedGpuEngine().submit("a", [1] * 8, max_tokens=1, adapter="t/a")


def test_slots_never_evict_an_adapter_the_step_uses() -> None:
    slots = SimLoraSlots(max_loras=2, max_cpu_loras=2)
    slots.prepare({"x", "y"})
    slots.prepare({"z", "y"})
    assert slots.loaded == ("y", "z")
    assert slots.blocks("w", {"y", "z"}) and not slots.blocks("y", {"y", "z"})
    assert not slots.blocks(None, {"y", "z"})

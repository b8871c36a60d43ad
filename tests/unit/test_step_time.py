"""The TPOT cap: decode step time learnt from batch size and context, and the slots it leaves."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import cast

import pytest
from structlog.testing import capture_logs

from schemas.messages import InferenceJob, SamplingSettings
from topics.redis_relay import RedisReplicaDirectory
from workers.engine.simulated import H100_SXM, LLAMA_70B, ReplicaProfile, SimulatedGpuEngine
from workers.headroom import HeadroomPolicy
from workers.heartbeat import Heartbeat
from workers.load import LoadTracker
from workers.load_view import engine_load
from workers.step_time import MIN_SAMPLES, SAFETY_MARGIN, START_CAP, StepTimeModel
from workers.team_activity import TEAM_ACTIVE_S, TeamActivity


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RecordingModel(StepTimeModel):
    """A model that also remembers every sample it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.added: list[tuple[int, int, float]] = []

    def add(self, n: int, context_tokens: int, step_s: float) -> None:
        self.added.append((n, context_tokens, step_s))
        super().add(n, context_tokens, step_s)


def job(
    rid: str, prompt: int = 100, n: int = 1, max_tokens: int = 200, tokens: list[int] | None = None
) -> InferenceJob:
    ids = tuple(tokens) if tokens is not None else tuple(range(prompt))
    return InferenceJob(
        request_id=rid, team="t", model="m", pool="p", prompt_token_ids=ids,
        sampling=SamplingSettings(max_tokens=max_tokens, n=n), created_at=0, deadline=1e12,
        reply_to="r",
    )  # fmt: skip


def linear_samples(
    model: StepTimeModel, a: float, b: float, c: float, count: int = 200, seed: int = 1
) -> None:
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randint(1, 64)
        ctx = n * rng.randint(200, 4_000)
        model.add(n, ctx, a + b * n + c * ctx)


# -- the model ------------------------------------------------------------------------------


def test_the_fit_recovers_a_known_linear_model_from_noisy_samples_with_outliers() -> None:
    a, b, c = 0.012, 2e-4, 3e-8
    rng = random.Random(7)
    model = StepTimeModel()
    for i in range(500):
        n = rng.randint(1, 64)
        ctx = n * rng.randint(200, 4_000)
        step = a + b * n + c * ctx + rng.gauss(0.0, 3e-4)
        if i % 20 == 0:
            step += 0.15  # a step that also ran a prefill chunk
        model.add(n, ctx, step)
    fit = model.fit()
    assert fit is not None
    assert fit.a == pytest.approx(a, rel=0.05)
    assert fit.b == pytest.approx(b, rel=0.05)
    assert fit.c == pytest.approx(c, rel=0.05)
    assert fit.samples <= 500 - 25  # the prefill-heavy steps were dropped
    assert model.predict(32, 32 * 2_000) == pytest.approx(a + b * 32 + c * 64_000, rel=0.02)


def test_coefficients_stay_non_negative() -> None:
    model = StepTimeModel()
    rng = random.Random(3)
    for _ in range(100):  # steps that get faster with more sequences: no such thing
        n = rng.randint(1, 32)
        model.add(n, n * 1_000, 0.03 - 1e-4 * n)
    fit = model.fit()
    assert fit is not None
    assert min(fit.a, fit.b, fit.c) >= 0.0


def test_every_sequence_holding_the_same_context_still_fits() -> None:
    model = StepTimeModel()
    for n in range(1, 65):  # context proportional to n: n and context are collinear
        model.add(n, 1_000 * n, 0.01 + 5e-4 * n)
    fit = model.fit()
    assert fit is not None
    assert fit.predict(40, 40_000) == pytest.approx(0.01 + 5e-4 * 40)
    assert model.cap(0.05, 1_000, 256) == 70  # (0.9 x 0.05 - 0.01) / 5e-4


@pytest.mark.parametrize(
    ("a", "b", "c", "slo", "per_seq", "most", "cap"),
    [
        (0.01, 5e-4, 0.0, 0.05, 0, 256, 70),  # (0.045 - 0.01) / 5e-4
        (0.01, 5e-4, 1e-7, 0.05, 1_000, 256, 58),  # / (5e-4 + 1e-4) = 58.3
        (0.01, 5e-4, 0.0, 0.05, 0, 32, 32),  # never above max_num_seqs
        (0.01, 5e-4, 0.0, 0.005, 0, 256, 1),  # never below 1
        (0.02, 0.0, 0.0, 0.05, 0, 256, 256),  # flat: any batch size meets the SLO
    ],
)
def test_cap_for_a_known_model_and_slo(
    a: float, b: float, c: float, slo: float, per_seq: int, most: int, cap: int
) -> None:
    model = StepTimeModel()
    linear_samples(model, a, b, c)
    assert model.cap(slo, per_seq, most) == cap
    fit = model.current
    assert fit is not None
    if 1 < cap < most:  # the largest batch within the margin, and the next one over it
        assert fit.predict(cap, cap * per_seq) <= SAFETY_MARGIN * slo
        assert fit.predict(cap + 1, (cap + 1) * per_seq) > SAFETY_MARGIN * slo


def test_without_enough_samples_or_spread_the_cap_is_the_slow_start() -> None:
    model = StepTimeModel()
    for n in (1, 2, 3) * ((MIN_SAMPLES - 1) // 3):
        model.add(n, 1_000 * n, 0.5 * n)
    assert model.fit() is None
    assert model.predict(8, 8_000) is None
    assert model.cap(0.05, 1_000, 64) == START_CAP < 64
    assert model.cap(0.05, 1_000, 2) == 2  # never above the engine's slots
    one_size = StepTimeModel()
    for _ in range(200):  # many samples, one batch size: no slope to extrapolate with
        one_size.add(16, 16_000, 0.5)
    assert one_size.cap(0.05, 1_000, 64) == START_CAP

    started = StepTimeModel()  # 10 ms + 1 ms a sequence: a batch of 35 is within 0.9 x 50 ms
    for n in (4, 5, 6, 7):  # a full batch: each step timed within the SLO lifts the cap by one
        for _ in range(3):
            started.add(n, 1_000 * n, 0.01 + 0.001 * n)
        assert started.fit() is None  # too few samples
        assert started.cap(0.05, 1_000, 64) == n + 1
    started.add(40, 40_000, 0.05)  # over 45 ms: does not lift it
    assert started.cap(0.05, 1_000, 64) == 8
    assert started.cap(0.05, 1_000, 6) == 6
    for n in (4, 5, 6, 7) * 5:  # the sizes the slow start let run give a first fit
        started.add(n, 1_000 * n, 0.01 + 0.001 * n)
    assert started.fit() is not None
    assert started.cap(0.05, 1_000, 64) == 35


def test_a_window_without_spread_keeps_the_previous_fit() -> None:
    model = StepTimeModel(window=64, refit_every=8)
    linear_samples(model, 0.01, 5e-4, 0.0, count=64)
    assert model.cap(0.05, 0, 256) == 70
    for _ in range(64):  # the batch size settles at the cap: the window has no spread
        model.add(70, 70_000, 0.01 + 5e-4 * 70)
    assert model.cap(0.05, 0, 256) == 70


def test_meaningless_samples_are_ignored() -> None:
    model = StepTimeModel()
    model.add(0, 0, 0.01)
    model.add(4, 100, 0.0)
    model.add(4, 100, float("inf"))
    assert model.sample_count == 0


# -- sampling from produced() ---------------------------------------------------------------


def test_produced_calls_become_one_sample_per_step() -> None:
    clock, model = FakeClock(), RecordingModel()
    tracker = LoadTracker(tpot_slo_s=0.05, step_times=model, clock=clock)
    for rid, prompt in (("a", 100), ("b", 200), ("c", 300)):
        tracker.started(job(rid, prompt))
    clock.now += 0.2  # the prefill
    for rid in "abc":
        tracker.produced(rid, 1, 0)  # first tokens: no step time yet
    assert model.added == []
    for step in range(1, 4):
        clock.now += 0.02
        for rid in "abc":  # three jobs, one step: one sample
            tracker.produced(rid, 1, 0)
        assert len(model.added) == step
        # the context the step read: prompts + tokens before it (its own are not in yet)
        assert model.added[-1] == pytest.approx((3, 600 + 3 + 3 * (step - 1), 0.02))
    clock.now += 0.06  # a step that brought three tokens at once: a third each
    tracker.produced("a", 3, 0)
    assert model.added[-1] == pytest.approx((3, 600 + 3 + 9, 0.02))
    tracker.produced("b", 3, 0)
    tracker.produced("c", 3, 0)
    assert len(model.added) == 4
    tracker.finished("c")
    clock.now += 0.04  # "b" reports two steps first: jobs and context without "c"
    tracker.produced("b", 2, 0)
    assert model.added[-1] == pytest.approx((2, (100 + 7) + (200 + 7), 0.02))
    tracker.produced("a", 1, 0)  # same step: not sampled again
    assert len(model.added) == 5


def test_steps_with_a_prefill_are_not_sampled() -> None:
    clock, model = FakeClock(), RecordingModel()
    tracker = LoadTracker(tpot_slo_s=0.05, step_times=model, clock=clock)
    tracker.started(job("a"))
    clock.now += 0.1
    tracker.produced("a", 1, 0)
    clock.now += 0.02
    tracker.produced("a", 1, 0)
    assert len(model.added) == 1
    tracker.started(job("b", 2_000))  # prefilling: the step carries its chunk
    clock.now += 0.15
    tracker.produced("a", 1, 0)
    clock.now += 0.001
    tracker.produced("b", 1, 0)  # its first token
    assert len(model.added) == 1
    clock.now += 0.02
    tracker.produced("a", 1, 0)  # "b"'s first token arrived in this gap: discarded too
    assert len(model.added) == 1
    clock.now += 0.02
    tracker.produced("a", 1, 0)
    tracker.produced("b", 1, 0)
    assert model.added[-1] == pytest.approx((2, (100 + 4) + (2_000 + 1), 0.02))
    tracker.produced("a", 0, 0)  # an empty step (the end of a stream): nothing
    assert len(model.added) == 2


def test_jobs_with_several_choices_give_no_samples() -> None:
    clock, model = FakeClock(), RecordingModel()
    tracker = LoadTracker(tpot_slo_s=0.05, step_times=model, clock=clock)
    tracker.started(job("a", n=2))
    tracker.produced("a", 1, 0)
    for _ in range(3):
        clock.now += 0.02
        tracker.produced("a", 1, 0)  # choice 0
        tracker.produced("a", 1, 0)  # choice 1, same step
    assert model.added == []


def test_without_an_slo_nothing_is_learnt_and_nothing_capped() -> None:
    tracker = LoadTracker()
    assert tracker.step_times is None
    tracker.started(job("a"))
    tracker.produced("a", 1, 0)
    tracker.produced("a", 1, 0)
    assert tracker.seq_cap(16) == 16
    with pytest.raises(ValueError):
        LoadTracker(tpot_slo_s=0.0)


def capped_tracker(cap: int = 5) -> LoadTracker:
    """A tracker whose steps took 10 ms + 2 ms per sequence; an SLO that allows ``cap``."""
    slo = (0.01 + (cap + 0.3) * 0.002) / SAFETY_MARGIN
    tracker = LoadTracker(tpot_slo_s=slo)
    assert tracker.step_times is not None
    linear_samples(tracker.step_times, 0.01, 0.002, 0.0)
    return tracker


def test_each_sequence_brings_its_successors_prefill_to_the_cap() -> None:
    tracker = capped_tracker(5)  # 10 ms + 2 ms per sequence: 5 fit the SLO
    assert tracker.seq_cap(16) == 5  # no job prefilled yet: no prefill term
    for i in range(4):  # 80 of 100 prompt tokens computed (20 cached), 40 tokens produced
        tracker.started(job(f"j{i}", prompt=100))
        tracker.produced(f"j{i}", 1, 20)
        for _ in range(39):
            tracker.produced(f"j{i}", 1, 20)
        tracker.finished(f"j{i}")
    assert tracker.prefill_s_per_seq(20_000) == pytest.approx(80 / 20_000 / 40)  # 0.1 ms
    assert tracker.seq_cap(16, 20_000) == 5  # (5.3 x 2 ms) / 2.1 ms = 5.05
    assert tracker.prefill_s_per_seq(2_000) == pytest.approx(1e-3)
    assert tracker.seq_cap(16, 2_000) == 3  # 10.6 ms / 3 ms = 3.5
    assert tracker.prefill_s_per_seq() > 0  # without the engine's rate: first-token timings


def test_before_a_job_finished_its_max_tokens_stand_for_its_output() -> None:
    tracker = capped_tracker(5)
    tracker.started(job("a", prompt=100, max_tokens=50))
    tracker.produced("a", 1, 0)
    assert tracker.prefill_s_per_seq(1_000) == pytest.approx(100 / 1_000 / 50)


def test_a_cap_change_is_logged_once() -> None:
    tracker = capped_tracker(5)
    with capture_logs() as logs:
        assert tracker.seq_cap(16) == 5
        assert tracker.seq_cap(16) == 5
    assert [entry["event"] for entry in logs] == ["seq_cap_changed"]
    assert logs[0]["old"] == 16 and logs[0]["new"] == 5
    assert logs[0]["step_s"] == pytest.approx(0.02)
    assert tracker.tpot_slo_s is not None and logs[0]["slo"] == tracker.tpot_slo_s


# -- what the cap does to the worker ----------------------------------------------------------


def test_engine_load_starts_up_to_the_cap_and_not_beyond() -> None:
    engine = SimulatedGpuEngine(max_num_seqs=16)
    policy = HeadroomPolicy(team_slot_reserve=0)
    tracker = capped_tracker(5)
    running = [job(f"r{i}") for i in range(5)]
    for j in running:
        tracker.started(j)
        tracker.produced(j.request_id, 1, 0)
    four = engine_load(
        engine, policy, tracker, TeamActivity(TEAM_ACTIVE_S),
        running=running[:4], waiting=[], interactive_buffered=1,
    )  # fmt: skip
    assert four.max_num_seqs == 5
    assert policy.can_start(four, 300, "interactive", "t")
    five = engine_load(
        engine, policy, tracker, TeamActivity(TEAM_ACTIVE_S),
        running=running, waiting=[], interactive_buffered=1,
    )  # fmt: skip
    assert not policy.can_start(five, 300, "interactive", "t")
    assert policy.fetch_budget(five).total == 0


def test_running_jobs_over_a_lowered_cap_are_not_preempted_for_it() -> None:
    engine = SimulatedGpuEngine(max_num_seqs=16)
    policy = HeadroomPolicy(team_slot_reserve=0)
    tracker = capped_tracker(5)
    batch = [job(f"b{i}").model_copy(update={"tier": "batch"}) for i in range(7)]
    over = engine_load(
        engine, policy, tracker, TeamActivity(TEAM_ACTIVE_S),
        running=batch[:7], waiting=[], interactive_buffered=1,
    )  # fmt: skip
    assert over.in_flight == 7 and over.max_num_seqs == 5
    assert not policy.can_start(over, 300, "interactive", "t")
    assert not policy.preemption_needed(over, "interactive", 300, "t")  # two over: wait
    assert policy.fetch_budget(over).interactive == 0
    at_cap = engine_load(
        engine, policy, tracker, TeamActivity(TEAM_ACTIVE_S),
        running=batch[:5], waiting=[], interactive_buffered=1,
    )  # fmt: skip
    assert policy.preemption_needed(at_cap, "interactive", 300, "t")  # as without a cap


def test_the_heartbeat_reports_the_cap_as_its_slots() -> None:
    heartbeat = Heartbeat(
        cast(RedisReplicaDirectory, object()), replica_id="r", pool="p", model="m",
        interval_s=1.0,
    )  # fmt: skip
    heartbeat.engine = SimulatedGpuEngine(max_num_seqs=16)
    heartbeat.state = "ready"
    assert heartbeat.current().max_num_seqs == 16
    heartbeat.load = LoadTracker()
    assert heartbeat.current().max_num_seqs == 16
    heartbeat.load = capped_tracker(5)
    assert heartbeat.current().max_num_seqs == 5


# -- on the simulated GPU ---------------------------------------------------------------------


@dataclass
class SimulatedRun:
    tracker: LoadTracker
    decode_steps: list[tuple[int, float]]
    """Every decode-only step: (batch size, seconds)."""
    most: int
    """The most jobs that ran at once."""
    tpots: list[tuple[int, float]]
    """Each finished job's phase (its index in ``demand`` when it started) and TPOT: seconds
    from its first token to its last over the gaps between them."""


def run_simulated(
    tpot_slo_s: float | None, demand: list[int], steps_each: int = 250
) -> SimulatedRun:
    """Llama 3 70B on four H100s, jobs of 3-4k-token prompts and 400-800 tokens of output,
    started through the headroom policy while ``demand`` jobs want to run (one phase each)."""
    rng = random.Random(11)
    clock = FakeClock()
    engine = SimulatedGpuEngine(ReplicaProfile(H100_SXM, LLAMA_70B, 4), max_num_seqs=256)
    tracker = LoadTracker(tpot_slo_s=tpot_slo_s, clock=clock)
    policy = HeadroomPolicy(team_slot_reserve=0)
    teams = TeamActivity(TEAM_ACTIVE_S, clock=clock)
    running: dict[str, InferenceJob] = {}
    decode_steps: list[tuple[int, float]] = []
    first_at: dict[str, tuple[float, int]] = {}  # first token's time, tokens since
    phase_of: dict[str, int] = {}
    tpots: list[tuple[int, float]] = []
    most = made = 0
    pending: InferenceJob | None = None  # the next job, waiting for room
    for phase, wanted in enumerate(demand):
        for _ in range(steps_each):
            while len(running) < wanted:
                if pending is None:
                    made += 1
                    prompt = [rng.randrange(32_000) for _ in range(rng.randint(3_000, 4_000))]
                    pending = job(f"j{made}", max_tokens=rng.randint(400, 800), tokens=prompt)
                load = engine_load(
                    engine, policy, tracker, teams,
                    running=list(running.values()), waiting=[pending], interactive_buffered=1,
                )  # fmt: skip
                size = len(pending.prompt_token_ids)
                tokens = policy.job_tokens(size, pending.sampling.max_tokens)
                if not policy.can_start(load, tokens, "interactive", "t"):
                    break
                engine.submit(
                    pending.request_id, pending.prompt_token_ids, pending.sampling.max_tokens
                )
                tracker.started(pending)
                running[pending.request_id] = pending
                phase_of[pending.request_id] = phase
                pending = None
            most = max(most, len(running))
            result = engine.step()
            clock.now += result.duration_s
            if result.prefill_tokens == 0 and result.decode_tokens:
                decode_steps.append((result.decode_tokens, result.duration_s))
            for seq in result.emitted:
                tracker.produced(seq.request_id, 1, seq.cached_tokens)
                started, tokens = first_at.get(seq.request_id, (clock.now, -1))
                first_at[seq.request_id] = (started, tokens + 1)
                if seq.state == "done":
                    tracker.finished(seq.request_id)
                    del running[seq.request_id]
                    started, gaps = first_at.pop(seq.request_id)
                    if gaps > 0:
                        tpots.append((phase_of[seq.request_id], (clock.now - started) / gaps))
    return SimulatedRun(tracker, decode_steps, most, tpots)


def test_the_learnt_cap_keeps_simulated_70b_tokens_within_the_tpot_slo() -> None:
    demand = [8, 16, 32, 96, 96, 96, 96, 96, 96]  # jobs started from phase 4 on met a fit
    rate = SimulatedGpuEngine(ReplicaProfile(H100_SXM, LLAMA_70B, 4)).stats().prefill_tokens_per_s
    per_seq = 3_500 / rate / 600  # a successor's prompt at the engine's rate, per output token

    uncapped = run_simulated(None, demand)
    assert uncapped.most == 96
    assert max(step for _, step in uncapped.decode_steps) > 0.020  # 96 long sequences
    late = [tpot for phase, tpot in uncapped.tpots if phase >= 3]
    assert late and min(late) > 0.050  # and their successors' prefills: over 50 ms a token

    for slo, low, high in ((0.020, 5, 10), (0.050, 40, 60)):
        run = run_simulated(slo, demand)
        tracker = run.tracker
        fit = tracker.step_times.current if tracker.step_times else None
        assert fit is not None  # memory-bound: ~13 ms of weights + KV reads per context token
        assert fit.a == pytest.approx(35e9 / (3.35e12 * 0.8), rel=0.02)
        assert fit.c == pytest.approx(327_680 / 4 / (3.35e12 * 0.8), rel=0.02)
        assert tracker.prefill_s_per_seq(rate) == pytest.approx(per_seq, rel=0.15)
        # (0.9 x SLO - 13 ms) / (0.12 ms of KV reads + 0.5 ms of prefill) per sequence:
        # about 7 at 20 ms and 50 at 50 ms; without the prefill term 40 and 250.
        cap = tracker.seq_cap(256, rate)
        assert low <= cap <= high
        assert max(n for n, _ in run.decode_steps[-1_000:]) <= cap  # the policy kept to it
        late = [tpot for phase, tpot in run.tpots if phase >= 4]
        assert len(late) >= 5
        assert max(late) <= slo  # every token gap, prefills included, within the SLO

"""SIMULATION: one GPU replica's continuous batching, timed from first principles, no model.

`SimReplica` is the synchronous core of `workers.engine.simulated.SimulatedGpuEngine`: `submit`
queues a request, `step` schedules and runs one step and returns its modelled duration, so a
discrete-event driver (`llmq.bench.simulate`) runs replicas in virtual time.

Step times, KV capacity and KV blocks come from `workers.engine.sim_model` (weights and KV read
per step at a share of HBM bandwidth; prefill at a share of peak FLOPS; their sum).

Scheduling follows vLLM V1: a token budget per step (chunked prefill, ``max_num_batched_tokens``),
decodes first, then running prefills, then waiting requests by (priority, arrival): interactive
(0) before batch (10). A request is admitted only when the KV blocks for its prompt + 1 token
fit, and at most ``max_num_seqs`` run. When a decode needs a block and none is free, the lowest
priority, latest running sequence is preempted and recomputed later (its stream just pauses).
Prefix caching: full 16-token prompt blocks are hashed as a chain (each with its parent), and
blocks seen recently (refcounted while in use, then kept in an LRU that only occupies free KV
blocks) count as cached tokens that skip prefill, at most all but the prompt's last token.

LoRA (``max_loras`` > 0): a step runs at most ``max_loras`` distinct adapters, a waiting request
whose adapter would exceed that is skipped for the step, and a step waits while its adapters are
loaded into GPU slots (`workers.engine.sim_lora`).
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from workers.engine.port import EngineRequestError, EngineStats, EngineStep
from workers.engine.sim_lora import LoraTimings, SimLoraSlots
from workers.engine.sim_model import KvBlockPool, ReplicaProfile, block_hashes

SeqState = Literal["waiting", "running", "done"]


class StepMailbox:
    """One request's steps, from the engine's step loop to its stream: a deque and at most
    one waiter. (An `asyncio.Queue`'s bookkeeping cost more per token than the hand-over.)"""

    __slots__ = ("_steps", "_waiter", "token")

    def __init__(self) -> None:
        self._steps: deque[EngineStep] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.token: EngineStep | None = None
        """The step of one mid-stream token, the same each time (built once)."""

    def put(self, step: EngineStep) -> None:
        self._steps.append(step)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> EngineStep:
        while not self._steps:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._steps.popleft()


@dataclass(eq=False)
class SimSequence:
    """One request inside the simulation (read-only for callers)."""

    request_id: str
    priority: int
    order: int
    prompt_len: int
    max_tokens: int
    hashes: tuple[int, ...]
    """Chained hashes of the prompt's full blocks."""
    adapter: str | None = None
    state: SeqState = "waiting"
    target: int = 0
    """Tokens whose KV must exist before the next token: prompt (+ output after a preemption)."""
    computed: int = 0
    cached_tokens: int = 0
    generated: int = 0
    private_blocks: int = 0
    finish_reason: str | None = None
    preemptions: int = 0
    mailbox: StepMailbox | None = field(default=None, repr=False)
    """Where `SimulatedGpuEngine` puts its steps for the request's stream (None in virtual time)."""

    def remaining(self) -> int:
        """Outstanding work: tokens left to prefill plus output tokens left to decode."""
        return (self.target - self.computed) + (self.max_tokens - self.generated)


@dataclass(frozen=True)
class SimStepResult:
    duration_s: float
    emitted: list[SimSequence]
    """Sequences that produced one token this step (finished ones have ``state == "done"``)."""
    prefill_tokens: int
    decode_tokens: int


def _rank(seq: SimSequence) -> tuple[int, int]:
    return (seq.priority, seq.order)


class SimReplica:
    """SIMULATION of one GPU replica's scheduler and step times (see the module docstring)."""

    def __init__(
        self,
        profile: ReplicaProfile | None = None,
        *,
        max_num_seqs: int = 256,
        max_model_len: int = 8192,
        name: str = "sim-0",
        max_loras: int = 0,
        max_cpu_loras: int | None = None,
        lora_timings: LoraTimings | None = None,
    ) -> None:
        self.profile = profile or ReplicaProfile()
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.name = name
        self.lora = SimLoraSlots(max_loras, max_cpu_loras, lora_timings) if max_loras else None
        """Adapter residency, or None when LoRA is off (adapter requests are refused)."""
        self.kv_capacity_tokens = self.profile.kv_capacity_tokens
        if self.kv_capacity_tokens <= 0:
            raise ValueError(f"{self.profile.model.name} does not fit on this replica")
        self._bs = self.profile.block_size
        self._token_limit = min(max_model_len, self.kv_capacity_tokens)
        """A sequence stops ("length") here, so a lone sequence always fits in KV."""
        self._kv = KvBlockPool(self.profile.kv_capacity_blocks, self._bs)
        self._seqs: dict[str, SimSequence] = {}
        self._waiting: list[tuple[int, int, SimSequence]] = []
        self._n_waiting = 0
        self._running: list[SimSequence] = []
        self._order = 0
        self.outstanding_tokens = 0
        self.clock_s = 0.0
        """Simulated seconds this engine has spent stepping."""

    def submit(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        priority: int = 0,
        salt: object = None,
        adapter: str | None = None,
    ) -> SimSequence:
        """Queue one request; EngineRequestError when it can never run on this replica."""
        prompt_len = len(prompt_token_ids)
        if adapter is not None and self.lora is None:
            raise EngineRequestError(f"adapter {adapter} requested but LoRA is not enabled")
        if request_id in self._seqs:
            raise EngineRequestError(f"request {request_id} is already running")
        if prompt_len == 0 or max_tokens < 1:
            raise EngineRequestError("the prompt is empty or max_tokens < 1")
        if prompt_len + 1 > self._token_limit:
            raise EngineRequestError(
                f"prompt of {prompt_len} tokens does not fit max_model_len {self.max_model_len}"
                f" / KV capacity {self.kv_capacity_tokens}"
            )
        self._order += 1
        seq = SimSequence(
            request_id, priority, self._order, prompt_len, max_tokens,
            block_hashes(prompt_token_ids, self._bs, salt), adapter, target=prompt_len,
        )  # fmt: skip
        self._seqs[request_id] = seq
        self._push_waiting(seq)
        self.outstanding_tokens += seq.remaining()
        return seq

    def abort_request(self, request_id: str) -> SimSequence | None:
        """Drop a request wherever it is and free its KV blocks."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return None
        if seq.state == "running":
            self._running.remove(seq)
            self._release(seq)
        elif seq.state == "waiting":
            self._n_waiting -= 1  # its heap entry is skipped when reached
        self._finish(seq, "abort")
        return seq

    @property
    def has_work(self) -> bool:
        return bool(self._running) or self._n_waiting > 0

    def step(self) -> SimStepResult:
        """Schedule and run one step; the state is as of its end, `duration_s` its cost."""
        budget = self.profile.max_num_batched_tokens
        emitted: list[SimSequence] = []
        decodes = prefill = 0
        for seq in list(self._running):  # decodes first, in (priority, arrival) order
            if seq.state != "running" or seq.computed < seq.target or budget == 0:
                continue
            if not self._grow(seq, seq.computed + 1):
                continue  # preempted itself
            seq.computed += 1
            seq.target += 1
            budget -= 1
            decodes += 1
            emitted.append(seq)
        for seq in self._running:  # then prefills in progress
            if budget == 0:
                break
            if seq.computed < seq.target:
                budget -= (chunk := self._prefill(seq, budget, emitted))
                prefill += chunk
        adapters = {s.adapter for s in self._running if s.adapter is not None}
        skipped: list[tuple[int, int, SimSequence]] = []
        while budget > 0 and len(self._running) < self.max_num_seqs:  # then new admissions
            head = self._peek_waiting()
            if head is not None and self.lora and self.lora.blocks(head.adapter, adapters):
                skipped.append(heapq.heappop(self._waiting))  # no slot for its adapter
                continue
            if head is None or not self._admit(head):
                break
            if head.adapter is not None:
                adapters.add(head.adapter)
            budget -= (chunk := self._prefill(head, budget, emitted))
            prefill += chunk
        for entry in skipped:
            heapq.heappush(self._waiting, entry)
        kv_tokens = sum(s.computed for s in self._running)
        duration = self.profile.step_time(prefill, decodes, kv_tokens)
        if self.lora is not None and adapters:
            duration += self.lora.prepare(adapters)
        limit = self._token_limit
        for seq in emitted:
            seq.generated += 1
            self.outstanding_tokens -= 1
            if seq.generated >= seq.max_tokens or seq.prompt_len + seq.generated >= limit:
                self._running.remove(seq)
                self._release(seq)
                self._finish(seq, "length")
        self.clock_s += duration
        return SimStepResult(duration, emitted, prefill, decodes)

    def stats(self) -> EngineStats:
        usage = self._kv.used / self._kv.total
        return EngineStats(
            running=len(self._running),
            waiting=self._n_waiting,
            kv_cache_usage=usage,
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            adapters=self.lora.loaded if self.lora is not None else (),
        )

    @property
    def prefill_tokens_per_s(self) -> float:
        """The modelled prefill rate: tokens of a full chunk per second of its compute."""
        chunk = self.profile.max_num_batched_tokens
        return chunk / self.profile.compute_time(chunk)

    # -- KV blocks and scheduling ---------------------------------------------------------

    def _push_waiting(self, seq: SimSequence) -> None:
        seq.state = "waiting"
        heapq.heappush(self._waiting, (seq.priority, seq.order, seq))
        self._n_waiting += 1

    def _peek_waiting(self) -> SimSequence | None:
        while self._waiting and self._waiting[0][2].state != "waiting":
            heapq.heappop(self._waiting)  # aborted while waiting
        return self._waiting[0][2] if self._waiting else None

    def _admit(self, seq: SimSequence) -> bool:
        """Take the head of the waiting queue if KV blocks for its prompt + 1 token fit."""
        private = self._kv.blocks_for(seq.target + 1) - len(seq.hashes)
        hits = min(self._kv.cached_blocks(seq.hashes), (seq.target - 1) // self._bs)
        if not self._kv.hold(seq.hashes, private):
            return False
        heapq.heappop(self._waiting)
        self._n_waiting -= 1
        seq.private_blocks = private
        seq.computed = hits * self._bs  # the last prompt token is always computed
        if seq.preemptions == 0:
            seq.cached_tokens = seq.computed
        self.outstanding_tokens -= seq.computed
        seq.state = "running"
        bisect.insort(self._running, seq, key=_rank)
        return True

    def _prefill(self, seq: SimSequence, budget: int, emitted: list[SimSequence]) -> int:
        chunk = min(seq.target - seq.computed, budget)
        before = seq.computed // self._bs
        seq.computed += chunk
        self._kv.computed(seq.hashes[before : seq.computed // self._bs])
        self.outstanding_tokens -= chunk
        if seq.computed == seq.target:
            emitted.append(seq)
        return chunk

    def _grow(self, seq: SimSequence, tokens: int) -> bool:
        """Hold blocks for ``tokens`` tokens, preempting others (or ``seq``) when out of KV."""
        need = self._kv.blocks_for(tokens) - len(seq.hashes) - seq.private_blocks
        while need > 0 and not self._kv.grow(need):
            victim = self._running[-1]  # lowest priority, latest arrival
            self._preempt(victim)
            if victim is seq:
                return False
        seq.private_blocks += max(need, 0)
        return True

    def _preempt(self, seq: SimSequence) -> None:
        """Free a running sequence's KV; it waits again and recomputes prompt + output."""
        self._running.remove(seq)
        self._release(seq)
        self.outstanding_tokens -= seq.remaining()
        seq.computed = 0
        seq.target = seq.prompt_len + seq.generated
        seq.preemptions += 1
        self.outstanding_tokens += seq.remaining()
        self._push_waiting(seq)

    def _release(self, seq: SimSequence) -> None:
        self._kv.release(seq.hashes, seq.private_blocks)
        seq.private_blocks = 0

    def _finish(self, seq: SimSequence, reason: str) -> None:
        self.outstanding_tokens -= seq.remaining()
        seq.state = "done"
        seq.finish_reason = reason
        self._seqs.pop(seq.request_id, None)

"""SIMULATION: one GPU replica behind the `EngineClient` port, in wall-clock time, no model.

`SimulatedGpuEngine` implements the `EngineClient` port without weights, tokenizer or GPU. It is
for capacity planning, load tests of the queue path and many-replica experiments in one
process; it is never the default engine for serving, and its text is placeholder tokens.

Scheduling, step times, prefix caching and LoRA limits are `workers.engine.sim_replica`'s
(`SimReplica`, whose synchronous `submit` and `step` a discrete-event driver such as
`llmq.bench.simulate` runs in virtual time). Here one asyncio task per engine steps while there
is work, sleeping each step's duration / ``time_scale`` (simulated seconds per wall second).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import structlog

from schemas.messages import InferenceJob
from workers.engine.port import EngineStep
from workers.engine.sim_lora import LoraTimings
from workers.engine.sim_model import (
    H100_SXM,
    H200,
    LLAMA_8B,
    LLAMA_70B,
    GpuProfile,
    ModelProfile,
    ReplicaProfile,
)
from workers.engine.sim_replica import SimReplica, SimSequence, SimStepResult, StepMailbox
from workers.engine.vllm_engine import TIER_PRIORITY, openai_finish_reason

__all__ = [
    "H100_SXM", "H200", "LLAMA_8B", "LLAMA_70B", "GpuProfile", "ModelProfile", "ReplicaProfile",
    "SimSequence", "SimStepResult", "SimulatedGpuEngine",
]  # fmt: skip

log = structlog.get_logger()

PLACEHOLDER_TOKEN = "tok "


class SimulatedGpuEngine(SimReplica):
    """SIMULATION of one GPU replica behind `EngineClient` (see the module docstring)."""

    def __init__(
        self,
        profile: ReplicaProfile | None = None,
        *,
        max_num_seqs: int = 256,
        max_model_len: int = 8192,
        time_scale: float = 1.0,
        name: str = "sim-0",
        max_loras: int = 0,
        max_cpu_loras: int | None = None,
        lora_timings: LoraTimings | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        super().__init__(
            profile, max_num_seqs=max_num_seqs, max_model_len=max_model_len, name=name,
            max_loras=max_loras, max_cpu_loras=max_cpu_loras, lora_timings=lora_timings,
        )  # fmt: skip
        self.time_scale = time_scale
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def submit(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        priority: int = 0,
        salt: object = None,
        adapter: str | None = None,
    ) -> SimSequence:
        seq = super().submit(request_id, prompt_token_ids, max_tokens, priority, salt, adapter)
        self._wake.set()
        return seq

    @property
    def prefill_tokens_per_s(self) -> float:
        """The modelled prefill rate in wall-clock time."""
        return super().prefill_tokens_per_s * self.time_scale

    async def start(self) -> None:
        """Start the step loop (there is no model to load)."""
        if self._task is None:
            log.info(
                "engine_started",
                engine="simulated",
                model=self.profile.model.name,
                gpu=self.profile.gpu.name,
                tensor_parallel=self.profile.tensor_parallel,
                kv_capacity_tokens=self.kv_capacity_tokens,
            )
            self._wake = asyncio.Event()
            self._wake.set()
            self._task = asyncio.create_task(self._loop(), name=f"sim-engine-{self.name}")

    def generate(self, job: InferenceJob) -> AsyncIterator[EngineStep]:
        """Stream one job: one placeholder token per step; closing the iterator aborts it."""
        adapter = job.adapter.id if job.adapter is not None else None
        salt = (adapter, job.cache_salt)  # as in vLLM: both are part of the block hash
        priority = TIER_PRIORITY.get(job.tier, 0)
        return self.stream(
            job.request_id, job.prompt_token_ids, job.sampling.max_tokens, priority, salt, adapter
        )

    async def stream(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        priority: int = 0,
        salt: object = None,
        adapter: str | None = None,
    ) -> AsyncGenerator[EngineStep, None]:
        """`generate`'s stream (also for a queue-less server over this engine); closing it
        aborts the request."""
        if self._task is None:
            raise RuntimeError("engine not started")
        seq = self.submit(request_id, prompt_token_ids, max_tokens, priority, salt, adapter)
        mailbox = seq.mailbox = StepMailbox()
        finished = False
        try:
            while not finished:
                step = await mailbox.get()
                finished = step.finished
                yield step
        finally:
            if not finished and seq.state != "done":
                self.abort_request(seq.request_id)

    async def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with a final, finished step (as vLLM's does)."""
        seq = self.abort_request(request_id)
        if seq is not None and seq.mailbox is not None:
            seq.mailbox.put(self._event(seq, 0))

    async def shutdown(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for request_id in list(self._seqs):
            await self.abort(request_id)

    def _event(self, seq: SimSequence, tokens: int) -> EngineStep:
        done = seq.state == "done"
        reason = openai_finish_reason(seq.finish_reason) if done else None
        return EngineStep(
            PLACEHOLDER_TOKEN * tokens, tokens, seq.prompt_len, seq.cached_tokens, done, reason
        )

    async def _loop(self) -> None:
        """Step while there is work, sleeping each step's duration / time_scale (wall time)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.has_work:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
            result = self.step()
            wall = result.duration_s / self.time_scale
            deadline += wall
            delay = deadline - loop.time()
            await asyncio.sleep(max(delay, 0.0))
            if delay < -wall:
                deadline = loop.time()  # far behind: stop catching up
            for seq in result.emitted:
                mailbox = seq.mailbox
                if mailbox is None or seq.finish_reason == "abort":
                    continue
                if seq.state == "done":
                    mailbox.put(self._event(seq, 1))
                else:
                    mailbox.token = mailbox.token or self._event(seq, 1)
                    mailbox.put(mailbox.token)

"""`EngineClient` on vLLM's in-process ``AsyncLLM`` (the only module that imports vllm).

One request per `InferenceJob`: token-id prompts, streamed as deltas, priority by tier, prefix
caching on. Load comes from a custom stat logger that vLLM feeds ``SchedulerStats`` after every
engine step; since nothing is recorded while the engine is idle, the adapter also counts the
requests it has in flight and never reports more running or waiting requests than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import structlog

from schemas.chat import ChatCompletionTokenLogprob, TopLogprob
from schemas.messages import AdapterRef, InferenceJob, SamplingSettings
from workers.engine.port import AdapterLoadError, EngineRequestError, EngineStats, EngineStep
from workers.engine.prefill_rate import PrefillRate

log = structlog.get_logger()

TIER_PRIORITY = {"interactive": 0, "batch": 10}
"""vLLM runs lower priority values first."""

STRUCTURED_OUTPUT_BACKEND: Final = "xgrammar"
"""Compact JSON (no free whitespace) needs an explicit backend: "auto" rejects the flag."""

_FINISH_REASONS = {"stop": "stop", "length": "length"}


LOGPROB_FLOOR: Final = -9999.0
"""What a log probability of minus infinity is reported as (JSON has no infinity; vLLM's
own server reports the same)."""


def _candidate(logprob: Any) -> TopLogprob:
    token = str(logprob.decoded_token or "")
    return TopLogprob(
        token=token,
        logprob=max(float(logprob.logprob), LOGPROB_FLOOR),
        bytes=list(token.encode("utf-8")),
    )


def token_logprobs(
    token_ids: Sequence[int], positions: Any, top: int | None
) -> tuple[ChatCompletionTokenLogprob, ...] | None:
    """OpenAI's per-token log probabilities from vLLM's: one `{token id: Logprob}` mapping per
    generated token, holding the chosen token and the `top` most likely ones."""
    if top is None or positions is None:
        return None
    out = []
    for token_id, position in zip(token_ids, positions, strict=False):
        chosen = _candidate(position[token_id])
        ranked = sorted(position.values(), key=lambda p: p.rank if p.rank is not None else 1 << 30)
        out.append(
            ChatCompletionTokenLogprob(
                **chosen.model_dump(), top_logprobs=[_candidate(p) for p in ranked[:top]]
            )
        )
    return tuple(out)


def _first_line(exc: BaseException) -> str:
    """An exception's first line, at most 300 characters (engine errors can be pages)."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


@dataclass(frozen=True)
class LoraSettings:
    """The engine's LoRA limits (the worker's `max_lora_rank`, `max_loras`, ...)."""

    max_lora_rank: int
    max_loras: int
    max_cpu_loras: int | None = None


class AdapterFolderSource(Protocol):
    async def folder(self, adapter: AdapterRef) -> Path:
        """The adapter's verified local folder."""
        ...


def openai_finish_reason(reason: str | None) -> str:
    """Map vLLM's finish reason (stop, length, abort, error, repetition) to OpenAI's."""
    return _FINISH_REASONS.get(str(reason), "stop")


@dataclass
class _Load:
    """The last ``SchedulerStats`` the engine reported."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefill: PrefillRate = field(default_factory=PrefillRate)
    """Prompt tokens per second of the engine's own prefill steps."""


def _stat_logger_factory(load: _Load) -> Any:
    """A per-engine ``StatLoggerBase`` factory whose loggers write into ``load``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class LoadStatLogger(StatLoggerBase):  # type: ignore[misc,unused-ignore]
        """Keeps the scheduler's running/waiting counts and KV usage."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            prompt_tokens = int(getattr(iteration_stats, "num_prompt_tokens", 0) or 0)
            load.prefill.stepped(time.monotonic(), prompt_tokens)
            if scheduler_stats is None:
                return
            load.running = int(scheduler_stats.num_running_reqs)
            load.waiting = int(scheduler_stats.num_waiting_reqs) + int(
                getattr(scheduler_stats, "num_skipped_waiting_reqs", 0)
            )
            load.kv_cache_usage = float(scheduler_stats.kv_cache_usage)

        def log_engine_initialized(self) -> None:
            pass

    return LoadStatLogger


class VllmEngine:
    """vLLM ``AsyncLLM`` behind the `EngineClient` port."""

    def __init__(
        self,
        model_path: str,
        served_name: str,
        *,
        max_num_seqs: int,
        max_model_len: int,
        dtype: str = "bfloat16",
        kv_cache_bytes: int | None = None,
        enforce_eager: bool = True,
        lora: LoraSettings | None = None,
        adapter_folders: AdapterFolderSource | None = None,
    ) -> None:
        self.model_path = model_path
        self.served_name = served_name
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.kv_capacity_tokens = 0
        self.dtype = dtype
        self.kv_cache_bytes = kv_cache_bytes
        self.enforce_eager = enforce_eager
        self.lora = lora
        self._adapter_folders = adapter_folders
        self._adapter_ids: dict[str, int] = {}
        """Adapter digest -> its id in the engine (vLLM's lora_int_id), once loaded."""
        self._adapter_locks: dict[str, asyncio.Lock] = {}
        self._next_adapter_id = 0
        self._adapter_names: dict[str, str] = {}
        """Adapter digest -> its `team/name`, once loaded."""
        self._llm: Any = None
        self._load = _Load()
        self._in_flight: Counter[str] = Counter()

    async def start(self) -> None:
        """Start the engine process and load the model (off the event loop)."""
        if self._llm is not None:
            return
        from vllm import AsyncEngineArgs
        from vllm.config import StructuredOutputsConfig
        from vllm.v1.engine.async_llm import AsyncLLM

        options: dict[str, Any] = {
            "model": self.model_path,
            "served_model_name": [self.served_name],
            "dtype": self.dtype,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "enforce_eager": self.enforce_eager,
            "enable_prefix_caching": True,
            "scheduling_policy": "priority",
            "disable_log_stats": True,  # no periodic log lines; our stat logger still runs
            "structured_outputs_config": StructuredOutputsConfig(
                backend=STRUCTURED_OUTPUT_BACKEND, disable_any_whitespace=True
            ),
        }
        if self.lora is not None:
            options.update(
                enable_lora=True,
                max_lora_rank=self.lora.max_lora_rank,
                max_loras=self.lora.max_loras,
                max_cpu_loras=self.lora.max_cpu_loras or self.lora.max_loras,
            )
        from vllm.platforms import current_platform

        if self.kv_cache_bytes is not None and current_platform.is_cpu():
            options["kv_cache_memory_bytes"] = self.kv_cache_bytes  # GPUs size it themselves
            # vLLM's legacy whole-GiB variable would override the exact size.
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        args = AsyncEngineArgs(**options)
        started = time.monotonic()
        factory = _stat_logger_factory(self._load)
        self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=[factory])
        # Built off the loop, the engine's output task would start only with the first
        # request; start it now (as vLLM does when built on a loop) so failures surface early.
        if hasattr(self._llm, "_run_output_handler"):
            self._llm._run_output_handler()
        cache = self._llm.vllm_config.cache_config
        self.kv_capacity_tokens = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
        log.info(
            "engine_started",
            kv_capacity_tokens=self.kv_capacity_tokens,
            model=self.served_name,
            seconds=round(time.monotonic() - started, 2),
        )

    def _sampling_params(self, sampling: SamplingSettings) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = None
        if sampling.json_schema is not None:
            structured = StructuredOutputsParams(json=sampling.json_schema)
        elif sampling.json_object:
            structured = StructuredOutputsParams(json_object=True)
        elif sampling.regex is not None:
            structured = StructuredOutputsParams(regex=sampling.regex)
        elif sampling.choice is not None:
            structured = StructuredOutputsParams(choice=list(sampling.choice))
        elif sampling.grammar is not None:
            structured = StructuredOutputsParams(grammar=sampling.grammar)
        return SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            frequency_penalty=sampling.frequency_penalty,
            presence_penalty=sampling.presence_penalty,
            stop=list(sampling.stop) or None,
            seed=sampling.seed,
            structured_outputs=structured,
            output_kind=RequestOutputKind.DELTA,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            min_tokens=sampling.min_tokens,
            ignore_eos=sampling.ignore_eos,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            skip_special_tokens=sampling.skip_special_tokens,
            spaces_between_special_tokens=sampling.spaces_between_special_tokens,
            logit_bias=dict(sampling.logit_bias) if sampling.logit_bias else None,
            logprobs=sampling.logprobs,
            n=sampling.n,
        )

    async def generate(self, job: InferenceJob) -> AsyncIterator[EngineStep]:
        """Stream one job; closing or cancelling the iterator aborts the request."""
        if self._llm is None:
            raise RuntimeError("engine not started")
        from vllm import TokensPrompt
        from vllm.exceptions import VLLMClientError

        try:
            params = self._sampling_params(job.sampling)
        except (VLLMClientError, ValueError) as exc:  # building them only validates values
            raise EngineRequestError(str(exc)) from exc
        lora_request = await self._lora_request(job) if job.adapter is not None else None
        prompt = TokensPrompt(prompt_token_ids=list(job.prompt_token_ids))
        if job.cache_salt is not None:
            prompt["cache_salt"] = job.cache_salt  # only same-salt requests share cached blocks
        request_id = job.request_id
        self._load.prefill.submitted(time.monotonic(), idle=self._in_flight.total() == 0)
        self._in_flight[request_id] += 1
        finished = False
        stream: AsyncGenerator[Any, None] = self._llm.generate(
            prompt,
            params,
            request_id,
            priority=TIER_PRIORITY.get(job.tier, 0),
            lora_request=lora_request,
        )
        try:
            async for output in stream:
                finished = bool(output.finished)
                last = len(output.outputs) - 1
                for i, completion in enumerate(output.outputs):  # one per choice that moved
                    ended = completion.finish_reason is not None or (finished and i == last)
                    yield EngineStep(
                        text=completion.text,
                        num_new_tokens=len(completion.token_ids),
                        prompt_tokens=len(output.prompt_token_ids or job.prompt_token_ids),
                        cached_tokens=int(output.num_cached_tokens or 0),
                        finished=finished and i == last,
                        finish_reason=(
                            openai_finish_reason(completion.finish_reason) if ended else None
                        ),
                        logprobs=token_logprobs(
                            completion.token_ids, completion.logprobs, job.sampling.logprobs
                        ),
                        index=int(completion.index),
                    )
                if finished:
                    break
        except VLLMClientError as exc:
            raise EngineRequestError(str(exc)) from exc
        finally:
            self._in_flight[request_id] -= 1
            if self._in_flight[request_id] <= 0:
                del self._in_flight[request_id]
            await stream.aclose()  # vLLM aborts the request if it is still running
            if not finished and request_id not in self._in_flight:
                await self._abort_quietly(request_id)  # by id, in case it never started

    async def _lora_request(self, job: InferenceJob) -> Any:
        """vLLM's `LoRARequest` for the job's adapter, loaded into the engine on first use
        (fetched and verified first); `AdapterLoadError` when that fails. The engine keeps
        its least recently used adapters in host memory and reloads evicted ones from the
        verified folder on disk."""
        from vllm.lora.request import LoRARequest

        adapter = job.adapter
        assert adapter is not None
        if self.lora is None or self._adapter_folders is None:
            raise AdapterLoadError(
                f"adapter {adapter.id!r}: this worker runs without LoRA (max_lora_rank 0)"
            )
        if adapter.rank > self.lora.max_lora_rank:
            raise AdapterLoadError(
                f"adapter {adapter.id!r} has rank {adapter.rank}, above this worker's "
                f"max_lora_rank of {self.lora.max_lora_rank}"
            )
        sha256 = adapter.sha256
        try:
            folder = await self._adapter_folders.folder(adapter)
        except Exception as exc:
            raise AdapterLoadError(f"adapter {adapter.id!r} could not be fetched: {exc}") from exc
        name = f"{adapter.id}@{sha256[:12]}"
        known = self._adapter_ids.get(sha256)
        if known is not None:
            return LoRARequest(name, known, str(folder))
        lock = self._adapter_locks.setdefault(sha256, asyncio.Lock())
        async with lock:
            if sha256 in self._adapter_ids:
                return LoRARequest(name, self._adapter_ids[sha256], str(folder))
            self._next_adapter_id += 1  # never reused: a failed id may linger in the engine
            request = LoRARequest(name, self._next_adapter_id, str(folder))
            started = time.monotonic()
            try:
                # Loaded ahead of any request: vLLM checks an adapter's tensors against the
                # model only when it activates them, and a request that activates a bad
                # adapter kills the whole engine; a failed add_lora fails only this call.
                await self._llm.add_lora(request)
            except Exception as exc:
                log.warning("adapter_load_failed", adapter=adapter.id, sha256=sha256[:12])
                with contextlib.suppress(Exception):  # else it may hold one of max_loras
                    await self._llm.remove_lora(request.lora_int_id)
                raise AdapterLoadError(
                    f"adapter {adapter.id!r} could not be loaded: {_first_line(exc)}"
                ) from exc
            self._adapter_ids[sha256] = request.lora_int_id
            self._adapter_names[sha256] = adapter.id
            log.info(
                "adapter_loaded",
                adapter=adapter.id,
                sha256=sha256[:12],
                seconds=round(time.monotonic() - started, 3),
            )
            return request

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await self._llm.abort(request_id)
        except Exception as exc:  # the engine may be shutting down
            log.warning("engine_abort_failed", request_id=request_id, error=repr(exc))

    async def abort(self, request_id: str) -> None:
        """Stop a running request; its stream ends with a final, finished step."""
        if self._llm is not None:
            await self._llm.abort(request_id)

    def stats(self) -> EngineStats:
        """Scheduler load, bounded by the requests this adapter has in flight."""
        in_flight = self._in_flight.total()
        adapters = tuple(sorted(set(self._adapter_names.values())))
        if in_flight == 0:
            return EngineStats(
                prefill_tokens_per_s=self._load.prefill.tokens_per_s(), adapters=adapters
            )
        running = min(self._load.running, in_flight)
        waiting = min(self._load.waiting, in_flight - running)
        return EngineStats(
            running=running,
            waiting=waiting,
            kv_cache_usage=self._load.kv_cache_usage,
            prefill_tokens_per_s=self._load.prefill.tokens_per_s(),
            adapters=adapters,
        )

    async def shutdown(self) -> None:
        """Stop the engine core process and release its resources."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        handler = getattr(llm, "output_handler", None)
        if handler is not None:  # else it logs EngineDeadError while the core stops
            handler.cancel()
        await asyncio.to_thread(llm.shutdown)
        del llm
        gc.collect()  # else AsyncLLM.__del__ may run at interpreter exit and log a TypeError
        self._in_flight.clear()
        log.info("engine_stopped", model=self.served_name)

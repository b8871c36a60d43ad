"""Shadow evaluation: real prompts read back from the job topics, answered by a candidate
version and the stable one without answering anyone, and scored for agreement.

No other serving stack can do this without mirroring live traffic: in llmq every request
already is a message on a retained topic. The prompts (token ids) are sampled from a time
range, kept in memory only for the run, and never logged; only the scores are kept, as an
`EvalResult` of kind `shadow`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from llmq.evaluation import GatewayAnswers, agreement, verdict
from llmq.replay import RangeReader
from schemas.messages import InferenceJob
from schemas.rollout import EvalResult

SHADOW_METRICS = ("exact_match", "token_overlap")
"""What a shadow run can score: answers have no kind, so no JSON or refusal checks."""


@dataclass(frozen=True)
class ShadowPrompt:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


async def sample_prompts(
    open_reader: Callable[[], AbstractAsyncContextManager[RangeReader]],
    topics: Sequence[str],
    name: str,
    since: float,
    limit: int,
    max_tokens: int,
    seed: int = 0,
) -> tuple[list[ShadowPrompt], int]:
    """Up to `limit` prompts of deployment `name` produced since `since` (a uniform sample,
    reservoir-style, so memory stays bounded), and how many matched in all. A job retried
    under the same request id counts once."""
    rng = random.Random(seed)
    chosen: list[ShadowPrompt] = []
    seen: set[str] = set()
    for topic in topics:
        async with open_reader() as reader:
            if await reader.partitions(topic) is None:
                continue
            await reader.open(topic, since=since)
            async for _topic, _partition, _offset, _ts, value in reader.records():
                try:
                    job = InferenceJob.model_validate_json(value)
                except ValueError:
                    continue
                if job.model != name or job.request_id in seen:
                    continue
                seen.add(job.request_id)
                prompt = ShadowPrompt(
                    job.prompt_token_ids, max(1, min(job.sampling.max_tokens, max_tokens))
                )
                if len(chosen) < limit:
                    chosen.append(prompt)
                else:
                    slot = rng.randrange(len(seen))
                    if slot < limit:
                        chosen[slot] = prompt
    return chosen, len(seen)


async def run_shadow(
    prompts: Sequence[ShadowPrompt],
    answers: GatewayAnswers,
    name: str,
    candidate: str,
    reference: str,
    thresholds: dict[str, float],
    concurrency: int = 4,
) -> EvalResult:
    """Answer every prompt greedily on both versions (pinned) and score their agreement."""
    gate = asyncio.Semaphore(concurrency)

    async def one(version: str, prompt: ShadowPrompt) -> str:
        async with gate:
            return await answers.complete(
                f"{name}@{version}", prompt.prompt_token_ids, prompt.max_tokens
            )

    ours = await asyncio.gather(*(one(candidate, p) for p in prompts))
    theirs = await asyncio.gather(*(one(reference, p) for p in prompts))
    scores = agreement(ours, theirs)
    kept = {k: v for k, v in thresholds.items() if k in SHADOW_METRICS}
    return EvalResult(
        kind="shadow",
        suite="shadow",
        reference=reference,
        passed=bool(prompts) and verdict(scores, kept),
        scores={k: round(v, 4) for k, v in scores.items()},
        thresholds=kept,
        prompts=len(prompts),
        ran_at=time.time(),
    )

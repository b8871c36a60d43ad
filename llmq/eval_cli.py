"""`llmq eval NAME@VERSION`: run the evaluation suite (or shadow traffic) on a version against
the stable one, print the scores against the thresholds, and record the result in the
registry, where a passing one opens the eval gate for a change of numerics.

Inference goes through the gateway with a team key (pinned versions, greedy); the result is
recorded with the admin key. Exit code 0 when the version passed, 1 when it did not, 2 when
the evaluation could not run.
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from llmq.cli_options import DEFAULT_BASE_URL, BaseUrlOption
from llmq.deployments_cli import DEFAULT_ADMIN_KEY, AdminKeyOption, act, make_client, show
from llmq.evaluation import GatewayAnswers, load_suite, run_suite
from llmq.shadow import run_shadow, sample_prompts
from schemas.registry import split_model
from schemas.rollout import EvalResult
from topics.catalog import job_topic

DEFAULT_SUITE = Path(__file__).resolve().parent.parent / "evals" / "default.toml"
DEFAULT_TEAM_KEY = "sk-llmq-dev"
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(value: str, now: float | None = None) -> float:
    """Unix seconds from `30m`, `2h`, `1d` (ago) or an ISO 8601 time."""
    relative = _RELATIVE.match(value.strip())
    if relative:
        ago = float(relative.group(1)) * _UNIT_S[relative.group(2)]
        return (time.time() if now is None else now) - ago
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError as exc:
        raise typer.BadParameter(f"{value!r}: use 30m, 2h, 1d or an ISO 8601 time") from exc


def format_scores(result: EvalResult) -> list[str]:
    lines = [f"{'SCORE':<28}{'VALUE':>8}  {'NEEDS':>8}"]
    for metric, value in sorted(result.scores.items()):
        bound = result.thresholds.get(metric)
        if bound is None:
            lines.append(f"{metric:<28}{value:>8.3f}")
        else:
            mark = "ok" if value >= bound else "FAIL"
            lines.append(f"{metric:<28}{value:>8.3f}  >= {bound:>5.2f}  {mark}")
    verdict = "PASSED" if result.passed else "FAILED"
    what = "shadow traffic" if result.kind == "shadow" else f"suite {result.suite}"
    lines.append(f"{verdict}: {what}, {result.prompts} prompts, against version {result.reference}")
    return lines


async def _evaluate(
    name: str,
    candidate: str,
    reference: str,
    deployment: dict[str, Any],
    *,
    base_url: str,
    api_key: str,
    suite_path: Path,
    shadow_since: float | None,
    limit: int,
    bootstrap: str,
) -> EvalResult:
    suite = load_suite(suite_path)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=300) as c:
        answers = GatewayAnswers(c, suite.max_tokens)
        if shadow_since is None:
            return await run_suite(suite, answers.chat, name, candidate, reference)
        from topics.kafka_replay import KafkaTopicReader

        pool = next(v["pool"] for v in deployment["versions"] if v["version"] == reference)
        prompts, matched = await sample_prompts(
            lambda: KafkaTopicReader(bootstrap, client_id="llmq-eval-shadow"),
            [job_topic(pool, "interactive")],
            name,
            shadow_since,
            limit,
            suite.max_tokens,
        )
        typer.echo(f"shadow: {len(prompts)} of the {matched} prompts of {name} in that range")
        return await run_shadow(prompts, answers, name, candidate, reference, suite.thresholds)


def eval_command(
    model: Annotated[str, typer.Argument(help="The version to evaluate: NAME@VERSION.")],
    reference: Annotated[
        str | None, typer.Option(help="The version to compare with (default: the stable one).")
    ] = None,
    suite: Annotated[Path, typer.Option(help="The suite file (prompts, thresholds).")] = (
        DEFAULT_SUITE
    ),
    shadow: Annotated[
        bool, typer.Option(help="Score agreement on real prompts read back from job topics.")
    ] = False,
    since: Annotated[
        str, typer.Option(help="With --shadow: prompts since 30m, 2h, 1d or an ISO time.")
    ] = "1h",
    limit: Annotated[int, typer.Option(min=1, help="With --shadow: most prompts used.")] = 50,
    record: Annotated[
        bool, typer.Option(help="Record the result in the registry (opens the eval gate).")
    ] = True,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    api_key: Annotated[
        str, typer.Option("--api-key", envvar="LLMQ_API_KEY", help="Team key for inference.")
    ] = DEFAULT_TEAM_KEY,
    admin_key: AdminKeyOption = DEFAULT_ADMIN_KEY,
    bootstrap: Annotated[str, typer.Option(envvar="LLMQ_KAFKA_BOOTSTRAP")] = "127.0.0.1:9092",
) -> None:
    """Evaluate NAME@VERSION against the stable version: exact-match rate and word overlap
    of greedy answers, JSON validity and refusal rate (the suite), or agreement on real
    traffic (--shadow). Exit code 0: passed; 1: failed; 2: could not run."""
    name, candidate = split_model(model)
    if candidate is None:
        raise typer.BadParameter("name the version: NAME@VERSION", param_hint="MODEL")
    shadow_since = parse_since(since) if shadow else None
    try:
        with make_client(base_url, admin_key) as admin:
            deployment = show(admin, name)
            against = reference or deployment["traffic"]["stable"]
            if against == candidate:
                raise typer.BadParameter(f"{model} is the stable version: pass --reference")
            result = asyncio.run(
                _evaluate(
                    name, candidate, against, deployment, base_url=base_url, api_key=api_key,
                    suite_path=suite, shadow_since=shadow_since, limit=limit,
                    bootstrap=bootstrap,
                )
            )  # fmt: skip
            typer.echo("\n".join(format_scores(result)))
            if record:
                body = {"version": candidate, "result": result.model_dump(mode="json")}
                act(admin, name, "evaluations", body)
                typer.echo(f"recorded in the registry for {model}")
    except typer.BadParameter:
        raise
    except Exception as exc:  # the stack away, a version not serving: one line, exit 2
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    raise typer.Exit(0 if result.passed else 1)

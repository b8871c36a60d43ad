"""The `llmq` command: run the processes, manage topics, the local stack, models, benchmarks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from llmq.bench.commands import bench_app
from llmq.cli_options import DEFAULT_BASE_URL, BaseUrlOption
from llmq.deployments_cli import deployments_app
from llmq.eval_cli import eval_command
from llmq.k8s_cli import k8s_app
from llmq.plan_cli import plan_command
from llmq.weights_cli import weights_app

app = typer.Typer(help="llmq: a queue-centric, OpenAI-compatible LLM inference platform.")
topics_app = typer.Typer(help="Kafka topics.")
dev_app = typer.Typer(help="The local stack (broker, Redis, S3, gateway, one worker).")
model_app = typer.Typer(help="Model folders for the local stack and tests.")
batch_app = typer.Typer(help="Batches through the OpenAI Batch API: submit, watch, cancel.")
app.add_typer(topics_app, name="topics")
app.add_typer(dev_app, name="dev")
app.add_typer(model_app, name="model")
app.add_typer(bench_app, name="bench")
app.add_typer(batch_app, name="batch")
app.add_typer(deployments_app, name="deployments")
app.add_typer(weights_app, name="weights")
app.add_typer(k8s_app, name="k8s")
app.command("eval")(eval_command)
app.command("plan")(plan_command)

ApiKeyOption = Annotated[
    str,
    typer.Option("--api-key", envvar=["LLMQ_API_KEY", "OPENAI_API_KEY"], help="llmq API key."),
]
IntervalOption = Annotated[
    float, typer.Option("--interval", min=0.0, help="Seconds between status polls.")
]
OutputOption = Annotated[
    Path | None,
    typer.Option("--output", dir_okay=False, help="Download the output file (results) here."),
]
ErrorsOption = Annotated[
    Path | None,
    typer.Option("--errors", dir_okay=False, help="Download the error file (failed lines) here."),
]

DEFAULT_API_KEY = "sk-llmq-dev"


@app.command()
def gateway() -> None:
    """Run the gateway (configured by LLMQ_* environment variables)."""
    from gateway.app import create_app
    from gateway.server import serve
    from gateway.settings import GatewaySettings
    from llmq.logging import configure_logging

    settings = GatewaySettings()
    configure_logging(settings.log_json, settings.log_level)
    serve(create_app(settings), settings)


@app.command()
def worker() -> None:
    """Run one worker: a vLLM engine replica pulling its pool's jobs."""
    from llmq.engine_env import reexec_with_engine_env
    from llmq.logging import configure_logging
    from workers.main import run_worker
    from workers.settings import WorkerSettings

    settings = WorkerSettings()
    if settings.engine == "vllm":
        reexec_with_engine_env(settings.kv_cache_gib)
    configure_logging(settings.log_json, settings.log_level)
    run_worker(settings)


@app.command()
def controller() -> None:
    """Run the pool controller: each deployment version's replicas as local worker processes,
    following the registry (what `llmq dev up` runs)."""
    from llmq.controller import ControllerSettings, serve
    from llmq.logging import configure_logging

    settings = ControllerSettings()
    configure_logging(settings.log_json)
    asyncio.run(serve(settings))


@topics_app.command("ensure")
def topics_ensure(
    pool: Annotated[list[str], typer.Option(help="Pools whose job topics to create.")],
    bootstrap: Annotated[str, typer.Option(envvar="LLMQ_KAFKA_BOOTSTRAP")] = "127.0.0.1:9092",
    partitions: Annotated[int, typer.Option(help="Partitions per topic.")] = 8,
) -> None:
    """Create every topic the given pools need (safe to run again)."""
    from topics.kafka import ensure_topics

    created = asyncio.run(ensure_topics(bootstrap, pool, partitions))
    typer.echo(f"created {len(created)} topics" + (f": {', '.join(created)}" if created else ""))


@topics_app.command("asyncapi")
def topics_asyncapi(
    out: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
) -> None:
    """Every topic and Redis channel as an AsyncAPI 3 document (docs/asyncapi.yaml)."""
    from llmq.asyncapi import render

    if out is None:
        typer.echo(render(), nl=False)
    else:
        out.write_text(render())


@dev_app.command("up")
def dev_up(
    detach: Annotated[bool, typer.Option(help="Return once ready; leave it running.")] = False,
    engine: Annotated[
        str | None,
        typer.Option(
            help="vllm (the real model on the CPU) or simulated (SIMULATED GPU replicas with "
            "placeholder text, for load tests); default LLMQ_DEV_ENGINE or vllm."
        ),
    ] = None,
) -> None:
    """Start the local stack and serve the API on 127.0.0.1:8000."""
    from llmq.devstack import DevStackSettings, up
    from llmq.logging import configure_logging

    configure_logging(json=False)
    settings = DevStackSettings() if engine is None else DevStackSettings(engine=engine)
    up(settings, detach=detach)


@dev_app.command("down")
def dev_down() -> None:
    """Stop a detached local stack."""
    from llmq.devstack import down

    down()


@dev_app.command("status")
def dev_status() -> None:
    """One line per part of the local stack."""
    from llmq.devstack import status

    raise typer.Exit(status())


@model_app.command("build")
def model_build(name: str) -> None:
    """Build a model folder (`smollm2-135m-instruct` or `tiny-llama`) if missing; print its path."""
    from llmq.logging import configure_logging
    from llmq.modelbuild import ensure_model

    configure_logging(json=False)
    typer.echo(str(ensure_model(name)))


@batch_app.command("serve")
def batch_serve() -> None:
    """Run the batch service: validates and fans out batches, collects their results."""
    from batch.service import run_batch_service
    from batch.settings import BatchSettings
    from llmq.logging import configure_logging

    settings = BatchSettings()
    configure_logging(settings.log_json)
    run_batch_service(settings)


@batch_app.command("submit")
def batch_submit(
    file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="JSONL requests.")
    ],
    model: Annotated[
        str | None, typer.Option(help="Set body.model on every line before uploading.")
    ] = None,
    endpoint: Annotated[str, typer.Option(help="Endpoint every line calls.")] = (
        "/v1/chat/completions"
    ),
    window: Annotated[str, typer.Option(help="Completion window.")] = "24h",
    metadata: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE metadata (repeatable).")
    ] = None,
    watch: Annotated[bool, typer.Option(help="Follow the batch like `llmq batch watch`.")] = False,
    interval: IntervalOption = 1.0,
    output: OutputOption = None,
    errors: ErrorsOption = None,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    api_key: ApiKeyOption = DEFAULT_API_KEY,
) -> None:
    """Upload a JSONL file, create a batch on it, print its id (and follow it with --watch)."""
    from llmq.batch_cli import run_submit

    code = run_submit(
        base_url, api_key, file, model=model, endpoint=endpoint, window=window,
        metadata=metadata or [], watch_it=watch, interval=interval, output=output, errors=errors,
    )  # fmt: skip
    raise typer.Exit(code)


@batch_app.command("watch")
def batch_watch(
    batch_id: str,
    interval: IntervalOption = 1.0,
    output: OutputOption = None,
    errors: ErrorsOption = None,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    api_key: ApiKeyOption = DEFAULT_API_KEY,
) -> None:
    """Follow a batch with a progress bar to its end; exit 0 if it completed, 1 otherwise."""
    from llmq.batch_cli import run_watch

    raise typer.Exit(
        run_watch(base_url, api_key, batch_id, interval=interval, output=output, errors=errors)
    )


@batch_app.command("cancel")
def batch_cancel(
    batch_id: str,
    base_url: BaseUrlOption = DEFAULT_BASE_URL,
    api_key: ApiKeyOption = DEFAULT_API_KEY,
) -> None:
    """Cancel a batch; print its id and status."""
    from llmq.batch_cli import run_cancel

    raise typer.Exit(run_cancel(base_url, api_key, batch_id))


@app.command("replay")
def replay(
    topic: Annotated[
        str | None, typer.Option(help="Job topic to re-drive (llmq.jobs.<pool>.<class>).")
    ] = None,
    dead: Annotated[
        bool,
        typer.Option(
            "--dead", help="Re-drive dead letters' jobs to their original topic and partition."
        ),
    ] = False,
    partition: Annotated[
        list[int] | None, typer.Option(min=0, help="Partition to read (repeatable; default all).")
    ] = None,
    from_offset: Annotated[
        int | None, typer.Option(min=0, help="First offset per partition (inclusive).")
    ] = None,
    to_offset: Annotated[
        int | None, typer.Option(min=0, help="End offset per partition (exclusive).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            metavar="TIME",
            help="Records produced at or after TIME (ISO-8601, UTC if no zone, or epoch s).",
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option(metavar="TIME", help="Records produced before TIME.")
    ] = None,
    team: Annotated[str | None, typer.Option(help="Only this team's jobs.")] = None,
    model: Annotated[str | None, typer.Option(help="Only jobs for this model.")] = None,
    batch_id: Annotated[str | None, typer.Option(help="Only this batch's lines.")] = None,
    request_id: Annotated[
        list[str] | None, typer.Option(help="Only these request ids (repeatable).")
    ] = None,
    reason: Annotated[
        str | None,
        typer.Option(help="With --dead: unparseable, unknown_schema_version or engine_failed."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replay jobs even if the done ledger says finished.")
    ] = False,
    extend_deadline: Annotated[
        float | None,
        typer.Option(
            metavar="S",
            help="Deadline at least S seconds from now (else expired jobs are skipped).",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count; produce nothing.")] = False,
    bootstrap: Annotated[str, typer.Option(envvar="LLMQ_KAFKA_BOOTSTRAP")] = "127.0.0.1:9092",
    redis_url: Annotated[str, typer.Option(envvar="LLMQ_REDIS_URL")] = "redis://127.0.0.1:6379/0",
) -> None:
    """Re-drive jobs (same request ids, with a replay marker) from a job topic or dead letters."""
    from llmq.logging import configure_logging
    from llmq.replay import JobFilters, ReplayOptions, run_replay_command
    from llmq.replay_input import ReplayUsageError, parse_time

    configure_logging(json=False, level="WARNING")
    try:
        options = ReplayOptions(
            topic=topic, dead=dead, partitions=tuple(partition or ()), from_offset=from_offset,
            to_offset=to_offset, since=None if since is None else parse_time(since),
            until=None if until is None else parse_time(until), force=force,
            filters=JobFilters(team=team, model=model, batch_id=batch_id,
                               request_ids=frozenset(request_id or ()), reason=reason),
            extend_deadline_s=extend_deadline, dry_run=dry_run,
        )  # fmt: skip
        options.validate()
    except ReplayUsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    raise typer.Exit(run_replay_command(options, bootstrap=bootstrap, redis_url=redis_url))


if __name__ == "__main__":
    app()
